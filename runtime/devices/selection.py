"""Which devices the user lets pipelines use, and the check that a route's device is allowed.

The selection is a small JSON settings file, ``devices.json``, in the user's configuration
folder (``platformdirs.user_config_dir("omni-edge-studio")``, or ``$OMNI_EDGE_CONFIG_DIR``
when set)::

    {"version": 1, "allowed": ["CPU-…", "GPU-…"]}

``"allowed": null`` (or no file at all) allows every device. Ids not present on the
current machine are kept: a selection may be shared by several topologies.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import platformdirs

from runtime.contracts.devices import DeviceDescriptor, DeviceKind, ExecutionDomain
from runtime.contracts.ep_device import EpDeviceRequest, normalize_pci_bus_id
from runtime.devices.topology import DISCOVERED
from runtime.errors import ConfigError, DeviceExcluded, UsageError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from runtime.devices.topology import Topology

APP_NAME = "omni-edge-studio"
CONFIG_DIR_ENV = "OMNI_EDGE_CONFIG_DIR"
SELECTION_FILE = "devices.json"
SELECTION_FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class RouteTarget:
    """What a route's ``ep`` may target: the providers it names and device kinds, preferred first."""

    providers: frozenset[str]
    kinds: tuple[DeviceKind, ...]


_GPU = (DeviceKind.DGPU, DeviceKind.IGPU)
ROUTE_TARGETS: Mapping[str, RouteTarget] = MappingProxyType(
    {
        "cpu": RouteTarget(
            frozenset(
                {"CPUExecutionProvider", "DnnlExecutionProvider", "XnnpackExecutionProvider"}
            ),
            (DeviceKind.CPU,),
        ),
        "cuda": RouteTarget(frozenset({"CUDAExecutionProvider"}), _GPU),
        "tensorrt": RouteTarget(frozenset({"TensorrtExecutionProvider"}), _GPU),
        "nv_tensorrt_rtx": RouteTarget(frozenset({"NvTensorRTRTXExecutionProvider"}), _GPU),
        "dml": RouteTarget(frozenset({"DmlExecutionProvider"}), (DeviceKind.IGPU, DeviceKind.DGPU)),
        "rocm": RouteTarget(frozenset({"ROCMExecutionProvider"}), _GPU),
        "migraphx": RouteTarget(frozenset({"MIGraphXExecutionProvider"}), _GPU),
        "webgpu": RouteTarget(
            frozenset({"WebGpuExecutionProvider"}), (DeviceKind.IGPU, DeviceKind.DGPU)
        ),
        "vitisai": RouteTarget(frozenset({"VitisAIExecutionProvider"}), (DeviceKind.NPU,)),
        "qnn": RouteTarget(frozenset({"QNNExecutionProvider"}), (DeviceKind.NPU,)),
        "openvino": RouteTarget(frozenset({"OpenVINOExecutionProvider"}), (DeviceKind.NPU,)),
        "coreml": RouteTarget(frozenset({"CoreMLExecutionProvider"}), (DeviceKind.NPU,)),
    }
)
"""Route ``ep`` -> target providers and device kinds. CUDA-family providers prefer a discrete
GPU and also accept an integrated one (Jetson-class boards); DirectML and WebGPU prefer an
integrated GPU; VitisAI, QNN, OpenVINO and CoreML routes target the NPU."""


@dataclass(frozen=True, slots=True)
class DeviceSelection:
    """The physical ids pipelines may use; ``allowed=None`` means every device."""

    allowed: frozenset[str] | None = None

    def allows(self, physical_id: str) -> bool:
        return self.allowed is None or physical_id in self.allowed

    def allow(self, topology: Topology, physical_id: str) -> DeviceSelection:
        """This selection with one more device allowed (it must be in ``topology``)."""
        _require_device(topology, physical_id)
        if self.allowed is None:
            return self
        return DeviceSelection(self.allowed | {physical_id})

    def exclude(self, topology: Topology, physical_id: str) -> DeviceSelection:
        """This selection without one device; 'all devices' becomes all of ``topology``'s."""
        _require_device(topology, physical_id)
        current = (
            frozenset(device.physical_id for device in topology.devices)
            if self.allowed is None
            else self.allowed
        )
        return DeviceSelection(current - {physical_id})

    def to_dict(self) -> dict[str, object]:
        allowed = None if self.allowed is None else sorted(self.allowed)
        return {"version": SELECTION_FORMAT_VERSION, "allowed": allowed}


