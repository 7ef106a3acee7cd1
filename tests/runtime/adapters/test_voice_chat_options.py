"""The voice chat's own options, checked before anything loads (the conversation itself runs
in tests/runtime/vllm/test_voice_chat.py)."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.adapters.voice_chat import VoiceChatOptions, VoiceChatOptionsError


def test_defaults() -> None:
    options = VoiceChatOptions.parse({})
    assert options.first_words == 2
    assert options.clause_chars == 12
    assert options.barge_in is True
    assert options.max_history_turns == 8
    assert "SmolLM" in options.system_prompt


@pytest.mark.parametrize(
    ("given", "key", "accepted"),
    [
        ({"system_prompt": 3}, "system_prompt", "accepted: a string"),
        ({"max_history_turns": -1}, "max_history_turns", "an integer from 0 to 100"),
        ({"first_words": 1.5}, "first_words", "an integer from 0 to 50"),
        ({"clause_chars": 500, "max_sentence_chars": 100}, "clause_chars", "at most that"),
        ({"min_sentence_chars": 0}, "min_sentence_chars", "an integer from 1 to 2000"),
        ({"barge_in": "yes"}, "barge_in", "true or false"),
    ],
)
def test_bad_options_name_the_key_and_what_is_accepted(
    given: dict[str, Any], key: str, accepted: str
) -> None:
    with pytest.raises(VoiceChatOptionsError, match=accepted) as caught:
        VoiceChatOptions.parse(given, file="voice-chat.yaml", line=4)
    assert caught.value.key == f"adapter.options.{key}"
    assert "voice-chat.yaml" in str(caught.value)


def test_the_prompt_keeps_only_the_last_interrupted_fragment() -> None:
    from runtime.adapters.voice_chat import prompt_messages
    from runtime.conversation import VoiceTurn

    options = VoiceChatOptions.parse({"system_prompt": "Be brief.", "max_history_turns": 3})
    turns = [
        VoiceTurn(0, "Hello", "Hi there.", "Hi there."),
        VoiceTurn(1, "Tell me a story", "Once upon a time a dragon", "Once upon", True),
        VoiceTurn(2, "Stop", "Okay.", "Okay."),
        VoiceTurn(3, "Tell me another", "There was a knight", "There was", True),
    ]
    messages = [(m.role, m.content) for m in prompt_messages(turns, options, "Why?")]
    assert messages == [
        ("system", "Be brief."),
        # Three exchanges: the first falls out; the earlier fragment is not shown.
        ("user", "Tell me a story"),
        ("user", "Stop"),
        ("assistant", "Okay."),
        ("user", "Tell me another"),
        # The last exchange keeps what was heard of it, without a mark.
        ("assistant", "There was"),
        ("user", "Why?"),
    ]
    bare = VoiceChatOptions.parse({"system_prompt": "", "max_history_turns": 0})
    assert [(m.role, m.content) for m in prompt_messages(turns, bare, "Hi")] == [("user", "Hi")]
