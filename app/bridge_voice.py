"""The part of the bridge that holds a spoken conversation on the open voice-chat pipeline: one
:class:`runtime.talk.VoiceConversation` at a time, started and ended in control jobs, its
events carried to the GUI thread by the bridge's one hop and emitted there as Qt signals.

While it runs, a timer on the GUI thread reads what the conversation offers for that without
waiting (``state``, the microphone's ``level()``, the turns' timings) about 20 times a
second. Push to talk runs the same conversation with the microphone muted while the button
is up: :class:`MutableDuplexAudio` feeds silence in place of the microphone while its switch
is set, so the conversation keeps its timing and hears the user only while the button is
held.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import numpy as np
from PySide6.QtCore import QObject, QTimer, Signal

from app.bridge_audio_input import LEVEL_INTERVAL_S, InputLevel
from runtime.adapters.vad_bundle import ensure_vad_bundle
from runtime.audio.duplex import DuplexAudio
from runtime.audio.echo import make_echo_canceller
from runtime.talk import TalkSettings, VoiceConversation

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path

    from runtime.api import PipelineSession
    from runtime.audio.duplex import CapturedBlock
    from runtime.conversation import ConversationEvent

__all__ = [
    "MutableDuplexAudio",
    "VoiceEnded",
    "VoiceStart",
    "VoiceTalk",
    "export_missing_vad",
]

#: The voice's rate when the session does not say (Piper ``joe``).
DEFAULT_REPLY_RATE: Final = 22050
#: How long ending a conversation waits for the reply being made to finish.
STOP_TIMEOUT_S: Final = 30.0
#: Where a pipeline names the voice activity bundle made on first use.
VAD_PLACEHOLDER: Final = "${data}/vad/silero/"


def export_missing_vad(pipeline: Path, progress: Callable[[str], None]) -> bool:
    """Make the voice activity bundle ``pipeline`` names under the user data directory when it
    is missing (on first use, as the voices and recognisers are); True when it names one."""
    try:
        text = pipeline.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False  # opening the pipeline reports it
    if VAD_PLACEHOLDER not in text:
        return False
    ensure_vad_bundle(progress=progress)
    return True


class MutableDuplexAudio(DuplexAudio):
    """A duplex stream whose microphone reads as silence while ``muted`` is set (push to talk).
    The played reference, the echo canceller and the stream's timing are unchanged."""

    def __init__(self, muted: threading.Event, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.muted = muted

    def read(self, timeout: float | None = None) -> CapturedBlock | None:
        block = super().read(timeout)
        if block is None or not self.muted.is_set():
            return block
        return dataclasses.replace(block, near=np.zeros_like(block.near))


@dataclass(frozen=True, slots=True)
class VoiceStart:
    """What a spoken conversation starts with: the input and output devices (names; None: the
    defaults), the echo canceller (``off`` with headphones) and the microphone's mute switch
    (set: silence is fed; push to talk clears it while the button is held)."""

    input_device: str | None = None
    output_device: str | None = None
    echo: str = "auto"
    muted: threading.Event = field(default_factory=threading.Event, compare=False)


@dataclass(frozen=True, slots=True)
class VoiceEnded:
    """How a conversation ended (``completed``, ``cancelled`` or ``failed`` with ``error``),
    its turns as the request's final output gave them (``VoiceTurn.to_json()``; none when it
    was cancelled) and each turn's timing (``TurnTiming.to_json()``)."""

    status: str
    error: BaseException | None = None
    turns: tuple[Mapping[str, Any], ...] = ()
    timings: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, eq=False)
class LiveConversation:
    """One running conversation and what the GUI shows of it. ``ended`` is set once the GUI
    thread heard that it ended (later news of it is dropped); the conversation's event
    callback holds only that, so no reference cycle keeps the conversation alive."""

    conversation: VoiceConversation
    device: str
    started_at: float
    ended: threading.Event = field(default_factory=threading.Event)


