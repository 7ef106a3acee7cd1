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
