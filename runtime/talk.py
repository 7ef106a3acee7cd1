"""A live spoken conversation: a voice-chat session, a full-duplex audio stream and the echo
canceller between them (used by ``omni-edge talk`` and the studio's microphone button).

:class:`VoiceConversation` submits one streaming request to a voice-chat session
(:class:`~runtime.adapters.voice_chat.VoiceChatProgram`) and runs two threads:

- the **capture** thread reads the microphone from :class:`~runtime.audio.duplex.DuplexAudio`
  (16 kHz, the played reply removed by the echo canceller, :mod:`runtime.audio.echo`) and
  feeds it to the request as :class:`~runtime.conversation.VoiceFrame` values, each with how
  much of the current reply has been played;
- the **output** thread reads the request's outputs: reply audio goes to the speaker as it
  comes (one reply per turn), ``barge_in`` fades it out and holds it, ``resumed`` plays it on,
  ``interrupted`` drops what is left; every event goes to ``on_event`` (called on that thread)
  and moves the conversation's :attr:`state` (listening, thinking, speaking).

Each turn's latency is the program's parts (from the end of the user's speech to the first
audio made) plus the player's lead (from that audio's arrival to its first sample handed to
the device, and the device's reported output latency), in :attr:`VoiceConversation.turns`.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from runtime.audio.duplex import DuplexAudio
from runtime.audio.echo import ECHO_KINDS, make_echo_canceller
from runtime.conversation import (
    BARGE_IN,
    INTERRUPTED,
    LISTENING,
    REPLY_AUDIO,
    REPLY_DONE,
    RESUMED,
    SPEAKING,
    SPEECH_STARTED,
    THINKING,
    TURN_ENDED,
    ConversationEvent,
    VoiceFrame,
)
from runtime.errors import OmniError, UsageError
from runtime.outputs import AudioChunk

if TYPE_CHECKING:
    from collections.abc import Callable

    from runtime.api import PipelineSession, RequestHandle
    from runtime.audio.duplex import DeviceSpec
    from runtime.outputs import OmniRequestOutput

__all__ = ["TalkSettings", "TurnTiming", "VoiceConversation"]

#: How long a waiting reader looks again whether the conversation ended.
_POLL_S: Final = 0.05


@dataclass(frozen=True, slots=True)
class TalkSettings:
    """The audio side of a conversation: the device (a name, an index, or an (input, output)
    pair; None: the defaults) and the echo canceller (``off`` with headphones)."""

    device: DeviceSpec | tuple[DeviceSpec, DeviceSpec] = None
    echo: str = "auto"
    block_frames: int = 256

    def __post_init__(self) -> None:
        if self.echo not in ECHO_KINDS:
            raise UsageError(
                f"echo cancellation {self.echo!r} is not known; accepted: {', '.join(ECHO_KINDS)}"
            )


@dataclass(slots=True)
class TurnTiming:
    """One turn as the conversation saw it (times are ``time.monotonic()``)."""

    turn: int
    ended_at: float | None = None
    first_audio_at: float | None = None
    first_sample_at: float | None = None
    output_latency_s: float = 0.0
    barge_in_at: float | None = None
    interrupted: bool = False
    #: The program's parts (seconds from the end of the user's speech): ``end_of_turn_s``,
    #: ``transcription_s``, ``first_clause_s``, ``first_audio_s``.
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def player_lead_s(self) -> float | None:
        """From the reply's first audio arriving to its first sample handed to the device."""
        if self.first_audio_at is None or self.first_sample_at is None:
            return None
        return max(0.0, self.first_sample_at - self.first_audio_at)

    def to_json(self) -> dict[str, Any]:
        return {
            "turn": self.turn,
            **self.parts,
            "player_lead_s": self.player_lead_s,
            "output_latency_s": self.output_latency_s,
            "interrupted": self.interrupted,
        }


