"""A machine's devices and the memory constraints they draw on, from discovery or a topology file.

The memory accounting follows one rule (see ``runtime.contracts.devices``): a CPU, an
integrated GPU and an NPU draw on ``machine:ram``; a discrete GPU draws on its own
``machine:vram:<physical-id>``; an allocation made from inside WSL on host memory also
draws on ``wsl:quota``. The same physical device seen from several execution domains
(Windows and WSL) is one device; the domains it was seen from are kept beside it.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import yaml

from runtime.contracts.devices import (
    MACHINE_RAM,
    VRAM_PREFIX,
    WSL_QUOTA,
    DeviceDescriptor,
    DeviceKind,
    ExecutionDomain,
    Integration,
    is_constraint_name,
    vram_constraint,
)
from runtime.contracts.ep_device import normalize_pci_bus_id
from runtime.devices._yaml import Located, compose_file
from runtime.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

TOPOLOGY_FORMAT_VERSION = 1
DISCOVERED = "discovered"

_PHYSICAL_ID_RE = re.compile(r"^[A-Za-z0-9_.\-]+(:[A-Za-z0-9_.\-]+)*$")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
_SIZE_UNITS: Mapping[str, int] = MappingProxyType(
    {
        "": 1,
        "B": 1,
        "KB": 1000,
        "kB": 1000,
        "MB": 1000**2,
        "GB": 1000**3,
        "TB": 1000**4,
        "KiB": 1024,
        "MiB": 1024**2,
        "GiB": 1024**3,
        "TiB": 1024**4,
    }
)
_BINARY_UNITS = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


def parse_size(value: object) -> int:
    """Bytes from an integer or a unit string such as ``"32GiB"``, ``"512MiB"`` or ``"1.5GB"``.

    Raises ValueError with what is accepted; the result must be a whole, non-negative number.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(
            f"expected a byte count or a size such as '32GiB', got {value!r} "
            f"(units: {', '.join(unit for unit in _SIZE_UNITS if unit)})"
        )
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative, got {value}")
        return value
    match = _SIZE_RE.match(value)
    if match is None or match.group(2) not in _SIZE_UNITS:
        raise ValueError(
            f"cannot read size {value!r}: write a number with an optional unit "
            f"({', '.join(unit for unit in _SIZE_UNITS if unit)}), e.g. '32GiB'"
        )
    try:
        amount = Decimal(match.group(1)) * _SIZE_UNITS[match.group(2)]
    except InvalidOperation:
        raise ValueError(f"cannot read size {value!r}") from None
    if amount != amount.to_integral_value():
        raise ValueError(f"size {value!r} is not a whole number of bytes")
    return int(amount)


def format_size(size: int | None) -> str:
    """A short human-readable size (``"31.2 GiB"``); ``"unknown"`` for None."""
    if size is None:
        return "unknown"
    for unit, factor in _BINARY_UNITS:
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{size} B"


def exact_size(size: int) -> str | int:
    """A size written exactly: ``"32GiB"`` when a binary unit divides it, else the byte count."""
    for unit, factor in _BINARY_UNITS:
        if size and size % factor == 0:
            return f"{size // factor}{unit}"
    return size


def integration_for(kind: DeviceKind) -> Integration:
    """Only a discrete GPU has memory of its own; everything else shares host RAM."""
    return Integration.DISCRETE if kind is DeviceKind.DGPU else Integration.INTEGRATED


def constraints_for(kind: DeviceKind, physical_id: str, domain: ExecutionDomain) -> tuple[str, ...]:
    """The memory constraints one allocation on this device, made from ``domain``, charges."""
    if kind is DeviceKind.DGPU:
        return (vram_constraint(physical_id),)
    if domain is ExecutionDomain.WSL:
        return (MACHINE_RAM, WSL_QUOTA)
    return (MACHINE_RAM,)


def check_physical_id(physical_id: str) -> str:
    """Return the id, or raise ValueError: it must be usable inside a constraint name."""
    if not _PHYSICAL_ID_RE.match(physical_id):
        raise ValueError(
            f"bad physical id {physical_id!r}: use letters, digits and '_.-', with ':' only "
            "between parts (a UUID such as GPU-…, a PCI address or LUID-…)"
        )
    return physical_id


