"""The bridge's one hop: whatever a runtime thread reports reaches the widgets on the GUI thread,
through the bridge's one hop, for the bridge and each of its parts."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Qt, Signal

from app.models import RunState
from tests.app.support import open_pipeline, wait_state

if TYPE_CHECKING:
    from collections.abc import Callable

APP = Path(__file__).resolve().parents[2] / "app"


def _signals(part: QObject) -> list[str]:
    names: set[str] = set()
    for cls in type(part).__mro__:
        names.update(
            name
            for name, value in vars(cls).items()
            if isinstance(value, Signal) and not name.startswith("_")
        )
    return sorted(names - {"destroyed", "objectNameChanged"})


def _record_threads(part: QObject, seen: list[tuple[str, bool]]) -> None:
    """Note, for each of ``part``'s signals as it is emitted, whether on the GUI thread."""
    for name in _signals(part):

        def record(*_args: object, name: str = name) -> None:
            seen.append((name, threading.current_thread() is threading.main_thread()))

        getattr(part, name).connect(record, Qt.ConnectionType.DirectConnection)


def test_every_signal_of_the_bridge_and_its_parts_is_emitted_on_the_gui_thread(
    make_window: Callable[..., Any], qtbot: Any, demo_root: Path
) -> None:
    window = make_window()
    bridge = window.bridge
    seen: list[tuple[str, bool]] = []
    parts = (bridge, bridge.imports, bridge.setup_jobs, bridge.recorder)
    for part in parts:
        _record_threads(part, seen)
    open_pipeline(qtbot, window, demo_root / "pipelines" / "add.yaml")
    with qtbot.waitSignal(bridge.run_finished, timeout=60_000) as finished:
        assert bridge.run()
    assert finished.args[0].status == "completed"
    wait_state(qtbot, window, RunState.LOADED)
    assert bridge.unload()
    wait_state(qtbot, window, RunState.READY)
    with qtbot.waitSignal(bridge.shut_down, timeout=30_000):
        window.close()

    emitted = {name for name, _gui in seen}
    # The ledger's reservations, the loading events and the outputs come from runtime threads.
    assert {
        "ledger_changed",
        "load_progress",
        "execution_changed",
        "run_started",
        "tensors_ready",
        "metrics_changed",
        "run_finished",
        "log_line",
        "topology_changed",
        "shut_down",
    } <= emitted
    assert sorted({name for name, gui in seen if not gui}) == []


def test_the_bridges_parts_reach_the_gui_only_through_its_one_hop() -> None:
    for path in sorted(APP.glob("bridge*.py")):
        text = path.read_text(encoding="utf-8")
        assert "QueuedConnection" not in text, path
    assert (APP / "control.py").read_text(encoding="utf-8").count("QueuedConnection") == 1
