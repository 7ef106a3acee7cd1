"""The studio loads a pipeline's stages when it is opened: the progress per stage in the Run
view and the conversation view, Run waiting for that load instead of starting another, and a
load cancelled by opening another pipeline or closing the window, with nothing left behind."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from app.conversations import ConversationStore
from app.models import RunOutcome, RunState
from app.presenters import load_view
from app.widgets.chat import ChatView
from runtime.events import LoadingStage, LoadProgress, PipelineLoading, StageStarting
from tests.app.support import open_pipeline, wait_state, wait_topology
from tests.runtime.engine.support import StageSpec, write_pipeline

if TYPE_CHECKING:
    from collections.abc import Callable

    from app.models import LoadView

SLOW_LOAD_WORKER = Path(__file__).with_name("slow_load_worker.py")
TIMEOUT_MS = 60_000


def _snapshots(window: Any) -> list[LoadView | None]:
    seen: list[LoadView | None] = []
    window.bridge.load_progress.connect(seen.append)
    return seen


def _states(window: Any) -> list[RunState]:
    seen: list[RunState] = []
    window.bridge.state_changed.connect(seen.append)
    return seen


def _slow_pipeline(tmp_path: Path, loop_manifest: Path) -> Path:
    spec = StageSpec(loop_manifest, worker=str(SLOW_LOAD_WORKER), max_io="4MiB")
    return write_pipeline(tmp_path / "slow.yaml", spec, name="slow_load")


def _slow_workers() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if any(part.endswith(SLOW_LOAD_WORKER.name) for part in child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue
    return found


def _wait_loading_phase(qtbot: Any, window: Any) -> None:
    """Until the slow stage's worker answered and its load is under way."""
    qtbot.waitUntil(
        lambda: (
            window.bridge.load_view is not None
            and window.bridge.load_view.stages[0].phase == "loading"
        ),
        timeout=TIMEOUT_MS,
    )


def _gone(processes: list[psutil.Process]) -> bool:
    return not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes)


def test_opening_a_graph_pipeline_loads_its_stages_without_a_run(
    qtbot: Any, make_window: Callable[..., Any], demo_root: Path
) -> None:
    window = make_window()
    wait_topology(qtbot, window)
    snapshots = _snapshots(window)
    info = open_pipeline(qtbot, window, demo_root / "pipelines" / "add.yaml")
    assert window.bridge.loading  # started by opening it
    wait_state(qtbot, window, RunState.LOADED)
    assert not window.bridge.loading
    loads = {snapshot.started for snapshot in snapshots if snapshot is not None}
    assert len(loads) == 1
    final = window.bridge.load_view
    assert final is not None
    assert final.status == "ready"
    assert [stage.stage for stage in final.stages] == list(info.stage_names)
    # Each stage went through its phases, each shown as it came.
    phases = [s.stages[0].phase for s in snapshots if s is not None]
    assert phases[0] == "preparing"
    assert phases[-1] == "ready"
    assert "starting worker" in phases
    assert "loading" in phases
    lines = window.run_pane.loading.lines()
    assert lines[0].startswith(f"{info.stage_names[0]} · add (graph worker): ready ")
    assert window.run_pane.loading.isVisible()
    assert "loaded in" in window.run_pane.loading.summary.text()
    assert window.bridge.ledger.snapshot().reservations  # the stages hold their memory


def test_run_after_open_uses_the_loaded_stages(
    qtbot: Any, make_window: Callable[..., Any], demo_root: Path
) -> None:
    window = make_window()
    wait_topology(qtbot, window)
    open_pipeline(qtbot, window, demo_root / "pipelines" / "add.yaml")
    wait_state(qtbot, window, RunState.LOADED)
    snapshots = _snapshots(window)
    states = _states(window)
    with qtbot.waitSignal(window.bridge.run_finished, timeout=TIMEOUT_MS) as finished:
        window.run()
    outcome: RunOutcome = finished.args[0]
    assert outcome.status == "completed", outcome.message
    wait_state(qtbot, window, RunState.LOADED)
    assert RunState.LOADING not in states  # no second load
    assert snapshots == []


def test_run_during_the_load_waits_for_it(
    qtbot: Any, make_window: Callable[..., Any], demo_root: Path
) -> None:
    window = make_window()
    wait_topology(qtbot, window)
    snapshots = _snapshots(window)
    states = _states(window)
    open_pipeline(qtbot, window, demo_root / "pipelines" / "add.yaml")
    assert window.bridge.loading
    with qtbot.waitSignal(window.bridge.run_finished, timeout=TIMEOUT_MS) as finished:
        window.run()
        assert window.bridge.state is RunState.LOADING  # queued behind the load
    assert finished.args[0].status == "completed", finished.args[0].message
    wait_state(qtbot, window, RunState.LOADED)
    assert states[states.index(RunState.LOADING) :][:2] == [RunState.LOADING, RunState.RUNNING]
    # One load only: the request waited for the one under way.
    assert len({s.started for s in snapshots if s is not None}) == 1


