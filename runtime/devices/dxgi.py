"""Windows display adapters through DXGI: a pure parser of adapter records and the live call.

DXGI's ``DXGI_ADAPTER_DESC1`` reports dedicated video memory as a pointer-sized integer, so
sizes above 4 GB are exact (WMI's ``Win32_VideoController.AdapterRAM`` is a 32-bit value
and is never used). An adapter is identified by its LUID. A LUID is stable while Windows
runs but is assigned again at boot, so a saved device selection that names one may need
the device allowed again after a restart.

The live enumeration runs only on Windows (``ctypes``, no extra package). Everything else
here is pure and is tested on recorded adapter records (JSON, the same field names as
``DXGI_ADAPTER_DESC1``); ``python -m runtime.devices.dxgi`` prints such a record.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.contracts.devices import DeviceDescriptor, DeviceKind, ExecutionDomain
from runtime.devices.topology import make_descriptor
from runtime.errors import ConfigError

VENDOR_NVIDIA = 0x10DE
VENDOR_AMD = 0x1002
VENDOR_INTEL = 0x8086
VENDOR_MICROSOFT = 0x1414
_VENDORS_ALWAYS_INTEGRATED = frozenset({0x5143, 0x4D4F4351, 0x13B5, 0x106B})

FLAG_REMOTE = 0x1
FLAG_SOFTWARE = 0x2

_REQUIRED = (
    "Description",
    "VendorId",
    "DeviceId",
    "AdapterLuid",
    "DedicatedVideoMemory",
    "SharedSystemMemory",
    "Flags",
)
_OPTIONAL = ("SubSysId", "Revision", "DedicatedSystemMemory", "Integrated")
_RECORD_KEYS = frozenset({"source", "adapters"})


@dataclass(frozen=True, slots=True)
class DxgiAdapter:
    """One adapter as ``IDXGIAdapter1::GetDesc1`` describes it.

    ``integrated_hint`` is an optional, better-informed answer (e.g. from D3D12's UMA
    feature or DXCore's IsIntegrated) that a recorder may add; DXGI itself has none.
    """

    description: str
    vendor_id: int
    device_id: int
    luid_high: int
    luid_low: int
    dedicated_video_memory: int
    dedicated_system_memory: int
    shared_system_memory: int
    flags: int
    sub_sys_id: int = 0
    revision: int = 0
    integrated_hint: bool | None = None

    @property
    def physical_id(self) -> str:
        return f"LUID-{self.luid_high & 0xFFFFFFFF:08X}-{self.luid_low & 0xFFFFFFFF:08X}"

    @property
    def is_software(self) -> bool:
        """Software (WARP, Basic Render Driver) and remote adapters are not devices to place on."""
        basic_render = self.vendor_id == VENDOR_MICROSOFT and self.device_id == 0x8C
        return bool(self.flags & (FLAG_SOFTWARE | FLAG_REMOTE)) or basic_render

    @property
    def is_integrated(self) -> bool:
        """Integrated vs discrete from the vendor and the memory DXGI reports.

        NVIDIA adapters on Windows are discrete; Qualcomm, ARM and Apple GPUs are integrated;
        for AMD, Intel and others an adapter whose dedicated memory is smaller than the
        shared system memory it may borrow is an integrated GPU with a small carve-out. An
        APU given a carve-out larger than that reads as discrete: record ``Integrated`` or
        correct the topology file in that case.
        """
        if self.integrated_hint is not None:
            return self.integrated_hint
        if self.vendor_id == VENDOR_NVIDIA:
            return False
        if self.vendor_id in _VENDORS_ALWAYS_INTEGRATED:
            return True
        return self.dedicated_video_memory < self.shared_system_memory

    @property
    def kind(self) -> DeviceKind:
        return DeviceKind.IGPU if self.is_integrated else DeviceKind.DGPU

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "Description": self.description,
            "VendorId": self.vendor_id,
            "DeviceId": self.device_id,
            "SubSysId": self.sub_sys_id,
            "Revision": self.revision,
            "DedicatedVideoMemory": self.dedicated_video_memory,
            "DedicatedSystemMemory": self.dedicated_system_memory,
            "SharedSystemMemory": self.shared_system_memory,
            "AdapterLuid": {"HighPart": self.luid_high, "LowPart": self.luid_low},
            "Flags": self.flags,
        }
        if self.integrated_hint is not None:
            record["Integrated"] = self.integrated_hint
        return record


def parse_adapter_records(records: Sequence[object], *, source: str) -> tuple[DxgiAdapter, ...]:
    """Typed adapters from records; a bad record is a ConfigError naming ``source`` and key."""
    return tuple(
        _parse_record(record, source=source, where=f"adapters[{index}]")
        for index, record in enumerate(records)
    )


def _parse_record(record: object, *, source: str, where: str) -> DxgiAdapter:
    if not isinstance(record, Mapping):
        raise ConfigError("an adapter record is a JSON object", file=source, key=where)
    unknown = sorted(set(record) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise ConfigError(
            f"unknown field (accepted: {', '.join(_REQUIRED + _OPTIONAL)})",
            file=source,
            key=f"{where}.{unknown[0]}",
        )
    for name in _REQUIRED:
        if name not in record:
            raise ConfigError("missing field", file=source, key=f"{where}.{name}")
    description = record["Description"]
    if not isinstance(description, str):
        raise ConfigError("expected a string", file=source, key=f"{where}.Description")
    luid = record["AdapterLuid"]
    if not (isinstance(luid, Mapping) and set(luid) == {"HighPart", "LowPart"}):
        raise ConfigError(
            "expected an object with HighPart and LowPart", file=source, key=f"{where}.AdapterLuid"
        )
    hint = record.get("Integrated")
    if hint is not None and not isinstance(hint, bool):
        raise ConfigError("expected true or false", file=source, key=f"{where}.Integrated")

    def number(key: str, default: object = None, *, signed: bool = False) -> int:
        value = luid[key[len("AdapterLuid.") :]] if key.startswith("AdapterLuid.") else None
        if value is None:
            value = record.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or (value < 0 and not signed):
            accepted = "an integer" if signed else "a non-negative integer"
            raise ConfigError(
                f"expected {accepted}, got {value!r}", file=source, key=f"{where}.{key}"
            )
        return value

    return DxgiAdapter(
        description=description.strip(),
        vendor_id=number("VendorId"),
        device_id=number("DeviceId"),
        luid_high=number("AdapterLuid.HighPart", signed=True),
        luid_low=number("AdapterLuid.LowPart"),
        dedicated_video_memory=number("DedicatedVideoMemory"),
        dedicated_system_memory=number("DedicatedSystemMemory", 0),
        shared_system_memory=number("SharedSystemMemory"),
        flags=number("Flags"),
        sub_sys_id=number("SubSysId", 0),
        revision=number("Revision", 0),
        integrated_hint=hint,
    )


def load_adapter_records(path: str | Path) -> tuple[DxgiAdapter, ...]:
    """Adapters from a recorded JSON file ``{"source": "...", "adapters": [...]}``."""
    name = str(path)
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError("file not found", file=name) from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"not valid JSON: {error.msg}", file=name, line=error.lineno) from None
    if not isinstance(document, dict):
        raise ConfigError("expected a JSON object with an 'adapters' list", file=name)
    unknown = sorted(set(document) - _RECORD_KEYS)
    if unknown:
        raise ConfigError("unknown key (accepted: source, adapters)", file=name, key=unknown[0])
    records = document.get("adapters")
    if not isinstance(records, list):
        raise ConfigError("expected a list of adapter records", file=name, key="adapters")
    return parse_adapter_records(records, source=name)


def hardware_adapters(adapters: Iterable[DxgiAdapter]) -> tuple[DxgiAdapter, ...]:
    """The adapters that are real devices (software and remote adapters dropped)."""
    return tuple(adapter for adapter in adapters if not adapter.is_software)


def adapter_descriptor(
    adapter: DxgiAdapter,
    *,
    domain: ExecutionDomain = ExecutionDomain.WINDOWS,
    providers: Iterable[str] = (),
    physical_id: str | None = None,
) -> DeviceDescriptor:
    """The descriptor of a hardware adapter; ``physical_id`` replaces the LUID when a better
    identity is known (an NVIDIA GPU's UUID, so Windows and WSL views of it merge)."""
    if adapter.is_software:
        raise ValueError(f"{adapter.description} is a software adapter, not a device")
    return make_descriptor(
        physical_id=physical_id or adapter.physical_id,
        kind=adapter.kind,
        name=adapter.description,
        domain=domain,
        providers=providers,
    )


if sys.platform == "win32":
    import ctypes
    from ctypes import wintypes

    class _Luid(ctypes.Structure):
        _fields_ = [("LowPart", wintypes.DWORD), ("HighPart", wintypes.LONG)]

    class _AdapterDesc1(ctypes.Structure):
        _fields_ = [
            ("Description", wintypes.WCHAR * 128),
            ("VendorId", wintypes.UINT),
            ("DeviceId", wintypes.UINT),
            ("SubSysId", wintypes.UINT),
            ("Revision", wintypes.UINT),
            ("DedicatedVideoMemory", ctypes.c_size_t),
            ("DedicatedSystemMemory", ctypes.c_size_t),
            ("SharedSystemMemory", ctypes.c_size_t),
            ("AdapterLuid", _Luid),
            ("Flags", wintypes.UINT),
        ]

    class _Guid(ctypes.Structure):
        _fields_ = [
            ("Data1", wintypes.DWORD),
            ("Data2", wintypes.WORD),
            ("Data3", wintypes.WORD),
            ("Data4", ctypes.c_ubyte * 8),
        ]

    _IID_IDXGI_FACTORY1 = _Guid(
        0x770AAE78,
        0xF26F,
        0x4DBA,
        (ctypes.c_ubyte * 8)(0xA8, 0x29, 0x25, 0x3C, 0x83, 0xD1, 0xB3, 0x87),
    )
    _DXGI_ERROR_NOT_FOUND = 0x887A0002
    # Vtable slots: IUnknown (3) + IDXGIObject (4) + IDXGIFactory (5) put EnumAdapters1 at 12;
    # IUnknown (3) + IDXGIObject (4) + IDXGIAdapter (3) put GetDesc1 at 10; Release is 2.
    _SLOT_RELEASE = 2
    _SLOT_ENUM_ADAPTERS1 = 12
    _SLOT_GET_DESC1 = 10

    def _method(obj: ctypes.c_void_p, slot: int, restype: Any, *argtypes: Any) -> Any:
        vtable = ctypes.cast(obj, ctypes.POINTER(ctypes.POINTER(ctypes.c_void_p))).contents
        prototype = ctypes.WINFUNCTYPE(restype, ctypes.c_void_p, *argtypes)
        return prototype(vtable[slot])

    def _enumerate_windows() -> tuple[DxgiAdapter, ...]:
        create = ctypes.WinDLL("dxgi.dll").CreateDXGIFactory1
        create.restype = ctypes.c_long
        create.argtypes = [ctypes.POINTER(_Guid), ctypes.POINTER(ctypes.c_void_p)]
        factory = ctypes.c_void_p()
        result = create(ctypes.byref(_IID_IDXGI_FACTORY1), ctypes.byref(factory))
        if result < 0:
            raise OSError(f"CreateDXGIFactory1 failed with HRESULT 0x{result & 0xFFFFFFFF:08X}")
        adapters: list[DxgiAdapter] = []
        try:
            enum_adapters1 = _method(
                factory,
                _SLOT_ENUM_ADAPTERS1,
                ctypes.c_long,
                wintypes.UINT,
                ctypes.POINTER(ctypes.c_void_p),
            )
            index = 0
            while True:
                adapter = ctypes.c_void_p()
                result = enum_adapters1(factory, index, ctypes.byref(adapter))
                if result & 0xFFFFFFFF == _DXGI_ERROR_NOT_FOUND:
                    break
                if result < 0:
                    raise OSError(
                        f"IDXGIFactory1::EnumAdapters1({index}) failed with HRESULT "
                        f"0x{result & 0xFFFFFFFF:08X}"
                    )
                try:
                    desc = _AdapterDesc1()
                    get_desc1 = _method(
                        adapter, _SLOT_GET_DESC1, ctypes.c_long, ctypes.POINTER(_AdapterDesc1)
                    )
                    if get_desc1(adapter, ctypes.byref(desc)) >= 0:
                        adapters.append(
                            DxgiAdapter(
                                description=desc.Description.strip(),
                                vendor_id=desc.VendorId,
                                device_id=desc.DeviceId,
                                luid_high=desc.AdapterLuid.HighPart,
                                luid_low=desc.AdapterLuid.LowPart,
                                dedicated_video_memory=desc.DedicatedVideoMemory,
                                dedicated_system_memory=desc.DedicatedSystemMemory,
                                shared_system_memory=desc.SharedSystemMemory,
                                flags=desc.Flags,
                                sub_sys_id=desc.SubSysId,
                                revision=desc.Revision,
                            )
                        )
                finally:
                    _method(adapter, _SLOT_RELEASE, wintypes.ULONG)(adapter)
                index += 1
        finally:
            _method(factory, _SLOT_RELEASE, wintypes.ULONG)(factory)
        return tuple(adapters)

    def enumerate_adapters() -> tuple[DxgiAdapter, ...]:
        """The adapters DXGI lists now."""
        return _enumerate_windows()

else:

    def enumerate_adapters() -> tuple[DxgiAdapter, ...]:
        """DXGI exists only on Windows: elsewhere it lists no adapters."""
        return ()


def main() -> None:
    """Print the adapters DXGI lists as a record file (for tests and bug reports)."""
    document = {
        "source": f"recorded on {sys.platform}",
        "adapters": [adapter.to_record() for adapter in enumerate_adapters()],
    }
    print(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
