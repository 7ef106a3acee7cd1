"""The Metrics panel: time to first audio, real-time factor, underruns, per-stage latency, and
a spoken conversation's latency turn by turn."""

from __future__ import annotations

import os

os.environ.setdefault("PYQTGRAPH_QT_LIB", "PySide6")

from typing import TYPE_CHECKING

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QTimer
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QFrame, QGridLayout, QLabel, QVBoxLayout, QWidget

from app.models import RequestMetrics
from app.widgets.common import format_seconds, readonly_table, set_row

if TYPE_CHECKING:
    from collections.abc import Sequence

    from app.models import StallStats
    from app.voice_presenters import TurnLatencyRow

#: The turn table's columns after the turn, and what each measures.
TURN_COLUMNS = (
    ("End of turn", "from the end of your speech to the turn's end being known (the silence)"),
    ("Transcription", "the transcription still to finish when the turn ended"),
    ("First clause", "the language model's first clause of the reply"),
    ("First audio", "the voice's first audio of the reply"),
    ("Player lead", "from that audio's arrival to its first sample handed to the device"),
    ("Total", "from the end of your speech to the reply's first sample at the device"),
)
#: Metrics arrive per stage call; the panel redraws at most this often.
REFRESH_MS = 100
QUEUE_COLOR = (150, 150, 160)
RUN_COLOR = (52, 120, 216)
TRANSFER_COLOR = (232, 150, 40)


