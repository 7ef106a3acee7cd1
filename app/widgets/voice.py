"""The conversation view's microphone: a spoken conversation with the voice-chat pipeline.

Two ways to talk: **hands-free** (Talk starts the conversation, which listens until the button
is clicked again) and **push to talk** (the conversation hears the microphone only while Hold
to talk is held; End ends it). The conversation's state (listening, thinking, speaking) and
the microphone's level show beside the button. On another pipeline only an offer to open the
voice-chat pipeline shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QCheckBox, QComboBox, QHBoxLayout, QPushButton, QWidget

from app.voice_presenters import state_look
from app.widgets.audio_input import LevelMeter
from app.widgets.common import StatusChip

if TYPE_CHECKING:
    from app.bridge_audio_input import InputLevel

HANDS_FREE: Final = "Hands-free"
PUSH_TO_TALK: Final = "Push to talk"
TALK_TIP: Final = (
    "Start a spoken conversation: speak, and the assistant answers aloud; speak over a reply to "
    "interrupt it. Click again to end the conversation"
)
HOLD_TIP: Final = (
    "Hold to speak: the microphone is heard only while the button is held; End ends the "
    "conversation"
)


class VoiceControls(QWidget):
    """Talk or Hold to talk, the mode, headphones, the state and the level (see the module)."""

    talk_clicked = Signal(bool)  # hands-free: start (True) or end (False)
    hold_changed = Signal(bool)  # push to talk: held (True) or released (False)
    end_requested = Signal()
    offer_clicked = Signal()  # open the voice-chat pipeline

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.voice = False
        self.running = False
        self.starting = False
        self.held = False
        self.offer_button = QPushButton("Voice conversation…")
        self.offer_button.setToolTip(
            "Open the voice-chat pipeline (assets/pipelines/voice-chat.yaml) to talk with the "
            "assistant: the microphone button is there"
        )
        self.mode_box = QComboBox()
        self.mode_box.addItems([HANDS_FREE, PUSH_TO_TALK])
        self.mode_box.setToolTip("Hands-free listens all the time; push to talk while held")
        self.talk_button = QPushButton("Talk")
        self.end_button = QPushButton("End")
        self.end_button.setToolTip("End the conversation")
        self.headphones = QCheckBox("Headphones")
        self.headphones.setToolTip(
            "With headphones the speaker is not heard by the microphone: no echo cancellation"
        )
        self.state = StatusChip()
        self.meter = LevelMeter()
        self.meter.setMinimumWidth(70)
        self.meter.setMaximumWidth(120)
        self.offer_button.clicked.connect(self.offer_clicked)
        self.mode_box.currentIndexChanged.connect(lambda _index: self._redraw())
        self.talk_button.clicked.connect(self._clicked)
        self.talk_button.pressed.connect(lambda: self._held(True))
        self.talk_button.released.connect(lambda: self._held(False))
        self.end_button.clicked.connect(self.end_requested)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        for widget in (self.offer_button, self.mode_box, self.talk_button, self.end_button):
            row.addWidget(widget)
        row.addWidget(self.headphones)
        row.addWidget(self.meter)
        row.addStretch(1)
        row.addWidget(self.state)
        self.show_state("")
        self._redraw()

    @property
    def push_to_talk(self) -> bool:
        return self.mode_box.currentText() == PUSH_TO_TALK

    def set_voice(self, voice: bool) -> None:
        """A voice-chat pipeline is open (the controls), or another (the offer)."""
        self.voice = voice
        self._redraw()

    def set_running(self, running: bool, *, starting: bool = False) -> None:
        """A conversation runs, or is starting (waiting for the stages to load)."""
        self.running = running
        self.starting = starting
        self._redraw()

    def show_state(self, state: str) -> None:
        text, colour = state_look(state)
        self.state.set_status(text, colour)

    def show_level(self, level: InputLevel) -> None:
        self.meter.show_level(level)

    def _clicked(self, checked: bool) -> None:
        if not self.push_to_talk:
            self.talk_clicked.emit(checked)

    def _held(self, held: bool) -> None:
        if self.push_to_talk:
            self.held = held
            self._redraw()
            self.hold_changed.emit(held)

    def _redraw(self) -> None:
        voice = self.voice
        busy = self.running or self.starting
        self.offer_button.setVisible(not voice)
        for widget in (self.mode_box, self.talk_button, self.headphones, self.state, self.meter):
            widget.setVisible(voice)
        self.mode_box.setEnabled(not busy)
        self.headphones.setEnabled(not busy)
        push = self.push_to_talk
        self.end_button.setVisible(voice and push and busy)
        self.talk_button.blockSignals(True)
        self.talk_button.setCheckable(not push)
        self.talk_button.setChecked(not push and busy)
        self.talk_button.blockSignals(False)
        if push:
            self.talk_button.setText("Talking…" if self.held else "Hold to talk")
            self.talk_button.setToolTip(HOLD_TIP)
        else:
            self.talk_button.setText(
                "Starting… (click to cancel)"
                if self.starting
                else "End conversation"
                if self.running
                else "Talk"
            )
            self.talk_button.setToolTip(TALK_TIP)
        if not busy:
            self.meter.clear()
