"""One physical device seen from several domains is one device in a topology."""

from __future__ import annotations

import pytest

from runtime.contracts.devices import (
    MACHINE_RAM,
    WSL_QUOTA,
    DeviceDescriptor,
    DeviceKind,
    ExecutionDomain,
    vram_constraint,
)
from runtime.devices import build_topology, make_descriptor, merge_same_physical

GPU = "GPU-8c3e55aa-1b2c-4d5e-9f00-112233445566"
GiB = 1024**3


def rtx(domain: ExecutionDomain, *providers: str) -> DeviceDescriptor:
    return make_descriptor(
        physical_id=GPU,
        kind=DeviceKind.DGPU,
        name="NVIDIA GeForce RTX 5090 Laptop GPU",
        domain=domain,
        providers=providers,
        power_domain="dgpu" if domain is ExecutionDomain.WSL else None,
    )


def test_windows_and_wsl_views_of_one_gpu_merge() -> None:
    windows = rtx(ExecutionDomain.WINDOWS, "CUDAExecutionProvider", "DmlExecutionProvider")
    wsl = rtx(ExecutionDomain.WSL, "CUDAExecutionProvider", "TensorrtExecutionProvider")
    merged = merge_same_physical([windows, wsl])
    (device,) = merged.devices
    assert device.physical_id == GPU
    assert device.execution_domain is ExecutionDomain.WINDOWS
    assert device.providers == (
        "CUDAExecutionProvider",
        "DmlExecutionProvider",
        "TensorrtExecutionProvider",
    )
    assert device.power_domain == "dgpu"
    assert merged.domains[GPU] == (ExecutionDomain.WINDOWS, ExecutionDomain.WSL)
    assert device.memory_constraints == (vram_constraint(GPU),)


def test_a_merged_topology_has_one_vram_constraint_for_the_gpu() -> None:
    cpu_wsl = make_descriptor(
        physical_id="CPU-X", kind=DeviceKind.CPU, name="X", domain=ExecutionDomain.WSL
    )
    cpu_windows = make_descriptor(
        physical_id="CPU-X", kind=DeviceKind.CPU, name="X", domain=ExecutionDomain.WINDOWS
    )
    topology = build_topology(
        [
            cpu_wsl,
            rtx(ExecutionDomain.WSL, "CUDAExecutionProvider"),
            cpu_windows,
            rtx(ExecutionDomain.WINDOWS, "DmlExecutionProvider"),
        ],
        capacities={MACHINE_RAM: 32 * GiB, WSL_QUOTA: 16 * GiB, vram_constraint(GPU): 24 * GiB},
        source="discovered",
    )
    assert [device.physical_id for device in topology.devices] == ["CPU-X", GPU]
    assert topology.constraints[vram_constraint(GPU)].devices == (GPU,)
    assert topology.device(GPU).providers == ("CUDAExecutionProvider", "DmlExecutionProvider")
    assert topology.charges("CPU-X") == (MACHINE_RAM, WSL_QUOTA)
    assert topology.charges("CPU-X", ExecutionDomain.WINDOWS) == (MACHINE_RAM,)
    assert topology.wsl


def test_one_id_with_two_kinds_is_a_contradiction() -> None:
    igpu = make_descriptor(
        physical_id=GPU, kind=DeviceKind.IGPU, name="other", domain=ExecutionDomain.WINDOWS
    )
    with pytest.raises(ValueError, match=r"both dgpu .* and igpu"):
        merge_same_physical([rtx(ExecutionDomain.WINDOWS), igpu])


def test_capacities_must_match_what_devices_draw_on() -> None:
    cpu = make_descriptor(
        physical_id="CPU-X", kind=DeviceKind.CPU, name="X", domain=ExecutionDomain.POSIX
    )
    with pytest.raises(ValueError, match="no capacity given for machine:ram"):
        build_topology([cpu], capacities={}, source="discovered")
    with pytest.raises(ValueError, match="no device draws on wsl:quota"):
        build_topology([cpu], capacities={MACHINE_RAM: 1, WSL_QUOTA: 1}, source="discovered")


def test_physical_ids_must_fit_in_a_constraint_name() -> None:
    with pytest.raises(ValueError, match="bad physical id"):
        make_descriptor(
            physical_id="GPU 0", kind=DeviceKind.DGPU, name="G", domain=ExecutionDomain.POSIX
        )
