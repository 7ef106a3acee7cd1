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


def _fields(where: str, wire: object, names: frozenset[str]) -> Mapping[str, Any]:
    if not isinstance(wire, Mapping) or set(wire) != names:
        _bad(where, "", wire, f"an object with exactly the fields {sorted(names)}")
    return wire


@dataclass(frozen=True, slots=True)
class EpDeviceRequest:
    """The hardware device the controller admitted a stage on.

    ``vendor_id`` and ``device_id`` are None when the topology does not know them; the worker
    then matches on the provider and the type alone, and refuses when that leaves more than
    one device.
    """

    physical_id: str
    type: str
    vendor_id: int | None = None
    device_id: int | None = None

    def __post_init__(self) -> None:
        where = "device"
        if not isinstance(self.physical_id, str) or not self.physical_id:
            _bad(where, "physical_id", self.physical_id, "a non-empty string")
        if self.type not in DEVICE_TYPES:
            _bad(where, "type", self.type, f"one of {list(DEVICE_TYPES)}")
        _optional_id(where, "vendor_id", self.vendor_id)
        _optional_id(where, "device_id", self.device_id)

    def describe(self) -> str:
        ids = ", ".join(
            f"{name} {value:#06x}"
            for name, value in (("vendor", self.vendor_id), ("device", self.device_id))
            if value is not None
        )
        return f"{self.type} {self.physical_id}" + (f" ({ids})" if ids else "")

    def to_wire(self) -> dict[str, Any]:
        return {
            "physical_id": self.physical_id,
            "type": self.type,
            "vendor_id": self.vendor_id,
            "device_id": self.device_id,
        }

    @classmethod
    def from_wire(cls, wire: object, where: str = "load.device") -> EpDeviceRequest:
        if isinstance(wire, EpDeviceRequest):
            return wire
        fields = _fields(where, wire, frozenset({"physical_id", "type", "vendor_id", "device_id"}))
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
