"""A spoken conversation's values: what goes into a voice-chat request and what comes out.

A voice-chat request (``assets/pipelines/voice-chat.yaml``) is one duplex request: the caller
feeds microphone audio as it comes, each piece a :class:`VoiceFrame` (16 kHz mono float32,
with how much of the current reply the listener has heard), and reads the conversation's
outputs as they come. Each output carries an ``event`` name (:data:`EVENTS`) and ``turn``;
:class:`ConversationEvent` reads them back as a value. Audio of the reply arrives as outputs
that also carry the ``pcm`` of an :class:`~runtime.outputs.AudioChunk`.

Kept below the engine (NumPy and the runtime's errors only): the program that makes these
outputs, the conversation driver that plays them and the studio that shows them all read
the same values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from runtime.errors import ModelError, UsageError

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "BARGE_IN",
    "EVENTS",
    "INTERRUPTED",
    "LISTENING",
    "REPLY_AUDIO",
    "REPLY_DONE",
    "REPLY_TEXT",
    "RESUMED",
    "SPEAKING",
    "SPEECH_STARTED",
    "STATES",
    "THINKING",
    "TRANSCRIPT",
    "TRANSCRIPT_PARTIAL",
    "TURN_ENDED",
    "ConversationEvent",
    "ConversationUpdate",
    "SpokenTurn",
    "StopReply",
    "TextTurn",
    "TurnLatency",
    "VoiceFrame",
    "VoiceTurn",
]

#: Speech rate of a voice frame.
VOICE_FRAME_RATE: Final = 16000

# Events, in the order a turn meets them.
SPEECH_STARTED: Final = "speech_started"
TRANSCRIPT_PARTIAL: Final = "transcript_partial"
TURN_ENDED: Final = "turn_ended"
TRANSCRIPT: Final = "transcript"
REPLY_TEXT: Final = "reply_text"
REPLY_AUDIO: Final = "reply_audio"
REPLY_DONE: Final = "reply_done"
#: User voice while the reply plays: the player fades out and holds.
BARGE_IN: Final = "barge_in"
#: The voice was too short to be speech (a cough): the held reply plays on.
RESUMED: Final = "resumed"
#: The user spoke over the reply: it is cancelled; what was heard stays in the history.
INTERRUPTED: Final = "interrupted"
EVENTS: Final = (
    SPEECH_STARTED,
    TRANSCRIPT_PARTIAL,
    TURN_ENDED,
    TRANSCRIPT,
    REPLY_TEXT,
    REPLY_AUDIO,
    REPLY_DONE,
    BARGE_IN,
    RESUMED,
    INTERRUPTED,
)

# The conversation's state, as the studio shows it.
LISTENING: Final = "listening"
THINKING: Final = "thinking"
SPEAKING: Final = "speaking"
STATES: Final = (LISTENING, THINKING, SPEAKING)


@dataclass(frozen=True, slots=True)
class VoiceFrame:
    """Microphone audio fed to a voice-chat request: ``pcm`` (16 kHz mono float32, any
    length) and, when the caller plays the replies, how many samples of reply ``reply``
    (its turn number) had been played when this audio was captured."""

    pcm: np.ndarray
    reply: int | None = None
    played_samples: int = 0

    def __post_init__(self) -> None:
        pcm = self.pcm
        if not isinstance(pcm, np.ndarray) or pcm.ndim != 1 or pcm.dtype != np.float32:
            shape = f"{pcm.dtype} {pcm.shape}" if isinstance(pcm, np.ndarray) else type(pcm)
            raise UsageError(
                f"a voice frame's pcm is {shape}; accepted: 1-D float32 samples at "
                f"{VOICE_FRAME_RATE} Hz"
            )
        if self.reply is not None and (type(self.reply) is not int or self.reply < 0):
            raise UsageError(f"a voice frame's reply is {self.reply!r}; accepted: a turn number")
        if type(self.played_samples) is not int or self.played_samples < 0:
            raise UsageError(
                f"a voice frame's played_samples is {self.played_samples!r}; accepted: a "
                "count of samples, 0 or more"
            )


@dataclass(frozen=True, slots=True)
class TextTurn:
    """A turn the user typed, fed between voice frames: the reply to ``text`` is made and
    spoken at once (no turn detection, no transcription)."""

    text: str

    def __post_init__(self) -> None:
        if not isinstance(self.text, str) or not self.text.strip():
            raise UsageError(f"a text turn's text is {self.text!r}; accepted: non-empty text")


@dataclass(frozen=True, slots=True)
class SpokenTurn:
    """A whole turn of speech the caller decided is complete (``pcm``: 16 kHz mono float32):
    it is transcribed and answered at once, without the voice activity's turn detection."""

    pcm: np.ndarray

    def __post_init__(self) -> None:
        pcm = self.pcm
        if (
            not isinstance(pcm, np.ndarray)
            or pcm.ndim != 1
            or pcm.dtype != np.float32
            or pcm.size == 0
        ):
            shape = f"{pcm.dtype} {pcm.shape}" if isinstance(pcm, np.ndarray) else type(pcm)
            raise UsageError(
                f"a spoken turn's pcm is {shape}; accepted: 1-D float32 samples at "
                f"{VOICE_FRAME_RATE} Hz, at least one"
            )


