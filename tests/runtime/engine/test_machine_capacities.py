"""Capacities belong to the machine: several pipelines (``Omni`` on one ledger) share the
machine's memory constraints, each pipeline's declared capacities are its own ceiling, and a
set that does not fit is refused naming the pipelines that hold the memory and how much."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import yaml

from runtime.api import Omni
from runtime.devices import ConstraintInfo, Topology
from runtime.errors import AdmissionRefused
from runtime.ledger import ResourceLedger
from runtime.planning import plan_pipeline
from tests.runtime.engine.support import StageSpec, child_pids, write_pipeline

GiB = 1 << 30
MiB = 1 << 20
RAM = "machine:ram"
WSL = "wsl:quota"


def machine_with(machine: Topology, capacity: int, free: int | None = None) -> Topology:
    """This machine's devices with ``capacity`` bytes of RAM (``free`` of them free now), as a
    topology file would state them."""
    info = machine.constraints[RAM]
    constraints = dict(machine.constraints)
    constraints[RAM] = ConstraintInfo(
        RAM, capacity, capacity if free is None else free, info.devices
    )
    return dataclasses.replace(
        machine, constraints=MappingProxyType(constraints), source="test-machine.yaml"
    )


def add_pipeline(demo_root: Path, folder: Path, name: str, capacity: str, demand: str) -> Path:
    manifest = demo_root / "bundles" / "add" / "manifest.json"
    spec = StageSpec(manifest, capacity=capacity, demand=demand)
    return write_pipeline(folder / f"{name}.yaml", spec, name=name)


def ram(ledger: ResourceLedger) -> tuple[int, int]:
    state = ledger.snapshot().constraints[RAM]
    return state.capacity, state.reserved


@pytest.mark.parametrize("roomy_first", [True, False])
def test_pipelines_with_different_ceilings_load_together_on_the_machines_memory(
    demo_root: Path, tmp_path: Path, machine: Topology, roomy_first: bool
) -> None:
    """add.yaml declares 2 GiB and a roomy pipeline 6 GiB: in either order both load, the
    ledger keeps the machine's 8 GiB, and neither ceiling is rewritten by the other."""
    options: dict[str, Any] = {"topology": machine_with(machine, 8 * GiB)}
    roomy = add_pipeline(demo_root, tmp_path, "roomy", "6GiB", "3GiB")
    add = demo_root / "pipelines" / "add.yaml"
    ledger = ResourceLedger(name="api")
    first, second = (roomy, add) if roomy_first else (add, roomy)
    with Omni(first, ledger=ledger, **options) as one:
        assert ram(ledger) == (8 * GiB, 3 * GiB if roomy_first else 128 * MiB)
        with Omni(second, ledger=ledger, **options) as two:
            assert ram(ledger) == (8 * GiB, 3 * GiB + 128 * MiB)
            owners = sorted(reservation.owner for reservation in ledger.snapshot().reservations)
            assert owners == ["demo_add", "roomy"]
            for omni in (one, two):
                example = omni.example_inputs()
                assert (omni.run()["sum"] == example["a"] + example["b"]).all()
        assert ram(ledger) == (8 * GiB, 3 * GiB if roomy_first else 128 * MiB)
        # The pipeline whose ceiling is the smaller still loads again beside the other.
        with Omni(add if roomy_first else roomy, ledger=ledger, **options):
            assert ram(ledger) == (8 * GiB, 3 * GiB + 128 * MiB)
    assert ledger.snapshot().is_empty


def test_a_set_that_does_not_fit_is_refused_naming_the_pipelines_and_amounts(
    demo_root: Path, tmp_path: Path, machine: Topology
) -> None:
    options: dict[str, Any] = {"topology": machine_with(machine, GiB)}
    add = demo_root / "pipelines" / "add.yaml"
    other = add_pipeline(demo_root, tmp_path, "other_add", "2GiB", "256MiB")
    big = add_pipeline(demo_root, tmp_path, "big", "2GiB", "768MiB")
    ledger = ResourceLedger(name="api")
    with Omni(add, ledger=ledger, **options), Omni(other, ledger=ledger, **options):
        children = child_pids()
        with pytest.raises(AdmissionRefused) as caught:
            Omni(big, ledger=ledger, **options)
        refusal = caught.value
        assert str(refusal) == (
            "admission refused: machine:ram needs 768.0 MiB for stage-0 but only 640.0 MiB is "
            "free of 1.0 GiB; held by other_add (256.0 MiB), demo_add (128.0 MiB)"
        )
        assert refusal.holders == (("other_add", 256 * MiB), ("demo_add", 128 * MiB))
        assert (refusal.needed, refusal.free, refusal.exit_code) == (768 * MiB, 640 * MiB, 3)
        assert child_pids() == children  # refused before any worker started
        assert ram(ledger) == (GiB, 384 * MiB)
    assert ledger.snapshot().is_empty