def make_descriptor(
    *,
    physical_id: str,
    kind: DeviceKind,
    name: str,
    domain: ExecutionDomain,
    providers: Iterable[str] = (),
    package: str | None = None,
    bandwidth_group: str | None = None,
    power_domain: str | None = None,
    vendor_id: int | None = None,
    device_id: int | None = None,
    pci_bus_id: str | None = None,
) -> DeviceDescriptor:
    """A descriptor whose integration and memory constraints follow from kind and domain."""
    check_physical_id(physical_id)
    return DeviceDescriptor(
        physical_id=physical_id,
        kind=kind,
        name=name,
        execution_domain=domain,
        integration=integration_for(kind),
        memory_constraints=constraints_for(kind, physical_id, domain),
        providers=tuple(dict.fromkeys(providers)),
        package=package,
        bandwidth_group=bandwidth_group,
        power_domain=power_domain,
        vendor_id=vendor_id,
        device_id=device_id,
        pci_bus_id=pci_bus_id,
    )


@dataclass(frozen=True, slots=True)
class MergedDevices:
    """Devices with one entry per physical id, and every domain each was seen from."""

    devices: tuple[DeviceDescriptor, ...]
    domains: Mapping[str, tuple[ExecutionDomain, ...]]


def merge_same_physical(devices: Iterable[DeviceDescriptor]) -> MergedDevices:
    """Fold descriptors of one physical device (e.g. a GPU seen from Windows and WSL) into one.

    The first descriptor of an id keeps its domain, name and memory constraints; providers are
    united in order; optional relationships take the first observed value. Two descriptors of
    one id with different kinds contradict each other and raise ValueError.
    """
    merged: dict[str, DeviceDescriptor] = {}
    domains: dict[str, list[ExecutionDomain]] = {}
    for device in devices:
        known = merged.get(device.physical_id)
        if known is None:
            merged[device.physical_id] = device
            domains[device.physical_id] = [device.execution_domain]
            continue
        if known.kind is not device.kind:
            raise ValueError(
                f"physical id {device.physical_id} is reported as both {known.kind.value} "
                f"({known.name}) and {device.kind.value} ({device.name})"
            )
        merged[device.physical_id] = replace(
            known,
            providers=tuple(dict.fromkeys(known.providers + device.providers)),
            package=known.package or device.package,
            bandwidth_group=known.bandwidth_group or device.bandwidth_group,
            power_domain=known.power_domain or device.power_domain,
            vendor_id=known.vendor_id if known.vendor_id is not None else device.vendor_id,
            device_id=known.device_id if known.device_id is not None else device.device_id,
            pci_bus_id=known.pci_bus_id or device.pci_bus_id,
        )
        if device.execution_domain not in domains[device.physical_id]:
            domains[device.physical_id].append(device.execution_domain)
    return MergedDevices(
        devices=tuple(merged.values()),
        domains=MappingProxyType({key: tuple(value) for key, value in domains.items()}),
    )


@dataclass(frozen=True, slots=True)
class ConstraintInfo:
    """One memory constraint: its capacity, free memory observed now, and who draws on it.

    ``capacity`` is None only when discovery could not read it; ``observed_free`` is None when
    nothing was observed.
    """

    name: str
    capacity: int | None
    observed_free: int | None
    devices: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "observed_free": self.observed_free,
            "devices": list(self.devices),
        }


