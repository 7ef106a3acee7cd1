"""A spoken conversation's presenters, without a QApplication: which pipeline is one, the
conversation view's turns folded from the conversation's events (the partial transcript as the
pending message, the reply streaming in, an interrupted reply kept as heard), the state's look
and each turn's latency row."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from app.conversations import Conversation
from app.voice_presenters import (
    TurnLatencyRow,
    VoiceTurns,
    heard_share,
    is_voice_chat,
    names_voice_chat,
    state_look,
    turn_latency_rows,
)
from runtime.config import load_pipeline
from runtime.conversation import ConversationEvent

PIPELINES = Path(__file__).resolve().parents[2] / "assets" / "pipelines"


def event(name: str, turn: int, text: str | None = None, **values: float) -> ConversationEvent:
    return ConversationEvent(name, turn, None, text, values)


def fold(turns: VoiceTurns, *events: ConversationEvent) -> list[bool]:
    return [turns.apply(item) for item in events]


def _config(adapter: str | None) -> Any:
    """What :func:`is_voice_chat` reads of a pipeline's configuration."""
    named = None if adapter is None else SimpleNamespace(name=adapter, line=3)
    return SimpleNamespace(adapter=named, source=PIPELINES / "x.yaml")


def test_only_the_voice_chat_program_is_a_spoken_conversation() -> None:
    shipped = (PIPELINES / "voice-chat.yaml").read_text(encoding="utf-8")
    adapter = "runtime.adapters.voice_chat:VoiceChatProgram"
    assert f"name: {adapter}" in shipped
    assert is_voice_chat(_config(adapter))
    assert not is_voice_chat(_config("runtime.adapters.transcribe_live:LiveTranscribeAdapter"))
    assert not is_voice_chat(_config(None))
    assert not is_voice_chat(load_pipeline(PIPELINES / "chat.yaml"))
    # Read from the file without checking its stages (the self-test skips a conversation).
    assert names_voice_chat(PIPELINES / "voice-chat.yaml")
    for name in ("chat.yaml", "transcribe.yaml", "speak.yaml", "add.yaml", "missing.yaml"):
        assert not names_voice_chat(PIPELINES / name), name


def test_a_turn_shows_the_words_being_heard_then_the_reply_as_it_is_written() -> None:
    turns = VoiceTurns(Conversation.new("voice-chat"))
    assert not turns.apply(event("speech_started", 1))
    assert (turns.heard, turns.note) == ("", "listening")
    assert not turns.apply(event("transcript_partial", 1, "What is the"))
    assert turns.heard == "What is the"
    # The speaker went on: a later partial replaces the earlier one.
    assert not turns.apply(event("transcript_partial", 1, " What is the capital of France?"))
    assert turns.heard == "What is the capital of France?"
    assert turns.conversation.turns == ()
    assert not turns.apply(event("turn_ended", 1))
    assert turns.note == "thinking"
    # The final transcript is the user's turn (saved); the reply waits for its text.
    assert turns.apply(event("transcript", 1, " What is the capital of France?"))
    assert turns.heard is None
    assert turns.reply == ""
    assert [(t.role, t.content) for t in turns.conversation.turns] == [
        ("user", "What is the capital of France?")
    ]
    assert fold(turns, event("reply_text", 1, "The capital"), event("reply_text", 1, " is")) == [
        False,
        False,
    ]
    assert turns.reply == "The capital is"
    assert turns.apply(event("reply_done", 1, "The capital is Paris.", samples=40000))
    assert turns.reply is None
    last = turns.conversation.turns[-1]
    assert (last.role, last.content, last.status) == ("assistant", "The capital is Paris.", "done")
    assert turns.conversation.title == "What is the capital of France?"


def test_nothing_understood_adds_no_turn_and_its_reply_is_ignored() -> None:
    turns = VoiceTurns(Conversation.new("voice-chat"))
    changed = fold(
        turns,
        event("speech_started", 1),
        event("turn_ended", 1),
        event("transcript", 1, "  "),
        event("reply_done", 1, ""),
    )
    assert changed == [False, False, False, False]
    assert turns.conversation.turns == ()
    assert turns.heard is None
    assert turns.reply is None


