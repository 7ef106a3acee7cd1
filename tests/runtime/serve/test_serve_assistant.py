"""The chat-speak demo served as shipped: the built-in assistant (SmolLM2) answers through
the official ``openai`` client, the conversation reaching the model once, in its own chat
template (the pipeline renders the turns; the server does not wrap them again)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.runtime.serve.support import API_KEY, REPO, ServeProcess, wait_until
from tests.runtime.vllm.support import START_TIMEOUT_S

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(4 * START_TIMEOUT_S)]

CHAT_SPEAK = REPO / "assets" / "pipelines" / "chat-speak.yaml"


@pytest.fixture(scope="module")
def server(smollm2_model: Path, speak_pipeline: Path) -> Iterator[ServeProcess]:
    process = ServeProcess([CHAT_SPEAK], start_timeout_s=3 * START_TIMEOUT_S)
    try:
        yield process
    finally:
        status = process.stop()
        assert status == 130, "\n".join(process.stderr)
        assert not process.segments()


def test_the_assistant_answers_a_conversation_once_templated(server: ServeProcess) -> None:
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
