"""Discover this machine's devices: CPU and RAM, WSL, NVIDIA GPUs, ONNX Runtime, DXGI.

Discovery gathers what each source reports into plain records (``DiscoveryInputs``), then
one pure function, ``assemble_topology``, turns them into a Topology. Sources:

* CPU and host RAM through psutil. Inside WSL the VM's total RAM *is* the WSL quota, so a
  host-memory allocation charges both ``machine:ram`` and ``wsl:quota``; the Windows host's
  own RAM is not visible from inside, so ``machine:ram`` shows the same numbers there.
* NVIDIA GPUs through NVML (PyPI ``nvidia-ml-py``, module ``pynvml``): without the module or
  the driver no GPU is listed and nothing fails. A GPU NVML lists offers
  ``CUDAExecutionProvider`` (the workers' CUDA environments reach it), whatever this
  process's own ONNX Runtime build has. A GPU's id is its NVML UUID, which Windows
  and WSL report alike, so both views of one GPU merge into one device.
* ONNX Runtime: ``get_ep_devices()`` (ORT >= 1.22) names the hardware each execution
  provider can use. A provider that ``get_available_providers()`` lists is not proof of a
  working device: it is attached only to a device another source found, never creates one.
* Windows display adapters through DXGI (``runtime.devices.dxgi``).
"""

from __future__ import annotations

import importlib
import os
import platform
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import psutil

