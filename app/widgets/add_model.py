"""The Add model dialog: an ONNX file, a GGUF file or a Hugging Face model folder made into
one of "My pipelines", with the import's progress, Cancel, and the runtime's refusal shown
as it is written (it names the file and what is accepted)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.my_pipelines import ImportRequest, JobOutcome, SourceKind, source_kind
from app.widgets.common import BAD, NEUTRAL, monospace, section_title

if TYPE_CHECKING:
    from PySide6.QtGui import QCloseEvent

    from app.bridge_models import ModelImports

MODEL_FILTER = "Models (*.onnx *.gguf);;ONNX files (*.onnx);;GGUF files (*.gguf);;All files (*)"
CHOOSE_HINT = (
    "Choose an ONNX file (.onnx), a GGUF file (.gguf) or a Hugging Face model folder "
    "(config.json, *.safetensors, tokenizer.json)."
)
CANCEL_HINT = (
    "Cancelling: the import stops at the end of the step that is running and removes what "
    "it began. A GGUF conversion cannot be interrupted; it runs to its end (about half a "
    "minute) and its result is then removed."
)
LOG_LINES = 400


class AddModelDialog(QDialog):
    """One import; ``added`` carries the made pipeline (a MyPipeline) and the dialog closes."""

    added = Signal(object)  # MyPipeline

    def __init__(
        self,
        imports: ModelImports,
        parent: QWidget | None = None,
        *,
        start_folder: Path | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Add model")
        self.setObjectName("addModelDialog")
        self.setMinimumWidth(620)
        self.imports = imports
        self._folder = start_folder if start_folder is not None else Path.home()
        self._close_when_done = False

        self.source_edit = QLineEdit()
        self.source_edit.setPlaceholderText("a .onnx or .gguf file, or a model folder")
        self.file_button = QPushButton("File…")
        self.file_button.clicked.connect(self.choose_file)
        self.folder_button = QPushButton("Folder…")
        self.folder_button.setToolTip("A Hugging Face model folder")
        self.folder_button.clicked.connect(self.choose_folder)
        source_row = QHBoxLayout()
        source_row.addWidget(self.source_edit, 1)
        source_row.addWidget(self.file_button)
        source_row.addWidget(self.folder_button)
        self.kind_label = QLabel(CHOOSE_HINT)
        self.kind_label.setWordWrap(True)
        self.kind_label.setStyleSheet(f"color: {NEUTRAL};")

        self.name_edit = QLineEdit()
        self.name_edit.setPlaceholderText("from the file's name")
        self.inputs_edit = QLineEdit()
        self.inputs_edit.setPlaceholderText("generated from the graph's declared inputs")
        self.inputs_button = QPushButton("Browse…")
        self.inputs_button.clicked.connect(self.choose_inputs)
        inputs_row = QHBoxLayout()
        inputs_row.addWidget(self.inputs_edit, 1)
        inputs_row.addWidget(self.inputs_button)
        self.speak_check = QCheckBox("Speak the replies (chat-speak, with the default voice)")

        form = QFormLayout()
        form.addRow("Model", source_row)
        form.addRow("", self.kind_label)
        form.addRow("Name", self.name_edit)
        form.addRow("Example inputs (.npz)", inputs_row)
        form.addRow("", self.speak_check)

        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, 0)  # the import's steps have no measurable share
        self.progress_bar.setTextVisible(False)
        self.step_label = QLabel("")
        self.step_label.setWordWrap(True)
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setFont(monospace())
        self.log.setMaximumBlockCount(LOG_LINES)
        self.log.setMinimumHeight(110)
        self.error_label = QLabel("")
        self.error_label.setObjectName("addModelError")
        self.error_label.setWordWrap(True)
        self.error_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.buttons = QDialogButtonBox()
        self.add_button = self.buttons.addButton("Add", QDialogButtonBox.ButtonRole.AcceptRole)
        self.close_button = self.buttons.addButton("Close", QDialogButtonBox.ButtonRole.RejectRole)
        self.add_button.setDefault(True)
        self.add_button.clicked.connect(self.add)
        self.close_button.clicked.connect(self._close_clicked)

        layout = QVBoxLayout(self)
        layout.addWidget(section_title("Make a model into one of My pipelines"))
        layout.addLayout(form)
        layout.addWidget(self.progress_bar)
        layout.addWidget(self.step_label)
        layout.addWidget(self.log, 1)
        layout.addWidget(self.error_label)
        layout.addWidget(self.buttons)

        self.source_edit.textChanged.connect(self._update_fields)
        imports.progress.connect(self._on_progress)
        imports.finished.connect(self._on_finished)
        self._set_running(False)
        self._update_fields()
        self.log.setVisible(False)
        self.error_label.setVisible(False)

    # -- choosing --------------------------------------------------------------------------

    def choose_file(self) -> None:
        path, _filter = QFileDialog.getOpenFileName(
            self, "An ONNX or GGUF file", str(self._folder), MODEL_FILTER
        )
        if path:
            self.set_source(Path(path))

    def choose_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(
            self, "A Hugging Face model folder", str(self._folder)
        )
        if path:
            self.set_source(Path(path))

    def choose_inputs(self) -> None:
        path, _filter = QFileDialog.getOpenFileName(
            self, "Example inputs", str(self._folder), "NumPy archives (*.npz)"
        )
        if path:
            self.inputs_edit.setText(path)

    def set_source(self, path: Path) -> None:
        self._folder = path.parent
        self.source_edit.setText(str(path))

    def source(self) -> Path | None:
        text = self.source_edit.text().strip()
        return Path(text).expanduser() if text else None

    def kind(self) -> SourceKind | None:
        source = self.source()
        return None if source is None else source_kind(source)

    def request(self) -> ImportRequest | None:
        source = self.source()
        if source is None:
            return None
        kind = source_kind(source)
        name = self.name_edit.text().strip() or None
        inputs_text = self.inputs_edit.text().strip()
        inputs = Path(inputs_text).expanduser() if inputs_text and kind is SourceKind.ONNX else None
        speak = self.speak_check.isChecked() and kind is not None and kind.is_language_model
        return ImportRequest(source, name=name, inputs=inputs, speak=speak)

    def _update_fields(self) -> None:
        kind = self.kind()
        running = self.imports.busy
        self.kind_label.setText(CHOOSE_HINT if kind is None else f"This is {kind.value}.")
        onnx = kind is SourceKind.ONNX
        self.inputs_edit.setEnabled(onnx and not running)
        self.inputs_button.setEnabled(onnx and not running)
        self.speak_check.setEnabled(kind is not None and kind.is_language_model and not running)
        # Anything else goes to the runtime, whose refusal names what it accepts.
        self.add_button.setEnabled(self.source() is not None and not running)

    # -- importing -------------------------------------------------------------------------

    def add(self) -> bool:
        request = self.request()
        if request is None or self.imports.busy:
            return False
        self.error_label.setVisible(False)
        self.log.clear()
        self.log.setVisible(False)
        if not self.imports.start(request):
            return False
        self.step_label.setText(f"adding {request.source.name}…")
        self._set_running(True)
        return True

    def cancel_import(self) -> bool:
        if not self.imports.cancel():
            return False
        self.step_label.setText(CANCEL_HINT)
        self.close_button.setEnabled(False)
        self.close_button.setText("Cancelling…")
        return True

    def _set_running(self, running: bool) -> None:
        self.progress_bar.setVisible(running)
        for widget in (self.source_edit, self.file_button, self.folder_button, self.name_edit):
            widget.setEnabled(not running)
        self.close_button.setText("Cancel" if running else "Close")
        self.close_button.setEnabled(True)
        self._update_fields()

    def _on_progress(self, line: str) -> None:
        self.log.setVisible(True)
        self.log.appendPlainText(line)
        if not line.startswith(" ") and not self.imports.cancelling:
            self.step_label.setText(line)

    def _on_finished(self, outcome: JobOutcome) -> None:
        self._set_running(False)
        if outcome.made is not None:
            self.step_label.setText(outcome.message)
            self.added.emit(outcome.made)
            self.accept()
            return
        if self._close_when_done:
            super().reject()
            return
        if outcome.status == "cancelled":
            self.step_label.setText(f"Cancelled: {outcome.message}.")
            self.log.appendPlainText(outcome.message)
            return
        self.step_label.setText("The model was not added.")
        self.show_error(outcome.message)

    def show_error(self, message: str) -> None:
        self.error_label.setText(message)
        self.error_label.setStyleSheet(f"color: {BAD};")
        self.error_label.setVisible(True)

    # -- closing ---------------------------------------------------------------------------

    def _close_clicked(self) -> None:
        """Cancel while an import runs (the dialog stays to say so); Close otherwise."""
        if not self.cancel_import() and not self.imports.busy:
            self.reject()

    def reject(self) -> None:
        """Close, or while an import runs: cancel it and close when it has ended."""
        if self.imports.busy:
            self._close_when_done = True
            self.cancel_import()
            return
        super().reject()

    def closeEvent(self, event: QCloseEvent) -> None:
        if self.imports.busy:
            event.ignore()
            self.reject()
            return
        super().closeEvent(event)
