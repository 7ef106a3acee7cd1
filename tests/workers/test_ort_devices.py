"""Choosing a session's execution-provider device (``workers.ort_devices``).

The CPU provider's device is the only one this machine has: sessions here are real. GPU and
NPU entries, and an ONNX Runtime without the device API, come through the module's seam,
``DeviceApi``, with entries recorded from what ONNX Runtime lists on such machines.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import onnxruntime as ort
import pytest

from runtime.contracts.ep_device import EpDeviceRequest
from tests.workers.support import CPU, identity_of
from workers.errors import WorkerError
from workers.ort_devices import (
    ORT_DEVICE_API,
    EpDeviceEntry,
    configure_providers,
    select_ep_device,
)
from workers.ort_session import (
    create_placed_session,
    load_verified_graph,
    open_graph,
    warm_up,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

CUDA = "CUDAExecutionProvider"
DML = "DmlExecutionProvider"
VITISAI = "VitisAIExecutionProvider"

#: What ``get_ep_devices()`` lists on a Windows laptop with a Radeon 890M, an AMD NPU and
#: an RTX 5090 Laptop GPU (onnxruntime-gpu with DirectML): vendor and PCI device ids.
LAPTOP = (
    EpDeviceEntry(CPU, "cpu", "AMD", 0x1022, 0x0000),
    EpDeviceEntry(DML, "gpu", "AMD", 0x1002, 0x150E),
    EpDeviceEntry(DML, "gpu", "NVIDIA", 0x10DE, 0x2C58),
    EpDeviceEntry(CUDA, "gpu", "NVIDIA", 0x10DE, 0x2C58),
    EpDeviceEntry(VITISAI, "npu", "AMD", 0x1022, 0x17F0),
)


@dataclass
class RecordedApi:
    """The seam with recorded entries: records what the session options would be given."""

    entries: tuple[EpDeviceEntry, ...] | None
    added: list[tuple[tuple[EpDeviceEntry, ...], dict[str, str]]] = field(default_factory=list)
    registered: list[tuple[str, str]] = field(default_factory=list)

    def ep_devices(self) -> tuple[EpDeviceEntry, ...] | None:
        return self.entries

    def register_library(self, name: str, path: str) -> None:
        self.registered.append((name, path))

    def add_for_devices(
        self,
        options: ort.SessionOptions,
        entries: Sequence[EpDeviceEntry],
        provider_options: Mapping[str, str],
    ) -> None:
        self.added.append((tuple(entries), dict(provider_options)))


def test_the_entry_matching_type_vendor_and_device_is_chosen() -> None:
    nvidia = EpDeviceRequest("GPU-0000", "gpu", vendor_id=0x10DE, device_id=0x2C58)
    assert select_ep_device(nvidia, DML, LAPTOP) == LAPTOP[2]
    radeon = EpDeviceRequest("PCI-0000:c4:00.0", "gpu", vendor_id=0x1002, device_id=0x150E)
    assert select_ep_device(radeon, DML, LAPTOP) == LAPTOP[1]
    # Without ids, a provider's only device of the type is enough.
    assert select_ep_device(EpDeviceRequest("NPU", "npu"), VITISAI, LAPTOP) == LAPTOP[4]
    assert select_ep_device(None, CUDA, LAPTOP) == LAPTOP[3]


def test_a_device_that_is_not_listed_is_refused_naming_every_listed_one() -> None:
    intel = EpDeviceRequest("PCI-0000:00:02.0", "gpu", vendor_id=0x8086, device_id=0x7D55)
    with pytest.raises(WorkerError) as caught:
        select_ep_device(intel, DML, LAPTOP)
    assert caught.value.code == "device_absent"
    message = str(caught.value)
    assert "no DmlExecutionProvider device matches gpu PCI-0000:00:02.0 (vendor 0x8086" in message
    for entry in LAPTOP:
        assert entry.describe() in message


def test_two_devices_without_ids_to_tell_them_apart_are_refused() -> None:
    with pytest.raises(WorkerError, match="2 DmlExecutionProvider devices match") as caught:
        select_ep_device(EpDeviceRequest("GPU-x", "gpu"), DML, LAPTOP)
    assert "vendor_id, device_id and pci_bus_id" in str(caught.value)


def test_the_target_gets_its_device_and_the_route_options_the_cpu_none() -> None:
    api = RecordedApi(LAPTOP)
    request = EpDeviceRequest("GPU-0000", "gpu", vendor_id=0x10DE, device_id=0x2C58)
    chosen = configure_providers(
        ort.SessionOptions(),
        [CUDA, CPU],
        CUDA,
        device=request,
        provider_options={"device_id": "0", "cudnn_conv_algo_search": "HEURISTIC"},
        api=api,
    )
    assert api.added == [
        ((LAPTOP[3],), {"device_id": "0", "cudnn_conv_algo_search": "HEURISTIC"}),
        ((LAPTOP[0],), {}),
    ]
    assert chosen.providers is None
    assert chosen.applied.method == "ep_device"
    assert (chosen.applied.vendor_id, chosen.applied.device_id) == (0x10DE, 0x2C58)
    assert dict(chosen.applied.provider_options) == {
        "device_id": "0",
        "cudnn_conv_algo_search": "HEURISTIC",
    }


def test_a_plugin_library_is_registered_before_its_devices_are_listed(tmp_path: Path) -> None:
    library = tmp_path / "onnxruntime_providers_openvino_plugin.so"
    library.write_bytes(b"\x7fELF")
    openvino = "OpenVINOExecutionProvider"
    api = RecordedApi((*LAPTOP, EpDeviceEntry(openvino, "npu", "Intel", 0x8086, 0x7D1D)))
    chosen = configure_providers(
        ort.SessionOptions(),
        [openvino],
        openvino,
        device=EpDeviceRequest("NPU-1", "npu", vendor_id=0x8086),
        provider_options={"device_type": "NPU"},
        ep_library=str(library),
        api=api,
    )
    assert api.registered == [(openvino, str(library))]
    assert chosen.applied.ep_library == str(library)
    assert dict(chosen.applied.provider_options) == {"device_type": "NPU"}


def test_an_ep_library_that_is_not_a_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkerError, match="is not a file in the worker's domain") as caught:
        configure_providers(
            ort.SessionOptions(),
            [CPU],
            CPU,
            ep_library=str(tmp_path / "absent.so"),
            api=RecordedApi(LAPTOP),
        )
    assert caught.value.code == "provider_absent"


def test_onnx_runtime_refusing_a_library_is_a_provider_absent(tmp_path: Path) -> None:
    # The real registration: a file that is no shared library.
    library = tmp_path / "not-a-library.so"
    library.write_bytes(b"not an ELF file")
    with pytest.raises(WorkerError, match="could not register the plugin library") as caught:
        configure_providers(
            ort.SessionOptions(), [CPU], CPU, ep_library=str(library), api=ORT_DEVICE_API
        )
    assert caught.value.code == "provider_absent"
    assert str(library) in str(caught.value)


def test_without_the_device_api_the_options_go_to_the_session_by_provider(
    add_manifest: Path,
) -> None:
    # An ONNX Runtime older than 1.22: a real session, given providers and options by name.
    graph = load_verified_graph(add_manifest, identity_of(add_manifest))
    session, applied = create_placed_session(
        graph,
        [CPU],
        [CPU],
        CPU,
        device=EpDeviceRequest("CPU-x", "cpu", vendor_id=0xFFFF),
        provider_options={"arena_extend_strategy": "kSameAsRequested"},
        device_api=RecordedApi(None),
    )
    warm_up(session, graph.example_inputs)
    assert session.get_providers() == [CPU]
    assert applied.method == "provider_options"
    assert applied.vendor_id is None
    assert applied.provider_options["arena_extend_strategy"] == "kSameAsRequested"


def test_the_real_cpu_device_is_found_and_a_session_runs_on_it(add_manifest: Path) -> None:
    graph = load_verified_graph(add_manifest, identity_of(add_manifest))
    (cpu,) = [d for d in ort.get_ep_devices() if d.ep_name == CPU]
    request = EpDeviceRequest(
        "CPU-here", "cpu", vendor_id=cpu.device.vendor_id, device_id=cpu.device.device_id
    )
    session, applied = create_placed_session(graph, [CPU], [CPU], CPU, device=request)
    warm_up(session, graph.example_inputs)
    assert session.get_providers() == [CPU]
    assert applied.method == "ep_device"
    assert applied.vendor == cpu.device.vendor


def test_a_provider_without_device_entries_sends_every_provider_by_name() -> None:
    # The Azure provider is built in without device entries: a route allowing it gets its
    # providers by name, but the target's requested device is still looked for.
    azure = "AzureExecutionProvider"
    chosen = configure_providers(ort.SessionOptions(), [CPU, azure], CPU, api=ORT_DEVICE_API)
    assert chosen.providers == (CPU, azure)
    assert chosen.applied.method == "provider_options"
    elsewhere = EpDeviceRequest("CPU-other", "cpu", vendor_id=0xFFFF)
    with pytest.raises(WorkerError) as caught:
        configure_providers(
            ort.SessionOptions(), [CPU, azure], CPU, device=elsewhere, api=ORT_DEVICE_API
        )
    assert caught.value.code == "device_absent"


def test_an_accelerator_is_initialised_under_its_host_lock(
    add_manifest: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another process initialises the GPU for a second: this load waits for it.
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nfrom runtime.host.locks import device_init_lock\n"
            "with device_init_lock('GPU-5090'):\n    print('held', flush=True)\n"
            "    time.sleep(1.0)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        # The recorded CUDA device cannot really be given to a session here: the load then
        # fails (CPU fallback is off, nothing runs the graph), after the lock was taken.
        with pytest.raises(WorkerError) as caught:
            open_graph(
                add_manifest,
                identity_of(add_manifest),
                [CUDA],
                [CUDA],
                CUDA,
                max_io_bytes=1 << 20,
                device=EpDeviceRequest("GPU-5090", "gpu", vendor_id=0x10DE, device_id=0x2C58),
                device_api=RecordedApi(LAPTOP),
            )
        assert caught.value.code == "session_failed"
        assert "CPU fallback is disabled" in str(caught.value)
        assert time.monotonic() - started > 0.5
    finally:
        holder.wait(timeout=10)


#: Two identical GPUs (onnxruntime-gpu on Linux lists each with its PCI address).
TWIN_GPUS = (
    EpDeviceEntry(CPU, "cpu", "AMD", 0x1022, 0x0000),
    EpDeviceEntry(CUDA, "gpu", "NVIDIA", 0x10DE, 0x2684, pci_bus_id="0000:01:00.0"),
    EpDeviceEntry(CUDA, "gpu", "NVIDIA", 0x10DE, 0x2684, pci_bus_id="0000:41:00.0"),
)


def test_identical_gpus_are_told_apart_by_their_pci_address() -> None:
    second = EpDeviceRequest(
        "GPU-b", "gpu", vendor_id=0x10DE, device_id=0x2684, pci_bus_id="0000:41:00.0"
    )
    assert select_ep_device(second, CUDA, TWIN_GPUS) == TWIN_GPUS[2]
    elsewhere = EpDeviceRequest("GPU-c", "gpu", vendor_id=0x10DE, pci_bus_id="0000:81:00.0")
    with pytest.raises(WorkerError, match="no CUDAExecutionProvider device matches") as caught:
        select_ep_device(elsewhere, CUDA, TWIN_GPUS)
    assert "PCI 0000:41:00.0" in str(caught.value)
    # A DirectML adapter is named by its LUID.
    dml = (
        EpDeviceEntry(DML, "gpu", "AMD", 0x1002, 0x150E, luid="LUID-00000000-0000F2A1"),
        EpDeviceEntry(DML, "gpu", "AMD", 0x1002, 0x150E, luid="LUID-00000000-0000F3B2"),
    )
    by_luid = EpDeviceRequest("LUID-00000000-0000F3B2", "gpu", luid="LUID-00000000-0000F3B2")
    assert select_ep_device(by_luid, DML, dml) == dml[1]


def test_a_plugin_whose_provider_lists_no_device_is_refused(tmp_path: Path) -> None:
    library = tmp_path / "libonnxruntime_providers_webgpu.so"
    library.write_bytes(b"\x7fELF")
    webgpu = "WebGpuExecutionProvider"
    api = RecordedApi(LAPTOP)
    with pytest.raises(WorkerError) as caught:
        configure_providers(
            ort.SessionOptions(), [webgpu], webgpu, ep_library=str(library), api=api
        )
    assert caught.value.code == "device_absent"
    assert f"lists no {webgpu} device on this machine" in str(caught.value)
    assert api.registered == [(webgpu, str(library))]
    assert api.added == []
