"""The offer made when a pipeline needs what this machine does not have yet (the vLLM
environment, the built-in assistant's model when Run is pressed; the speech recogniser's
bundles when the pipeline is opened): what will be made, a progress bar over its steps, the
lines it prints, and Cancel."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QVBoxLayout,
    QWidget,
)

from app.first_use import LLM_CANCEL_NOTE
from app.widgets.common import BAD, NEUTRAL, monospace, section_title

if TYPE_CHECKING:
    from PySide6.QtGui import QCloseEvent

    from app.bridge_setup import SetupJobs
    from app.first_use import SetupNeeds
    from app.my_pipelines import JobOutcome

CANCEL_NOTE = LLM_CANCEL_NOTE
LOG_LINES = 400


class SetupDialog(QDialog):
    """Make ``needs`` on request; ``ready`` follows when all is made (then the dialog closes)."""

    ready = Signal()

    def __init__(
        self,
        jobs: SetupJobs,
        needs: SetupNeeds,
        parent: QWidget | None = None,
        *,
        action: str = "Make them and run",
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"Prepare {needs.pipeline.stem}")
        self.setObjectName("setupDialog")
        self.setMinimumWidth(600)
        self.jobs = jobs
        self.needs = needs
        self._close_when_done = False
        self.cancel_note = needs.cancel_note()
        self.intro_label = intro = QLabel(needs.intro())
        intro.setWordWrap(True)
        self.needs_label = QLabel("\n".join(f"• {line}" for line in needs.lines()))
        self.needs_label.setWordWrap(True)
        note = QLabel(f"Made once in the user data folder and reused. {self.cancel_note}")
        note.setWordWrap(True)
        note.setStyleSheet(f"color: {NEUTRAL};")
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, needs.steps)
        self.progress_bar.setValue(0)
        self.step_label = QLabel("")
        self.step_label.setWordWrap(True)
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setFont(monospace())
        self.log.setMaximumBlockCount(LOG_LINES)
        self.log.setMinimumHeight(120)
        self.error_label = QLabel("")
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet(f"color: {BAD};")
        self.error_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.buttons = QDialogButtonBox()
        self.create_button = self.buttons.addButton(action, QDialogButtonBox.ButtonRole.AcceptRole)
        self.close_button = self.buttons.addButton(
            "Not now", QDialogButtonBox.ButtonRole.RejectRole
        )
        self.create_button.setDefault(True)
        self.create_button.clicked.connect(self.make)
        self.close_button.clicked.connect(self._close_clicked)

        layout = QVBoxLayout(self)
        layout.addWidget(section_title(f"{needs.pipeline.stem} needs a first setup"))
        layout.addWidget(intro)
        layout.addWidget(self.needs_label)
        layout.addWidget(note)
        layout.addWidget(self.progress_bar)
        layout.addWidget(self.step_label)
        layout.addWidget(self.log, 1)
        layout.addWidget(self.error_label)
        layout.addWidget(self.buttons)
        for widget in (self.progress_bar, self.log, self.error_label):
            widget.setVisible(False)

        jobs.progress.connect(self._on_progress)
        jobs.step.connect(self.progress_bar.setValue)
        jobs.finished.connect(self._on_finished)

    def make(self) -> bool:
        if self.jobs.busy or not self.jobs.start(self.needs):
            return False
        self.error_label.setVisible(False)
        self.progress_bar.setVisible(True)
        self.progress_bar.setValue(0)
        self.create_button.setEnabled(False)
        self.close_button.setText("Cancel")
        self.step_label.setText("starting…")
        return True

    def cancel(self) -> bool:
        if not self.jobs.cancel():
            return False
        self.close_button.setEnabled(False)
        self.close_button.setText("Cancelling…")
        self.step_label.setText(f"Cancelling. {self.cancel_note}")
        return True

    def _close_clicked(self) -> None:
        if not self.cancel() and not self.jobs.busy:
            self.reject()

    def _on_progress(self, line: str) -> None:
        self.log.setVisible(True)
        self.log.appendPlainText(line)
        if not line.startswith(" ") and not self.jobs.cancelling:
            self.step_label.setText(line)

    def _on_finished(self, outcome: JobOutcome) -> None:
        self.create_button.setEnabled(True)
        self.close_button.setEnabled(True)
        self.close_button.setText("Not now")
        self.progress_bar.setVisible(False)
        if outcome.status == "made":
            self.ready.emit()
            self.accept()
            return
        if self._close_when_done:
            super().reject()
            return
        if outcome.status == "cancelled":
            self.step_label.setText(f"Cancelled: {outcome.message}.")
            return
        self.step_label.setText("It could not be made.")
        self.error_label.setText(outcome.message)
        self.error_label.setVisible(True)

    def reject(self) -> None:
        """Close, or while a job runs: cancel it and close when it has ended."""
        if self.jobs.busy:
            self._close_when_done = True
            self.cancel()
            return
        super().reject()

    def closeEvent(self, event: QCloseEvent) -> None:
        if self.jobs.busy:
            event.ignore()
            self.reject()
            return
        super().closeEvent(event)
