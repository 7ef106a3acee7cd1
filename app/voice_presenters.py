"""A spoken conversation as the studio shows it, without Qt: which pipeline is one, the
conversation view's values folded from its events (:class:`VoiceTurns`), how its state looks,
and each turn's latency as the Metrics panel lists it (:func:`turn_latency_rows`).

The events are :class:`runtime.conversation.ConversationEvent` values, delivered in order on
the GUI thread by the bridge (:mod:`app.bridge_voice`); the turns go into the same
:class:`~app.conversations.Conversation` values (and files) as typed chats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import yaml

from runtime.config import resolve_callable
from runtime.conversation import (
    BARGE_IN,
    INTERRUPTED,
    LISTENING,
    REPLY_DONE,
    REPLY_TEXT,
    RESUMED,
    SPEAKING,
    SPEECH_STARTED,
    THINKING,
    TRANSCRIPT,
    TRANSCRIPT_PARTIAL,
    TURN_ENDED,
)
from runtime.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from pathlib import Path

    from app.conversations import Conversation
    from runtime.config import PipelineConfig
    from runtime.conversation import ConversationEvent

__all__ = [
    "VOICE_CHAT_KIND",
    "TurnLatencyRow",
    "VoiceTurns",
    "heard_share",
    "is_voice_chat",
    "names_voice_chat",
    "state_look",
    "turn_latency_rows",
]

#: The program kind of a spoken conversation (``runtime.adapters.voice_chat``).
VOICE_CHAT_KIND: Final = "voice-chat"
#: The state label's text and colour per conversation state; "" is no conversation.
_STATE_LOOKS: Final = {
    LISTENING: ("listening", "#2e9d4f"),
    THINKING: ("thinking", "#d98a1c"),
    SPEAKING: ("speaking", "#3478d8"),
    "": ("not talking", "#6b7785"),
}


def is_voice_chat(config: PipelineConfig) -> bool:
    """Whether ``config``'s program is a spoken conversation (its adapter's ``kind``), known
    before anything loads."""
    if config.adapter is None:
        return False
    factory = resolve_callable(
        config.adapter.name, file=str(config.source), line=config.adapter.line, key="adapter.name"
    )
    return getattr(factory, "kind", None) == VOICE_CHAT_KIND


def names_voice_chat(path: Path) -> bool:
    """Whether the pipeline file at ``path`` names a spoken conversation's program, read
    without checking its stages (their bundles may not be made yet)."""
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    adapter = document.get("adapter") if isinstance(document, dict) else None
    name = adapter.get("name") if isinstance(adapter, dict) else None
    if not isinstance(name, str):
        return False
    try:
        factory = resolve_callable(name, file=str(path), line=None, key="adapter.name")
    except ConfigError:
        return False
    return getattr(factory, "kind", None) == VOICE_CHAT_KIND


def state_look(state: str) -> tuple[str, str]:
    """The label text and colour of a conversation ``state`` ("" when none runs)."""
    return _STATE_LOOKS.get(state, (state, "#6b7785"))


def heard_share(text: str, played_samples: float, samples: float) -> str:
    """The words of a reply heard when ``played_samples`` of its ``samples`` were played (by
    share of its audio; the runtime's exact account replaces it when the conversation ends)."""
    if samples <= 0 or played_samples <= 0:
        return ""
    words = text.split()
    share = min(1.0, played_samples / samples)
    return " ".join(words[: int(len(words) * share)])


@dataclass
class VoiceTurns:
    """The conversation view's values of one spoken conversation (GUI thread): the saved
    ``conversation``, the user's words while they are heard (``heard``, the partial
    transcript), the reply while it is written and spoken (``reply``), and what those pending
    bubbles say (``note``)."""

    conversation: Conversation
    heard: str | None = None
    reply: str | None = None
    note: str = ""
    #: The turn whose user words are in the conversation and whose reply is awaited.
    open_turn: int | None = None
    #: Where each turn's reply is in ``conversation.turns``.
    replies: dict[int, int] = field(default_factory=dict)

    def apply(self, event: ConversationEvent) -> bool:
        """Fold ``event`` in; True when the saved conversation changed (save it)."""
        name = event.event
        text = event.text or ""
        if name == SPEECH_STARTED:
            self.heard, self.note = "", LISTENING
        elif name == TRANSCRIPT_PARTIAL:
            self.heard = text.strip()
        elif name == TURN_ENDED:
            self.note = THINKING
        elif name == TRANSCRIPT:
            self.heard = None
            if not text.strip():
                self.open_turn, self.reply = None, None
                return False
            self.conversation = self.conversation.with_user(text.strip())
            self.open_turn, self.reply = event.turn, ""
            return True
        elif name == REPLY_TEXT and event.turn == self.open_turn and self.reply is not None:
            self.reply += text
        elif name == BARGE_IN:
            self.note = "held: you spoke"
        elif name == RESUMED:
            self.note = SPEAKING
        elif name == REPLY_DONE and event.turn == self.open_turn:
            return self._close(text or self.reply or "", "done", event.turn)
        elif name == INTERRUPTED:
            played = event.values.get("played_samples", 0.0)
            samples = event.values.get("samples", 0.0)
            if event.turn == self.open_turn:
                heard = heard_share(self.reply or "", played, samples)
                return self._close(heard, "interrupted", event.turn)
            index = self.replies.get(event.turn)
            if index is not None:
                written = self.conversation.turns[index].content
                heard = heard_share(written, played, samples)
                self.conversation = self.conversation.with_reply_at(index, heard, "interrupted")
                return True
        return False

    def _close(self, text: str, status: str, turn: int) -> bool:
        self.open_turn, self.reply = None, None
        if not self.conversation.awaits_reply:
            return False
        self.conversation = self.conversation.with_reply(
            text.strip(), "interrupted" if status == "interrupted" else "done"
        )
        self.replies[turn] = len(self.conversation.turns) - 1
        return True

    def settle(self, turns: Iterable[Mapping[str, object]]) -> bool:
        """The conversation ended: each interrupted reply keeps exactly what was heard, as the
        request's final output accounts it (``VoiceTurn.to_json()`` values). True when the
        saved conversation changed."""
        self.heard = self.reply = None
        self.open_turn = None
        changed = False
        for entry in turns:
            turn = entry.get("index")
            index = self.replies.get(turn) if isinstance(turn, int) else None
            heard = entry.get("heard")
            if index is None or not entry.get("interrupted") or not isinstance(heard, str):
                continue
            if self.conversation.turns[index].content != heard:
                self.conversation = self.conversation.with_reply_at(index, heard, "interrupted")
                changed = True
        return changed


@dataclass(frozen=True, slots=True)
class TurnLatencyRow:
    """One turn's wait, in seconds from the end of the user's speech: the program's parts
    (None until the conversation ends and its final output reports them), the player's lead
    (from the reply's first audio to its first sample handed to the device) and the device's
    output latency."""

    turn: int
    end_of_turn_s: float | None
    transcription_s: float | None
    first_clause_s: float | None
    first_audio_s: float | None
    player_lead_s: float | None
    output_latency_s: float
    interrupted: bool

    @property
    def total_s(self) -> float | None:
        """From the end of the user's speech to the reply's first sample at the device."""
        if self.first_audio_s is None:
            return None
        return self.first_audio_s + (self.player_lead_s or 0.0)


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def turn_latency_rows(timings: Iterable[Mapping[str, object]]) -> tuple[TurnLatencyRow, ...]:
    """The Metrics panel's rows from the conversation's turn timings
    (``runtime.talk.TurnTiming.to_json()`` values), in turn order."""
    rows = []
    for timing in timings:
        turn = timing.get("turn")
        if isinstance(turn, bool) or not isinstance(turn, int):
            continue
        rows.append(
            TurnLatencyRow(
                turn=turn,
                end_of_turn_s=_seconds(timing.get("end_of_turn_s")),
                transcription_s=_seconds(timing.get("transcription_s")),
                first_clause_s=_seconds(timing.get("first_clause_s")),
                first_audio_s=_seconds(timing.get("first_audio_s")),
                player_lead_s=_seconds(timing.get("player_lead_s")),
                output_latency_s=_seconds(timing.get("output_latency_s")) or 0.0,
                interrupted=timing.get("interrupted") is True,
            )
        )
    return tuple(sorted(rows, key=lambda row: row.turn))
