"""The output area: streaming text, a growing waveform with playback, tensor results."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

import numpy as np
import numpy.ma

os.environ.setdefault("PYQTGRAPH_QT_LIB", "PySide6")

import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QDoubleValidator, QPalette
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QStyle,
    QVBoxLayout,
    QWidget,
)

from app.models import (
    Comparison,
    ReceivedAudio,
    TensorResults,
    TextChunk,
    Tolerance,
    compare_outputs,
)
from app.widgets.common import BAD, NEUTRAL, OK, StatusChip, dim, readonly_table, set_row

if TYPE_CHECKING:
    from collections.abc import Mapping

    from app.playback import AudioOutput, OutputDevice


#: The waveform redraws at most this often while chunks arrive (and never faster than the
#: screen refreshes).
REDRAW_MS = 40
#: Samples per envelope bin at first; the bins double whenever there are more than
#: :data:`MAX_BINS`, so a redraw costs the same however long the audio grows.
FIRST_BIN = 64
MAX_BINS = 2048


class StreamingTextView(QPlainTextEdit):
    """Text that grows as chunks arrive.

    A chunk whose text starts with everything shown so far replaces it (cumulative
    streams); any other chunk is appended (delta streams).
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setPlaceholderText("Streamed text appears here as the pipeline produces it.")
        self.chunks = 0

    def clear_text(self) -> None:
        self.chunks = 0
        self.setPlainText("")

    def append_chunk(self, chunk: TextChunk) -> None:
        self.chunks += 1
        current = self.toPlainText()
        if current and chunk.text.startswith(current):
            addition = chunk.text[len(current) :]
        else:
            addition = chunk.text
        cursor = self.textCursor()
        cursor.movePosition(cursor.MoveOperation.End)
        cursor.insertText(addition)
        self.setTextCursor(cursor)
        self.ensureCursorVisible()


