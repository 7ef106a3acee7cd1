"""What is loading and for how long: one line per stage of the load under way (or the last
one), from the bridge's ``LoadView`` values. The seconds count on a timer of the widget's
own, so the view never waits on the runtime; the runtime's events only change the phases."""

from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QFrame, QLabel, QProgressBar, QVBoxLayout, QWidget

from app.widgets.common import BAD, NEUTRAL, OK, WARN, dim

if TYPE_CHECKING:
    from app.models import LoadView, StageLoadView

#: How often the seconds are redrawn while a load is under way.
TICK_MS = 500
_PHASE_COLOURS = {"ready": OK, "failed": BAD, "preparing": NEUTRAL}


class LoadingView(QFrame):
    """A load's stages, each with its phase and seconds; hidden while there is none."""

    def __init__(self, parent: QWidget | None = None, *, hide_when_ready: bool = False) -> None:
        super().__init__(parent)
        #: The conversation view steps aside once the model answers; the Run view keeps the
        #: stages' load times.
        self.hide_when_ready = hide_when_ready
        self.snapshot: LoadView | None = None
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.summary = QLabel("")
        self.summary.setWordWrap(True)
        self.rows = QLabel("")
        self.rows.setWordWrap(True)
        dim(self.rows)
        self.bar = QProgressBar()
        self.bar.setRange(0, 0)  # busy: how long a worker takes is not known in advance
        self.bar.setTextVisible(False)
        self.bar.setMaximumHeight(6)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        layout.setSpacing(4)
        layout.addWidget(self.summary)
        layout.addWidget(self.bar)
        layout.addWidget(self.rows)
        self._timer = QTimer(self)
        self._timer.setInterval(TICK_MS)
        self._timer.timeout.connect(self.redraw)
        self.hide()

    def show_snapshot(self, snapshot: LoadView | None) -> None:
        """The bridge's latest value (None: no load to show)."""
        self.snapshot = snapshot
        visible = snapshot is not None and not (self.hide_when_ready and snapshot.status == "ready")
        self.setVisible(visible)
        if snapshot is not None and snapshot.loading:
            self._timer.start()
        else:
            self._timer.stop()
        self.redraw()

    def lines(self, now: float | None = None) -> list[str]:
        """The stages' lines as shown (for people and tests)."""
        if self.snapshot is None:
            return []
        return self.snapshot.lines(time.monotonic() if now is None else now)

    def redraw(self) -> None:
        snapshot = self.snapshot
        if snapshot is None:
            self.summary.setText("")
            self.rows.setText("")
            return
        now = time.monotonic()
        colour = {"ready": OK, "failed": BAD}.get(snapshot.status, WARN)
        self.summary.setText(f'<b style="color:{colour}">{html.escape(snapshot.summary(now))}</b>')
        self.bar.setVisible(snapshot.loading)
        self.rows.setText("<br>".join(_row(stage, now) for stage in snapshot.stages))


def _row(stage: StageLoadView, now: float) -> str:
    colour = _PHASE_COLOURS.get(stage.phase, WARN)
    return f'<span style="color:{colour}">●</span> {html.escape(stage.line(now))}'
