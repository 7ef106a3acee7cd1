"""Physical device descriptors and the memory constraints they draw on.

A device is identified by a stable physical id (a UUID, PCI address or LUID, never an
enumeration index). Memory is accounted in named *constraints*: every CPU, integrated
GPU and NPU allocation charges ``machine:ram``; a discrete GPU charges its own
``machine:vram:<physical-id>``; inside WSL an allocation also charges ``wsl:quota``.
Those are two limits on one allocation, not two amounts of memory.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

MACHINE_RAM = "machine:ram"
WSL_QUOTA = "wsl:quota"
VRAM_PREFIX = "machine:vram:"

_MAX_ID = 0xFFFFFFFF
_CONSTRAINT_RE = re.compile(r"^[a-z][a-z0-9_-]*(:[A-Za-z0-9_.\-]+)+$")


def vram_constraint(physical_id: str) -> str:
    """The constraint name for a discrete GPU's own memory."""
    if not physical_id:
        raise ValueError("a discrete GPU needs a physical id")
    return VRAM_PREFIX + physical_id


def is_constraint_name(name: str) -> bool:
    """True for names such as ``machine:ram`` or ``machine:vram:GPU-1234``."""
    return bool(_CONSTRAINT_RE.match(name))


class DeviceKind(enum.Enum):
    CPU = "cpu"
    IGPU = "igpu"
    NPU = "npu"
    DGPU = "dgpu"


class ExecutionDomain(enum.Enum):
    """Which OS the process using the device runs in."""

    POSIX = "posix"
    WINDOWS = "windows"
    WSL = "wsl"


class Integration(enum.Enum):
    """Whether the device shares the host's memory (integrated) or has its own."""

    INTEGRATED = "integrated"
    DISCRETE = "discrete"


@dataclass(frozen=True, slots=True)
class DeviceDescriptor:
    """One physical device. Optional relationships are ``None`` when not observed.

    ``vendor_id`` and ``device_id`` are the hardware ids ONNX Runtime reports for the device
    (the PCI ids on PCI hardware) and ``pci_bus_id`` its PCI address (``0000:01:00.0``); a
    graph worker matches its execution-provider device on them. ``None`` when unknown.
    """

    physical_id: str
    kind: DeviceKind
    name: str
    execution_domain: ExecutionDomain
    integration: Integration
    memory_constraints: tuple[str, ...]
    providers: tuple[str, ...] = ()
    package: str | None = None
    bandwidth_group: str | None = None
    power_domain: str | None = None
    vendor_id: int | None = None
    device_id: int | None = None
    pci_bus_id: str | None = None

    def __post_init__(self) -> None:
        if not self.physical_id:
            raise ValueError("a device needs a stable physical id")
        if not self.memory_constraints:
            raise ValueError(f"device {self.physical_id} references no memory constraint")
        for name in self.memory_constraints:
            if not is_constraint_name(name):
                raise ValueError(f"device {self.physical_id}: bad constraint name {name!r}")
        for label, value in (("vendor_id", self.vendor_id), ("device_id", self.device_id)):
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MAX_ID
            ):
                raise ValueError(
                    f"device {self.physical_id}: {label} {value!r} is not an integer in "
                    f"[0, {_MAX_ID:#x}]"
                )