@dataclass(frozen=True, slots=True)
class StopReply:
    """The caller stops the reply being made or played: it ends ``interrupted``, as a
    barge-in would, and the conversation listens on."""


@dataclass(frozen=True, slots=True)
class ConversationUpdate:
    """New settings for the rest of the conversation, fed between voice frames: a system
    prompt and turn-taking settings (a
    :class:`~runtime.adapters.turns.TurnSettings`); None keeps the current one."""

    system_prompt: str | None = None
    turns: Any = None

    def __post_init__(self) -> None:
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise UsageError(
                f"a conversation update's system_prompt is {self.system_prompt!r}; accepted: "
                "text or None"
            )


@dataclass(frozen=True, slots=True)
class TurnLatency:
    """Where one turn's wait went: seconds from the end of the user's speech (in the stream's
    own time) until the turn's end was known (``end_of_turn``), the transcript was ready
    (``transcription``), the language model's first piece was ready (``first_clause``) and
    the voice's first audio went out (``first_audio``, the total). Work done ahead of the
    turn's end shows as ready before ``end_of_turn``."""

    end_of_turn: float
    transcription: float
    first_clause: float
    first_audio: float

    @property
    def total(self) -> float:
        return self.first_audio

    def to_json(self) -> dict[str, float]:
        return {
            "end_of_turn_s": self.end_of_turn,
            "transcription_s": self.transcription,
            "first_clause_s": self.first_clause,
            "first_audio_s": self.first_audio,
        }


@dataclass(frozen=True, slots=True)
class VoiceTurn:
    """One exchange: what the user said and the reply (``heard`` is what was played of it;
    ``interrupted`` when the user spoke over it)."""

    index: int
    user: str
    reply: str
    heard: str
    interrupted: bool = False
    latency: TurnLatency | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "user": self.user,
            "reply": self.reply,
            "heard": self.heard,
            "interrupted": self.interrupted,
            "latency": None if self.latency is None else self.latency.to_json(),
        }


def _number(outputs: Mapping[str, object], name: str, source: str) -> float | None:
    value = outputs.get(name)
    if value is None:
        return None
    array = np.asarray(value)
    if array.size != 1 or array.dtype.kind not in "iuf":
        raise ModelError(f"{source}: {name!r} is {array.dtype} {array.shape}; expected a number")
    return float(array.reshape(()).item())


@dataclass(frozen=True, slots=True)
class ConversationEvent:
    """An output of a voice-chat request, read back: its ``event`` (:data:`EVENTS`), ``turn``,
    ``t`` (seconds of input audio where it happened, when it has one), ``text`` (a transcript
    or a reply's text delta) and the numbers it carries (``values``)."""

    event: str
    turn: int
    t: float | None = None
    text: str | None = None
    values: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_outputs(
        cls, outputs: Mapping[str, object], text: str | None = None, *, source: str = "an output"
    ) -> ConversationEvent | None:
        """The event an output carries; None for an output without ``event``."""
        name = outputs.get("event")
        if name is None:
            return None
        if not isinstance(name, str) or name not in EVENTS:
            raise ModelError(f"{source}: event {name!r} is not one of {', '.join(EVENTS)}")
        turn = _number(outputs, "turn", source)
        if turn is None:
            raise ModelError(f"{source}: the {name} event carries no 'turn'")
        values = {
            key: number
            for key, value in outputs.items()
            if key not in ("event", "turn", "t", "text", "pcm")
            and isinstance(value, int | float | np.number)
            and (number := _number(outputs, key, source)) is not None
        }
        return cls(name, int(turn), _number(outputs, "t", source), text, values)

    def to_outputs(self) -> dict[str, Any]:
        outputs: dict[str, Any] = {"event": self.event, "turn": self.turn, **self.values}
        if self.t is not None:
            outputs["t"] = self.t
        return outputs
