"""A graph stage's device and provider options reach its worker process.

Admission picks the device (``check_route_device``); the worker finds that device among
ONNX Runtime's execution-provider devices, creates the session on it with the route's
provider options, and reports both in ``ready``; the execution plan records them. Only
the CPU provider's device exists here, so these run on it, in real worker processes.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import onnxruntime as ort
import pytest

from runtime.api import Omni
from runtime.cli import main
from runtime.contracts.devices import DeviceKind
from runtime.devices import DeviceSelection, load_topology
from runtime.engine.stage_runtime import StageStartError
from runtime.errors import PlacementRefused
from runtime.events import Event, EventBus, StageReady
from runtime.ledger import ResourceLedger
from tests.runtime.engine.support import (
    StageSpec,
    child_pids,
    controller_segments,
    write_pipeline,
)

if TYPE_CHECKING:
    from pathlib import Path

    from runtime.devices import Topology

OPTIONS = {"arena_extend_strategy": "kSameAsRequested"}


def _cpu_ep_device() -> Any:
    (device,) = [d for d in ort.get_ep_devices() if d.ep_name == "CPUExecutionProvider"]
    return device.device


def _stage_entry(plan: dict[str, Any]) -> dict[str, Any]:
    (stage,) = plan["stages"]
    return stage


def test_the_chosen_device_and_options_reach_the_worker_and_the_execution_plan(
    demo_root: Path, tmp_path: Path, machine: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMNI_EDGE_CONFIG_DIR", str(tmp_path / "config"))
    pipeline = write_pipeline(
        tmp_path / "add.yaml",
        StageSpec(demo_root / "bundles" / "add" / "manifest.json", provider_options=OPTIONS),
    )
    out = tmp_path / "out"
    assert main(["run", str(pipeline), "--out", str(out)]) == 0
    stage = _stage_entry(json.loads((out / "execution_plan.json").read_text()))
    assert stage["worker"]["pid"] != os.getpid()
    cpu = next(device for device in machine.devices if device.kind is DeviceKind.CPU)
    found = _cpu_ep_device()
    device = stage["device"]
    assert device["requested"] == {
        "physical_id": cpu.physical_id,
        "name": cpu.name,
        "kind": "cpu",
        "vendor_id": found.vendor_id,
        "device_id": found.device_id,
    }
    assert stage["route"]["provider_options"] == OPTIONS
    # What the worker process applied: the CPU provider's OrtEpDevice, with the options.
    assert device["applied"] == {
        "method": "ep_device",
        "ep_name": "CPUExecutionProvider",
        "type": "cpu",
        "vendor": found.vendor,
        "vendor_id": found.vendor_id,
        "device_id": found.device_id,
        "provider_options": OPTIONS,
        "ep_library": None,
    }


def test_the_ready_event_carries_the_applied_device(
    demo_root: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    pipeline = write_pipeline(
        tmp_path / "add.yaml", StageSpec(demo_root / "bundles" / "add" / "manifest.json")
    )
    events = EventBus()
    recorded: list[Event] = []
    events.subscribe(recorded.append)
    with Omni(pipeline, ledger=ResourceLedger(name="ready"), events=events, **options) as omni:
        plan = omni.execution_plan.to_json()
    (ready,) = [event for event in recorded if isinstance(event, StageReady)]
    record = ready.record.to_json()
    assert record["device"]["applied"]["method"] == "ep_device"
    assert _stage_entry(plan)["device"]["applied"] == record["device"]["applied"]


def test_a_device_the_worker_cannot_find_is_refused_naming_what_it_found(
    demo_root: Path, tmp_path: Path
) -> None:
    # A machine described with a CPU whose hardware ids no ONNX Runtime device here has:
    # admission accepts it, the worker process does not find it.
    topology_file = tmp_path / "other-cpu.yaml"
    topology_file.write_text(
        "version: 1\ndevices:\n  - id: CPU-Other\n    kind: cpu\n    name: Another CPU\n"
        "    domains: [posix]\n    providers: [CPUExecutionProvider]\n"
        "    vendor_id: 0xFFFF\n    device_id: 0x1234\n"
        "memory:\n  machine:ram: 8GiB\n",
        encoding="utf-8",
    )
    pipeline = write_pipeline(
        tmp_path / "add.yaml", StageSpec(demo_root / "bundles" / "add" / "manifest.json")
    )
    ledger = ResourceLedger(name="absent-device")
    with pytest.raises(StageStartError) as caught:
        Omni(
            pipeline,
            ledger=ledger,
            topology=load_topology(topology_file),
            selection=DeviceSelection(),
        )
    cause = caught.value.cause
    assert isinstance(cause, PlacementRefused)
    assert caught.value.exit_code == 3
    message = str(cause)
    assert "device_absent" in message
    assert "no CPUExecutionProvider device matches cpu CPU-Other (vendor 0xffff" in message
    found = _cpu_ep_device()
    assert (
        f"lists: CPUExecutionProvider on {found.vendor} cpu (vendor {found.vendor_id:#06x}"
        in message
    )
    assert not child_pids()
    assert not controller_segments()
    assert ledger.snapshot().is_empty
