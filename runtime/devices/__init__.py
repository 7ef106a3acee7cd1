"""Devices of one machine: discovery, topology files, and the user's device selection.

``discover_topology()`` reads this machine; ``load_topology(path)`` reads a topology file
(format in ``assets/topologies/README.md``) so a plan can be checked for another machine.
Both give a ``Topology``: devices (``DeviceDescriptor``), the memory constraints they draw
on, and text and JSON renderings.
"""

from runtime.devices.discovery import (
    DiscoveryInputs,
    EpDeviceRecord,
    FreeShortfall,
    HostMemory,
    NvmlGpu,
    NvmlProbe,
    OrtProbe,
    assemble_topology,
    discover_topology,
    free_shortfalls,
    observed_free,
)
from runtime.devices.selection import (
    ROUTE_TARGETS,
    DeviceSelection,
    RouteTarget,
    check_route_device,
    config_dir,
    ep_device_request,
    load_selection,
    route_domain,
    save_selection,
    selection_path,
)
from runtime.devices.topology import (
    DISCOVERED,
    ConstraintInfo,
    MergedDevices,
    Topology,
    build_topology,
    constraints_for,
    format_size,
    load_topology,
    make_descriptor,
    merge_same_physical,
    parse_size,
    save_topology,
    topology_document,
)

__all__ = [
    "DISCOVERED",
    "ROUTE_TARGETS",
    "ConstraintInfo",
    "DeviceSelection",
    "DiscoveryInputs",
    "EpDeviceRecord",
    "FreeShortfall",
    "HostMemory",
    "MergedDevices",
    "NvmlGpu",
    "NvmlProbe",
    "OrtProbe",
    "RouteTarget",
    "Topology",
    "assemble_topology",
    "build_topology",
    "check_route_device",
    "config_dir",
    "constraints_for",
    "discover_topology",
    "ep_device_request",
    "format_size",
    "free_shortfalls",
    "load_selection",
    "load_topology",
    "make_descriptor",
    "merge_same_physical",
    "observed_free",
    "parse_size",
    "route_domain",
    "save_selection",
    "save_topology",
    "selection_path",
    "topology_document",
]