class VoiceConversation:
    """One live conversation on a loaded voice-chat ``session`` (see the module)."""

    def __init__(
        self,
        session: PipelineSession,
        settings: TalkSettings | None = None,
        *,
        on_event: Callable[[ConversationEvent], None] | None = None,
        audio: DuplexAudio | None = None,
    ) -> None:
        if session.kind != "voice-chat":
            raise UsageError(
                f"pipeline {session.name} is a {session.kind} pipeline; a conversation needs a "
                "voice-chat pipeline (e.g. assets/pipelines/voice-chat.yaml)"
            )
        self.session = session
        self.settings = settings or TalkSettings()
        self._on_event = on_event
        self._audio = audio
        self._handle: RequestHandle | None = None
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._state = LISTENING
        self._reply_turn: int | None = None
        #: The latest reply the speaker has begun (set by the player thread): the capture
        #: thread reports its playback. It lags ``_reply_turn`` while the player thread waits
        #: (a held reply's full buffer), and a reply not begun yet has nothing played.
        self._begun_turn: int | None = None
        self._open_reply: int | None = None
        #: The speaker's work, in order, for the player's thread: begin, audio, end of a reply.
        self._queue: queue.Queue[tuple[str, int, int | np.ndarray | None] | None] = queue.Queue()
        #: Turns whose replies were interrupted: what is still queued of them is dropped.
        self._dropped: set[int] = set()
        self._timings: dict[int, TurnTiming] = {}
        self._final: OmniRequestOutput | None = None
        self._failure: BaseException | None = None
        self._stopping = threading.Event()
        self._done = threading.Event()

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Open the audio device and start listening."""
        if self._handle is not None:
            raise UsageError("the conversation was started already; start a new one")
        if self._audio is None:
            canceller = (
                None if self.settings.echo == "off" else make_echo_canceller(self.settings.echo)
            )
            self._audio = DuplexAudio(
                self.settings.device,
                reply_rate=self.session.options.sample_rate or 22050,
                block_frames=self.settings.block_frames,
                # A whole reply fits (the voice runs ahead of the speaker).
                buffer_s=60.0,
                echo_canceller=canceller,
            )
        self._audio.start()
        try:
            self._handle = self.session.submit(streaming=True)
        except BaseException:
            self._audio.close()
            raise
        threads = (("capture", self._capture), ("output", self._output), ("player", self._player))
        for name, target in threads:
            thread = threading.Thread(target=target, name=f"omni-talk-{name}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self, timeout: float | None = 30.0) -> None:
        """End the conversation: no more input; the reply being made finishes, then the
        request ends and the device closes. Raises what failed the conversation."""
        self._stopping.set()
        self._join(timeout)
        if self._failure is not None:
            raise self._failure

    def cancel(self) -> None:
        """Stop at once: the request is cancelled (nothing left behind) and the device closed."""
        self._stopping.set()
        if self._handle is not None:
            self._handle.cancel()
        self._join(10.0)

    def _join(self, timeout: float | None) -> None:
        for thread in self._threads:
            thread.join(timeout)
        if self._handle is not None and any(t.is_alive() for t in self._threads):
            self._handle.cancel()
            for thread in self._threads:
                thread.join(5.0)
        if self._audio is not None:
            self._audio.close()

    def __enter__(self) -> VoiceConversation:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if exc_info[0] is None:
            self.stop()
        else:
            self.cancel()

    # ----------------------------------------------------------------- what it shows

    @property
    def state(self) -> str:
        """``listening``, ``thinking`` (the user's turn ended, no reply heard yet) or
        ``speaking``."""
        return self._state

    @property
    def audio(self) -> DuplexAudio:
        if self._audio is None:
            raise UsageError("the conversation has not started")
        return self._audio

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the request ended; True when it did."""
        return self._done.wait(timeout)

    @property
    def final(self) -> OmniRequestOutput | None:
        """The request's final output (its metrics hold every turn), once it ended."""
        return self._final

    def timings(self) -> list[TurnTiming]:
        with self._lock:
            return [self._timings[turn] for turn in sorted(self._timings)]

    # ----------------------------------------------------------------- threads

    def _capture(self) -> None:
        handle = self._handle
        audio = self._audio
        assert handle is not None
        assert audio is not None
        try:
            while not self._stopping.is_set() and not self._done.is_set():
                block = audio.read(_POLL_S)
                if block is None:
                    if audio.ended:
                        break
                    continue
                turn = self._begun_turn
                played = 0
                if turn is not None:
                    playback = audio.reply(str(turn))
                    played = playback.played
                    self._follow(turn, playback.first_sample_at, playback.output_latency_s)
                    if playback.finished and self._state == SPEAKING:
                        self._state = LISTENING
                handle.feed(VoiceFrame(block.near, reply=turn, played_samples=played))
            if not self._done.is_set():
                handle.end_input()
        except OmniError as exc:
            # A cancel ends the request under the feeding thread: that is no failure.
            if not self._done.is_set() and not self._stopping.is_set():
                self._fail(exc)
        except BaseException as exc:  # noqa: BLE001 - reported to the owner by stop()
            self._fail(exc)

    def _follow(self, turn: int, first_sample_at: float | None, latency: float) -> None:
        timing = self._timing(turn)
        if timing.first_sample_at is None and first_sample_at is not None:
            timing.first_sample_at = first_sample_at
            timing.output_latency_s = latency

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
        self._stopping.set()
        if self._handle is not None:
            self._handle.cancel(wait=False)

    def _output(self) -> None:
        handle = self._handle
        assert handle is not None
        try:
            for output in handle:
                if output.finished:
                    self._final = output
                    self._collect(output)
                    break
                event = ConversationEvent.from_outputs(
                    output.outputs, output.text, source=f"output {output.index}"
                )
                if event is None:
                    continue
                self._on(event, output)
        except BaseException as exc:  # noqa: BLE001 - reported to the owner by stop()
            if not isinstance(exc, OmniError) or not self._stopping.is_set():
                self._fail(exc)
        finally:
            self._close_reply()
            self._queue.put(None)
            self._done.set()
            self._stopping.set()

    def _timing(self, turn: int) -> TurnTiming:
        with self._lock:
            timing = self._timings.get(turn)
            if timing is None:
                timing = self._timings[turn] = TurnTiming(turn)
            return timing

    def _on(self, event: ConversationEvent, output: OmniRequestOutput) -> None:
        audio = self._audio
        assert audio is not None
        now = time.monotonic()
        name = event.event
        if name == REPLY_AUDIO:
            chunk = AudioChunk.from_output(output)
            if chunk is not None and chunk.pcm.size:
                self._play(event.turn, chunk, now)
            return
        if name == BARGE_IN:
            audio.duck()
            self._timing(event.turn).barge_in_at = now
        elif name == RESUMED:
            audio.resume()
        elif name == INTERRUPTED:
            # What is queued for the speaker is dropped, here and in the player's thread.
            self._dropped.add(event.turn)
            audio.interrupt()
            self._timing(event.turn).interrupted = True
            self._close_reply()
            self._state = LISTENING
        elif name == REPLY_DONE:
            self._close_reply()
            if self._reply_turn != event.turn:
                # Nothing was said (an empty transcript, or nothing speakable).
                self._state = LISTENING
        elif name == TURN_ENDED:
            self._timing(event.turn).ended_at = now
            self._state = THINKING
        elif name == SPEECH_STARTED:
            self._state = LISTENING
        if self._on_event is not None:
            self._on_event(event)

    def _play(self, turn: int, chunk: AudioChunk, now: float) -> None:
        if self._open_reply != turn:
            self._close_reply()
            self._queue.put(("begin", turn, chunk.sample_rate))
            self._open_reply = turn
            self._reply_turn = turn
            self._timing(turn).first_audio_at = now
            self._state = SPEAKING
        self._queue.put(("pcm", turn, chunk.pcm.copy()))

    def _close_reply(self) -> None:
        if self._open_reply is None:
            return
        self._queue.put(("end", self._open_reply, None))
        self._open_reply = None

    def _player(self) -> None:
        """Hands the replies' audio to the speaker. A thread of its own: while the speaker
        holds a reply (a barge-in) its buffer may fill and ``feed`` wait, and the outputs
        (among them the interruption that ends the wait) must go on being read meanwhile."""
        audio = self._audio
        assert audio is not None
        begun: int | None = None
        while (item := self._queue.get()) is not None:
            kind, turn, value = item
            try:
                if turn in self._dropped:
                    if kind == "end" and begun == turn:
                        audio.end_reply()
                        begun = None
                    continue
                if kind == "begin":
                    assert isinstance(value, int)
                    audio.begin_reply(str(turn), sample_rate=value)
                    begun = self._begun_turn = turn
                elif kind == "pcm":
                    assert isinstance(value, np.ndarray)
                    audio.feed(value)
                elif kind == "end" and begun == turn:
                    audio.end_reply()
                    begun = None
            except OmniError as exc:
                if not self._stopping.is_set():
                    self._fail(exc)
                return

    def _collect(self, final: OmniRequestOutput) -> None:
        audio = self._audio
        turns = final.metrics.get("turns") if final.metrics else None
        for entry in turns if isinstance(turns, list) else []:
            if not isinstance(entry, dict) or not isinstance(entry.get("index"), int):
                continue
            timing = self._timing(entry["index"])
            latency = entry.get("latency")
            if isinstance(latency, dict):
                timing.parts = {
                    k: float(v) for k, v in latency.items() if isinstance(v, int | float)
                }
            if audio is not None:
                with contextlib.suppress(OmniError):
                    played = audio.reply(str(timing.turn))
                    timing.first_sample_at = played.first_sample_at
                    timing.output_latency_s = played.output_latency_s