class WaveformView(pg.PlotWidget):  # type: ignore[misc]  # pyqtgraph has no type hints
    """A waveform that grows as audio chunks arrive (seconds on x, amplitude on y).

    Each chunk is folded into a min/max envelope as it arrives (work proportional to the
    chunk); the curve draws that envelope, at most :data:`MAX_BINS` bins of two points each,
    on a timer no faster than the display, so neither a chunk nor a redraw costs more as the
    audio grows."""

    grew = Signal(int)  # samples drawn

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumHeight(140)
        self.samples = np.zeros(0, np.float32)
        self._length = 0
        self.sample_rate = 0
        self.chunks = 0
        self.drawn_samples = 0
        self._reset_envelope()
        self._boundaries: list[float] = []
        # Chunks can arrive faster than the screen refreshes; redraw at most every REDRAW_MS.
        self._redraw = QTimer(self)
        self._redraw.setSingleShot(True)
        self._redraw.setInterval(self._redraw_interval_ms())
        self._redraw.timeout.connect(self._draw)
        plot = self.getPlotItem()
        plot.setMenuEnabled(False)
        plot.hideButtons()
        plot.showGrid(x=True, y=True, alpha=0.15)
        plot.setLabel("bottom", "time", units="s")
        plot.setYRange(-1.0, 1.0, padding=0.05)
        plot.setMouseEnabled(x=True, y=False)
        self.curve = plot.plot([], [])
        self.boundary_curve = plot.plot([], [], connect="pairs")
        self._restyle()

    def _redraw_interval_ms(self) -> int:
        screen = self.screen()
        rate = screen.refreshRate() if screen is not None else 0.0
        return max(REDRAW_MS, math.ceil(1000.0 / rate)) if rate > 0 else REDRAW_MS

    def _reset_envelope(self) -> None:
        self._bin = FIRST_BIN
        self._mins = np.zeros(0, np.float32)
        self._maxs = np.zeros(0, np.float32)
        self._bins = 0
        self._binned = 0  # samples folded into full bins

    @property
    def duration_s(self) -> float:
        return self._length / self.sample_rate if self.sample_rate else 0.0

    @property
    def sample_count(self) -> int:
        return self._length

    @property
    def bin_samples(self) -> int:
        """Samples per envelope bin now."""
        return self._bin

    def clear_audio(self) -> None:
        self.samples = np.zeros(0, np.float32)
        self._length = 0
        self.sample_rate = 0
        self.chunks = 0
        self.drawn_samples = 0
        self._reset_envelope()
        self._boundaries.clear()
        self._redraw.stop()
        self.curve.setData([], [])
        self.boundary_curve.setData([], [])

    def append_chunk(self, chunk: ReceivedAudio) -> None:
        """Add a chunk; the curve redraws within REDRAW_MS (``grew`` fires when it has)."""
        if chunk.sample_rate <= 0:
            raise ValueError(f"chunk {chunk.chunk_index} has no sample rate")
        if self.sample_rate and chunk.sample_rate != self.sample_rate:
            raise ValueError(
                f"chunk {chunk.chunk_index} is at {chunk.sample_rate} Hz, earlier chunks at "
                f"{self.sample_rate} Hz"
            )
        self.sample_rate = chunk.sample_rate
        needed = self._length + chunk.pcm.size
        if needed > self.samples.size:
            grown = np.zeros(max(needed, 2 * self.samples.size, 1 << 15), np.float32)
            grown[: self._length] = self.samples[: self._length]
            self.samples = grown
        if self._length:
            self._boundaries.append(self._length / self.sample_rate)
        self.samples[self._length : needed] = chunk.pcm
        self._length = needed
        self.chunks += 1
        self._fold()
        if not self._redraw.isActive():
            self._redraw.start()

    def _fold(self) -> None:
        """Fold the samples that complete bins into the envelope; halve it when too long."""
        full = (self._length - self._binned) // self._bin
        if full:
            block = self.samples[self._binned : self._binned + full * self._bin]
            block = block.reshape(full, self._bin)
            needed = self._bins + full
            if needed > self._mins.size:
                size = max(needed, 2 * self._mins.size, 256)
                self._mins = np.resize(self._mins, size)
                self._maxs = np.resize(self._maxs, size)
            self._mins[self._bins : needed] = block.min(axis=1)
            self._maxs[self._bins : needed] = block.max(axis=1)
            self._bins = needed
            self._binned += full * self._bin
        while self._bins > MAX_BINS:
            pairs = self._bins // 2
            self._mins[:pairs] = np.minimum(
                self._mins[0 : 2 * pairs : 2], self._mins[1 : 2 * pairs : 2]
            )
            self._maxs[:pairs] = np.maximum(
                self._maxs[0 : 2 * pairs : 2], self._maxs[1 : 2 * pairs : 2]
            )
            # An odd last bin goes back to the samples not yet folded.
            self._binned -= (self._bins - 2 * pairs) * self._bin
            self._bins = pairs
            self._bin *= 2

    def envelope(self) -> tuple[np.ndarray, np.ndarray]:
        """What the curve draws: times and values, a (min, max) pair per bin, then the samples
        not yet in a full bin as one more pair."""
        mins, maxs = self._mins[: self._bins], self._maxs[: self._bins]
        tail = self.samples[self._binned : self._length]
        if tail.size:
            mins = np.append(mins, tail.min())
            maxs = np.append(maxs, tail.max())
        starts = np.arange(mins.size, dtype=np.float64) * self._bin
        values = np.empty(2 * mins.size, np.float32)
        values[0::2] = mins
        values[1::2] = maxs
        times = np.repeat((starts + self._bin / 2) / max(1, self.sample_rate), 2)
        return times, values

    def _draw(self) -> None:
        times, values = self.envelope()
        self.curve.setData(times, values)
        marks = np.repeat(np.asarray(self._boundaries, dtype=np.float64), 2)
        heights = np.tile(np.array([-1.0, 1.0]), len(self._boundaries))
        self.boundary_curve.setData(marks, heights, connect="pairs")
        self.getPlotItem().setXRange(0.0, max(self.duration_s, 0.5), padding=0.01)
        self.drawn_samples = self._length
        self.grew.emit(self._length)

    def _boundary_pen(self) -> pg.mkPen:
        color = self.palette().color(QPalette.ColorRole.PlaceholderText)
        color.setAlpha(90)
        return pg.mkPen(color, width=1, style=Qt.PenStyle.DashLine)

    def _restyle(self) -> None:
        palette = self.palette()
        self.setBackground(palette.color(QPalette.ColorRole.Base))
        self.curve.setPen(pg.mkPen(palette.color(QPalette.ColorRole.Highlight), width=1))
        self.boundary_curve.setPen(self._boundary_pen())
        axis_pen = pg.mkPen(palette.color(QPalette.ColorRole.Text))
        for name in ("left", "bottom"):
            axis = self.getPlotItem().getAxis(name)
            axis.setPen(axis_pen)
            axis.setTextPen(axis_pen)

    def changeEvent(self, event: QEvent) -> None:
        # Qt sends palette changes during construction, before the plot items exist.
        if event.type() == QEvent.Type.PaletteChange and "curve" in self.__dict__:
            self._restyle()
        super().changeEvent(event)


