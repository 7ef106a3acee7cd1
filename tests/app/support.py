"""Helpers for the studio tests: waiting on the bridge's signals (never on sleeps)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import shiboken6

if TYPE_CHECKING:
    from pathlib import Path

    from PySide6.QtCore import QThread

#: How long a test's threads get to finish after it ends.
THREAD_GRACE_MS = 5000


def wait_state(qtbot: Any, window: Any, *states: Any, timeout: int = 60_000) -> None:
    """Wait (on the bridge's state signal) until the studio is in one of ``states``."""
    bridge = window.bridge
    if bridge.state in states:
        return
    with qtbot.waitSignal(
        bridge.state_changed, timeout=timeout, check_params_cb=lambda state: state in states
    ):
        pass


def wait_topology(qtbot: Any, window: Any) -> None:
    if window.devices_panel.topology is None:
        with qtbot.waitSignal(window.bridge.topology_changed, timeout=30_000):
            pass


def open_pipeline(qtbot: Any, window: Any, path: Path) -> Any:
    """Open ``path`` in the window and return the opened PipelineInfo."""
    with qtbot.waitSignal(window.bridge.pipeline_opened, timeout=30_000) as blocker:
        assert window.open_path(path)
    return blocker.args[0]


def running_threads(
    started: list[QThread], before: set[int], grace_ms: int = THREAD_GRACE_MS
) -> list[str]:
    """QThreads from ``started`` and Python threads not in ``before`` that are still running,
    after giving each up to ``grace_ms`` to finish."""
    leaked = []
    for thread in started:
        if shiboken6.isValid(thread) and thread.isRunning() and not thread.wait(grace_ms):
            leaked.append(f"QThread {thread.objectName() or type(thread).__name__}")
    for thread in threading.enumerate():
        # Dummy threads are foreign (Qt) threads Python saw running code; QThreads are checked above.
        if (
            thread.ident in before
            or thread is threading.current_thread()
            or isinstance(thread, threading._DummyThread)
        ):
            continue
        thread.join(grace_ms / 1000)
        if thread.is_alive():
            leaked.append(f"thread {thread.name}")
    return leaked
