"""What a voice chat is fed besides audio (typed and spoken turns, a stop, new settings), and
the turn detector taking new settings mid-stream; the conversation that acts on them runs in
tests/runtime/vllm/test_voice_chat.py and tests/runtime/serve/test_realtime.py."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.adapters.turns import TurnDetector, TurnEnded, TurnSettings
from runtime.conversation import ConversationUpdate, SpokenTurn, StopReply, TextTurn
from runtime.errors import UsageError

CHUNK = 512


@pytest.mark.parametrize("text", ["", "   ", 3])
def test_a_text_turn_needs_text(text: object) -> None:
    with pytest.raises(UsageError, match="text turn's text"):
        TextTurn(text)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "pcm",
    [np.zeros(0, np.float32), np.zeros((2, 4), np.float32), np.zeros(4, np.int16), [0.0]],
)
def test_a_spoken_turn_needs_16_khz_float_samples(pcm: object) -> None:
    with pytest.raises(UsageError, match="spoken turn's pcm"):
        SpokenTurn(pcm)  # type: ignore[arg-type]


def test_an_update_needs_a_text_prompt() -> None:
    with pytest.raises(UsageError, match="system_prompt"):
        ConversationUpdate(system_prompt=5)  # type: ignore[arg-type]
    assert ConversationUpdate().system_prompt is None
    assert StopReply() == StopReply()


def _turn_end(detector: TurnDetector, silent_chunks: int) -> int | None:
    """Push 0.5 s of speech then silence; the chunk (counted in the silence) ending the turn."""
    for _ in range(16):
        detector.push(0.9, CHUNK)
    for index in range(silent_chunks):
        if any(isinstance(event, TurnEnded) for event in detector.push(0.0, CHUNK)):
            return index
    return None


def test_retune_takes_effect_from_the_next_chunk() -> None:
    detector = TurnDetector(TurnSettings(end_of_turn_s=0.45))
    default_end = _turn_end(detector, 100)
    assert default_end is not None
    detector.retune(TurnSettings(end_of_turn_s=1.2))
    longer_end = _turn_end(detector, 100)
    assert longer_end is not None
    # 0.45 s and 1.2 s of silence, in 32 ms chunks.
    assert default_end == 14
    assert longer_end == 37
    assert detector.settings.end_of_turn_s == 1.2