class VoiceTalk(QObject):
    """Starts, watches and ends one spoken conversation at a time. ``submit`` runs a job on
    the bridge's control thread, ``post`` (the bridge's one hop) runs a callback on the GUI
    thread."""

    conversation_event = Signal(object)  # ConversationEvent, in the order the conversation met them
    state_changed = Signal(str)  # listening, thinking, speaking; "" once it ended
    level = Signal(object)  # InputLevel of the microphone
    timings_changed = Signal(object)  # tuple of TurnTiming.to_json() values
    started = Signal()
    ended = Signal(object)  # VoiceEnded

    def __init__(
        self,
        *,
        post: Callable[[Callable[[], None]], None],
        submit: Callable[[Callable[[], None]], None],
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._post = post
        self._submit = submit
        self._live: LiveConversation | None = None  # control thread only
        self._shown: LiveConversation | None = None  # GUI thread only
        self._ending = False
        self._state = ""
        self._timings: tuple[Mapping[str, Any], ...] = ()
        self._timer = QTimer(self)
        self._timer.setInterval(round(LEVEL_INTERVAL_S * 1000))
        self._timer.timeout.connect(self._tick)

    @property
    def running(self) -> bool:
        """A conversation runs (GUI thread); False again once ``ended`` was emitted."""
        return self._shown is not None

    @property
    def state(self) -> str:
        return self._state

    # -- control thread ----------------------------------------------------------------

    def start_job(self, session: PipelineSession, start: VoiceStart) -> LiveConversation:
        """Open the audio device and start the conversation (control thread); raises what
        stopped it, with the device closed again and no request left."""
        device = (start.input_device, start.output_device)
        canceller = None if start.echo == "off" else make_echo_canceller(start.echo)
        settings = TalkSettings(device=device, echo=start.echo)
        audio = MutableDuplexAudio(
            start.muted,
            device,
            reply_rate=session.options.sample_rate or DEFAULT_REPLY_RATE,
            block_frames=settings.block_frames,
            echo_canceller=canceller,
        )
        ended = threading.Event()

        def on_event(event: ConversationEvent) -> None:  # the conversation's output thread
            self._post(partial(self._deliver, ended, event))

        conversation = VoiceConversation(session, settings, on_event=on_event, audio=audio)
        try:
            conversation.start()
        except BaseException:
            audio.close()
            raise
        live = LiveConversation(conversation, audio.metrics().input_device, time.monotonic(), ended)
        self._live = live
        return live

    def _end_job(self, live: LiveConversation, cancel: bool) -> None:
        conversation = live.conversation
        error: BaseException | None = None
        try:
            if cancel:
                conversation.cancel()
            else:
                conversation.stop(STOP_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - what failed the conversation, shown to the user
            error = exc
        final = conversation.final
        turns = final.metrics.get("turns") if final is not None and final.metrics else None
        ended = VoiceEnded(
            "failed" if error is not None else "cancelled" if cancel else "completed",
            error,
            tuple(turn for turn in turns if isinstance(turn, dict))
            if isinstance(turns, list)
            else (),
            tuple(timing.to_json() for timing in conversation.timings()),
        )
        if self._live is live:
            self._live = None
        self._post(partial(self._ended, live, ended))

    def close_job(self) -> None:
        """Cancel the conversation, if one runs (control thread; the studio is closing)."""
        live = self._live
        if live is not None:
            self._end_job(live, cancel=True)

    # -- GUI thread --------------------------------------------------------------------

    def attach(self, live: LiveConversation) -> None:
        """The conversation started: watch it until it ends."""
        self._shown = live
        self._ending = False
        self._timer.start()
        self.started.emit()
        self._tick()

    def stop(self) -> bool:
        """End the conversation: no more input; the reply being made finishes (never waits);
        ``ended`` follows."""
        live = self._shown
        if live is None or self._ending:
            return False
        self._ending = True
        self._submit(partial(self._end_job, live, False))
        return True

    def cancel(self) -> bool:
        """Stop the conversation at once (never waits); ``ended`` follows."""
        live = self._shown
        if live is None:
            return False
        self._ending = True
        self._submit(partial(self._end_job, live, True))
        return True

    def _deliver(self, ended: threading.Event, event: ConversationEvent) -> None:
        if ended.is_set():
            return
        self.conversation_event.emit(event)
        self._show_state()

    def _tick(self) -> None:
        live = self._shown
        if live is None:
            return
        conversation = live.conversation
        value = conversation.audio.level()
        recorded = time.monotonic() - live.started_at
        self.level.emit(InputLevel(value.rms_dbfs, value.peak_dbfs, recorded, live.device))
        self._show_state()
        timings = tuple(timing.to_json() for timing in conversation.timings())
        if timings != self._timings:
            self._timings = timings
            self.timings_changed.emit(timings)
        if conversation.finished:
            self.stop()  # it ended by itself (a failure): collect what ended it

    def _show_state(self) -> None:
        live = self._shown
        state = "" if live is None else live.conversation.state
        if state != self._state:
            self._state = state
            self.state_changed.emit(state)

    def _ended(self, live: LiveConversation, ended: VoiceEnded) -> None:
        if live.ended.is_set():
            return
        live.ended.set()
        if self._shown is live:
            self._shown = None
            self._timer.stop()
            self._ending = False
        self._show_state()
        self._timings = ended.timings
        self.timings_changed.emit(ended.timings)
        self.ended.emit(ended)
