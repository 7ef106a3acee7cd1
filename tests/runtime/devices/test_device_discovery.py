"""Discovery: this machine for real, NVML with and without its module or driver, and the
assembly of recorded source outputs (Windows laptop, WSL) into one topology."""

from __future__ import annotations

import subprocess
import sys
import types
from dataclasses import dataclass
from typing import Any

import psutil
import pytest
from devices_testdata import LAPTOP, REPO, SAMPLES, ep_records

from runtime.contracts.devices import (
    MACHINE_RAM,
    WSL_QUOTA,
    DeviceKind,
    ExecutionDomain,
    vram_constraint,
)
from runtime.devices import (
    DiscoveryInputs,
    HostMemory,
    NvmlGpu,
    NvmlProbe,
    OrtProbe,
    assemble_topology,
    discover_topology,
    discovery,
    free_shortfalls,
    load_topology,
    observed_free,
)
from runtime.devices.dxgi import load_adapter_records

GiB = 1024**3
RTX_UUID = "GPU-5090a1b2-c3d4-4e5f-8a6b-7c8d9e0f1a2b"
RTX = NvmlGpu(
    uuid=RTX_UUID,
    name="NVIDIA GeForce RTX 5090 Laptop GPU",
    pci_bus_id="0000:01:00.0",
    pci_device_id=(11352 << 16) | 0x10DE,
    memory_total=24 * GiB,
    memory_free=22 * GiB,
)
HX370 = "AMD Ryzen AI 9 HX 370 w/ Radeon 890M"


def test_discovery_on_this_machine_lists_the_cpu_with_host_ram() -> None:
    topology = discover_topology()
    assert topology.source == "discovered"
    cpus = [device for device in topology.devices if device.kind is DeviceKind.CPU]
    assert len(cpus) == 1
    cpu = cpus[0]
    assert MACHINE_RAM in cpu.memory_constraints
    assert cpu.physical_id.startswith("CPU-")
    assert "CPUExecutionProvider" in cpu.providers
    ram = topology.constraints[MACHINE_RAM]
    assert ram.capacity == psutil.virtual_memory().total
    assert ram.observed_free is not None
    assert 0 < ram.observed_free <= ram.capacity
    assert cpu.physical_id in ram.devices
    nvidia = [device for device in topology.devices if device.physical_id.startswith("GPU-")]
    assert len(nvidia) == len(discovery.probe_nvml().gpus)
    assert topology.wsl is (cpu.execution_domain is ExecutionDomain.WSL)
    assert "CPUExecutionProvider" in topology.to_table()


def test_without_the_nvml_module_no_gpu_is_listed_and_nothing_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    probe = discovery.probe_nvml()
    assert probe.gpus == ()
    assert "nvidia-ml-py is not installed" in probe.notes[0]
    topology = discover_topology()
    assert not any(device.physical_id.startswith("GPU-") for device in topology.devices)
    assert any("nvidia-ml-py is not installed" in note for note in topology.notes)


def test_without_the_nvidia_driver_no_gpu_is_listed_and_nothing_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pynvml = pytest.importorskip("pynvml")

    def no_driver() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    probe = discovery.probe_nvml()
    assert probe.gpus == ()
    assert "NVML is not usable" in probe.notes[0]
    assert "Not Found" in probe.notes[0]


@dataclass
class _Pci:
    busId: bytes
    pciDeviceId: int


@dataclass
class _Memory:
    total: int
    free: int