from runtime.contracts.devices import (
    MACHINE_RAM,
    WSL_QUOTA,
    DeviceDescriptor,
    DeviceKind,
    ExecutionDomain,
    vram_constraint,
)
from runtime.contracts.ep_device import luid_id, normalize_pci_bus_id
from runtime.devices import dxgi
from runtime.devices.topology import (
    DISCOVERED,
    Topology,
    build_topology,
    file_observed_free,
    make_descriptor,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

# Providers that run on the CPU; those that only drive NVIDIA GPUs; those that only drive
# AMD GPUs; providers that are not local devices at all.
_CPU_PROVIDERS = frozenset(
    {"CPUExecutionProvider", "DnnlExecutionProvider", "XnnpackExecutionProvider"}
)
_NVIDIA_PROVIDERS = frozenset(
    {"CUDAExecutionProvider", "TensorrtExecutionProvider", "NvTensorRTRTXExecutionProvider"}
)
_AMD_GPU_PROVIDERS = frozenset({"ROCMExecutionProvider", "MIGraphXExecutionProvider"})
_DXGI_PROVIDERS = frozenset({"DmlExecutionProvider"})
_NOT_DEVICES = frozenset({"AzureExecutionProvider"})

_KIND_ORDER = {DeviceKind.CPU: 0, DeviceKind.IGPU: 1, DeviceKind.NPU: 2, DeviceKind.DGPU: 3}
_MB_RE = re.compile(r"^\s*(\d+)\s*MB\s*$")


@dataclass(frozen=True, slots=True)
class HostMemory:
    total: int
    available: int


@dataclass(frozen=True, slots=True)
class NvmlGpu:
    """One GPU as NVML reports it; ``pci_device_id`` is ``device_id << 16 | vendor_id``."""

    uuid: str
    name: str
    pci_bus_id: str
    pci_device_id: int
    memory_total: int
    memory_free: int


@dataclass(frozen=True, slots=True)
class NvmlProbe:
    gpus: tuple[NvmlGpu, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class EpDeviceRecord:
    """One (execution provider, hardware device) pair from ``onnxruntime.get_ep_devices()``."""

    ep_name: str
    device_type: str
    vendor_id: int
    device_id: int
    vendor: str
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class OrtProbe:
    """``ep_devices`` is None when this ONNX Runtime has no ``get_ep_devices``."""

    available_providers: tuple[str, ...]
    ep_devices: tuple[EpDeviceRecord, ...] | None


@dataclass(frozen=True, slots=True)
class DiscoveryInputs:
    """Everything discovery read, before any interpretation."""

    domain: ExecutionDomain
    cpu_name: str
    memory: HostMemory
    nvml: NvmlProbe
    ort: OrtProbe
    dxgi_adapters: tuple[dxgi.DxgiAdapter, ...] = ()
    notes: tuple[str, ...] = ()


def is_wsl(osrelease: str, environ: Mapping[str, str]) -> bool:
    """True inside WSL: its kernel release names Microsoft, or WSL set its distro variable."""
    return "microsoft" in osrelease.lower() or bool(environ.get("WSL_DISTRO_NAME"))


def current_domain() -> ExecutionDomain:
    if sys.platform == "win32":
        return ExecutionDomain.WINDOWS
    try:
        osrelease = Path("/proc/sys/kernel/osrelease").read_text(encoding="utf-8")
    except OSError:
        osrelease = platform.release()
    return ExecutionDomain.WSL if is_wsl(osrelease, os.environ) else ExecutionDomain.POSIX


def read_host_memory() -> HostMemory:
    memory = psutil.virtual_memory()
    return HostMemory(total=int(memory.total), available=int(memory.available))


def read_cpu_name() -> str:
    """The processor's brand string, the same from Windows and from WSL on one machine."""
    if sys.platform == "win32":
        import winreg

        key = r"HARDWARE\DESCRIPTION\System\CentralProcessor\0"
        try:
            with winreg.OpenKey(winreg.HKEY_LOCAL_MACHINE, key) as handle:
                return str(winreg.QueryValueEx(handle, "ProcessorNameString")[0]).strip()
        except OSError:
            return platform.processor() or "CPU"
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor() or "CPU"
    return cpu_name_from_cpuinfo(cpuinfo) or platform.processor() or "CPU"


def cpu_name_from_cpuinfo(cpuinfo: str) -> str | None:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware") and value.strip():
            return value.strip()
    return None


def cpu_physical_id(name: str) -> str:
    """``CPU-<brand>``: the brand string is what identifies the host's processor across OSes."""
    cleaned = re.sub(r"\((R|TM|C)\)", "", name, flags=re.IGNORECASE)
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", cleaned).strip("-.")
    return f"CPU-{slug or 'unknown'}"


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def probe_nvml() -> NvmlProbe:
    """NVIDIA GPUs from NVML; an absent module, library or driver gives none and a note."""
    try:
        nvml: Any = importlib.import_module("pynvml")
    except ImportError:
        return NvmlProbe((), ("nvidia-ml-py is not installed, so NVIDIA GPUs are not listed",))
    nvml_error: type[BaseException] = nvml.NVMLError
    try:
        nvml.nvmlInit()
    except nvml_error as error:
        return NvmlProbe((), (f"NVML is not usable ({error}), so no NVIDIA GPU is listed",))
    gpus: list[NvmlGpu] = []
    notes: list[str] = []
    try:
        for index in range(int(nvml.nvmlDeviceGetCount())):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                pci = nvml.nvmlDeviceGetPciInfo(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                gpus.append(
                    NvmlGpu(
                        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                        name=_text(nvml.nvmlDeviceGetName(handle)),
                        pci_bus_id=normalize_pci_bus_id(_text(pci.busId)) or _text(pci.busId),
                        pci_device_id=int(pci.pciDeviceId),
                        memory_total=int(memory.total),
                        memory_free=int(memory.free),
                    )
                )
            except nvml_error as error:
                notes.append(f"NVML could not describe GPU number {index}: {error}")
    except nvml_error as error:
        notes.append(f"NVML could not list GPUs: {error}")
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml_error as error:
            notes.append(f"NVML did not shut down cleanly: {error}")
    return NvmlProbe(tuple(gpus), tuple(notes))


def probe_onnxruntime() -> OrtProbe:
    """The providers this ONNX Runtime offers and, where it can say, the devices for each."""
    import onnxruntime

    available = tuple(str(name) for name in onnxruntime.get_available_providers())
    get_ep_devices = getattr(onnxruntime, "get_ep_devices", None)
    if get_ep_devices is None:
        return OrtProbe(available, None)
    records = tuple(
        EpDeviceRecord(
            ep_name=str(ep_device.ep_name),
            device_type=str(ep_device.device.type.name).lower(),
            vendor_id=int(ep_device.device.vendor_id),
            device_id=int(ep_device.device.device_id),
            vendor=str(ep_device.device.vendor),
            metadata={str(key): str(value) for key, value in ep_device.device.metadata.items()},
        )
        for ep_device in get_ep_devices()
    )
    return OrtProbe(available, records)


def gather_inputs() -> DiscoveryInputs:
    """Read every source on this machine."""
    notes: list[str] = []
    adapters: tuple[dxgi.DxgiAdapter, ...] = ()
    try:
        adapters = dxgi.enumerate_adapters()
    except OSError as error:
        notes.append(f"DXGI could not list display adapters: {error}")
    return DiscoveryInputs(
        domain=current_domain(),
        cpu_name=read_cpu_name(),
        memory=read_host_memory(),
        nvml=probe_nvml(),
        ort=probe_onnxruntime(),
        dxgi_adapters=adapters,
        notes=tuple(notes),
    )


def discover_topology() -> Topology:
    """This machine's devices and memory constraints, as seen from this process's domain."""
    return assemble_topology(gather_inputs())


@dataclass(slots=True)
class _Found:
    """A device being assembled: its identity, providers so far, and its memory if its own."""

    physical_id: str
    kind: DeviceKind
    name: str
    vendor_id: int | None = None
    device_id: int | None = None
    pci_bus_id: str | None = None
    luid: str | None = None
    providers: list[str] = field(default_factory=list)
    vram_total: int | None = None
    vram_free: int | None = None

    def add_provider(self, provider: str) -> None:
        if provider not in self.providers:
            self.providers.append(provider)


def assemble_topology(inputs: DiscoveryInputs) -> Topology:
    """Turn what the sources reported into one Topology (pure: no reads of the machine)."""
    notes = list(inputs.notes) + list(inputs.nvml.notes)
    cpu = _Found(cpu_physical_id(inputs.cpu_name), DeviceKind.CPU, inputs.cpu_name)
    found: list[_Found] = [cpu]

    for gpu in inputs.nvml.gpus:
        found.append(
            _Found(
                physical_id=gpu.uuid,
                kind=DeviceKind.DGPU,
                name=gpu.name,
                vendor_id=gpu.pci_device_id & 0xFFFF,
                device_id=gpu.pci_device_id >> 16,
                pci_bus_id=gpu.pci_bus_id,
                vram_total=gpu.memory_total,
                vram_free=gpu.memory_free,
            )
        )
    nvml_devices = list(found[1:])

    for adapter in dxgi.hardware_adapters(inputs.dxgi_adapters):
        twin = _unique(
            device
            for device in nvml_devices
            if (device.vendor_id, device.device_id) == (adapter.vendor_id, adapter.device_id)
        )
        if twin is not None:
            twin.luid = adapter.physical_id
            continue
        found.append(
            _Found(
                physical_id=adapter.physical_id,
                kind=adapter.kind,
                name=adapter.description,
                vendor_id=adapter.vendor_id,
                device_id=adapter.device_id,
                luid=adapter.physical_id,
                vram_total=adapter.dedicated_video_memory if not adapter.is_integrated else None,
            )
        )

    seen_providers: set[str] = set()
    for record in inputs.ort.ep_devices or ():
        seen_providers.add(record.ep_name)
        if record.device_type == "cpu":
            cpu.add_provider(record.ep_name)
            if cpu.vendor_id is None:
                cpu.vendor_id, cpu.device_id = record.vendor_id, record.device_id
            continue
        target = _match_ep_device(record, found)
        if target is None:
            target = _device_from_ep_record(record)
            found.append(target)
        target.add_provider(record.ep_name)

    for provider in inputs.ort.available_providers:
        if provider in seen_providers or provider in _NOT_DEVICES:
            continue
        targets = _fallback_targets(provider, found)
        if not targets:
            notes.append(
                f"{provider} is available but no device for it was found (an available "
                "provider does not show a working device)"
            )
        for target in targets:
            target.add_provider(provider)

    for device in nvml_devices:
        # NVML saw the GPU through the NVIDIA driver: CUDA reaches it from the workers'
        # environments (ort-cuda, vllm-cuda) even where this process's ONNX Runtime has no
        # CUDA provider; the worker's own ONNX Runtime is checked when the stage loads.
        device.add_provider("CUDAExecutionProvider")

    found.sort(key=lambda device: _KIND_ORDER[device.kind])
    descriptors: list[DeviceDescriptor] = [
        make_descriptor(
            physical_id=device.physical_id,
            kind=device.kind,
            name=device.name,
            domain=inputs.domain,
            providers=device.providers,
            vendor_id=device.vendor_id,
            device_id=device.device_id,
            pci_bus_id=device.pci_bus_id,
        )
        for device in found
    ]
    capacities: dict[str, int | None] = {MACHINE_RAM: inputs.memory.total}
    observed: dict[str, int] = {MACHINE_RAM: inputs.memory.available}
    if inputs.domain is ExecutionDomain.WSL:
        capacities[WSL_QUOTA] = inputs.memory.total
        observed[WSL_QUOTA] = inputs.memory.available
        notes.append(
            "inside WSL the Windows host's RAM is not visible: machine:ram shows the WSL quota"
        )
    for device in found:
        if device.kind is DeviceKind.DGPU:
            constraint = vram_constraint(device.physical_id)
            capacities[constraint] = device.vram_total
            if device.vram_free is not None:
                observed[constraint] = device.vram_free
    return build_topology(
        descriptors, capacities=capacities, observed=observed, source=DISCOVERED, notes=notes
    )


def _unique(candidates: Iterable[_Found]) -> _Found | None:
    matches = list(candidates)
    return matches[0] if len(matches) == 1 else None


def _match_ep_device(record: EpDeviceRecord, found: list[_Found]) -> _Found | None:
    """The already-found device an ORT hardware device is: by LUID, PCI bus, then PCI ids."""
    wanted_kinds = (
        {DeviceKind.NPU} if record.device_type == "npu" else {DeviceKind.IGPU, DeviceKind.DGPU}
    )
    candidates = [device for device in found if device.kind in wanted_kinds]
    luid = luid_id(record.metadata.get("LUID", ""))
    if luid is not None:
        by_luid = _unique(device for device in candidates if device.luid == luid)
        if by_luid is not None:
            return by_luid
    bus = normalize_pci_bus_id(record.metadata.get("pci_bus_id", ""))
    if bus is not None:
        by_bus = _unique(device for device in candidates if device.pci_bus_id == bus)
        if by_bus is not None:
            return by_bus
    return _unique(
        device
        for device in candidates
        if (device.vendor_id, device.device_id) == (record.vendor_id, record.device_id)
    )


def _device_from_ep_record(record: EpDeviceRecord) -> _Found:
    """A device only ONNX Runtime reported (an NPU, or a GPU no other source saw)."""
    luid = luid_id(record.metadata.get("LUID", ""))
    bus = normalize_pci_bus_id(record.metadata.get("pci_bus_id", ""))
    physical_id = luid or (f"PCI-{bus}" if bus else None)
    if physical_id is None:
        # Only the vendor and device ids are known: they name the model, enough on one machine.
        physical_id = f"PCI-{record.vendor_id:04X}-{record.device_id:04X}"
    if record.device_type == "npu":
        kind = DeviceKind.NPU
    elif record.metadata.get("Discrete") == "1" or record.vendor_id == dxgi.VENDOR_NVIDIA:
        kind = DeviceKind.DGPU
    else:
        # Unknown integration is treated as shared RAM: it never overstates free memory.
        kind = DeviceKind.IGPU
    name = record.metadata.get("Description") or f"{record.vendor} {record.device_type.upper()}"
    vram = _MB_RE.match(record.metadata.get("DxgiVideoMemory", ""))
    return _Found(
        physical_id=physical_id,
        kind=kind,
        name=name,
        vendor_id=record.vendor_id,
        device_id=record.device_id,
        pci_bus_id=bus,
        luid=luid,
        vram_total=int(vram.group(1)) * 1024 * 1024 if vram and kind is DeviceKind.DGPU else None,
    )


def _fallback_targets(provider: str, found: list[_Found]) -> list[_Found]:
    """Devices a provider without device information can only mean."""
    if provider in _CPU_PROVIDERS:
        return [device for device in found if device.kind is DeviceKind.CPU]
    gpus = [device for device in found if device.kind in (DeviceKind.IGPU, DeviceKind.DGPU)]
    if provider in _NVIDIA_PROVIDERS:
        return [device for device in gpus if device.vendor_id == dxgi.VENDOR_NVIDIA]
    if provider in _AMD_GPU_PROVIDERS:
        return [device for device in gpus if device.vendor_id == dxgi.VENDOR_AMD]
    if provider in _DXGI_PROVIDERS:
        return [device for device in gpus if device.luid is not None]
    return []


def observed_free(topology: Topology) -> Mapping[str, int]:
    """Free memory per constraint now, so a plan can warn when a capacity exceeds it.

    For a discovered topology this samples the machine again (psutil's available RAM for
    ``machine:ram`` and, in WSL, ``wsl:quota``; NVML's free memory for NVIDIA VRAM). For a
    topology file it is the ``observed_free`` values the file states.
    """
    if topology.source != DISCOVERED:
        return file_observed_free(topology)
    memory = read_host_memory()
    free: dict[str, int] = {MACHINE_RAM: memory.available}
    if WSL_QUOTA in topology.constraints:
        free[WSL_QUOTA] = memory.available
    for gpu in probe_nvml().gpus:
        constraint = vram_constraint(gpu.uuid)
        if constraint in topology.constraints:
            free[constraint] = gpu.memory_free
    return MappingProxyType(free)


@dataclass(frozen=True, slots=True)
class FreeShortfall:
    """A declared capacity larger than the memory observed free now."""

    constraint: str
    capacity: int
    free: int


def free_shortfalls(
    capacities: Mapping[str, int], free: Mapping[str, int]
) -> tuple[FreeShortfall, ...]:
    """The constraints whose declared capacity exceeds what is free now (unobserved ones skip)."""
    return tuple(
        FreeShortfall(name, capacity, free[name])
        for name, capacity in capacities.items()
        if name in free and capacity > free[name]
    )
