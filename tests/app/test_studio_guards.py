"""Guards of the studio's rules: the thread-leak check works, the Qt binding keeps reference
counts, and only the bridge talks to the runtime's engine, through the session."""

from __future__ import annotations

import ast
import sys
import threading
from pathlib import Path

from PySide6.QtCore import QObject, QThread, Signal
from PySide6.QtWidgets import QApplication

from tests.app.support import running_threads

APP = Path(__file__).resolve().parents[2] / "app"


class _Blocked(QThread):
    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def run(self) -> None:
        self.release.wait(30)


def test_the_thread_guard_reports_a_qthread_left_running(no_leaked_threads: list[QThread]) -> None:
    before = {thread.ident for thread in threading.enumerate() if thread.ident is not None}
    thread = _Blocked()
    thread.setObjectName("left-running")
    thread.start()
    assert thread in no_leaked_threads  # QThread.start is tracked during every studio test
    assert running_threads([thread], before, grace_ms=50) == ["QThread left-running"]
    thread.release.set()
    assert thread.wait(5000)
    assert running_threads([thread], before, grace_ms=50) == []


def test_the_thread_guard_reports_a_python_thread_left_running() -> None:
    before = {thread.ident for thread in threading.enumerate() if thread.ident is not None}
    release = threading.Event()
    worker = threading.Thread(target=release.wait, args=(30,), name="left-behind")
    worker.start()
    # A thread of an earlier test that ended meanwhile may have left its ident to this one.
    before.discard(worker.ident)
    # Threads an earlier test's cleanup still runs may be listed too: only this one is ours.
    assert "thread left-behind" in running_threads([], before, grace_ms=50)
    release.set()
    worker.join(5)
    assert "thread left-behind" not in running_threads([], before, grace_ms=50)


class _Emitter(QObject):
    value = Signal(object)


def test_the_qt_binding_keeps_reference_counts(qapp: QApplication) -> None:
    """PySide6 6.12.0 dropped a reference to None per processEvents and to a bool per emit,
    which crashed the studio after a few runs; the pinned binding must not."""
    emitter = _Emitter()
    received: list[object] = []
    emitter.value.connect(received.append)
    counts = (sys.getrefcount(None), sys.getrefcount(True), sys.getrefcount(False))
    for _ in range(2000):
        qapp.processEvents()
        emitter.value.emit(1)
    assert len(received) == 2000
    after = (sys.getrefcount(None), sys.getrefcount(True), sys.getrefcount(False))
    assert all(abs(now - then) < 50 for now, then in zip(after, counts, strict=True)), (
        counts,
        after,
    )


def _runtime_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.startswith("runtime")}


def test_the_studio_reaches_the_engine_only_through_the_bridges_session() -> None:
    """No studio module imports the engine; only the bridge's parts import the session."""
    offenders = {}
    for path in sorted(APP.rglob("*.py")):
        names = _runtime_imports(path)
        engine = {name for name in names if name.startswith("runtime.engine")}
        if not path.name.startswith("bridge"):
            engine |= {name for name in names if name.startswith("runtime.api")}
        if engine:
            offenders[str(path.relative_to(APP.parent))] = sorted(engine)
    assert offenders == {}
    assert "runtime.api" in _runtime_imports(APP / "bridge_pipelines.py")
    assert "runtime.events" in _runtime_imports(APP / "bridge.py")


def test_widgets_do_not_subscribe_to_runtime_callbacks() -> None:
    for path in sorted((APP / "widgets").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        calls = [
            node.func.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        ]
        assert "subscribe" not in calls, path
        assert not _runtime_imports(path) - {"runtime.ledger"}, path
