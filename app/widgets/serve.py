"""The Serve panel: a switch that serves the open pipeline over an OpenAI-compatible API on
localhost, the address to point clients at, and the requests it answered."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QCheckBox, QLabel, QListWidget, QVBoxLayout, QWidget

from app.widgets.common import BAD, monospace

if TYPE_CHECKING:
    from app.models import QueueLine, ServedLine, ServeView

HINT = (
    "Serves the open pipeline on 127.0.0.1 with its own workers, on the endpoints its kind "
    "takes; a request to a busy pipeline waits in its queue."
)


def queue_text(queues: tuple[QueueLine, ...]) -> str:
    """``queued: speak 2 of 16``, one pipeline after another."""
    return "queued: " + ", ".join(
        f"{queue.model} {queue.queued} of {queue.max_queue}" for queue in queues
    )


def served_line(line: ServedLine) -> str:
    """``200  POST /v1/audio/speech  speak  0.42 s``."""
    model = f"  {line.model}" if line.model else ""
    return f"{line.status}  {line.method} {line.path}{model}  {line.duration_s:.2f} s"


class ServePanel(QWidget):
    """Emits ``serve_toggled(bool)`` when the switch is flipped; shows :class:`ServeView`."""

    serve_toggled = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.switch = QCheckBox("Serve on localhost")
        self.switch.setEnabled(False)
        self.switch.toggled.connect(self._on_toggled)
        hint = QLabel(HINT)
        hint.setWordWrap(True)
        self.address_label = QLabel("not serving")
        self.address_label.setFont(monospace())
        self.address_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.count_label = QLabel("0 requests served")
        self.queue_label = QLabel("")
        self.endpoints_label = QLabel("")
        self.endpoints_label.setFont(monospace())
        self.endpoints_label.setWordWrap(True)
        self.endpoints_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.requests = QListWidget()
        self.requests.setFont(monospace())
        layout = QVBoxLayout(self)
        layout.addWidget(self.switch)
        layout.addWidget(hint)
        layout.addWidget(self.address_label)
        layout.addWidget(self.count_label)
        layout.addWidget(self.queue_label)
        layout.addWidget(self.endpoints_label)
        layout.addWidget(self.requests, 1)
        self._updating = False
        self._available = False
        self._unavailable: str | None = None
        self._state = "stopped"

    def set_unavailable(self, reason: str) -> None:
        """This build cannot serve: the switch stays off and says why."""
        self._unavailable = reason
        self.address_label.setText(reason)
        self.address_label.setWordWrap(True)
        self._enable()

    def set_available(self, available: bool) -> None:
        """Starting needs an open pipeline; a running server can always be stopped."""
        self._available = available
        self._enable()

    def _enable(self) -> None:
        startable = (
            self._state in ("stopped", "failed") and self._available and self._unavailable is None
        )
        self.switch.setEnabled(startable or self._state == "serving")

    def _on_toggled(self, checked: bool) -> None:
        if not self._updating:
            self.serve_toggled.emit(checked)

    def show_view(self, view: ServeView) -> None:
        self._updating = True
        try:
            self.switch.setChecked(view.state in ("starting", "serving"))
        finally:
            self._updating = False
        self._state = view.state
        self._enable()
        if view.state == "serving" and view.address:
            self.address_label.setText(f"{view.address}  ({', '.join(view.models)})")
            self.address_label.setStyleSheet("")
        elif view.state == "failed":
            self.address_label.setText(f"could not serve: {view.error}")
            self.address_label.setStyleSheet(f"color: {BAD};")
        elif self._unavailable is not None:
            self.address_label.setText(self._unavailable)
        else:
            self.address_label.setText(view.state if view.state != "stopped" else "not serving")
            self.address_label.setStyleSheet("")
        serving = view.state == "serving"
        self.queue_label.setText(queue_text(view.queues) if serving and view.queues else "")
        self.endpoints_label.setText("\n".join(view.endpoints) if serving else "")
        noun = "request" if view.served == 1 else "requests"
        self.count_label.setText(f"{view.served} {noun} served")
        self.requests.clear()
        self.requests.addItems([served_line(line) for line in view.recent])
        self.requests.scrollToBottom()