def _require_device(topology: Topology, physical_id: str) -> None:
    known = [device.physical_id for device in topology.devices]
    if physical_id not in known:
        raise UsageError(
            f"no device {physical_id!r} in {topology.source}; devices: {', '.join(known)}"
        )


def config_dir() -> Path:
    """The user's settings folder (``$OMNI_EDGE_CONFIG_DIR`` overrides the platform default)."""
    override = os.environ.get(CONFIG_DIR_ENV)
    if override:
        return Path(override)
    return Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))


def selection_path() -> Path:
    return config_dir() / SELECTION_FILE


def load_selection(path: Path | None = None) -> DeviceSelection:
    """The saved selection; a missing file means every device is allowed."""
    file = path or selection_path()
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return DeviceSelection()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read the device selection: {error}", file=str(file)) from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(
            f"not valid JSON: {error.msg}", file=str(file), line=error.lineno
        ) from None
    if not isinstance(document, dict):
        raise ConfigError(
            'expected an object such as {"version": 1, "allowed": null}', file=str(file)
        )
    for key in document:
        if key not in ("version", "allowed"):
            raise ConfigError("unknown key (accepted: version, allowed)", file=str(file), key=key)
    if document.get("version") != SELECTION_FORMAT_VERSION:
        raise ConfigError(
            f"unsupported version {document.get('version')!r} (this build reads "
            f"{SELECTION_FORMAT_VERSION})",
            file=str(file),
            key="version",
        )
    allowed = document.get("allowed")
    if allowed is None:
        return DeviceSelection()
    if not isinstance(allowed, list) or not all(isinstance(item, str) and item for item in allowed):
        raise ConfigError(
            "expected null (every device) or a list of physical device ids",
            file=str(file),
            key="allowed",
        )
    return DeviceSelection(frozenset(allowed))


def save_selection(selection: DeviceSelection, path: Path | None = None) -> Path:
    """Write the selection atomically (creating the folder) and return the file's path."""
    file = path or selection_path()
    file.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{file.name}.", dir=file.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            json.dump(selection.to_dict(), stream, indent=2)
            stream.write("\n")
        os.replace(temporary, file)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return file


