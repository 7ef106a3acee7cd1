"""A stall monitor: how late the GUI event loop runs a periodic timer.

A precise timer asks to run every ``interval_ms``; each time it runs, the delay beyond
the interval is the event loop's lateness (work or a block on the GUI thread). The
benchmark suite and ``--self-test`` read :meth:`StallMonitor.stats`.
"""

from __future__ import annotations

import time

import numpy as np
from PySide6.QtCore import QObject, Qt, QTimer, Signal

from app.models import StallStats

STALL_MS = 50.0
#: Older samples are dropped (half at a time) beyond this many (about 17 minutes at 10 ms).
MAX_SAMPLES = 100_000


class StallMonitor(QObject):
    """Measures event-loop lateness while running."""

    stall = Signal(float)  # lateness in ms of one tick that exceeded STALL_MS

    def __init__(self, interval_ms: int = 10, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.interval_ms = interval_ms
        self._timer = QTimer(self)
        self._timer.setTimerType(Qt.TimerType.PreciseTimer)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self._tick)
        self._last: float | None = None
        self._lateness: list[float] = []
        self._at: list[float] = []

    def start(self) -> None:
        self._last = time.perf_counter()
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()
        self._last = None

    @property
    def running(self) -> bool:
        return self._timer.isActive()

    def reset(self) -> None:
        self._lateness.clear()
        self._at.clear()
        if self._last is not None:
            self._last = time.perf_counter()

    def _tick(self) -> None:
        now = time.perf_counter()
        if self._last is not None:
            late = max(0.0, (now - self._last) * 1e3 - self.interval_ms)
            if len(self._lateness) >= MAX_SAMPLES:
                del self._lateness[: MAX_SAMPLES // 2], self._at[: MAX_SAMPLES // 2]
            self._lateness.append(late)
            self._at.append(now)
            if late > STALL_MS:
                self.stall.emit(late)
        self._last = now

    def stats(self, last_s: float | None = None) -> StallStats:
        """Lateness since start or reset, or over the last ``last_s`` seconds."""
        samples = np.asarray(self._lateness, dtype=np.float64)
        if last_s is not None and samples.size:
            since = time.perf_counter() - last_s
            samples = samples[np.searchsorted(np.asarray(self._at), since) :]
        if samples.size == 0:
            return StallStats(0, float(self.interval_ms), 0.0, 0.0, 0.0, 0)
        return StallStats(
            samples=int(samples.size),
            interval_ms=float(self.interval_ms),
            mean_ms=float(samples.mean()),
            p99_ms=float(np.percentile(samples, 99)),
            max_ms=float(samples.max()),
            over_50ms=int((samples > STALL_MS).sum()),
        )
