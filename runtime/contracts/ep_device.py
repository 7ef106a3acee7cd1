"""The execution-provider device of a graph stage: what the controller asks for in ``load``
and what the worker reports in ``ready``.

ONNX Runtime (1.22 and later) lists each (execution provider, hardware device) pair it can
use as an ``OrtEpDevice``; a hardware device has a type (``cpu``, ``gpu``, ``npu``), a vendor
id and a device id (the PCI ids on PCI hardware). The controller sends the device it
admitted the stage on as an :class:`EpDeviceRequest`; the worker picks the matching
``OrtEpDevice``, or, on an older ONNX Runtime, passes the route's provider options alone,
and answers with an :class:`AppliedDevice`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, NoReturn

#: ONNX Runtime's hardware device types (``OrtHardwareDeviceType``), lower case.
DEVICE_TYPES: Final = ("cpu", "gpu", "npu")
#: How a worker applied its device: an ``OrtEpDevice`` chosen with
#: ``SessionOptions.add_provider_for_devices``, or provider options alone (older ONNX Runtime).
DEVICE_METHODS: Final = ("ep_device", "provider_options")
_MAX_ID: Final = 0xFFFFFFFF
_PCI_BUS_RE: Final = re.compile(
    r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$"
)
_LUID_RE: Final = re.compile(r"^LUID-[0-9A-F]{8}-[0-9A-F]{8}$")


def normalize_pci_bus_id(bus_id: str) -> str | None:
    """``00000000:01:00.0`` and ``0000:01:00.0`` both become ``0000:01:00.0``; None when
    ``bus_id`` is no PCI address."""
    match = _PCI_BUS_RE.match(bus_id.strip())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def luid_id(value: str) -> str | None:
    """A Windows adapter LUID as ONNX Runtime's metadata gives it (a 64-bit number, decimal
    or hex) in the form of physical ids, ``LUID-<high 8 hex>-<low 8 hex>``."""
    try:
        number = int(value, 0)
    except ValueError:
        return None
    return f"LUID-{(number >> 32) & 0xFFFFFFFF:08X}-{number & 0xFFFFFFFF:08X}"


class EpDeviceError(ValueError):
    """A device request or report is malformed; the message names the field and value."""


def _bad(where: str, name: str, value: object, accepted: str) -> NoReturn:
    raise EpDeviceError(f"{where}.{name} = {value!r:.80} is invalid; expected {accepted}")


def _optional_id(where: str, name: str, value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MAX_ID:
        _bad(where, name, value, f"null or an integer in [0, {_MAX_ID:#x}]")
    return value


def _optional_str(where: str, name: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        _bad(where, name, value, "null or a non-empty string")
    return value


def check_options(where: str, value: object) -> Mapping[str, str]:
    """Provider options: a mapping of non-empty string keys to string values."""
    if not isinstance(value, Mapping) or not all(
        isinstance(key, str) and key and isinstance(item, str) for key, item in value.items()
    ):
        _bad(where, "provider_options", value, "an object of non-empty string keys and strings")
    return MappingProxyType(dict(value))


def _fields(
    where: str, wire: object, names: frozenset[str], optional: frozenset[str] = frozenset()
) -> Mapping[str, Any]:
    if not isinstance(wire, Mapping) or not names <= set(wire) <= names | optional:
        _bad(
            where,
            "",
            wire,
            f"an object with the fields {sorted(names)}"
            + (f" and optionally {sorted(optional)}" if optional else ""),
        )
    return wire


@dataclass(frozen=True, slots=True)
class EpDeviceRequest:
    """The hardware device the controller admitted a stage on.

    ``vendor_id`` and ``device_id`` are None when the topology does not know them; the worker
    then matches on the provider and the type alone. ``pci_bus_id`` and ``luid`` (where
    known) tell identical devices apart. The worker refuses when more than one device is
    left.
    """

    physical_id: str
    type: str
    vendor_id: int | None = None
    device_id: int | None = None
    pci_bus_id: str | None = None
    luid: str | None = None

    def __post_init__(self) -> None:
        where = "device"
        if not isinstance(self.physical_id, str) or not self.physical_id:
            _bad(where, "physical_id", self.physical_id, "a non-empty string")
        if self.type not in DEVICE_TYPES:
            _bad(where, "type", self.type, f"one of {list(DEVICE_TYPES)}")
        _optional_id(where, "vendor_id", self.vendor_id)
        _optional_id(where, "device_id", self.device_id)
        if self.pci_bus_id is not None and (
            not isinstance(self.pci_bus_id, str)
            or normalize_pci_bus_id(self.pci_bus_id) != self.pci_bus_id
        ):
            _bad(where, "pci_bus_id", self.pci_bus_id, "null or a PCI address like 0000:01:00.0")
        if self.luid is not None and (
            not isinstance(self.luid, str) or not _LUID_RE.match(self.luid)
        ):
            _bad(where, "luid", self.luid, "null or LUID-XXXXXXXX-XXXXXXXX (hex)")

    def describe(self) -> str:
        ids = [
            f"{name} {value:#06x}"
            for name, value in (("vendor", self.vendor_id), ("device", self.device_id))
            if value is not None
        ]
        if self.pci_bus_id is not None:
            ids.append(f"PCI {self.pci_bus_id}")
        if self.luid is not None:
            ids.append(self.luid)
        return f"{self.type} {self.physical_id}" + (f" ({', '.join(ids)})" if ids else "")

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "physical_id": self.physical_id,
            "type": self.type,
            "vendor_id": self.vendor_id,
            "device_id": self.device_id,
        }
        # Sent only when known: a receiver that predates them sees the fields it knows.
        if self.pci_bus_id is not None:
            wire["pci_bus_id"] = self.pci_bus_id
        if self.luid is not None:
            wire["luid"] = self.luid
        return wire

    @classmethod
    def from_wire(cls, wire: object, where: str = "load.device") -> EpDeviceRequest:
        if isinstance(wire, EpDeviceRequest):
            return wire
        fields = _fields(
            where,
            wire,
            frozenset({"physical_id", "type", "vendor_id", "device_id"}),
            frozenset({"pci_bus_id", "luid"}),
        )
        try:
            return cls(**fields)
        except EpDeviceError as exc:
            raise EpDeviceError(f"{where}: {exc}") from None


@dataclass(frozen=True, slots=True)
class AppliedDevice:
    """The device and options a worker's session was actually created with.

    With ``method == "ep_device"`` the ``type``, ``vendor`` and ids are those of the
    ``OrtEpDevice`` ONNX Runtime listed; with ``"provider_options"`` (an ONNX Runtime
    without the device API) they are None: only the options are known.
    ``ep_library`` is the plugin library registered for the provider, if any.
    """

    method: str
    ep_name: str
    type: str | None = None
    vendor: str | None = None
    vendor_id: int | None = None
    device_id: int | None = None
    provider_options: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    ep_library: str | None = None

    def __post_init__(self) -> None:
        where = "device"
        if self.method not in DEVICE_METHODS:
            _bad(where, "method", self.method, f"one of {list(DEVICE_METHODS)}")
        if not isinstance(self.ep_name, str) or not self.ep_name:
            _bad(where, "ep_name", self.ep_name, "a non-empty string")
        if self.type is not None and self.type not in DEVICE_TYPES:
            _bad(where, "type", self.type, f"null or one of {list(DEVICE_TYPES)}")
        _optional_str(where, "vendor", self.vendor)
        _optional_id(where, "vendor_id", self.vendor_id)
        _optional_id(where, "device_id", self.device_id)
        object.__setattr__(self, "provider_options", check_options(where, self.provider_options))
        _optional_str(where, "ep_library", self.ep_library)

    def to_wire(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "ep_name": self.ep_name,
            "type": self.type,
            "vendor": self.vendor,
            "vendor_id": self.vendor_id,
            "device_id": self.device_id,
            "provider_options": dict(self.provider_options),
            "ep_library": self.ep_library,
        }

    @classmethod
    def from_wire(cls, wire: object, where: str = "ready.device") -> AppliedDevice:
        if isinstance(wire, AppliedDevice):
            return wire
        names = frozenset(
            {
                "method",
                "ep_name",
                "type",
                "vendor",
                "vendor_id",
                "device_id",
                "provider_options",
                "ep_library",
            }
        )
        fields = _fields(where, wire, names)
        try:
            return cls(**fields)
        except EpDeviceError as exc:
            raise EpDeviceError(f"{where}: {exc}") from None