def check_route_device(
    topology: Topology,
    selection: DeviceSelection,
    *,
    ep: str,
    target_provider: str,
    stage: str,
    physical_id: str | None = None,
    os_domain: str | None = None,
    route: str | None = None,
) -> DeviceDescriptor:
    """The device a route runs on: one that offers ``target_provider``, of a kind ``ep`` targets
    (see ROUTE_TARGETS), that the route's ``os_domain`` reaches, and that ``selection``
    allows. ``physical_id`` pins one device; ``route`` names the route in messages.

    Raises ConfigError when ``ep`` is unknown or does not use ``target_provider``, and
    DeviceExcluded when no device offers the provider, when the route's domain reaches none
    of those that do (a Windows-only device from a POSIX route, and the reverse), or when
    every one it reaches is excluded.
    """
    target = ROUTE_TARGETS.get(ep)
    if target is None:
        raise ConfigError(
            f"{stage}: unknown route ep {ep!r} (accepted: {', '.join(sorted(ROUTE_TARGETS))})",
            key="ep",
        )
    if target_provider not in target.providers:
        raise ConfigError(
            f"{stage}: route ep {ep!r} targets {', '.join(sorted(target.providers))}, "
            f"not {target_provider}",
            key="ep",
        )
    candidates = _candidates(topology, target, target_provider)
    if physical_id is not None:
        candidates = [device for device in candidates if device.physical_id == physical_id]
    if not candidates:
        kinds = " or ".join(kind.value for kind in target.kinds)
        pinned = f" with id {physical_id}" if physical_id is not None else ""
        raise DeviceExcluded(
            f"{stage} targets {target_provider}, but no {kinds} device{pinned} in "
            f"{_topology_name(topology)} offers it; devices: {_device_list(topology.devices)}"
        )
    if os_domain is not None:
        domain = route_domain(topology, os_domain)
        provider_here = target_provider not in WINDOWS_ONLY_PROVIDERS or (
            domain is ExecutionDomain.WINDOWS
        )
        reachable = [
            device
            for device in candidates
            if provider_here
            and domain in topology.domains.get(device.physical_id, (device.execution_domain,))
        ]
        if not reachable:
            device = candidates[0]
            seen = topology.domains.get(device.physical_id, (device.execution_domain,))
            other = "windows" if domain is not ExecutionDomain.WINDOWS else "posix"
            where = (
                f"{target_provider} runs only in the windows domain"
                if not provider_here
                else f"{device.name} ({device.physical_id}), the device offering "
                f"{target_provider}, is reached only from {', '.join(d.value for d in seen)}"
            )
            raise DeviceExcluded(
                f"{stage}: route {route or '(unnamed)'} has os_domain {os_domain!r} and runs in "
                f"the {domain.value} domain, but {where}; accepted: os_domain: {other} for "
                f"{device.name} ({device.physical_id}), or a route to a device of the "
                f"{domain.value} domain"
            )
        candidates = reachable
    for device in candidates:
        if selection.allows(device.physical_id):
            return device
    device = candidates[0]
    raise DeviceExcluded(
        f"{stage} targets {device.name} ({device.physical_id}) which is excluded by your "
        f"device selection; allow it with `omni-edge devices --allow {device.physical_id}` "
        "or in the studio's Devices panel"
    )


#: Execution providers that exist only in Windows builds of ONNX Runtime: a device that
#: offers one is reached through it only by a route with ``os_domain: windows``.
WINDOWS_ONLY_PROVIDERS: frozenset[str] = frozenset({"DmlExecutionProvider"})


def route_domain(topology: Topology, os_domain: str) -> ExecutionDomain:
    """The execution domain a route's worker runs in on ``topology``'s machine: Windows for
    ``os_domain: windows``, else WSL on a WSL machine and POSIX elsewhere."""
    if os_domain == "windows":
        return ExecutionDomain.WINDOWS
    return ExecutionDomain.WSL if topology.wsl else ExecutionDomain.POSIX


def _candidates(topology: Topology, target: RouteTarget, provider: str) -> list[DeviceDescriptor]:
    offering = [
        device
        for device in topology.devices
        if provider in device.providers and device.kind in target.kinds
    ]
    return sorted(offering, key=lambda device: target.kinds.index(device.kind))


def _topology_name(topology: Topology) -> str:
    return "this machine" if topology.source == DISCOVERED else topology.source


def _device_list(devices: Iterable[DeviceDescriptor]) -> str:
    listed = [
        f"{device.name} ({device.kind.value}: {', '.join(device.providers) or 'no provider'})"
        for device in devices
    ]
    return "; ".join(listed) or "none"


_LUID_RE = re.compile(r"^LUID-[0-9A-F]{8}-[0-9A-F]{8}$")
#: ONNX Runtime's hardware device type for each device kind.
_EP_DEVICE_TYPES: Mapping[DeviceKind, str] = MappingProxyType(
    {DeviceKind.CPU: "cpu", DeviceKind.IGPU: "gpu", DeviceKind.DGPU: "gpu", DeviceKind.NPU: "npu"}
)


def ep_device_request(device: DeviceDescriptor) -> EpDeviceRequest:
    """What a graph worker is asked to find among ONNX Runtime's devices for ``device``."""
    bus = device.pci_bus_id
    if bus is None and device.physical_id.startswith("PCI-"):
        bus = normalize_pci_bus_id(device.physical_id[len("PCI-") :])
    luid = device.physical_id if _LUID_RE.match(device.physical_id) else None
    return EpDeviceRequest(
        physical_id=device.physical_id,
        type=_EP_DEVICE_TYPES[device.kind],
        vendor_id=device.vendor_id,
        device_id=device.device_id,
        pci_bus_id=bus,
        luid=luid,
    )