@dataclass(frozen=True, slots=True)
class Topology:
    """The devices of one machine, their memory constraints, and where this view came from.

    ``source`` is ``"discovered"`` or the path of a topology file; ``wsl`` is True when any
    device is used from inside WSL (then ``wsl:quota`` is one of the constraints).
    """

    devices: tuple[DeviceDescriptor, ...]
    constraints: Mapping[str, ConstraintInfo]
    source: str
    wsl: bool
    domains: Mapping[str, tuple[ExecutionDomain, ...]]
    name: str | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        ids = [device.physical_id for device in self.devices]
        if len(set(ids)) != len(ids):
            raise ValueError("a topology lists each physical device once")
        for device in self.devices:
            if self.domains.get(device.physical_id, ())[:1] != (device.execution_domain,):
                raise ValueError(f"{device.physical_id}: its own domain must be listed first")
            for domain in self.domains[device.physical_id]:
                for name in self.charges(device.physical_id, domain):
                    if name not in self.constraints:
                        raise ValueError(f"{device.physical_id} draws on {name}, not in topology")

    def device(self, physical_id: str) -> DeviceDescriptor:
        for device in self.devices:
            if device.physical_id == physical_id:
                return device
        raise KeyError(physical_id)

    def charges(self, physical_id: str, domain: ExecutionDomain | None = None) -> tuple[str, ...]:
        """The constraints an allocation on this device charges, from ``domain`` (default: its own)."""
        device = self.device(physical_id)
        if domain is None or domain is device.execution_domain:
            return device.memory_constraints
        return constraints_for(device.kind, device.physical_id, domain)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "name": self.name,
            "wsl": self.wsl,
            "devices": [self._device_dict(device) for device in self.devices],
            "constraints": {name: info.to_dict() for name, info in self.constraints.items()},
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def _device_dict(self, device: DeviceDescriptor) -> dict[str, Any]:
        return {
            "physical_id": device.physical_id,
            "name": device.name,
            "kind": device.kind.value,
            "integration": device.integration.value,
            "execution_domain": device.execution_domain.value,
            "domains": [domain.value for domain in self.domains[device.physical_id]],
            "memory_constraints": list(device.memory_constraints),
            "providers": list(device.providers),
            "package": device.package,
            "bandwidth_group": device.bandwidth_group,
            "power_domain": device.power_domain,
            "vendor_id": device.vendor_id,
            "device_id": device.device_id,
            "pci_bus_id": device.pci_bus_id,
        }

    def to_table(self) -> str:
        """A plain-text view for a terminal: one row per device, then one per constraint."""
        title = self.name or ("this machine" if self.source == DISCOVERED else "topology")
        origin = "discovered" if self.source == DISCOVERED else f"from {self.source}"
        lines = [f"{title} ({origin}{', WSL' if self.wsl else ''})", ""]
        device_rows = [("DEVICE", "ID", "KIND", "DOMAINS", "MEMORY", "PROVIDERS")]
        for device in self.devices:
            memory = dict.fromkeys(
                name
                for domain in self.domains[device.physical_id]
                for name in self.charges(device.physical_id, domain)
            )
            device_rows.append(
                (
                    device.name,
                    device.physical_id,
                    device.kind.value,
                    ",".join(domain.value for domain in self.domains[device.physical_id]),
                    ", ".join(memory),
                    ", ".join(device.providers) or "-",
                )
            )
        lines += _columns(device_rows)
        lines.append("")
        constraint_rows = [("CONSTRAINT", "CAPACITY", "FREE NOW", "DRAWN ON BY")]
        for name, info in self.constraints.items():
            free = "not observed" if info.observed_free is None else format_size(info.observed_free)
            constraint_rows.append(
                (name, format_size(info.capacity), free, ", ".join(info.devices) or "-")
            )
        lines += _columns(constraint_rows)
        if self.notes:
            lines.append("")
            lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)


