"""A request output's typed views: its audio, its tensors and the prompt its text answered."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.errors import ModelError
from runtime.outputs import OmniRequestOutput


def _output(
    outputs: dict[str, object], *, finished: bool = False, **fields: object
) -> OmniRequestOutput:
    return OmniRequestOutput(
        request_id="req-1",
        stage="voice",
        outputs=outputs,  # type: ignore[arg-type]
        finished=finished,
        **fields,  # type: ignore[arg-type]
    )


def test_the_audio_is_the_outputs_pcm_with_its_numbers() -> None:
    pcm = np.ones(4, np.float32)
    audio = _output({"pcm": pcm, "sample_rate": np.array(22050), "chunk_index": 2}).audio
    assert audio is not None
    assert (audio.pcm is pcm, audio.sample_rate, audio.chunk_index) == (True, 22050, 2)
    assert _output({"sum": np.ones(2)}).audio is None
    with pytest.raises(ModelError, match="output 0 of req-1: 'sample_rate' is None"):
        _ = _output({"pcm": pcm}).audio


def test_the_tensors_leave_out_audio_and_text() -> None:
    total = np.ones((1, 4), np.float32)
    output = _output(
        {"sum": total, "pcm": np.ones(2, np.float32), "sample_rate": 8000, "text": "hi"}
    )
    assert list(output.tensors) == ["sum"]
    assert output.tensors["sum"] is total


def test_the_prompt_is_on_the_final_output_only() -> None:
    metrics = {"prompt": "user: hello\nassistant:", "tokens": 3}
    assert _output({}, finished=True, metrics=metrics).prompt == "user: hello\nassistant:"
    assert _output({}, finished=False, metrics=metrics).prompt is None
    assert _output({}, finished=True, metrics={"prompt": None}).prompt is None
    assert _output({}, finished=True).prompt is None


def test_a_transcribed_segment_says_where_its_text_lies() -> None:
    segment = {"tokens": np.arange(3), "start_s": np.float64(1.5), "end_s": np.float64(2.25)}
    span = _output(segment, text=" hello").span
    assert span is not None
    assert (span.text, span.start_s, span.end_s) == (" hello", 1.5, 2.25)
    # Not a segment: the final output, text without times, times that are not one number.
    assert _output(segment, finished=True, text="hello").span is None
    assert _output({"start_s": 1.0}, text="hello").span is None
    assert _output({"start_s": np.arange(2), "end_s": 1.0}, text="hello").span is None