class PlaybackControls(QWidget):
    """Play, pause, stop, the output device, and live underrun and position read-outs."""

    device_changed = Signal(str)  # device name
    playback_error = Signal(str)
    underruns_changed = Signal(int)

    def __init__(self, output: AudioOutput, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.output = output
        style = self.style()
        self.play_button = QPushButton(
            style.standardIcon(QStyle.StandardPixmap.SP_MediaPlay), "Play"
        )
        self.pause_button = QPushButton(
            style.standardIcon(QStyle.StandardPixmap.SP_MediaPause), "Pause"
        )
        self.stop_button = QPushButton(
            style.standardIcon(QStyle.StandardPixmap.SP_MediaStop), "Stop"
        )
        self.device_box = QComboBox()
        self.device_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.device_box.setMinimumContentsLength(18)
        self.auto_play = QCheckBox("Play as it arrives")
        self.position_label = QLabel("0.00 / 0.00 s")
        self.underrun_label = QLabel("underruns: 0")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for widget in (self.play_button, self.pause_button, self.stop_button):
            layout.addWidget(widget)
        layout.addSpacing(8)
        layout.addWidget(QLabel("Output:"))
        layout.addWidget(self.device_box, 1)
        layout.addWidget(self.auto_play)
        layout.addSpacing(8)
        layout.addWidget(self.position_label)
        layout.addWidget(self.underrun_label)
        self.play_button.clicked.connect(self.play)
        self.pause_button.clicked.connect(self.pause)
        self.stop_button.clicked.connect(self.stop)
        self.device_box.currentIndexChanged.connect(self._device_chosen)
        self._poll = QTimer(self)
        self._poll.setInterval(100)
        self._poll.timeout.connect(self.refresh)
        self._devices: list[OutputDevice] = []
        self._underruns = 0
        self._listed = False
        #: The device name to select when the devices are first listed (from the settings).
        self.preferred_device: str | None = None
        self.device_box.addItem("Output devices are listed when audio arrives")
        self.refresh()

    def ensure_devices(self) -> None:
        """List the output devices once, when audio is first expected: starting PortAudio
        probes every sound system, which graph pipelines never need."""
        if not self._listed:
            self._listed = True
            self.populate_devices(self.preferred_device)
            self.auto_play.setChecked(self.available)

    def populate_devices(self, preferred: str | None = None) -> None:
        self._devices = self.output.devices()
        self.device_box.blockSignals(True)
        self.device_box.clear()
        if not self._devices:
            reason = self.output.unavailable_reason or "no output device found"
            self.device_box.addItem("No output device")
            self.device_box.setToolTip(reason)
        for device in self._devices:
            label = f"{device.name} ({device.host_api}){' — default' if device.is_default else ''}"
            self.device_box.addItem(label, device.index)
            if device.is_default:
                self.device_box.setCurrentIndex(self.device_box.count() - 1)
        if preferred is not None:
            found = self.device_box.findText(preferred)
            if found >= 0:
                self.device_box.setCurrentIndex(found)
        self.device_box.blockSignals(False)
        self.auto_play.setEnabled(bool(self._devices))
        self.refresh()

    @property
    def available(self) -> bool:
        return bool(self._devices)

    def selected_device(self) -> int | None:
        data = self.device_box.currentData()
        return int(data) if isinstance(data, int) else None

    def _device_chosen(self, _index: int) -> None:
        if self.output.state in ("playing", "paused"):
            self.output.stop()
        self.device_changed.emit(self.device_box.currentText())
        self.refresh()

    def new_request(self) -> None:
        self.output.reset()
        self.refresh()

    def add_chunk(self, chunk: ReceivedAudio) -> None:
        if not chunk.queued:
            # The bridge queues a run's audio for playback on the runtime's thread; only
            # chunks that did not come that way are fed here.
            self.output.feed(chunk.pcm, chunk.sample_rate)
        if self.auto_play.isChecked() and self.available and self.output.state == "stopped":
            self.play()
        self.refresh()

    def end_of_stream(self) -> None:
        self.output.end_of_stream()
        self.refresh()

    def play(self) -> None:
        try:
            self.output.play(self.selected_device())
        except (RuntimeError, ValueError) as exc:
            self.playback_error.emit(str(exc))
        except (
            OSError
        ) as exc:  # PortAudioError derives from Exception; device errors arrive as OSError
            self.playback_error.emit(f"the output device refused the stream: {exc}")
        self._poll.start()
        self.refresh()

    def pause(self) -> None:
        self.output.pause()
        self.refresh()

    def stop(self) -> None:
        self.output.stop()
        self.refresh()

    def refresh(self) -> None:
        state = self.output.state
        has_audio = self.output.buffered_s > 0
        self.play_button.setEnabled(self.available and has_audio and state != "playing")
        self.pause_button.setEnabled(state == "playing")
        self.stop_button.setEnabled(state in ("playing", "paused", "finished"))
        self.position_label.setText(
            f"{self.output.position_s:.2f} / {self.output.buffered_s:.2f} s"
        )
        underruns = self.output.underruns
        self.underrun_label.setText(f"underruns: {underruns}")
        if underruns != self._underruns:
            self._underruns = underruns
            self.underruns_changed.emit(underruns)
        if state in ("finished", "failed"):
            if state == "failed" or self.output.feed_error:
                self.playback_error.emit(
                    self.output.feed_error or "the audio output stopped unexpectedly"
                )
            self.output.stop()
            self._poll.stop()
            self.refresh()
        elif state not in ("playing", "paused"):
            self._poll.stop()


def _number(text: str, default: float) -> float:
    try:
        value = float(text)
    except ValueError:
        return default
    return value if value >= 0 else default


class TensorResultsView(QWidget):
    """Final tensors with summary statistics, compared with a reference when one is given."""

    compare_requested = Signal()
    save_requested = Signal()

    HEADERS = ("Output", "dtype", "shape", "min", "max", "mean", "vs reference", "max |diff|")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.results: TensorResults | None = None
        self.reference: Mapping[str, np.ndarray] | None = None
        self.reference_name = ""
        self.comparisons: tuple[Comparison, ...] = ()
        self.table = readonly_table(list(self.HEADERS))
        self.table.setMinimumHeight(90)
        self.verdict = StatusChip("no reference")
        self.reference_label = QLabel("Compare the outputs with a reference .npz to check them.")
        self.reference_label.setWordWrap(True)
        dim(self.reference_label)
        self.atol = QLineEdit(f"{Tolerance().atol:g}")
        self.rtol = QLineEdit(f"{Tolerance().rtol:g}")
        for field in (self.atol, self.rtol):
            validator = QDoubleValidator(0.0, 1e6, 12, field)
            validator.setNotation(QDoubleValidator.Notation.ScientificNotation)
            field.setValidator(validator)
            field.setMaximumWidth(72)
            field.editingFinished.connect(self._recompare)
        self.compare_button = QPushButton("Compare with reference…")
        self.save_button = QPushButton("Save outputs…")
        self.compare_button.clicked.connect(self.compare_requested)
        self.save_button.clicked.connect(self.save_requested)
        self.save_button.setEnabled(False)
        controls = QHBoxLayout()
        controls.addWidget(self.compare_button)
        controls.addWidget(QLabel("atol"))
        controls.addWidget(self.atol)
        controls.addWidget(QLabel("rtol"))
        controls.addWidget(self.rtol)
        controls.addWidget(self.verdict)
        controls.addStretch(1)
        controls.addWidget(self.save_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.table, 1)
        layout.addLayout(controls)
        layout.addWidget(self.reference_label)

    def clear_results(self) -> None:
        self.results = None
        self.table.setRowCount(0)
        self.save_button.setEnabled(False)
        self._recompare()

    def show_results(self, results: TensorResults) -> None:
        self.results = results
        self.save_button.setEnabled(True)
        self._recompare()

    def set_reference(self, name: str, arrays: Mapping[str, np.ndarray]) -> None:
        self.reference = dict(arrays)
        self.reference_name = name
        self._recompare()

    def tolerance(self) -> Tolerance:
        default = Tolerance()
        return Tolerance(
            atol=_number(self.atol.text(), default.atol),
            rtol=_number(self.rtol.text(), default.rtol),
        )

    def _recompare(self) -> None:
        results = self.results
        self.comparisons = ()
        if results is not None and self.reference is not None:
            self.comparisons = compare_outputs(results.arrays, self.reference, self.tolerance())
        by_name = {comparison.name: comparison for comparison in self.comparisons}
        arrays = {} if results is None else results.arrays
        self.table.setRowCount(0)
        for row, (name, array) in enumerate(arrays.items()):
            numeric = np.issubdtype(array.dtype, np.number) and array.size > 0
            stats = (
                [
                    f"{array.min():.6g}",
                    f"{array.max():.6g}",
                    f"{array.astype(np.float64).mean():.6g}",
                ]
                if numeric
                else ["-", "-", "-"]
            )
            comparison = by_name.get(name)
            if comparison is None:
                verdict, difference, color = "-", "-", None
            else:
                verdict = "match" if comparison.ok else (comparison.problem or "differs")
                difference = "-" if comparison.max_abs is None else f"{comparison.max_abs:.3g}"
                color = OK if comparison.ok else BAD
            set_row(
                self.table,
                row,
                [name, str(array.dtype), str(tuple(array.shape)), *stats, verdict, difference],
                color,
            )
        for row_offset, comparison in enumerate(
            c for c in self.comparisons if c.name not in arrays
        ):
            set_row(
                self.table,
                len(arrays) + row_offset,
                [comparison.name, "-", "-", "-", "-", "-", comparison.problem, "-"],
                BAD,
            )
        self.table.resizeColumnsToContents()
        if self.reference is None:
            self.verdict.set_status("no reference", NEUTRAL)
        elif results is None:
            self.verdict.set_status("reference loaded", NEUTRAL)
        elif all(comparison.ok for comparison in self.comparisons):
            self.verdict.set_status("matches reference", OK)
        else:
            self.verdict.set_status("differs from reference", BAD)
        if self.reference is not None:
            tolerance = self.tolerance()
            self.reference_label.setText(
                f"Reference: {self.reference_name} ({len(self.reference)} arrays); "
                f"match means |output - reference| <= {tolerance.atol:g} + {tolerance.rtol:g} x |reference|."
            )


class OutputArea(QWidget):
    """Streaming text and audio for speech and language pipelines; tensors for graphs."""

    def __init__(self, output: AudioOutput, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.status = StatusChip("no run yet")
        self.request_label = QLabel("")
        dim(self.request_label)
        self.text_view = StreamingTextView()
        self.waveform = WaveformView()
        self.playback = PlaybackControls(output)
        self.audio_label = QLabel("no audio yet")
        dim(self.audio_label)
        self.tensors = TensorResultsView()
        self.waiting = QLabel("Streamed text and audio appear here as the pipeline produces them.")
        self.waiting.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.waiting.setMinimumHeight(120)
        dim(self.waiting)

        self.text_box = QGroupBox("Text")
        text_layout = QVBoxLayout(self.text_box)
        text_layout.addWidget(self.text_view)
        self.audio_box = QGroupBox("Audio")
        audio_layout = QVBoxLayout(self.audio_box)
        audio_layout.addWidget(self.waveform, 1)
        audio_layout.addWidget(self.audio_label)
        audio_layout.addWidget(self.playback)
        self.tensor_box = QGroupBox("Tensors")
        tensor_layout = QVBoxLayout(self.tensor_box)
        tensor_layout.addWidget(self.tensors)

        header = QHBoxLayout()
        title = QLabel("Output")
        font = title.font()
        font.setBold(True)
        font.setPointSizeF(font.pointSizeF() * 1.15)
        title.setFont(font)
        header.addWidget(title)
        header.addWidget(self.status)
        header.addStretch(1)
        header.addWidget(self.request_label)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(header)
        layout.addWidget(self.waiting)
        layout.addWidget(self.text_box, 1)
        layout.addWidget(self.audio_box, 2)
        layout.addWidget(self.tensor_box, 2)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Expanding)
        self.show_streams(False)

    def show_streams(self, streams: bool) -> None:
        """For streaming pipelines a placeholder until the first text or audio chunk shows
        its section; the tensor section otherwise."""
        if streams:
            self.playback.ensure_devices()
        self.text_box.setVisible(False)
        self.audio_box.setVisible(False)
        self.waiting.setVisible(streams)
        self.tensor_box.setVisible(not streams)

    def new_run(self) -> None:
        self.text_view.clear_text()
        self.waveform.clear_audio()
        self.playback.new_request()
        self.tensors.clear_results()
        self.audio_label.setText("no audio yet")
        self.request_label.setText("")
        self.status.set_status("starting", NEUTRAL)

    def run_started(self, request_id: str) -> None:
        self.request_label.setText(request_id)
        self.status.set_status("running", NEUTRAL)

    def add_audio(self, chunk: ReceivedAudio) -> None:
        self.playback.ensure_devices()
        self.waiting.setVisible(False)
        self.tensor_box.setVisible(False)
        self.audio_box.setVisible(True)
        self.waveform.append_chunk(chunk)
        self.playback.add_chunk(chunk)
        self.audio_label.setText(
            f"{self.waveform.chunks} chunks · {self.waveform.duration_s:.2f} s · "
            f"{self.waveform.sample_rate} Hz"
        )

    def add_text(self, chunk: TextChunk) -> None:
        self.waiting.setVisible(False)
        self.tensor_box.setVisible(False)
        self.text_box.setVisible(True)
        self.text_view.append_chunk(chunk)

    def show_tensors(self, results: TensorResults) -> None:
        self.waiting.setVisible(False)
        self.tensor_box.setVisible(True)
        self.tensors.show_results(results)

    def finished(self, status: str, message: str) -> None:
        self.playback.end_of_stream()
        colors = {"completed": OK, "cancelled": NEUTRAL, "failed": BAD}
        self.status.set_status(status, colors.get(status, NEUTRAL))
        self.status.setToolTip(message)
