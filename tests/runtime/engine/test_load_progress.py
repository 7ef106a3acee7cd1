"""Loading progress: the events a start publishes per stage, folded by ``LoadProgress``, and a
start cancelled from another thread that leaves nothing behind."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from runtime.config import load_pipeline
from runtime.engine.orchestrator import LoadCancelled, Orchestrator, loading_stages
from runtime.events import (
    Event,
    EventBus,
    LoadingStage,
    LoadProgress,
    PipelineLoadFailed,
    PipelineLoading,
    PipelineReady,
    StageFailed,
    StageProgress,
    StageReady,
    StageStarting,
    StageWorkerUp,
)
from runtime.ledger import ResourceLedger
from runtime.records import StageRecord
from tests.runtime.engine.support import process_gone, wait_until


def _recorded(events: EventBus) -> list[Event]:
    seen: list[Event] = []
    events.subscribe(seen.append)
    return seen


def test_a_start_publishes_each_stage_phase_with_its_time(
    demo_root: Path, options: dict[str, Any]
) -> None:
    config = load_pipeline(demo_root / "pipelines" / "speak.yaml")
    events = EventBus()
    seen = _recorded(events)
    progress = LoadProgress()
    changes: list[bool] = []
    events.subscribe(lambda event: changes.append(progress.update(event)))
    orchestrator = Orchestrator(config, events=events, **options)
    try:
        orchestrator.start()
    finally:
        orchestrator.close()
    stages = [stage.name for stage in config.stages]
    loading = seen[0]
    assert isinstance(loading, PipelineLoading)
    assert [s.stage for s in loading.stages] == stages
    assert {s.kind for s in loading.stages} == {"graph worker"}
    for name in stages:
        kinds = [type(e) for e in seen if getattr(e, "stage", None) == name]
        # Each stage starts, its worker answers, then it is ready, in that order.
        assert kinds[:3] == [StageStarting, StageWorkerUp, StageReady], (name, kinds)
    ready = [e for e in seen if isinstance(e, StageReady)]
    assert all(e.elapsed_s > 0 for e in ready)
    pipeline_ready = next(i for i, e in enumerate(seen) if isinstance(e, PipelineReady))
    assert all(seen.index(e) < pipeline_ready for e in ready)
    snapshot = progress.snapshot
    assert snapshot is not None
    assert snapshot.status == "ready"
    assert any(changes)
    assert [s.phase for s in snapshot.stages] == ["ready"] * len(stages)
    assert snapshot.elapsed_s is not None
    assert snapshot.elapsed_s >= max(e.elapsed_s for e in ready)
    line = snapshot.stages[0].line(0.0)
    assert line.startswith(f"{stages[0]} · acoustic (graph worker): ready ")
    assert line.endswith(" s")
    assert snapshot.summary(0.0).startswith(f"{len(stages)} stage(s) loaded in ")


def test_cancel_start_during_a_load_unwinds_everything(
    demo_root: Path, options: dict[str, Any]
) -> None:
    config = load_pipeline(demo_root / "pipelines" / "speak.yaml")
    events = EventBus()
    seen = _recorded(events)
    ledger = ResourceLedger(name="cancel-start")
    orchestrator = Orchestrator(config, ledger=ledger, events=events, **options)
    pids: list[int] = []

    def cancel_once_a_worker_is_up(event: Event) -> None:
        if isinstance(event, StageWorkerUp) and not pids:
            pids.append(event.pid)
            # From another thread, as the studio's GUI thread does.
            threading.Thread(target=orchestrator.cancel_start).start()

    events.subscribe(cancel_once_a_worker_is_up)
    with pytest.raises(LoadCancelled, match="cancelled"):
        orchestrator.start()
    assert pids, "no worker answered before the start ended"
    assert ledger.snapshot().reservations == ()
    wait_until(lambda: all(process_gone(pid) for pid in pids), "the cancelled worker to go")
    failed = [e for e in seen if isinstance(e, PipelineLoadFailed)]
    assert len(failed) == 1
    assert failed[0].cancelled
    assert failed[0].message == "cancelled"
    assert not any(isinstance(e, PipelineReady) for e in seen)
    # A stage whose start was cut short says so (none of them was ready before the cancel
    # unless it finished first).
    ended = {e.stage for e in seen if isinstance(e, StageFailed | StageReady)}
    assert ended == {stage.name for stage in config.stages}
    assert not orchestrator.cancel_start()  # nothing under way any more
    orchestrator.close()


def test_cancel_start_before_start_raises_at_once(demo_root: Path, options: dict[str, Any]) -> None:
    config = load_pipeline(demo_root / "pipelines" / "add.yaml")
    events = EventBus()
    seen = _recorded(events)
    ledger = ResourceLedger(name="cancel-early")
    orchestrator = Orchestrator(config, ledger=ledger, events=events, **options)
    assert orchestrator.cancel_start()
    with pytest.raises(LoadCancelled):
        orchestrator.start()
    assert ledger.snapshot().reservations == ()
    assert not any(isinstance(e, StageStarting) for e in seen)
    progress = LoadProgress()
    for event in seen:
        progress.update(event)
    snapshot = progress.snapshot
    assert snapshot is not None
    assert snapshot.status == "failed"
    assert snapshot.summary(0.0).endswith(": cancelled")


def test_load_progress_lines_name_the_phase_and_the_seconds() -> None:
    progress = LoadProgress()
    stages = (
        LoadingStage("assistant", "vLLM worker", "smollm2"),
        LoadingStage("voice", "graph worker"),
    )
    assert progress.update(PipelineLoading(pipeline="p", stages=stages, at=100.0))
    assert progress.update(StageStarting(stage="assistant", route="r", at=101.0))
    assert progress.update(StageStarting(stage="voice", route="r", at=101.0))
    assert not progress.update(StageStarting(stage="unknown", route="r", at=101.0))
    assert progress.update(StageWorkerUp(stage="voice", pid=1, at=101.2))
    assert progress.update(
        StageReady(stage="voice", record=StageRecord("voice", "graph"), elapsed_s=0.42, at=101.42)
    )
    snapshot = progress.snapshot
    assert snapshot is not None
    assert snapshot.lines(113.4) == [
        "assistant · smollm2 (vLLM worker): starting worker… 12 s",
        "voice (graph worker): ready 0.4 s",
    ]
    summary = snapshot.summary(114.0)
    assert summary == "loading: assistant · smollm2 (vLLM worker) starting worker… 14 s"
    assert progress.update(StageWorkerUp(stage="assistant", pid=2, at=102.0))
    assert progress.snapshot is not None
    assert progress.snapshot.stages[0] == StageProgress(
        "assistant", "vLLM worker", "loading", since=101.0, model="smollm2"
    )
    assert progress.update(StageFailed(stage="assistant", message="boom", elapsed_s=3.0, at=104))
    assert progress.update(PipelineLoadFailed(pipeline="p", message="boom", at=104.5))
    assert progress.snapshot is not None
    assert progress.snapshot.lines(200.0)[0] == "assistant · smollm2 (vLLM worker): failed 3.0 s"
    assert progress.snapshot.summary(200.0) == "loading stopped after 4.5 s: boom"
    # Once ended, later events of that load change nothing.
    assert not progress.update(
        StageReady(stage="voice", record=StageRecord("voice", "graph"), elapsed_s=1.0)
    )


def test_loading_stages_name_what_serves_each_stage(demo_root: Path) -> None:
    config = load_pipeline(demo_root / "pipelines" / "add.yaml")
    assert loading_stages(config) == (LoadingStage(config.stages[0].name, "graph worker", "add"),)
