"""A non-modal banner: the runtime's message and the action that helps."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QStyle,
    QToolButton,
    QVBoxLayout,
)

from app.widgets.common import BAD, WARN

if TYPE_CHECKING:
    from app.models import ErrorAction, ErrorInfo


class ErrorBanner(QFrame):
    action_triggered = Signal(object)  # ErrorAction

    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("errorBanner")
        self.info: ErrorInfo | None = None
        self.icon = QLabel()
        self.title = QLabel()
        font = self.title.font()
        font.setBold(True)
        self.title.setFont(font)
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.action_button = QPushButton()
        self.action_button.clicked.connect(self._act)
        self.close_button = QToolButton()
        self.close_button.setText("✕")
        self.close_button.setToolTip("Dismiss")
        self.close_button.setAutoRaise(True)
        self.close_button.clicked.connect(self.dismiss)
        text = QVBoxLayout()
        text.setSpacing(2)
        text.addWidget(self.title)
        text.addWidget(self.message)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 8, 8, 8)
        layout.addWidget(self.icon, 0, Qt.AlignmentFlag.AlignTop)
        layout.addLayout(text, 1)
        layout.addWidget(self.action_button, 0, Qt.AlignmentFlag.AlignVCenter)
        layout.addWidget(self.close_button, 0, Qt.AlignmentFlag.AlignTop)
        self.hide()

    def show_error(self, info: ErrorInfo) -> None:
        self.info = info
        warning = info.kind == "warning"
        color = QColor(WARN if warning else BAD)
        pixmap = (
            QStyle.StandardPixmap.SP_MessageBoxWarning
            if warning
            else QStyle.StandardPixmap.SP_MessageBoxCritical
        )
        self.icon.setPixmap(self.style().standardIcon(pixmap).pixmap(24, 24))
        self.setStyleSheet(
            f"#errorBanner {{ background: rgba({color.red()}, {color.green()}, {color.blue()}, 0.13); "
            f"border: 1px solid {color.name()}; border-radius: 6px; }}"
        )
        self.title.setText(info.title)
        self.message.setText(info.message)
        self.action_button.setVisible(info.action is not None)
        if info.action is not None:
            self.action_button.setText(info.action.value)
        self.show()

    def _act(self) -> None:
        if self.info is not None and self.info.action is not None:
            action: ErrorAction = self.info.action
            self.action_triggered.emit(action)

    def dismiss(self) -> None:
        self.info = None
        self.hide()