class MetricTile(QFrame):
    """A big number with a caption."""

    def __init__(self, caption: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.value = QLabel("-")
        font = self.value.font()
        font.setPointSizeF(font.pointSizeF() * 1.6)
        font.setBold(True)
        self.value.setFont(font)
        self.caption = QLabel(caption)
        self.caption.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.addWidget(self.value)
        layout.addWidget(self.caption)

    def set_value(self, text: str, tooltip: str = "") -> None:
        self.value.setText(text)
        self.setToolTip(tooltip)


class StageLatencyChart(pg.PlotWidget):  # type: ignore[misc]  # pyqtgraph has no type hints
    """Stacked bars per stage: queue, run and transfer time of the request, in ms."""

    SERIES = (("queue", QUEUE_COLOR), ("run", RUN_COLOR), ("transfer", TRANSFER_COLOR))

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumHeight(170)
        plot = self.getPlotItem()
        plot.setMenuEnabled(False)
        plot.hideButtons()
        plot.setMouseEnabled(x=False, y=False)
        plot.showGrid(y=True, alpha=0.15)
        plot.setLabel("left", "time (ms)")
        plot.getAxis("left").enableAutoSIPrefix(False)
        self.legend = plot.addLegend(offset=(10, 4), colCount=3)
        # The bars are made once and updated in place: rebuilding pyqtgraph items is slow.
        self.bars: list[pg.BarGraphItem] = []
        for name, color in self.SERIES:
            bar = pg.BarGraphItem(
                x=[], y0=[], height=[], width=0.55, brush=pg.mkBrush(*color), pen=pg.mkPen(None)
            )
            plot.addItem(bar)
            self.legend.addItem(bar, name)
            self.bars.append(bar)
        self.stage_names: list[str] = []
        self.totals_ms: np.ndarray = np.zeros(0)
        self._restyle()

    def show_stages(self, metrics: RequestMetrics) -> None:
        plot = self.getPlotItem()
        stages = metrics.stages
        names = [stage.stage for stage in stages]
        x = np.arange(len(stages), dtype=np.float64)
        series = [
            np.array([stage.queue_s * 1e3 for stage in stages]),
            np.array([stage.run_s * 1e3 for stage in stages]),
            np.array([stage.transfer_s * 1e3 for stage in stages]),
        ]
        bottom = np.zeros(len(stages))
        for bar, values in zip(self.bars, series, strict=True):
            bar.setOpts(x=x, y0=bottom.copy(), height=values)
            bottom = bottom + values
        self.totals_ms = bottom
        if names != self.stage_names:
            self.stage_names = names
            plot.getAxis("bottom").setTicks([[(float(i), name) for i, name in enumerate(names)]])
            plot.setXRange(-0.6, max(0.6, len(stages) - 0.4))
        # Headroom above the tallest bar keeps the legend clear of it.
        plot.setYRange(0, max(1e-3, float(bottom.max()) * 1.3) if len(stages) else 1.0)

    def _restyle(self) -> None:
        palette = self.palette()
        self.setBackground(palette.color(QPalette.ColorRole.Base))
        pen = pg.mkPen(palette.color(QPalette.ColorRole.Text))
        for name in ("left", "bottom"):
            axis = self.getPlotItem().getAxis(name)
            axis.setPen(pen)
            axis.setTextPen(pen)
        self.legend.setLabelTextColor(palette.color(QPalette.ColorRole.Text))

    def changeEvent(self, event: QEvent) -> None:
        # Qt sends palette changes during construction, before the plot items exist.
        if event.type() == QEvent.Type.PaletteChange and "legend" in self.__dict__:
            self._restyle()
        super().changeEvent(event)


class MetricsPanel(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.metrics: RequestMetrics | None = None
        self.first_audio = MetricTile("time to first audio")
        self.rtf = MetricTile("real-time factor")
        self.underruns = MetricTile("playback underruns")
        self.elapsed = MetricTile("request time")
        self.audio = MetricTile("audio produced")
        self.lateness = MetricTile("UI event-loop lateness, last 10 s (p99 / max)")
        tiles = QGridLayout()
        for index, tile in enumerate(
            (self.first_audio, self.rtf, self.underruns, self.elapsed, self.audio, self.lateness)
        ):
            tiles.addWidget(tile, index // 3, index % 3)
        self.chart = StageLatencyChart()
        self.table = readonly_table(["Stage", "Calls", "Queue", "Run", "Transfer", "Total"])
        self.status = QLabel("No request yet.")
        self.turns_title = QLabel(
            "Spoken conversation: each turn's wait from the end of your speech (its parts come "
            "with the conversation's end)"
        )
        self.turns_title.setWordWrap(True)
        self.turns = readonly_table(["Turn", *(name for name, _tip in TURN_COLUMNS)])
        for column, (_name, tip) in enumerate(TURN_COLUMNS, start=1):
            header = self.turns.horizontalHeaderItem(column)
            if header is not None:
                header.setToolTip(tip)
        self.turn_rows: tuple[TurnLatencyRow, ...] = ()
        layout = QVBoxLayout(self)
        layout.addLayout(tiles)
        layout.addWidget(self.status)
        layout.addWidget(QLabel("Per-stage latency of the last request"))
        layout.addWidget(self.chart, 3)
        layout.addWidget(self.table, 2)
        layout.addWidget(self.turns_title)
        layout.addWidget(self.turns, 2)
        self.show_turns(())
        self.set_underruns(0)
        self._refresh = QTimer(self)
        self._refresh.setSingleShot(True)
        self._refresh.setInterval(REFRESH_MS)
        self._refresh.timeout.connect(self._redraw)

    def clear(self) -> None:
        self.metrics = None
        self._refresh.stop()
        for tile in (self.first_audio, self.rtf, self.elapsed, self.audio):
            tile.set_value("-")
        self.set_underruns(0)
        self.table.setRowCount(0)
        self.chart.show_stages(RequestMetrics("", 0.0, None, 0.0, 0, ()))
        self.status.setText("Waiting for the request…")

    def show_metrics(self, metrics: RequestMetrics) -> None:
        """Keep the latest metrics; the view redraws at most every REFRESH_MS."""
        self.metrics = metrics
        if not self._refresh.isActive():
            self._refresh.start()

    def _redraw(self) -> None:
        metrics = self.metrics
        if metrics is None:
            return
        self.first_audio.set_value(
            format_seconds(metrics.first_audio_s),
            "from submitting the request to its first audio chunk",
        )
        rtf = metrics.real_time_factor
        self.rtf.set_value(
            "-" if rtf is None else f"{rtf:.3f}",
            "time to produce the audio so far over its duration; below 1 is faster than real time",
        )
        self.elapsed.set_value(format_seconds(metrics.elapsed_s))
        self.audio.set_value(
            "-" if metrics.chunks == 0 else f"{metrics.audio_s:.2f} s", f"{metrics.chunks} chunk(s)"
        )
        self.status.setText(f"Request {metrics.request_id}: {metrics.status}")
        self.chart.show_stages(metrics)
        self.table.setRowCount(0)
        for row, stage in enumerate(metrics.stages):
            total = stage.queue_s + stage.run_s + stage.transfer_s
            set_row(
                self.table,
                row,
                [
                    stage.stage,
                    str(stage.calls),
                    format_seconds(stage.queue_s),
                    format_seconds(stage.run_s),
                    format_seconds(stage.transfer_s),
                    format_seconds(total),
                ],
            )
        self.table.resizeColumnsToContents()

    def show_turns(self, rows: Sequence[TurnLatencyRow]) -> None:
        """A spoken conversation's turns (none: the table is hidden)."""
        self.turn_rows = tuple(rows)
        self.turns_title.setVisible(bool(rows))
        self.turns.setVisible(bool(rows))
        self.turns.setRowCount(0)
        for index, row in enumerate(rows):
            parts = (row.end_of_turn_s, row.transcription_s, row.first_clause_s, row.first_audio_s)
            known = row.first_audio_s is not None
            cells = [
                f"{row.turn}" + (" (interrupted)" if row.interrupted else ""),
                *(format_seconds(part) if known else "…" for part in parts),
                format_seconds(row.player_lead_s),
                format_seconds(row.total_s) if known else "…",
            ]
            set_row(self.turns, index, cells)
        self.turns.resizeColumnsToContents()

    def set_underruns(self, count: int) -> None:
        self.underruns.set_value(
            str(count), "times playback ran out of audio before the request ended"
        )

    def show_stalls(self, stats: StallStats) -> None:
        if stats.samples:
            self.lateness.set_value(
                f"{stats.p99_ms:.1f} / {stats.max_ms:.1f} ms",
                f"{stats.samples} ticks of {stats.interval_ms:.0f} ms; "
                f"{stats.over_50ms} over 50 ms; mean {stats.mean_ms:.2f} ms",
            )