def _columns(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def build_topology(
    devices: Iterable[DeviceDescriptor],
    *,
    capacities: Mapping[str, int | None],
    observed: Mapping[str, int] | None = None,
    source: str,
    domains: Mapping[str, tuple[ExecutionDomain, ...]] | None = None,
    name: str | None = None,
    notes: Iterable[str] = (),
) -> Topology:
    """Assemble a Topology; devices of one physical id are merged first.

    ``domains`` adds domains a device is also used from (its own domain always comes first).
    Every constraint a device draws on needs an entry in ``capacities`` (None = unknown).
    """
    merged = merge_same_physical(devices)
    all_domains: dict[str, tuple[ExecutionDomain, ...]] = {}
    for device in merged.devices:
        extra = (domains or {}).get(device.physical_id, ())
        all_domains[device.physical_id] = tuple(
            dict.fromkeys(merged.domains[device.physical_id] + extra)
        )
    drawn_by: dict[str, list[str]] = {}
    for device in merged.devices:
        for domain in all_domains[device.physical_id]:
            for constraint in constraints_for(device.kind, device.physical_id, domain):
                users = drawn_by.setdefault(constraint, [])
                if device.physical_id not in users:
                    users.append(device.physical_id)
    missing = sorted(set(drawn_by) - set(capacities))
    if missing:
        raise ValueError(f"no capacity given for {', '.join(missing)}")
    unused = sorted(set(capacities) - set(drawn_by))
    if unused:
        raise ValueError(f"no device draws on {', '.join(unused)}")
    observed = observed or {}
    constraints = {
        constraint: ConstraintInfo(
            name=constraint,
            capacity=capacities[constraint],
            observed_free=observed.get(constraint),
            devices=tuple(drawn_by[constraint]),
        )
        for constraint in _constraint_order(drawn_by)
    }
    return Topology(
        devices=merged.devices,
        constraints=MappingProxyType(constraints),
        source=source,
        wsl=WSL_QUOTA in constraints,
        domains=MappingProxyType(all_domains),
        name=name,
        notes=tuple(notes),
    )


def _constraint_order(names: Iterable[str]) -> list[str]:
    def rank(name: str) -> tuple[int, str]:
        order = {MACHINE_RAM: 0, WSL_QUOTA: 1}
        return (order.get(name, 2), name)

    return sorted(names, key=rank)


_TOP_KEYS = frozenset({"version", "name", "description", "devices", "memory"})
_DEVICE_KEYS = frozenset(
    {
        "id",
        "kind",
        "name",
        "domains",
        "providers",
        "package",
        "bandwidth_group",
        "power_domain",
        "vendor_id",
        "device_id",
        "pci_bus_id",
    }
)
_MEMORY_KEYS = frozenset({"capacity", "observed_free"})


def load_topology(path: str | os.PathLike[str]) -> Topology:
    """Read a topology file (format in ``assets/topologies/README.md``) into a Topology.

    Every problem is a ConfigError naming the file, line and key.
    """
    file = Path(path)
    root = compose_file(file)
    top = root.mapping(_TOP_KEYS, frozenset({"version", "devices", "memory"}))
    version = top["version"].scalar()
    if version != TOPOLOGY_FORMAT_VERSION:
        top["version"].fail(
            f"unsupported topology format version {version!r} (this build reads "
            f"{TOPOLOGY_FORMAT_VERSION})"
        )
    name = top["name"].string() if "name" in top else None
    if "description" in top:
        top["description"].string()

    devices: list[DeviceDescriptor] = []
    domains: dict[str, tuple[ExecutionDomain, ...]] = {}
    device_nodes: dict[str, Located] = {}
    for item in top["devices"].sequence():
        device, device_domains = _read_device(item)
        if device.physical_id in device_nodes:
            item.fail(
                f"device id {device.physical_id} is listed twice (first on line "
                f"{device_nodes[device.physical_id].line}); list one entry per physical "
                "device with every domain it is used from under 'domains'"
            )
        device_nodes[device.physical_id] = item
        devices.append(device)
        domains[device.physical_id] = device_domains
    if not devices:
        top["devices"].fail("a topology lists at least one device")
    cpus = [device for device in devices if device.kind is DeviceKind.CPU]
    if len(cpus) != 1:
        top["devices"].fail(
            f"a topology lists exactly one cpu device (all packages together), found {len(cpus)}"
        )

    needed: dict[str, str] = {}
    for device in devices:
        for domain in domains[device.physical_id]:
            for constraint in constraints_for(device.kind, device.physical_id, domain):
                needed.setdefault(constraint, device.physical_id)

    capacities: dict[str, int | None] = {}
    observed: dict[str, int] = {}
    memory = top["memory"]
    for constraint, entry in memory.entries().items():
        if not is_constraint_name(constraint):
            entry.fail_key(
                f"bad constraint name {constraint!r}: use machine:ram, wsl:quota or "
                f"{VRAM_PREFIX}<physical-id>"
            )
        if constraint not in needed:
            entry.fail_key(_unused_constraint_message(constraint))
        capacity, free = _read_memory(entry)
        capacities[constraint] = capacity
        if free is not None:
            observed[constraint] = free
    for constraint, physical_id in needed.items():
        if constraint not in capacities:
            where = device_nodes[physical_id]
            memory.fail_key(
                f"device {physical_id} (line {where.line}) draws on {constraint}, but 'memory' "
                f"gives it no capacity; add `{constraint}: {{capacity: <size>}}`"
            )
    return build_topology(
        devices,
        capacities=capacities,
        observed=observed,
        source=str(file),
        domains=domains,
        name=name,
    )


def _unused_constraint_message(constraint: str) -> str:
    if constraint == WSL_QUOTA:
        return "wsl:quota is given but no device lists 'wsl' under 'domains'"
    if constraint.startswith(VRAM_PREFIX):
        return (
            f"no dgpu device has id {constraint[len(VRAM_PREFIX) :]!r}; a discrete GPU's "
            "memory is named machine:vram:<its id>"
        )
    return "no device draws on this constraint"


def _read_device(item: Located) -> tuple[DeviceDescriptor, tuple[ExecutionDomain, ...]]:
    keys = item.mapping(_DEVICE_KEYS, frozenset({"id", "kind", "name", "domains"}))
    physical_id = keys["id"].string()
    try:
        check_physical_id(physical_id)
    except ValueError as error:
        keys["id"].fail(str(error))
    kind_text = keys["kind"].string()
    try:
        kind = DeviceKind(kind_text)
    except ValueError:
        keys["kind"].fail(
            f"unknown device kind {kind_text!r} (accepted: "
            f"{', '.join(member.value for member in DeviceKind)})"
        )
    domains: list[ExecutionDomain] = []
    for text in keys["domains"].string_list():
        try:
            domains.append(ExecutionDomain(text))
        except ValueError:
            keys["domains"].fail(
                f"unknown execution domain {text!r} (accepted: "
                f"{', '.join(member.value for member in ExecutionDomain)})"
            )
    if not domains:
        keys["domains"].fail("list at least one execution domain")
    optional = {
        key: keys[key].string() if key in keys and not keys[key].is_null() else None
        for key in ("package", "bandwidth_group", "power_domain")
    }
    device = make_descriptor(
        physical_id=physical_id,
        kind=kind,
        name=keys["name"].string(),
        domain=domains[0],
        providers=keys["providers"].string_list() if "providers" in keys else (),
        package=optional["package"],
        bandwidth_group=optional["bandwidth_group"],
        power_domain=optional["power_domain"],
        vendor_id=_hardware_id(keys, "vendor_id"),
        device_id=_hardware_id(keys, "device_id"),
        pci_bus_id=_pci_bus(keys),
    )
    return device, tuple(domains)


def _pci_bus(keys: dict[str, Located]) -> str | None:
    """An optional ``pci_bus_id``: a PCI address, kept in its normal form."""
    if "pci_bus_id" not in keys or keys["pci_bus_id"].is_null():
        return None
    text = keys["pci_bus_id"].string()
    bus = normalize_pci_bus_id(text)
    if bus is None:
        keys["pci_bus_id"].fail(
            f"pci_bus_id {text!r} is not a PCI address; accepted: domain:bus:device.function "
            "in hex, e.g. '0000:01:00.0' (quoted)"
        )
    return bus


def _hardware_id(keys: dict[str, Located], key: str) -> int | None:
    """An optional ``vendor_id`` / ``device_id``: an integer (0x10DE and 4318 alike)."""
    if key not in keys or keys[key].is_null():
        return None
    value = keys[key].scalar()
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 0xFFFFFFFF:
        keys[key].fail(
            f"{key} {value!r} is not a hardware id; accepted: an integer in [0, 0xFFFFFFFF], "
            "e.g. 0x10DE"
        )
    return value


def _read_memory(entry: Located) -> tuple[int, int | None]:
    if isinstance(entry.node, yaml.ScalarNode):
        return _read_size(entry, positive=True), None
    keys = entry.mapping(_MEMORY_KEYS, frozenset({"capacity"}))
    capacity = _read_size(keys["capacity"], positive=True)
    if "observed_free" not in keys:
        return capacity, None
    free = _read_size(keys["observed_free"], positive=False)
    if free > capacity:
        keys["observed_free"].fail(
            f"observed free memory {format_size(free)} exceeds the capacity {format_size(capacity)}"
        )
    return capacity, free


def _read_size(entry: Located, *, positive: bool) -> int:
    try:
        size = parse_size(entry.scalar())
    except ValueError as error:
        entry.fail(str(error))
    if positive and size == 0:
        entry.fail("a capacity must be larger than zero")
    return size


def topology_document(topology: Topology) -> dict[str, Any]:
    """The topology as a topology-file document that ``load_topology`` reads back."""
    document: dict[str, Any] = {"version": TOPOLOGY_FORMAT_VERSION}
    if topology.name:
        document["name"] = topology.name
    devices = []
    for device in topology.devices:
        entry: dict[str, Any] = {
            "id": device.physical_id,
            "kind": device.kind.value,
            "name": device.name,
            "domains": [domain.value for domain in topology.domains[device.physical_id]],
        }
        if device.providers:
            entry["providers"] = list(device.providers)
        for key in (
            "package",
            "bandwidth_group",
            "power_domain",
            "vendor_id",
            "device_id",
            "pci_bus_id",
        ):
            value = getattr(device, key)
            if value is not None:
                entry[key] = value
        devices.append(entry)
    document["devices"] = devices
    memory: dict[str, Any] = {}
    for name, info in topology.constraints.items():
        if info.capacity is None:
            raise UsageError(
                f"the capacity of {name} is unknown, so this topology cannot be saved as a "
                "file; write the file by hand with the capacity filled in"
            )
        limits: dict[str, Any] = {"capacity": exact_size(info.capacity)}
        if info.observed_free is not None:
            limits["observed_free"] = exact_size(info.observed_free)
        memory[name] = limits
    document["memory"] = memory
    return document


def save_topology(topology: Topology, path: str | os.PathLike[str]) -> Path:
    """Write the topology as a YAML topology file (atomically) and return its path."""
    target = Path(path)
    text = yaml.safe_dump(topology_document(topology), sort_keys=False, allow_unicode=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


def file_observed_free(topology: Topology) -> Mapping[str, int]:
    """The observed free memory a topology file states, by constraint."""
    return MappingProxyType(
        {
            name: info.observed_free
            for name, info in topology.constraints.items()
            if info.observed_free is not None
        }
    )
