"""The output of a transcription pipeline: the audio it was given, its segments with their
times as each finishes, and Open audio…, Copy and Save as (.txt or .srt)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app.transcripts import segment_line, srt_text, transcript_text
from app.widgets.common import BAD, NEUTRAL, OK, StatusChip, dim, monospace

if TYPE_CHECKING:
    from app.models import TranscriptSegment

SAVE_FILTERS = "Text (*.txt);;SubRip subtitles (*.srt)"


class TranscriptView(QWidget):
    """Segments appended as they arrive; the buttons act on those shown."""

    open_requested = Signal()
    #: A save failed: the path and why.
    save_failed = Signal(str, str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.segments: list[TranscriptSegment] = []
        self.request_id: str | None = None
        title = QLabel("Transcript")
        font = title.font()
        font.setBold(True)
        font.setPointSizeF(font.pointSizeF() * 1.15)
        title.setFont(font)
        self.status = StatusChip("no audio yet")
        self.source_label = QLabel("Drop an audio file on the window, or open one.")
        self.source_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        dim(self.source_label)
        self.text_view = QPlainTextEdit()
        self.text_view.setReadOnly(True)
        self.text_view.setFont(monospace())
        self.text_view.setPlaceholderText("Segments appear here with their times as they finish.")
        self.open_button = QPushButton("Open audio…")
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy the transcript with its times to the clipboard")
        self.save_button = QPushButton("Save as…")
        self.save_button.setToolTip("Save the transcript as text (.txt) or subtitles (.srt)")
        self.open_button.clicked.connect(self.open_requested)
        self.copy_button.clicked.connect(self.copy)
        self.save_button.clicked.connect(self.choose_save)
        header = QHBoxLayout()
        header.addWidget(title)
        header.addWidget(self.status)
        header.addStretch(1)
        buttons = QHBoxLayout()
        buttons.addWidget(self.open_button)
        buttons.addStretch(1)
        buttons.addWidget(self.copy_button)
        buttons.addWidget(self.save_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(header)
        layout.addWidget(self.source_label)
        layout.addWidget(self.text_view, 1)
        layout.addLayout(buttons)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Expanding)
        self._update_buttons()

    def _update_buttons(self) -> None:
        self.copy_button.setEnabled(bool(self.segments))
        self.save_button.setEnabled(bool(self.segments))

    def new_run(self, source: str) -> None:
        """A new transcription of ``source`` (a file's name) begins."""
        self.segments = []
        self.request_id = None
        self.text_view.clear()
        self.source_label.setText(source)
        self.source_label.setToolTip(source)
        self.status.set_status("transcribing", NEUTRAL)
        self._update_buttons()

    def run_started(self, request_id: str) -> None:
        self.request_id = request_id

    def add_segment(self, segment: TranscriptSegment) -> None:
        if self.request_id is not None and segment.request_id != self.request_id:
            return
        self.segments.append(segment)
        self.text_view.appendPlainText(segment_line(segment))
        self.status.set_status(f"transcribing · {len(self.segments)} segments", NEUTRAL)
        self._update_buttons()

    def finished(self, status: str, message: str = "") -> None:
        colors = {"completed": OK, "cancelled": NEUTRAL, "failed": BAD}
        text = f"{status} · {len(self.segments)} segments" if status == "completed" else status
        self.status.set_status(text, colors.get(status, NEUTRAL))
        self.status.setToolTip(message)

    def text(self) -> str:
        """The transcript as shown: one segment a line, with its times."""
        return transcript_text(self.segments)

    def copy(self) -> bool:
        if not self.segments:
            return False
        QGuiApplication.clipboard().setText(self.text())
        return True

    def choose_save(self) -> None:
        path, chosen = QFileDialog.getSaveFileName(
            self, "Save the transcript", "transcript.txt", SAVE_FILTERS
        )
        if path:
            self.save(Path(path), subtitles=chosen.startswith("SubRip"))

    def save(self, path: Path, *, subtitles: bool | None = None) -> bool:
        """Write the transcript to ``path``: SubRip when ``subtitles`` (by default when the
        suffix is .srt), text with times otherwise."""
        if subtitles is None:
            subtitles = path.suffix.lower() == ".srt"
        body = srt_text(self.segments) if subtitles else self.text() + "\n"
        try:
            path.write_text(body, encoding="utf-8")
        except OSError as exc:
            self.save_failed.emit(str(path), str(exc))
            return False
        return True
