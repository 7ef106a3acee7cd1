"""The studio window driven like a user would, against the real runtime (workers, ledger).

Every wait is on a signal (or, for a worker computing, on the process itself); none sleeps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import psutil
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QFileDialog

from app.models import ErrorAction, RunState
from app.theme import follow_system_scheme
from runtime.devices import DeviceSelection, load_selection
from tests.app.support import open_pipeline, wait_state, wait_topology
from tests.runtime.engine.support import PLACEMENT_WORKER, StageSpec, write_pipeline

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

CPU = "CPUExecutionProvider"
MiB = 1 << 20


def _cpu_seconds(pid: int) -> float:
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return float(times.user + times.system)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_open_a_pipeline_through_the_file_menu(
    make_window: Callable[..., Any], qtbot: Any, demo_root: Path, monkeypatch: Any
) -> None:
    window = make_window()
    add = demo_root / "pipelines" / "add.yaml"
    monkeypatch.setattr(
        QFileDialog, "getOpenFileName", staticmethod(lambda *_a, **_k: (str(add), ""))
    )
    assert not window.run_action.isEnabled()
    with qtbot.waitSignal(window.bridge.pipeline_opened, timeout=30_000) as opened:
        window.open_action.trigger()
    info = opened.args[0]
    assert info.name == "demo_add"
    assert window.run_pane.title.text() == "demo_add"
    table = window.run_pane.tensor_inputs.table
    assert [table.item(row, 0).text() for row in range(table.rowCount())] == ["a", "b"]
    assert table.item(0, 2).text() == "(1, 1024)"
    assert window.run_pane.fit_chip.text() == "Fits"
    assert window.run_action.isEnabled()
    assert not window.cancel_action.isEnabled()
    files = window.manifest_panel.files
    assert sorted(files.item(row, 0).text() for row in range(files.rowCount())) == [
        "add.onnx",
        "inputs.npz",
    ]
    assert {files.item(row, 1).text() for row in range(files.rowCount())} == {"ok"}
    assert window.manifest_panel.chip.text() == "verified"
    assert window.plan_panel.chip.text() == "Admitted"
    assert window.pipelines.item_for(add, window.pipelines.recent) is not None
    assert window.windowTitle().startswith("demo_add")


def test_run_add_and_see_the_result(
    make_window: Callable[..., Any], qtbot: Any, demo_root: Path, tmp_path: Path
) -> None:
    window = make_window()
    info = open_pipeline(qtbot, window, demo_root / "pipelines" / "add.yaml")
    seen: list[tuple[RunState, bool, bool]] = []
    window.bridge.state_changed.connect(
        lambda state: seen.append(
            (state, window.run_action.isEnabled(), window.cancel_action.isEnabled())
        )
    )
    window.stall_monitor.reset()
    with qtbot.waitSignal(window.bridge.run_finished, timeout=60_000) as finished:
        qtbot.keyClick(window, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert finished.args[0].status == "completed"
    wait_state(qtbot, window, RunState.LOADED)
    stalls = window.stall_monitor.stats()
    print(f"event loop lateness during the add run: {stalls}")
    assert stalls.samples > 0

    example = info.example_inputs
    results = window.output.tensors.results
    assert results is not None
    np.testing.assert_array_equal(results.arrays["sum"], example["a"] + example["b"])
    table = window.output.tensors.table
    assert [table.item(0, column).text() for column in range(3)] == ["sum", "float32", "(1, 1024)"]
    reference = tmp_path / "reference.npz"
    np.savez(reference, sum=example["a"] + example["b"])
    assert window.load_reference(reference)
    assert window.output.tensors.verdict.text() == "matches reference"
    assert table.item(0, 6).text() == "match"
    np.savez(reference, sum=example["a"] + example["b"] + 1.0)
    assert window.load_reference(reference)
    assert window.output.tensors.verdict.text() == "differs from reference"

    # Run and Cancel followed the request at every step.
    assert [state for state, _run, _cancel in seen] == [
        RunState.LOADING,
        RunState.RUNNING,
        RunState.LOADED,
    ]
    assert all(run == state.can_run and cancel == state.can_cancel for state, run, cancel in seen)
    assert window.output.status.text() == "completed"

    # The Plan shows where the stage runs; the Devices panel what the ledger holds.
    execution = window.plan_panel.execution
    assert execution is not None
    (stage,) = execution.stages
    assert stage.pid is not None
    assert psutil.pid_exists(stage.pid)
    assert stage.generation >= 1
    assert dict(stage.provider_counts) == {CPU: 1}
    assert stage.fraction_on_target == 1.0
    assert window.plan_panel.stages.topLevelItem(0).text(3) == str(stage.pid)
    assert window.devices_panel.ledger.row("machine:ram").reserved == 128 * MiB
    assert window.metrics_panel.metrics is not None
    assert [timing.stage for timing in window.metrics_panel.metrics.stages] == ["stage-0"]

    with qtbot.waitSignal(window.bridge.execution_changed, timeout=30_000):
        window.unload_action.trigger()
    wait_state(qtbot, window, RunState.READY)
    assert window.bridge.ledger_snapshot().is_empty
    assert window.plan_panel.execution is None


def test_cancel_mid_run_returns_to_idle_with_the_ledger_at_zero(
    make_window: Callable[..., Any],
    qtbot: Any,
    tmp_path: Path,
    loop_manifest: Path,
    endless_inputs: Path,
) -> None:
    pipeline = write_pipeline(
        tmp_path / "loop.yaml", StageSpec(loop_manifest, max_io="4MiB"), name="endless_loop"
    )
    window = make_window()
    open_pipeline(qtbot, window, pipeline)
    assert window.load_inputs(endless_inputs)
    assert window.run_pane.tensor_inputs.source_label.text() == f"From {endless_inputs}"
    with qtbot.waitSignal(window.bridge.run_started, timeout=60_000):
        qtbot.mouseClick(window.run_pane.run_button, Qt.MouseButton.LeftButton)
    assert window.cancel_action.isEnabled()
    assert window.run_pane.cancel_button.isEnabled()
    assert not window.run_pane.run_button.isEnabled()
    execution = window.plan_panel.execution
    assert execution is not None
    pid = execution.stages[0].pid
    assert pid is not None
    qtbot.waitUntil(lambda: _cpu_seconds(pid) > 0.5, timeout=30_000)  # the call is computing

    with qtbot.waitSignal(window.bridge.run_finished, timeout=30_000) as finished:
        qtbot.keyClick(window, Qt.Key.Key_Escape)
    assert finished.args[0].status == "cancelled"
    # The worker of an active call is retired, so the studio unloads the pipeline.
    wait_state(qtbot, window, RunState.READY)
    assert window.run_action.isEnabled()
    assert not window.cancel_action.isEnabled()
    assert window.output.status.text() == "cancelled"
    assert window.bridge.ledger_snapshot().is_empty
    assert window.devices_panel.ledger.is_empty
    assert window.ledger_label.text() == "ledger: nothing reserved"
    qtbot.waitUntil(lambda: _gone(pid), timeout=10_000)


def test_an_admission_refusal_shows_a_banner_that_opens_the_devices_panel(
    make_window: Callable[..., Any], qtbot: Any, demo_root: Path, tmp_path: Path
) -> None:
    manifest = demo_root / "bundles" / "add" / "manifest.json"
    pipeline = write_pipeline(
        tmp_path / "big.yaml",
        StageSpec(manifest, capacity="64MiB", demand="128MiB"),
        name="too_big",
    )
    window = make_window()
    info = open_pipeline(qtbot, window, pipeline)
    assert not info.plan.admitted
    assert window.run_pane.fit_chip.text() == "Refused"
    assert "machine:ram needs 128.0 MiB" in window.run_pane.fit_label.text()
    with qtbot.waitSignal(window.bridge.error, timeout=30_000) as error:
        window.run_action.trigger()
    assert error.args[0].kind == "AdmissionRefused"
    wait_state(qtbot, window, RunState.READY)
    assert window.banner.isVisible()
    assert window.banner.title.text() == "Not enough memory for this plan"
    assert "machine:ram" in window.banner.message.text()
    assert window.banner.action_button.text() == ErrorAction.OPEN_DEVICES.value
    window.show_panel("log")
    qtbot.mouseClick(window.banner.action_button, Qt.MouseButton.LeftButton)
    assert window.current_panel() == "devices"
    assert window.output.status.text() == "failed"
    assert window.bridge.ledger_snapshot().is_empty
    qtbot.mouseClick(window.banner.close_button, Qt.MouseButton.LeftButton)
    assert not window.banner.isVisible()


def test_a_placement_refusal_shows_a_banner_that_opens_the_plan(
    make_window: Callable[..., Any], qtbot: Any, demo_root: Path, tmp_path: Path
) -> None:
    manifest = demo_root / "bundles" / "mlp-stage0" / "manifest.json"
    pipeline = write_pipeline(
        tmp_path / "split.yaml",
        StageSpec(
            manifest,
            worker=str(PLACEMENT_WORKER),
            env={"PLACEMENT_MOVE_TO": "AzureExecutionProvider"},
        ),
        name="split",
    )
    window = make_window()
    open_pipeline(qtbot, window, pipeline)
    with qtbot.waitSignal(window.bridge.error, timeout=60_000) as error:
        window.run_action.trigger()
    assert (
        error.args[0].kind == "PlacementViolation" or error.args[0].action is ErrorAction.SHOW_PLAN
    )
    wait_state(qtbot, window, RunState.READY)
    assert window.banner.action_button.text() == ErrorAction.SHOW_PLAN.value
    assert "AzureExecutionProvider" in window.banner.message.text()
    qtbot.mouseClick(window.banner.action_button, Qt.MouseButton.LeftButton)
    assert window.current_panel() == "plan"
    assert window.bridge.ledger_snapshot().is_empty


def test_a_device_subset_change_persists_across_a_restart(
    make_window: Callable[..., Any], qtbot: Any, demo_root: Path, user_dirs: Path
) -> None:
    window = make_window()
    wait_topology(qtbot, window)
    open_pipeline(qtbot, window, demo_root / "pipelines" / "add.yaml")
    cpu = next(device for device in window.devices_panel.topology.devices if device.kind == "cpu")
    box = window.devices_panel.checkboxes[cpu.physical_id]
    assert box.isChecked()
    with qtbot.waitSignal(window.bridge.plan_changed, timeout=30_000) as replanned:
        box.click()
    assert not replanned.args[0].admitted
    assert any("excluded by your device selection" in text for text in replanned.args[0].refusals)
    assert window.run_pane.fit_chip.text() == "Refused"
    # Saved where the CLI reads it, and mirrored in the studio's settings.
    assert load_selection() == DeviceSelection(frozenset())
    assert (user_dirs / "devices.json").is_file()
    assert window.settings.allowed_devices == []
    with qtbot.waitSignal(window.bridge.shut_down, timeout=30_000):
        window.close()

    again = make_window()
    wait_topology(qtbot, again)
    assert not again.devices_panel.checkboxes[cpu.physical_id].isChecked()
    assert "only the checked devices" in again.devices_panel.selection_label.text()
    open_pipeline(qtbot, again, demo_root / "pipelines" / "add.yaml")
    with qtbot.waitSignal(again.bridge.error, timeout=30_000) as error:
        again.run_action.trigger()
    assert error.args[0].action is ErrorAction.OPEN_DEVICES
    wait_state(qtbot, again, RunState.READY)
    with qtbot.waitSignal(again.bridge.plan_changed, timeout=30_000) as replanned:
        again.devices_panel.checkboxes[cpu.physical_id].click()
    assert replanned.args[0].admitted
    assert load_selection() == DeviceSelection()
    assert again.settings.allowed_devices is None


def test_closing_the_window_during_a_run_cancels_and_leaves_nothing(
    make_window: Callable[..., Any],
    qtbot: Any,
    tmp_path: Path,
    loop_manifest: Path,
    endless_inputs: Path,
) -> None:
    pipeline = write_pipeline(
        tmp_path / "loop.yaml", StageSpec(loop_manifest, max_io="4MiB"), name="endless_loop"
    )
    window = make_window()
    open_pipeline(qtbot, window, pipeline)
    assert window.load_inputs(endless_inputs)
    with qtbot.waitSignal(window.bridge.run_started, timeout=60_000):
        window.run_action.trigger()
    pid = window.plan_panel.execution.stages[0].pid
    with qtbot.waitSignal(window.closed, timeout=30_000):
        window.close()
    assert window.bridge.state is RunState.CLOSED
    assert not window.isVisible()
    assert window.bridge.ledger_snapshot().is_empty
    assert _gone(pid)


def test_a_dropped_manifest_opens_as_a_one_stage_pipeline(
    make_window: Callable[..., Any], qtbot: Any, demo_root: Path
) -> None:
    window = make_window()
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(demo_root / "bundles" / "add" / "manifest.json"))])
    enter = QDragEnterEvent(
        window.rect().center(),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    window.dragEnterEvent(enter)
    assert enter.isAccepted()
    drop = QDropEvent(
        QPointF(window.rect().center()),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    with qtbot.waitSignal(window.bridge.pipeline_opened, timeout=30_000) as opened:
        window.dropEvent(drop)
    info = opened.args[0]
    assert info.origin == "bundle"
    assert info.name == "bundle_add"
    assert "one-stage pipeline" in window.run_pane.path_label.text()
    assert list(info.example_inputs) == ["a", "b"]
    assert info.plan.admitted


def test_the_window_follows_the_system_colour_scheme(
    make_window: Callable[..., Any], qtbot: Any
) -> None:
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    original = app.palette()
    stop = follow_system_scheme(app)
    try:
        window = make_window()
        hints = QGuiApplication.styleHints()
        hints.colorSchemeChanged.emit(Qt.ColorScheme.Dark)
        assert app.palette().color(QPalette.ColorRole.Window).lightness() < 80
        qtbot.waitUntil(
            lambda: window.output.waveform.backgroundBrush().color().lightness() < 80, timeout=2000
        )
        hints.colorSchemeChanged.emit(Qt.ColorScheme.Light)
        assert app.palette().color(QPalette.ColorRole.Window).lightness() > 180
        qtbot.waitUntil(
            lambda: window.output.waveform.backgroundBrush().color().lightness() > 180, timeout=2000
        )
    finally:
        stop()
        app.setPalette(original)


def test_the_stall_monitor_measures_a_blocked_event_loop(qtbot: Any) -> None:
    import time

    from app.stall import StallMonitor

    monitor = StallMonitor(interval_ms=10)
    monitor.start()
    try:
        with qtbot.waitSignal(monitor.stall, timeout=5000) as stalled:
            # Block the GUI thread on purpose: this is the stall being measured, not a wait.
            qtbot.waitUntil(lambda: monitor.stats().samples >= 3, timeout=2000)
            time.sleep(0.12)
        assert stalled.args[0] >= 100.0
        stats = monitor.stats()
        assert stats.max_ms >= 100.0
        assert stats.over_50ms >= 1
    finally:
        monitor.stop()


def test_an_unexpected_failure_is_reported_and_the_studio_stays_usable(
    make_window: Callable[..., Any], qtbot: Any, demo_root: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    (tmp_path / "broken_transform.py").write_text(
        "raise RuntimeError('this module cannot be imported')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    text = (demo_root / "pipelines" / "mlp-chain.yaml").read_text()
    text = text.replace("runtime.adapters.tensor:mlp_handoff", "broken_transform:handoff")
    pipeline = tmp_path / "broken.yaml"
    pipeline.write_text(text.replace("../bundles/", f"{demo_root}/bundles/"))
    window = make_window()
    with qtbot.waitSignal(window.bridge.error, timeout=30_000) as error:
        window.open_path(pipeline)
    assert error.args[0].title == "Unexpected RuntimeError"
    assert error.args[0].action is ErrorAction.SHOW_LOG
    wait_state(qtbot, window, RunState.EMPTY)
    assert window.banner.isVisible()
    assert "this module cannot be imported" in window.banner.message.text()
    assert "this module cannot be imported" in window.log_panel.text()
    info = open_pipeline(qtbot, window, demo_root / "pipelines" / "add.yaml")
    assert info.name == "demo_add"
