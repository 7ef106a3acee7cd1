"""The main window's spoken conversation, kept beside :mod:`app.window`.

On a voice-chat pipeline the conversation view's microphone (:class:`app.widgets.voice.
VoiceControls`) starts a conversation through the bridge (:meth:`app.bridge.RuntimeBridge.talk`,
which loads the stages first when needed; :mod:`app.bridge_voice` holds the conversation):

- **hands-free**: Talk starts it, clicking again ends it (the reply being made finishes);
- **push to talk**: holding the button starts it and lets the microphone be heard; released,
  the conversation goes on hearing silence; End ends it.

Its events become the conversation view's turns (:class:`app.voice_presenters.VoiceTurns`,
saved like typed chats), its state shows beside the button, the microphone's level in the
Devices panel and beside the button, and each turn's latency in the Metrics panel. On another
pipeline the microphone offers to open ``voice-chat.yaml``.

Before anything starts, the input and output devices are looked up: when there is none the
banner says why and nothing is started or loaded.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Final, Protocol

from PySide6.QtCore import QObject

from app.bridge_voice import VoiceStart
from app.demos import assets_dir
from app.models import ErrorInfo, RunState
from app.voice_presenters import VoiceTurns, turn_latency_rows
from runtime.audio.devices import resolve_input_device, resolve_output_device
from runtime.errors import OmniError

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path
    from typing import Any

    from PySide6.QtWidgets import QWidget

    from app.bridge import RuntimeBridge
    from app.bridge_audio_input import InputLevel, InputRecorder, Recording
    from app.bridge_voice import VoiceEnded
    from app.models import PipelineInfo
    from app.settings import StudioSettings
    from app.widgets.banner import ErrorBanner
    from app.widgets.chat import ChatView
    from app.widgets.devices import DevicesPanel
    from app.widgets.metrics import MetricsPanel
    from app.window_setup import FirstUseHook
    from runtime.conversation import ConversationEvent

#: The bundled voice-chat pipeline's file name.
VOICE_PIPELINE: Final = "voice-chat.yaml"


class VoiceHost(Protocol):
    """What the hook uses of the main window (:class:`app.window.MainWindow`)."""

    bridge: RuntimeBridge
    settings: StudioSettings
    banner: ErrorBanner
    chat: ChatView
    devices_panel: DevicesPanel
    metrics_panel: MetricsPanel
    first_use: FirstUseHook
    demos: list[tuple[Path, str]]

    def open_path(self, path: Path | str) -> bool: ...


class VoiceHook(QObject):
    """Owns the conversation view's microphone and what a conversation shows."""

    def __init__(self, window: VoiceHost, recorder: InputRecorder, *, parent: QWidget) -> None:
        super().__init__(parent)
        self.window = window
        self.talk = window.bridge.voice
        self.recorder = recorder
        self.controls = window.chat.voice
        #: The open pipeline is a spoken conversation.
        self.open = False
        #: The conversation's turns while one runs (and after, until the next starts).
        self.turns: VoiceTurns | None = None
        #: The microphone's switch of the conversation starting or running (set: muted).
        self.muted = threading.Event()
        #: ``idle``, ``starting`` (asked for; the stages may be loading) or ``running``.
        self.phase = "idle"
        #: A conversation waits for the Devices panel's test to let go of the input.
        self._start_after_test: VoiceStart | None = None
        self._connect()

    def _connect(self) -> None:
        bridge = self.window.bridge
        bridge.pipeline_opened.connect(self._on_opened)
        bridge.state_changed.connect(self._on_bridge_state)
        self.controls.offer_clicked.connect(self.open_voice_pipeline)
        self.controls.talk_clicked.connect(self._on_talk_clicked)
        self.controls.hold_changed.connect(self._on_hold)
        self.controls.end_requested.connect(self.end)
        self.talk.started.connect(self._on_started)
        self.talk.conversation_event.connect(self._on_event)
        self.talk.state_changed.connect(self._on_state)
        self.talk.level.connect(self._on_level)
        self.talk.timings_changed.connect(self._on_timings)
        self.talk.ended.connect(self._on_ended)
        self.recorder.stopped.connect(self._on_test_stopped)

    def pipeline_path(self) -> Path:
        """The bundled voice-chat pipeline (among the window's demos when listed)."""
        for path, _description in self.window.demos:
            if path.name == VOICE_PIPELINE:
                return path
        return assets_dir() / "pipelines" / VOICE_PIPELINE

    def open_voice_pipeline(self) -> bool:
        return self.window.open_path(self.pipeline_path())

    # -- starting and ending -----------------------------------------------------------

    @property
    def active(self) -> bool:
        """A conversation runs, or is starting (the stages may be loading)."""
        return self.phase != "idle"

    def run(self) -> bool:
        """Run pressed: on a voice-chat pipeline start a hands-free conversation, or end the
        one running; False on another pipeline."""
        if not self.open:
            return False
        if self.active:
            self.end()
        else:
            self.start(muted=False)
        return True

    def start(self, *, muted: bool) -> bool:
        """Start a conversation (``muted``: push to talk's button is up) when the devices are
        there and nothing is to be made first; the banner says why not."""
        window = self.window
        if self.active or not window.bridge.state.can_run:
            return False
        settings = window.settings
        try:
            resolve_input_device(settings.input_device)
            resolve_output_device(settings.audio_device)
        except OmniError as exc:
            window.banner.show_error(
                ErrorInfo("The conversation needs a microphone and a speaker", str(exc))
            )
            return False
        if window.first_use.offer_before_run():
            return False
        window.banner.dismiss()
        self.muted = threading.Event()
        if muted:
            self.muted.set()
        echo = "off" if self.controls.headphones.isChecked() else "auto"
        start = VoiceStart(settings.input_device, settings.audio_device, echo, self.muted)
        chat = window.chat
        if chat.conversation.turns:
            chat.new_conversation()
        self.turns = VoiceTurns(chat.conversation)
        window.metrics_panel.show_turns(())
        if self.recorder.running:  # the Devices panel's test holds the input: let it go first
            self._start_after_test = start
            self.recorder.stop()
        elif not window.bridge.talk(start):
            return False
        self.phase = "starting"
        self._show_running()
        return True

    def end(self) -> None:
        """End the conversation (the reply being made finishes), or stop waiting for it."""
        if self.talk.running:
            self.talk.stop()
        elif self._start_after_test is not None:
            self._start_after_test = None
            self.phase = "idle"
        elif self.phase == "starting":
            self.window.bridge.cancel(keep_loaded=True)
        self._show_running()

    def _on_talk_clicked(self, start: bool) -> None:
        if start and not self.active:
            self.start(muted=False)
        else:
            self.end()
        self._show_running()  # a start refused leaves the button as it was

    def _on_hold(self, held: bool) -> None:
        if held:
            self.muted.clear()
            if not self.active:
                self.start(muted=False)
        else:
            self.muted.set()

    def _on_test_stopped(self, _recording: Recording) -> None:
        start, self._start_after_test = self._start_after_test, None
        if start is None:
            return
        self.window.devices_panel.audio_input.set_listening(False)
        if not self.window.bridge.talk(start):
            self.phase = "idle"
        self._show_running()

    # -- the bridge's signals ------------------------------------------------------------

    def _on_opened(self, info: PipelineInfo) -> None:
        self.open = info.voice
        self.window.chat.set_voice(info.voice)
        self._show_running()

    def _on_bridge_state(self, state: RunState) -> None:
        if self.phase == "starting" and self._start_after_test is None and not state.busy:
            self.phase = "idle"  # the start failed, or was cancelled while the stages loaded
        self._show_running()

    def _show_running(self) -> None:
        running = self.phase == "running"
        starting = self.phase == "starting"
        self.controls.set_running(running, starting=starting)
        can_start = self.window.bridge.state.can_run or self.active
        self.controls.talk_button.setEnabled(can_start)
        self.window.chat.set_talking(self.active)
        # The conversation holds the input: the Devices panel's meter shows its level.
        self.window.devices_panel.audio_input.test_button.setEnabled(not self.active)

    def _on_started(self) -> None:
        self.phase = "running"
        self._show_running()

    def _on_event(self, event: ConversationEvent) -> None:
        turns = self.turns
        if turns is None:
            return
        changed = turns.apply(event)
        self._show_turns(save=changed)

    def _on_state(self, state: str) -> None:
        self.controls.show_state(state)
        turns = self.turns
        if turns is not None and state and turns.reply is not None:
            turns.note = state
            self._show_turns()

    def _show_turns(self, *, save: bool = False) -> None:
        turns = self.turns
        if turns is None:
            return
        self.window.chat.show_voice(
            turns.conversation, turns.heard, turns.reply, turns.note, save=save
        )

    def _on_level(self, level: InputLevel) -> None:
        self.window.devices_panel.audio_input.show_level(level)
        self.controls.show_level(level)

    def _on_timings(self, timings: tuple[Mapping[str, Any], ...]) -> None:
        self.window.metrics_panel.show_turns(turn_latency_rows(timings))

    def _on_ended(self, ended: VoiceEnded) -> None:
        turns = self.turns
        if turns is not None:
            changed = turns.settle(ended.turns)
            self._show_turns(save=changed)
        self.phase = "idle"
        self.window.devices_panel.audio_input.set_listening(False)
        self.controls.show_state("")
        self._show_running()