def test_a_reply_interrupted_while_written_keeps_what_was_heard() -> None:
    turns = VoiceTurns(Conversation.new("voice-chat"))
    fold(
        turns,
        event("speech_started", 1),
        event("transcript", 1, "Tell me a story."),
        event("reply_text", 1, "Once upon a time there was a dragon"),
        event("barge_in", 1),
    )
    assert turns.note == "held: you spoke"
    assert turns.apply(event("interrupted", 1, played_samples=500, samples=1000))
    last = turns.conversation.turns[-1]
    assert (last.content, last.status) == ("Once upon a time", "interrupted")
    # The next turn goes on after it.
    fold(turns, event("speech_started", 2), event("transcript", 2, "Stop, please."))
    assert [t.role for t in turns.conversation.turns] == ["user", "assistant", "user"]


def test_a_reply_interrupted_after_it_was_written_is_marked_and_settled_exactly() -> None:
    turns = VoiceTurns(Conversation.new("voice-chat"))
    fold(
        turns,
        event("transcript", 3, "Tell me a story."),
        event("reply_done", 3, "One two three four.", samples=800),
    )
    assert turns.conversation.turns[-1].status == "done"
    assert turns.apply(event("interrupted", 3, played_samples=400, samples=800))
    assert (turns.conversation.turns[-1].content, turns.conversation.turns[-1].status) == (
        "One two",
        "interrupted",
    )
    # At the end the request's own account of what was heard replaces the estimate.
    final = [
        {"index": 3, "user": "Tell me a story.", "reply": "One two three four.", "heard": "One",
         "interrupted": True, "latency": None},
        {"index": 9, "user": "unknown", "reply": "", "heard": "", "interrupted": True},
    ]  # fmt: skip
    assert turns.settle(final)
    assert turns.conversation.turns[-1].content == "One"
    assert not turns.settle(final)
    # The conversation's next request sends the interrupted reply as far as it was heard.
    assert [m.content for m in turns.conversation.messages()] == ["Tell me a story.", "One"]


def test_heard_share_takes_the_words_of_the_played_share() -> None:
    assert heard_share("one two three four", 1000, 1000) == "one two three four"
    assert heard_share("one two three four", 600, 1000) == "one two"
    assert heard_share("one two three four", 0, 1000) == ""
    assert heard_share("one two", 10, 0) == ""


@pytest.mark.parametrize(
    ("state", "text"),
    [("listening", "listening"), ("thinking", "thinking"), ("speaking", "speaking"), ("", "not talking")],
)  # fmt: skip
def test_each_state_has_its_own_look(state: str, text: str) -> None:
    shown, colour = state_look(state)
    assert shown == text
    assert colour.startswith("#")
    assert len({state_look(s)[1] for s in ("listening", "thinking", "speaking", "")}) == 4


def test_turn_rows_hold_the_parts_the_player_lead_and_the_total() -> None:
    timings = [
        {"turn": 2, "player_lead_s": 0.02, "output_latency_s": 0.01, "interrupted": True},
        {
            "turn": 1,
            "end_of_turn_s": 0.45,
            "transcription_s": 0.5,
            "first_clause_s": 0.7,
            "first_audio_s": 0.8,
            "player_lead_s": 0.05,
            "output_latency_s": 0.02,
            "interrupted": False,
        },
        {"turn": "x"},
    ]
    rows = turn_latency_rows(timings)
    assert [row.turn for row in rows] == [1, 2]
    first, second = rows
    assert first == TurnLatencyRow(1, 0.45, 0.5, 0.7, 0.8, 0.05, 0.02, False)
    assert first.total_s == pytest.approx(0.85)
    # While the conversation runs only the player's lead is known: no total yet.
    assert second.first_audio_s is None
    assert second.total_s is None
    assert second.interrupted
