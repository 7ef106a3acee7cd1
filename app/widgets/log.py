"""The Log panel: the runtime's, the workers' and the ledger's log lines."""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.widgets.common import BAD, WARN, monospace

if TYPE_CHECKING:
    from app.models import LogLine

LEVELS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}
MAX_LINES = 5000


def short_source(name: str) -> str:
    """``omni.worker.stage-0`` -> ``worker stage-0``; other ``omni.*`` loggers -> ``runtime``."""
    if name.startswith("omni.worker."):
        return "worker " + name.removeprefix("omni.worker.")
    if name.startswith("omni.studio"):
        return "studio"
    if name.startswith(("omni.", "runtime.")):
        return "runtime"
    return name


class LogPanel(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.lines: deque[LogLine] = deque(maxlen=MAX_LINES)
        self.view = QPlainTextEdit()
        self.view.setReadOnly(True)
        self.view.setFont(monospace())
        self.view.setMaximumBlockCount(MAX_LINES)
        self.view.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.level_box = QComboBox()
        self.level_box.addItems(["DEBUG", "INFO", "WARNING", "ERROR"])
        self.level_box.setCurrentText("INFO")
        self.level_box.currentTextChanged.connect(self._refill)
        self.follow = QCheckBox("Follow")
        self.follow.setChecked(True)
        clear = QPushButton("Clear")
        clear.clicked.connect(self.clear)
        self.count_label = QLabel("0 lines")
        header = QHBoxLayout()
        header.addWidget(QLabel("Show from level:"))
        header.addWidget(self.level_box)
        header.addWidget(self.follow)
        header.addStretch(1)
        header.addWidget(self.count_label)
        header.addWidget(clear)
        layout = QVBoxLayout(self)
        layout.addLayout(header)
        layout.addWidget(self.view)

    def _threshold(self) -> int:
        return LEVELS.get(self.level_box.currentText(), 20)

    def add_line(self, line: LogLine) -> None:
        self.lines.append(line)
        if LEVELS.get(line.level, 20) >= self._threshold():
            self._append(line)
        self.count_label.setText(f"{len(self.lines)} lines")

    def _append(self, line: LogLine) -> None:
        stamp = (
            time.strftime("%H:%M:%S", time.localtime(line.wall_time))
            + f".{int(line.wall_time * 1000) % 1000:03d}"
        )
        text = f"{stamp} {line.level:<7} {short_source(line.source):<16} {line.text}"
        cursor = (
            self.view.textCursor()
            if not self.follow.isChecked()
            else QTextCursor(self.view.document())
        )
        cursor.movePosition(QTextCursor.MoveOperation.End)
        form = QTextCharFormat()
        level = LEVELS.get(line.level, 20)
        if level >= 40:
            form.setForeground(QColor(BAD))
        elif level >= 30:
            form.setForeground(QColor(WARN))
        if not self.view.document().isEmpty():
            cursor.insertBlock()
        cursor.insertText(text, form)
        if self.follow.isChecked():
            self.view.verticalScrollBar().setValue(self.view.verticalScrollBar().maximum())

    def _refill(self) -> None:
        self.view.clear()
        threshold = self._threshold()
        for line in self.lines:
            if LEVELS.get(line.level, 20) >= threshold:
                self._append(line)

    def clear(self) -> None:
        self.lines.clear()
        self.view.clear()
        self.count_label.setText("0 lines")

    def text(self) -> str:
        return self.view.toPlainText()
