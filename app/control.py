"""The plumbing the bridge runs on: the one hop into the GUI thread, the thread that makes its
blocking runtime calls, and the handler that forwards log records. None knows the runtime;
:mod:`app.bridge` owns them all."""

from __future__ import annotations

import logging
import queue
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Qt, QThread, Signal

from app.models import LogLine

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

log = logging.getLogger("omni.studio.bridge")


class GuiHop(QObject):
    """The studio's one hop into the GUI thread: :meth:`post` queues a callback (from any
    thread) that Qt runs on the GUI thread, in posting order. Every part of the bridge reaches
    the GUI through it, so what the runtime's threads report arrives in the order it happened."""

    _posted = Signal(object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._posted.connect(self._run, Qt.ConnectionType.QueuedConnection)

    def post(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the GUI thread (from any thread, never waits)."""
        self._posted.emit(callback)

    def _run(self, callback: Callable[[], None]) -> None:
        callback()


class ControlThread(QThread):
    """Runs the bridge's blocking runtime calls one at a time, in submission order."""

    def __init__(self, parent: QObject, on_error: Callable[[BaseException], None]) -> None:
        super().__init__(parent)
        self.setObjectName("omni-studio-control")
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._on_error = on_error

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def stop(self) -> None:
        """Finish the queued jobs, then end the thread."""
        self._jobs.put(None)

    def run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except Exception as exc:  # one failing job must not end the thread; it is reported
                log.exception("studio control job %r failed", job)
                self._on_error(exc)


class LogForwarder(logging.Handler):
    """Forwards runtime log records (from any thread) to a callback."""

    def __init__(self, forward: Callable[[LogLine], None]) -> None:
        super().__init__(logging.INFO)
        self._forward = forward

    def attach(self, names: Iterable[str]) -> Callable[[], None]:
        """Forward these loggers' records from INFO up; returns what restores them."""
        levels = {name: logging.getLogger(name).level for name in names}
        for name, level in levels.items():
            logger = logging.getLogger(name)
            if level == logging.NOTSET or level > logging.INFO:
                logger.setLevel(logging.INFO)
            logger.addHandler(self)

        def detach() -> None:
            for name, level in levels.items():
                logging.getLogger(name).removeHandler(self)
                logging.getLogger(name).setLevel(level)

        return detach

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                text = f"{text}: {record.exc_info[1]}"
            self._forward(LogLine(record.created, record.levelname, record.name, text))
        except (TypeError, ValueError, RuntimeError):  # a bad record, or the bridge is gone
            self.handleError(record)