def test_a_pipelines_own_ceiling_still_binds_on_a_roomy_machine(
    demo_root: Path, tmp_path: Path, machine: Topology
) -> None:
    options: dict[str, Any] = {"topology": machine_with(machine, 8 * GiB)}
    tight = add_pipeline(demo_root, tmp_path, "tight", "256MiB", "512MiB")
    ledger = ResourceLedger(name="api")
    children = child_pids()
    with pytest.raises(AdmissionRefused) as caught:
        Omni(tight, ledger=ledger, **options)
    assert str(caught.value) == (
        "admission: machine:ram needs 512.0 MiB for stage-0 but its declared capacity is "
        "256.0 MiB (short by 256.0 MiB)"
    )
    assert (caught.value.needed, caught.value.free) == (512 * MiB, 256 * MiB)
    assert child_pids() == children
    assert ledger.snapshot().is_empty
    # plan says the same before anything loads.
    plan = plan_pipeline(tight, topology=options["topology"])
    assert not plan.admitted
    assert plan.refusals == (str(caught.value),)


def test_plan_refuses_what_the_machine_cannot_hold_and_warns_of_free_memory(
    tmp_path: Path, demo_root: Path, machine: Topology
) -> None:
    roomy = add_pipeline(demo_root, tmp_path, "roomy", "6GiB", "3GiB")
    small = machine_with(machine, 2 * GiB, free=GiB)
    plan = plan_pipeline(roomy, topology=small)
    assert not plan.admitted
    assert plan.refusals == (
        "admission: machine:ram needs 3.0 GiB for stage-0 but the machine (test-machine.yaml) "
        "has 2.0 GiB",
    )
    assert any("exceeds the 1.0 GiB free now" in warning for warning in plan.warnings)
    # Loading agrees: the ledger takes the machine's 2 GiB and refuses the same demand.
    ledger = ResourceLedger(name="api")
    with pytest.raises(AdmissionRefused) as caught:
        Omni(roomy, ledger=ledger, topology=small)
    assert (str(caught.value),) == plan.refusals
    assert ram(ledger) == (2 * GiB, 0)
    assert plan_pipeline(roomy, topology=machine_with(machine, 8 * GiB)).admitted


def test_loading_warns_when_a_ceiling_exceeds_the_free_memory(
    demo_root: Path, machine: Topology, caplog: pytest.LogCaptureFixture
) -> None:
    tight = machine_with(machine, 8 * GiB, free=GiB)
    with (
        caplog.at_level(logging.WARNING, logger="omni.engine.runtime"),
        Omni(demo_root / "pipelines" / "add.yaml", topology=tight) as omni,
    ):
        assert omni.run()["sum"].shape == (1, 1024)
    assert (
        "demo_add declares machine:ram as 2.0 GiB, more than the 1.0 GiB free now; loading "
        "may fail or swap" in caplog.text
    )


def test_a_constraint_the_machine_lacks_takes_the_first_ceiling_and_keeps_it(
    demo_root: Path, tmp_path: Path, machine: Topology
) -> None:
    """``wsl:quota`` outside WSL: the machine states no capacity, so the first pipeline that
    declares it gives the ledger its ceiling; a later pipeline's larger one changes nothing."""
    assert WSL not in machine.constraints
    manifest = demo_root / "bundles" / "add" / "manifest.json"

    def with_quota(name: str, capacity: str, demand: str) -> Path:
        path = write_pipeline(tmp_path / f"{name}.yaml", StageSpec(manifest), name=name)
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        budget = document["stages"][0]["resource_budget"]
        budget["capacities"][WSL] = capacity
        budget["demands"][WSL] = demand
        path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
        return path

    options: dict[str, Any] = {"topology": machine_with(machine, 8 * GiB)}
    ledger = ResourceLedger(name="api")
    with Omni(with_quota("first", "1GiB", "768MiB"), ledger=ledger, **options):
        assert ledger.snapshot().constraints[WSL].capacity == GiB
        with pytest.raises(AdmissionRefused, match=r"wsl:quota needs 512\.0 MiB .* held by first"):
            Omni(with_quota("second", "4GiB", "512MiB"), ledger=ledger, **options)
        assert ledger.snapshot().constraints[WSL].capacity == GiB
    assert ledger.snapshot().is_empty