def _nvml_with(gpus: list[dict[str, Any]], calls: list[str]) -> types.ModuleType:
    """A module with pynvml's functions answering from recorded per-GPU values."""
    module = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def device(index: int) -> dict[str, Any]:
        if "error" in gpus[index]:
            raise NVMLError(gpus[index]["error"])
        return gpus[index]

    functions: dict[str, Any] = {
        "NVMLError": NVMLError,
        "nvmlInit": lambda: calls.append("init"),
        "nvmlShutdown": lambda: calls.append("shutdown"),
        "nvmlDeviceGetCount": lambda: len(gpus),
        "nvmlDeviceGetHandleByIndex": device,
        "nvmlDeviceGetUUID": lambda gpu: gpu["uuid"],
        "nvmlDeviceGetName": lambda gpu: gpu["name"],
        "nvmlDeviceGetPciInfo": lambda gpu: _Pci(gpu["bus"], gpu["pci"]),
        "nvmlDeviceGetMemoryInfo": lambda gpu: _Memory(gpu["total"], gpu["free"]),
    }
    for name, value in functions.items():
        setattr(module, name, value)
    return module


def test_nvml_gpus_become_records_and_nvml_is_shut_down(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    recorded: list[dict[str, Any]] = [
        {
            "uuid": RTX_UUID,
            "name": b"NVIDIA GeForce RTX 5090 Laptop GPU",
            "bus": b"00000000:01:00.0",
            "pci": RTX.pci_device_id,
            "total": 24 * GiB,
            "free": 22 * GiB,
        },
        {"error": "GPU is lost"},
    ]
    monkeypatch.setitem(sys.modules, "pynvml", _nvml_with(recorded, calls))
    probe = discovery.probe_nvml()
    assert probe.gpus == (RTX,)
    assert probe.notes == ("NVML could not describe GPU number 1: GPU is lost",)
    assert calls == ["init", "shutdown"]


def test_importing_the_package_loads_no_heavy_runtime() -> None:
    code = (
        "import sys, runtime.devices; print('onnxruntime' in sys.modules, 'pynvml' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.stdout.split() == ["False", "False"]


def test_is_wsl_from_kernel_release_or_environment() -> None:
    assert discovery.is_wsl("5.15.153.1-microsoft-standard-WSL2\n", {})
    assert discovery.is_wsl("4.4.0-19041-Microsoft", {})
    assert discovery.is_wsl("6.6.0", {"WSL_DISTRO_NAME": "Ubuntu"})
    assert not discovery.is_wsl("6.18.44-fc-v1045", {})


def test_cpu_ids_come_from_the_brand_string() -> None:
    assert discovery.cpu_physical_id(HX370) == "CPU-AMD-Ryzen-AI-9-HX-370-w-Radeon-890M"
    assert (
        discovery.cpu_physical_id("Intel(R) Core(TM) Ultra 7 155H  ")
        == "CPU-Intel-Core-Ultra-7-155H"
    )
    assert discovery.cpu_name_from_cpuinfo("processor\t: 0\nmodel name\t: AMD EPYC\n") == (
        "AMD EPYC"
    )
    assert discovery.cpu_name_from_cpuinfo("processor\t: 0\n") is None


def test_pci_bus_ids_are_normalized() -> None:
    assert discovery.normalize_pci_bus_id("00000000:01:00.0") == "0000:01:00.0"
    assert discovery.normalize_pci_bus_id("0000:C4:00.1") == "0000:c4:00.1"
    assert discovery.normalize_pci_bus_id("01:00.0") == "0000:01:00.0"
    assert discovery.normalize_pci_bus_id("GPU 0") is None


def laptop_inputs(domain: ExecutionDomain, **changes: Any) -> DiscoveryInputs:
    values: dict[str, Any] = {
        "domain": domain,
        "cpu_name": HX370,
        "memory": HostMemory(total=32 * GiB, available=20 * GiB),
        "nvml": NvmlProbe((RTX,)),
        "ort": OrtProbe(
            ("CPUExecutionProvider", "CUDAExecutionProvider", "AzureExecutionProvider"),
            ep_records("ep_devices_wsl_cuda.json"),
        ),
    }
    values.update(changes)
    return DiscoveryInputs(**values)


def test_an_nvml_gpu_offers_cuda_to_workers_when_this_onnx_runtime_lacks_it() -> None:
    # The controller's ONNX Runtime is the CPU build: CUDA comes with the worker's environment.
    cpu_only = OrtProbe(("CPUExecutionProvider",), ep_records("ep_devices_linux_cpu.json"))
    topology = assemble_topology(laptop_inputs(ExecutionDomain.POSIX, ort=cpu_only))
    cpu, gpu = topology.devices
    assert gpu.physical_id == RTX_UUID
    assert gpu.providers == ("CUDAExecutionProvider",)
    assert cpu.providers == ("CPUExecutionProvider",)
    assert (cpu.vendor_id, gpu.vendor_id) == (0x1022, 0x10DE)


def test_wsl_discovery_charges_quota_and_keeps_vram_separate() -> None:
    topology = assemble_topology(laptop_inputs(ExecutionDomain.WSL))
    assert topology.wsl
    cpu, gpu = topology.devices
    assert cpu.memory_constraints == (MACHINE_RAM, WSL_QUOTA)
    assert gpu.physical_id == RTX_UUID
    assert gpu.kind is DeviceKind.DGPU
    assert gpu.memory_constraints == (vram_constraint(RTX_UUID),)
    assert gpu.providers == ("CUDAExecutionProvider",)
    assert cpu.providers == ("CPUExecutionProvider",)
    quota = topology.constraints[WSL_QUOTA]
    assert (quota.capacity, quota.observed_free) == (32 * GiB, 20 * GiB)
    vram = topology.constraints[vram_constraint(RTX_UUID)]
    assert (vram.capacity, vram.observed_free, vram.devices) == (24 * GiB, 22 * GiB, (RTX_UUID,))
    assert RTX_UUID not in topology.constraints[MACHINE_RAM].devices


def test_windows_discovery_merges_the_gpu_seen_by_dxgi_and_nvml() -> None:
    inputs = laptop_inputs(
        ExecutionDomain.WINDOWS,
        ort=OrtProbe(
            ("CPUExecutionProvider", "DmlExecutionProvider", "CUDAExecutionProvider"),
            ep_records("ep_devices_hx370_windows.json"),
        ),
        dxgi_adapters=load_adapter_records(SAMPLES / "dxgi_hx370_rtx5090_laptop.json"),
    )
    topology = assemble_topology(inputs)
    assert not topology.wsl
    kinds = {device.kind: device for device in topology.devices}
    assert [device.kind for device in topology.devices] == [
        DeviceKind.CPU,
        DeviceKind.IGPU,
        DeviceKind.NPU,
        DeviceKind.DGPU,
    ]
    assert kinds[DeviceKind.DGPU].physical_id == RTX_UUID
    assert kinds[DeviceKind.DGPU].providers == ("DmlExecutionProvider", "CUDAExecutionProvider")
    assert kinds[DeviceKind.IGPU].physical_id == "LUID-00000000-0000F2A1"
    assert kinds[DeviceKind.IGPU].providers == ("DmlExecutionProvider",)
    assert kinds[DeviceKind.NPU].physical_id == "LUID-00000000-0000F32B"
    assert kinds[DeviceKind.NPU].providers == ("VitisAIExecutionProvider",)
    assert kinds[DeviceKind.NPU].name == "NPU Compute Accelerator Device"
    assert set(topology.constraints[MACHINE_RAM].devices) == {
        kinds[kind].physical_id for kind in (DeviceKind.CPU, DeviceKind.IGPU, DeviceKind.NPU)
    }
    assert topology.constraints[vram_constraint(RTX_UUID)].capacity == 24 * GiB
    assert not any("Basic Render" in device.name for device in topology.devices)
    assert len(topology.constraints) == 2


def test_without_nvml_the_windows_gpu_keeps_its_luid_and_dxgi_memory() -> None:
    inputs = laptop_inputs(
        ExecutionDomain.WINDOWS,
        nvml=NvmlProbe((), ("nvidia-ml-py is not installed",)),
        ort=OrtProbe(("CPUExecutionProvider", "DmlExecutionProvider"), None),
        dxgi_adapters=load_adapter_records(SAMPLES / "dxgi_hx370_rtx5090_laptop.json"),
    )
    topology = assemble_topology(inputs)
    dgpu = next(device for device in topology.devices if device.kind is DeviceKind.DGPU)
    assert dgpu.physical_id == "LUID-00000000-0000F2B6"
    assert dgpu.providers == ("DmlExecutionProvider",)
    assert topology.constraints[vram_constraint(dgpu.physical_id)].capacity == 25201475584
    assert topology.constraints[vram_constraint(dgpu.physical_id)].observed_free is None


def test_an_available_provider_alone_creates_no_device() -> None:
    inputs = laptop_inputs(
        ExecutionDomain.POSIX,
        nvml=NvmlProbe(()),
        ort=OrtProbe(
            (
                "CUDAExecutionProvider",
                "VitisAIExecutionProvider",
                "CPUExecutionProvider",
                "AzureExecutionProvider",
            ),
            None,
        ),
    )
    topology = assemble_topology(inputs)
    assert [device.kind for device in topology.devices] == [DeviceKind.CPU]
    assert topology.devices[0].providers == ("CPUExecutionProvider",)
    assert any(note.startswith("CUDAExecutionProvider is available") for note in topology.notes)
    assert any(note.startswith("VitisAIExecutionProvider is available") for note in topology.notes)
    assert not any("Azure" in note for note in topology.notes)


def test_an_available_cuda_provider_attaches_to_the_gpu_nvml_found() -> None:
    inputs = laptop_inputs(
        ExecutionDomain.POSIX, ort=OrtProbe(("CPUExecutionProvider", "CUDAExecutionProvider"), None)
    )
    topology = assemble_topology(inputs)
    assert topology.device(RTX_UUID).providers == ("CUDAExecutionProvider",)
    assert topology.devices[0].providers == ("CPUExecutionProvider",)


def test_onnxruntime_probe_reports_the_cpu_provider_and_device() -> None:
    probe = discovery.probe_onnxruntime()
    assert "CPUExecutionProvider" in probe.available_providers
    assert probe.ep_devices is not None
    cpu_records = [record for record in probe.ep_devices if record.device_type == "cpu"]
    assert any(record.ep_name == "CPUExecutionProvider" for record in cpu_records)


def test_observed_free_of_a_file_is_what_the_file_states() -> None:
    free = observed_free(load_topology(LAPTOP))
    assert dict(free) == {}
    wsl_file = LAPTOP.parent / "cpu-igpu-npu-dgpu-wsl.yaml"
    free = observed_free(load_topology(wsl_file))
    assert free[MACHINE_RAM] == 20 * GiB
    assert free[WSL_QUOTA] == 12 * GiB
    assert free[vram_constraint("GPU-00000000-0000-4000-8000-000000000001")] == 15 * GiB


def test_observed_free_of_this_machine_is_sampled_now() -> None:
    topology = discover_topology()
    free = observed_free(topology)
    capacity = topology.constraints[MACHINE_RAM].capacity
    assert capacity is not None
    assert 0 < free[MACHINE_RAM] <= capacity
    assert (WSL_QUOTA in free) is topology.wsl


def test_capacity_above_observed_free_is_reported() -> None:
    shortfalls = free_shortfalls(
        {MACHINE_RAM: 24 * GiB, WSL_QUOTA: 8 * GiB, "machine:vram:GPU-1": GiB},
        {MACHINE_RAM: 20 * GiB, WSL_QUOTA: 12 * GiB},
    )
    assert [(item.constraint, item.capacity, item.free) for item in shortfalls] == [
        (MACHINE_RAM, 24 * GiB, 20 * GiB)
    ]
