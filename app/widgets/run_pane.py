"""The run pane: the opened pipeline, its inputs, the pre-load check, Run and Cancel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.models import InputKind, LoadView, PipelineInfo, PlanView, RunState
from app.widgets.common import (
    BAD,
    NEUTRAL,
    OK,
    WARN,
    StatusChip,
    dim,
    machine_name,
    readonly_table,
    set_row,
)
from app.widgets.loading import LoadingView

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from PySide6.QtGui import QAction

STATE_COLORS = {
    RunState.EMPTY: NEUTRAL,
    RunState.OPENING: NEUTRAL,
    RunState.READY: NEUTRAL,
    RunState.LOADING: WARN,
    RunState.RUNNING: OK,
    RunState.CANCELLING: WARN,
    RunState.LOADED: OK,
    RunState.UNLOADING: WARN,
    RunState.CLOSING: WARN,
    RunState.CLOSED: NEUTRAL,
}


class TensorInputs(QWidget):
    """The request's tensors: the bundle's examples, or arrays from an ``.npz``."""

    replace_requested = Signal()
    reset_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.table = readonly_table(["Input", "dtype", "shape", "min", "max", "mean"])
        self.source_label = QLabel("")
        self.source_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        dim(self.source_label)
        self.replace_button = QPushButton("Replace from .npz…")
        self.reset_button = QPushButton("Use example inputs")
        self.replace_button.clicked.connect(self.replace_requested)
        self.reset_button.clicked.connect(self.reset_requested)
        buttons = QHBoxLayout()
        buttons.addWidget(self.source_label, 1)
        buttons.addWidget(self.reset_button)
        buttons.addWidget(self.replace_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.table)
        layout.addLayout(buttons)
        self.arrays: dict[str, np.ndarray] = {}
        self.from_file: Path | None = None

    def show_arrays(self, arrays: Mapping[str, np.ndarray], source: Path | None) -> None:
        self.arrays = dict(arrays)
        self.from_file = source
        self.table.setRowCount(0)
        for row, (name, array) in enumerate(self.arrays.items()):
            numeric = np.issubdtype(array.dtype, np.number) and array.size > 0
            stats = (
                [
                    f"{array.min():.4g}",
                    f"{array.max():.4g}",
                    f"{array.astype(np.float64).mean():.4g}",
                ]
                if numeric
                else ["-", "-", "-"]
            )
            set_row(self.table, row, [name, str(array.dtype), str(tuple(array.shape)), *stats])
        self.table.resizeColumnsToContents()
        rows = max(1, len(self.arrays))
        self.table.setFixedHeight(
            self.table.horizontalHeader().height()
            + rows * self.table.verticalHeader().defaultSectionSize()
            + 6
        )
        if source is None:
            self.source_label.setText("Example inputs from the first stage's bundle")
        else:
            self.source_label.setText(f"From {source}")
        self.source_label.setToolTip("" if source is None else str(source))
        self.reset_button.setEnabled(source is not None)


class RunPane(QWidget):
    """What will run, with what, whether it fits; and the buttons that run or cancel it."""

    #: Open audio… of a transcription pipeline.
    audio_requested = Signal()

    def __init__(
        self,
        run_action: QAction,
        cancel_action: QAction,
        unload_action: QAction,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.info: PipelineInfo | None = None
        self.title = QLabel("No pipeline open")
        font = self.title.font()
        font.setPointSizeF(font.pointSizeF() * 1.35)
        font.setBold(True)
        self.title.setFont(font)
        self.path_label = QLabel(
            "Open a pipeline (.yaml) or a bundle (manifest.json), or pick a demo."
        )
        self.path_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # Long paths are clipped rather than widening the window; the tooltip has it whole.
        self.path_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        dim(self.path_label)
        self.description = QLabel("")
        self.description.setWordWrap(True)
        self.fit_chip = StatusChip("not checked")
        self.fit_label = QLabel("")
        self.fit_label.setWordWrap(True)
        self.state_chip = StatusChip(RunState.EMPTY.value)
        #: The stages loading (from the moment the pipeline is opened) and their times.
        self.loading = LoadingView()

        self.tensor_inputs = TensorInputs()
        self.text_input = QPlainTextEdit()
        self.text_input.setPlaceholderText("Text to speak or to prompt with")
        self.text_input.setMaximumHeight(120)
        self.text_input.hide()
        #: A transcription pipeline's input: an audio file, opened or dropped.
        self.audio_row = QWidget()
        audio_layout = QHBoxLayout(self.audio_row)
        audio_layout.setContentsMargins(0, 0, 0, 0)
        audio_hint = QLabel("An audio file: drop one on the window, or")
        dim(audio_hint)
        self.open_audio_button = QPushButton("Open audio…")
        self.open_audio_button.clicked.connect(self.audio_requested)
        audio_layout.addWidget(audio_hint)
        audio_layout.addWidget(self.open_audio_button)
        audio_layout.addStretch(1)
        self.audio_row.hide()

        self.run_button = QPushButton("Run")
        self.run_button.setDefault(True)
        self.run_button.setMinimumWidth(110)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setMinimumWidth(90)
        self.unload_button = QToolButton()
        self.unload_button.setDefaultAction(unload_action)
        self._bind(self.run_button, run_action)
        self._bind(self.cancel_button, cancel_action)
        self.run_button.setToolTip(f"Run ({run_action.shortcut().toString()})")
        self.cancel_button.setToolTip(f"Cancel ({cancel_action.shortcut().toString()})")

        fit_row = QHBoxLayout()
        fit_row.addWidget(self.fit_chip)
        fit_row.addWidget(self.fit_label, 1)
        buttons = QHBoxLayout()
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.unload_button)
        buttons.addStretch(1)
        buttons.addWidget(QLabel("State:"))
        buttons.addWidget(self.state_chip)
        self.inputs_title = inputs_title = QLabel("Inputs")
        bold = inputs_title.font()
        bold.setBold(True)
        inputs_title.setFont(bold)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(6)
        layout.addWidget(self.title)
        layout.addWidget(self.path_label)
        layout.addWidget(self.description)
        layout.addLayout(fit_row)
        layout.addWidget(self.loading)
        layout.addSpacing(4)
        layout.addWidget(inputs_title)
        layout.addWidget(self.tensor_inputs)
        layout.addWidget(self.text_input)
        layout.addWidget(self.audio_row)
        layout.addLayout(buttons)
        layout.addStretch(1)
        self.set_state(RunState.EMPTY)

    @staticmethod
    def _bind(button: QPushButton, action: QAction) -> None:
        button.clicked.connect(action.trigger)
        button.setEnabled(action.isEnabled())
        action.enabledChanged.connect(button.setEnabled)

    def show_pipeline(self, info: PipelineInfo) -> None:
        self.info = info
        self.title.setText(info.name)
        origin = "bundle opened as a one-stage pipeline: " if info.origin == "bundle" else ""
        self.path_label.setText(f"{origin}{info.path}")
        self.path_label.setToolTip(str(info.path))
        stages = ", ".join(info.stage_names)
        self.description.setText(
            f"{info.description}\nStages: {stages}" if info.description else f"Stages: {stages}"
        )
        text = info.input_kind is InputKind.TEXT
        # A chat pipeline's input is the conversation view's message, sent from there; a
        # spoken conversation's is the microphone, started there.
        conversation = info.chat or info.voice
        self.inputs_title.setVisible(not conversation)
        self.run_button.setVisible(not conversation)
        self.cancel_button.setVisible(not conversation)
        self.text_input.setVisible(text and not info.chat)
        self.tensor_inputs.setVisible(info.input_kind is InputKind.TENSORS)
        self.audio_row.setVisible(info.input_kind is InputKind.AUDIO and not info.voice)
        if text:
            self.text_input.setPlainText(info.example_text)
        elif info.input_kind is InputKind.TENSORS:
            self.tensor_inputs.show_arrays(info.example_inputs, None)
        self.show_plan(info.plan)

    def show_loading(self, view: LoadView | None) -> None:
        """The stages' load; a chat pipeline's shows in its conversation view instead."""
        chat = self.info is not None and self.info.chat
        self.loading.show_snapshot(None if chat else view)

    def show_plan(self, plan: PlanView) -> None:
        if plan.admitted:
            self.fit_chip.set_status("Fits", OK)
            warnings = (
                f" {len(plan.warnings)} warning(s) in the Plan panel." if plan.warnings else ""
            )
            self.fit_label.setText(
                f"Checked before loading on {machine_name(plan.topology)}: bundles verified, devices allowed, "
                f"memory budget fits.{warnings}"
            )
        else:
            self.fit_chip.set_status("Refused", BAD)
            self.fit_label.setText(plan.refusals[0] if plan.refusals else "refused")
        self.fit_label.setToolTip("\n".join((*plan.refusals, *plan.warnings)))

    def set_state(self, state: RunState) -> None:
        self.state_chip.set_status(state.value, STATE_COLORS[state])
        editable = not state.busy
        self.tensor_inputs.replace_button.setEnabled(editable and self.info is not None)
        self.tensor_inputs.reset_button.setEnabled(
            editable and self.tensor_inputs.from_file is not None
        )
        self.text_input.setReadOnly(not editable)
        self.open_audio_button.setEnabled(editable)

    def request_input(self) -> object:
        """The request's input: text, or the tensors shown."""
        if self.info is not None and self.info.input_kind is InputKind.TEXT:
            return self.text_input.toPlainText()
        return dict(self.tensor_inputs.arrays) if self.tensor_inputs.from_file is not None else None
