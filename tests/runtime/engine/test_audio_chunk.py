"""``AudioChunk``: the audio of one output, decoded in one place for the CLI, ``speak``, the
chat-to-speech program and the studio."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from runtime.engine.outputs import AudioChunk, OmniRequestOutput
from runtime.errors import ModelError


def _output(outputs: dict[str, object]) -> OmniRequestOutput:
    return OmniRequestOutput(
        request_id="req-9",
        stage="decoder",
        outputs=outputs,  # type: ignore[arg-type]
        finished=False,
        index=4,
    )


def test_a_speech_chunk_round_trips_through_its_outputs() -> None:
    chunk = AudioChunk(
        np.ones(441, np.float32), 22050, chunk_index=3, sentence_index=1, sentence_samples=9000
    )
    outputs = chunk.to_outputs()
    assert set(outputs) == {
        "pcm",
        "sample_rate",
        "chunk_index",
        "sentence_index",
        "sentence_samples",
    }
    again = AudioChunk.from_output(_output(outputs))
    assert again is not None
    assert again.pcm is chunk.pcm  # the output's own array; copying is the caller's choice
    assert dataclasses.replace(again, pcm=chunk.pcm) == chunk
    assert again.duration_s == pytest.approx(0.02)


def test_numbers_may_be_numpy_scalars_and_indices_may_be_absent() -> None:
    chunk = AudioChunk.from_output(
        _output({"pcm": np.zeros(0, np.float32), "sample_rate": np.array([16000], np.int64)})
    )
    assert chunk is not None
    assert (chunk.sample_rate, type(chunk.sample_rate)) == (16000, int)
    assert chunk.pcm.size == 0
    assert (chunk.chunk_index, chunk.sentence_index, chunk.sentence_samples) == (None, None, None)
    assert set(chunk.to_outputs()) == {"pcm", "sample_rate"}


def test_an_output_without_pcm_carries_no_audio() -> None:
    assert AudioChunk.from_output(_output({"text": np.array("hi"), "sample_rate": 16000})) is None


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        ({"pcm": [0.0, 0.1], "sample_rate": 16000}, "'pcm' is <class 'list'>"),
        ({"pcm": np.zeros(2, np.int16), "sample_rate": 16000}, "'pcm' is int16 \\(2,\\)"),
        ({"pcm": np.zeros(2, np.float32), "sample_rate": 0}, "'sample_rate' is 0"),
        ({"pcm": np.zeros(2, np.float32), "sample_rate": "fast"}, "'sample_rate' is <U4 \\(\\)"),
        (
            {"pcm": np.zeros(2, np.float32), "sample_rate": 8000, "sentence_samples": [1, 2]},
            "'sentence_samples' is int64 \\(2,\\)",
        ),
    ],
)
def test_malformed_audio_names_the_output_and_the_array(
    outputs: dict[str, object], message: str
) -> None:
    with pytest.raises(ModelError, match=f"^output 4 of req-9: {message}"):
        AudioChunk.from_output(_output(outputs))
