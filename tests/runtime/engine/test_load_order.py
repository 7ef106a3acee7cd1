"""Stages load at most ``load_slots()`` at once, the local language-model stages first: more
loads than cores only share the cores, and the model's load is the longest."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

import runtime.engine.stage_runtime
from runtime.config import load_pipeline
from runtime.devices import DeviceSelection, Topology
from runtime.engine.stage_runtime import StageRuntime, load_slots
from runtime.events import Event, EventBus, StageReady, StageStarting, StageWorkerUp
from runtime.ledger import ResourceLedger
from tests.runtime.engine.support import StageSpec, write_pipeline

if TYPE_CHECKING:
    from pathlib import Path


def _three_stages(demo_root: Path, tmp_path: Path) -> Any:
    one = load_pipeline(
        write_pipeline(
            tmp_path / "one.yaml", StageSpec(demo_root / "bundles" / "add" / "manifest.json")
        )
    )
    (stage,) = one.stages
    return dataclasses.replace(
        one, stages=tuple(dataclasses.replace(stage, stage_id=index) for index in range(3))
    )


@pytest.mark.parametrize("slots", [1, 2])
def test_at_most_the_slots_load_at_once(
    slots: int,
    demo_root: Path,
    tmp_path: Path,
    machine: Topology,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runtime.engine.stage_runtime, "load_slots", lambda: slots)
    events = EventBus()
    seen: list[Event] = []
    events.subscribe(seen.append)
    ledger = ResourceLedger(name="load-order")
    stages = StageRuntime(
        _three_stages(demo_root, tmp_path),
        ledger=ledger,
        events=events,
        topology=machine,
        selection=DeviceSelection(),
    )

    async def start_and_close() -> None:
        await stages.start()
        await stages.close()

    asyncio.run(start_and_close())
    assert ledger.snapshot().is_empty
    # A stage's worker answers only once it has a slot: count the loads under way.
    loading, most = 0, 0
    for event in seen:
        if isinstance(event, StageWorkerUp):
            loading += 1
            most = max(most, loading)
        elif isinstance(event, StageReady):
            loading -= 1
    assert [type(event) for event in seen].count(StageReady) == 3
    assert 1 <= most <= slots


def test_the_language_model_stages_take_the_first_slots(
    demo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order the slots are taken in, whatever the stages' order in the pipeline."""
    monkeypatch.setattr(runtime.engine.stage_runtime, "load_slots", lambda: 2)
    events = EventBus()
    starting: list[str] = []
    events.subscribe(
        lambda event: starting.append(event.stage) if isinstance(event, StageStarting) else None
    )
    manifest = demo_root / "bundles" / "add" / "manifest.json"
    runtime_ = StageRuntime(
        load_pipeline(write_pipeline(tmp_path / "p.yaml", StageSpec(manifest))),
        ledger=ResourceLedger(name="load-order"),
        events=events,
    )
    kinds = {"vad": "graph", "asr": "graph", "model": "llm", "voice": "graph", "remote": "llm"}
    runtime_.stages = [
        SimpleNamespace(name=name, kind=kind, route_name="route") for name, kind in kinds.items()
    ]  # type: ignore[misc]
    began: list[str] = []
    running: list[str] = []

    async def start_stage(handle: Any) -> str:
        began.append(handle.name)
        running.append(handle.name)
        assert len(running) <= 2
        await asyncio.sleep(0.01)
        running.remove(handle.name)
        if handle.name == "asr":
            raise RuntimeError("asr failed")
        return f"{handle.name} ready"

    monkeypatch.setattr(runtime_, "_start_stage", start_stage)
    results = asyncio.run(runtime_._start_all())
    assert began == ["model", "remote", "vad", "asr", "voice"]
    # Each stage is announced as starting when its load begins, not while it waits.
    assert starting == began
    # Each result (or error) stands at its stage's place in the pipeline.
    assert [str(result) for result in results] == [
        "vad ready",
        "asr failed",
        "model ready",
        "voice ready",
        "remote ready",
    ]


def test_load_slots_are_the_cores_this_process_may_use_and_at_least_two(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    assert load_slots() == 5
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    assert load_slots() == 2
