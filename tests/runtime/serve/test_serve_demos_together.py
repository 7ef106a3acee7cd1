"""The bundled demos served together from one ``omni-edge serve``: chat-speak, chat, speak and
add, each with its own declared capacity, share the machine's memory (two vLLM workers and
three graph workers); the built-in assistant among them answers through the official
``openai`` client with the conversation in its own chat template; and a set that does not fit
the machine is refused, naming the pipelines already holding the memory and how much."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
import yaml

from runtime.devices import discover_topology, save_topology
from tests.runtime.engine.conftest import demo_root
from tests.runtime.serve.support import API_KEY, REPO, ServeProcess, wait_until
from tests.runtime.vllm.support import START_TIMEOUT_S

__all__ = ["demo_root"]

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(4 * START_TIMEOUT_S)]

DEMOS = ("chat-speak", "chat", "speak", "add")
NAMES = {"chat-speak": "chat-speak", "chat": "chat", "speak": "speak", "add": "demo_add"}


@pytest.fixture(scope="module")
def server(
    demo_root: Path,  # the fixture imported above
    smollm2_model: Path,
    speak_pipeline: Path,
) -> Iterator[ServeProcess]:
    paths = [demo_root / "pipelines" / f"{demo}.yaml" for demo in DEMOS]
    process = ServeProcess(paths, start_timeout_s=3 * START_TIMEOUT_S)
    try:
        yield process
    finally:
        status = process.stop()
        assert status == 130, "\n".join(process.stderr)
        assert not process.segments()


def test_the_four_demos_load_together_and_each_answers(server: ServeProcess) -> None:
    pipelines = server.pipelines()
    assert {name: entry["state"] for name, entry in pipelines.items()} == {
        name: "ready" for name in NAMES.values()
    }
    assert {name: entry["kind"] for name, entry in pipelines.items()} == {
        "chat-speak": "chat",
        "chat": "chat",
        "speak": "speech",
        "demo_add": "graph",
    }
    # Loading the second pipeline did not rewrite the first's ceiling: every one is ready.
    assert not [line for line in server.stderr if "admission refused" in line]
    client = openai.OpenAI(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=300)
    for model in ("chat", "chat-speak"):
        completion = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=12,
            temperature=0.0,
        )
        answer = completion.choices[0].message.content
        assert answer is not None
        assert "Paris" in answer, (model, answer)
    speech = client.audio.speech.create(
        model="speak", voice="joe", input="Hello there.", response_format="pcm"
    )
    samples = np.frombuffer(speech.content, dtype="<i2")
    assert samples.size > 0
    assert np.abs(samples).max() > 1000
    with server.client() as http:
        inputs = {"a": np.ones((1, 1024), np.float32), "b": np.full((1, 1024), 2, np.float32)}
        body = io.BytesIO()
        np.savez(body, **inputs)
        response = http.post("/omni/run", params={"model": "demo_add"}, content=body.getvalue())
    assert response.status_code == 200, response.text
    with np.load(io.BytesIO(response.content), allow_pickle=False) as outputs:
        np.testing.assert_array_equal(outputs["sum"], np.full((1, 1024), 3, np.float32))
    for name in NAMES.values():
        wait_until(lambda name=name: server.pipelines()[name]["in_flight"] == 0, name, 30)


def test_the_assistant_answers_a_conversation_once_templated(server: ServeProcess) -> None:
    """chat-speak as shipped: the built-in assistant (SmolLM2) gets the conversation once, in
    its own chat template (the pipeline renders the turns; the server does not wrap them)."""
    client = openai.OpenAI(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=300)
    completion = client.chat.completions.create(
        model="chat-speak",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24,
        temperature=0.0,
    )
    answer = completion.choices[0].message.content
    assert answer is not None
    assert "Paris" in answer, answer
    assert completion.usage is not None
    # SmolLM2's template adds its own system turn: the prompt is about 30 tokens. Wrapped twice
    # (ChatML inside ChatML) it would hold the turn markers twice over.
    assert 20 < completion.usage.prompt_tokens < 45, completion.usage
    wait_until(lambda: server.pipelines()["chat-speak"]["in_flight"] == 0, "the request to end", 30)


def small_machine(folder: Path, ram: str) -> Path:
    """This machine as a topology file stating ``ram`` of memory, all of it free."""
    path = save_topology(discover_topology(), folder / "small-machine.yaml")
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    document["memory"]["machine:ram"] = {"capacity": ram, "observed_free": ram}
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def test_demos_that_do_not_fit_are_refused_naming_the_pipelines_holding_the_memory(
    demo_root: Path,  # the fixture imported above
    smollm2_model: Path,
    speak_pipeline: Path,
    tmp_path: Path,
) -> None:
    """On a machine of 3.5 GiB, add (128 MiB) and speak (896 MiB) load; chat (3 GiB) does not
    fit beside them, whatever its own 4 GiB ceiling says: refused before its worker starts."""
    paths = [demo_root / "pipelines" / f"{demo}.yaml" for demo in ("add", "speak", "chat")]
    topology = small_machine(tmp_path, "3.5GiB")
    command = [sys.executable, "-m", "runtime.cli", "serve", *map(str, paths)]
    run = subprocess.run(
        [*command, "--port", "0", "--topology", str(topology)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )
    assert run.returncode == 3, run.stderr
    assert (
        "admission refused: machine:ram needs 3.0 GiB for stage-0 but only 2.5 GiB is free of "
        "3.5 GiB; held by speak (896.0 MiB), demo_add (128.0 MiB)"
    ) in run.stderr
    assert "serving" not in run.stdout
    assert "chat ready" not in run.stderr