def test_opening_another_pipeline_during_a_load_cancels_it_with_nothing_left(
    qtbot: Any,
    make_window: Callable[..., Any],
    demo_root: Path,
    tmp_path: Path,
    loop_manifest: Path,
) -> None:
    window = make_window()
    wait_topology(qtbot, window)
    open_pipeline(qtbot, window, _slow_pipeline(tmp_path, loop_manifest))
    _wait_loading_phase(qtbot, window)
    workers = _slow_workers()
    assert len(workers) == 1
    assert window.run_pane.loading.isVisible()
    assert window.state_label.text() == "slow_load: ready · loading stages"
    (line,) = window.run_pane.loading.lines()
    assert "(graph worker): loading… " in line
    held = window.bridge.ledger.snapshot().reservations
    assert [r.owner for r in held] == ["slow_load"]

    open_pipeline(qtbot, window, demo_root / "pipelines" / "add.yaml")
    wait_state(qtbot, window, RunState.LOADED)
    qtbot.waitUntil(lambda: _gone(workers), timeout=TIMEOUT_MS)
    pipelines = {r.owner for r in window.bridge.ledger.snapshot().reservations}
    assert pipelines == {"demo_add"}  # nothing of the cancelled load is held
    snapshot = window.bridge.load_view
    assert snapshot is not None
    assert snapshot.pipeline == "demo_add"


def test_closing_the_window_during_a_load_leaves_nothing(
    qtbot: Any, make_window: Callable[..., Any], tmp_path: Path, loop_manifest: Path
) -> None:
    window = make_window()
    wait_topology(qtbot, window)
    open_pipeline(qtbot, window, _slow_pipeline(tmp_path, loop_manifest))
    _wait_loading_phase(qtbot, window)
    workers = _slow_workers()
    assert workers
    with qtbot.waitSignal(window.bridge.shut_down, timeout=TIMEOUT_MS):
        window.close()
    assert _gone(workers)
    assert window.bridge.ledger.snapshot().reservations == ()


def test_cancel_during_a_load_a_request_waits_for_stops_the_load(
    qtbot: Any, make_window: Callable[..., Any], tmp_path: Path, loop_manifest: Path
) -> None:
    window = make_window()
    wait_topology(qtbot, window)
    open_pipeline(qtbot, window, _slow_pipeline(tmp_path, loop_manifest))
    _wait_loading_phase(qtbot, window)
    workers = _slow_workers()
    window.run()
    assert window.bridge.state is RunState.LOADING
    with qtbot.waitSignal(window.bridge.run_finished, timeout=TIMEOUT_MS) as finished:
        window.cancel()
    assert finished.args[0].status == "cancelled"
    wait_state(qtbot, window, RunState.READY)
    qtbot.waitUntil(lambda: _gone(workers), timeout=TIMEOUT_MS)
    assert window.bridge.ledger.snapshot().reservations == ()
    snapshot = window.bridge.load_view
    assert snapshot is not None
    assert snapshot.status == "failed"
    assert "cancelled" in window.run_pane.loading.summary.text()


def test_a_message_sent_while_the_model_loads_waits_visibly(qtbot: Any, tmp_path: Path) -> None:
    view = ChatView(ConversationStore(tmp_path / "conversations"))
    qtbot.addWidget(view)
    view.show()
    view.set_pipeline("assistant")
    view.set_state(RunState.READY)
    progress = LoadProgress()
    progress.update(
        PipelineLoading(
            pipeline="assistant", stages=(LoadingStage("assistant", "vLLM worker"),), at=1.0
        )
    )
    progress.update(StageStarting(stage="assistant", route="local-vllm", at=2.0))
    assert progress.snapshot is not None
    view.show_loading(load_view(progress.snapshot))
    assert view.loading.isVisible()
    assert view.loading.lines(14.0) == ["assistant (vLLM worker): starting worker… 12 s"]
    with qtbot.waitSignal(view.submit_requested):
        assert view.send("What is the capital of France?")
    view.set_state(RunState.LOADING)  # the bridge queued it behind the load
    assert view.waiting_for_load
    assert "waiting for the model to load" in view.transcript.toPlainText()
    assert view.status.text() == "waiting for the model to load"
    view.set_state(RunState.RUNNING)
    assert not view.waiting_for_load
    assert "writing" in view.transcript.toPlainText()
