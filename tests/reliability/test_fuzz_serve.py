"""Fuzzing the server's JSON and archive endpoints: generated request bodies (valid ones,
valid ones with fields dropped, added or replaced by any JSON value, bodies that are not
JSON or not an object, archives mutated or cut) sent to the server's application in this
process, serving real pipelines in their real workers.

Each answer must be a 200 (streamed answers are read to their end) or a typed refusal: a
4xx status of :data:`REFUSALS` with an OpenAI error body naming a code and saying why. The
application may raise nothing (the test client re-raises what it raised). After each example
nothing is left: no request in flight, no new descriptor, process, segment, reservation or
file under the test's ``TMPDIR``.

The default profile runs :data:`FAST_EXAMPLES` examples per endpoint; under
``HYPOTHESIS_PROFILE=slow`` (``make reliability``) each endpoint runs :data:`SLOW_SERVE`
examples, or ``OMNI_FUZZ_EXAMPLES`` when that is fewer.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from runtime.devices import discover_topology
from runtime.devices.selection import DeviceSelection
from runtime.serve import PipelineRegistry, ServeApp, ServeLimits
from tests.reliability.conftest import PROFILE, SLOW_EXAMPLES
from tests.reliability.support import Census
from tests.reliability.test_fuzz import FUZZ, Examples, examples, json_values

__all__ = ["examples"]

REPO = Path(__file__).resolve().parents[2]
PIPELINES = REPO / "assets" / "pipelines"
#: Examples per endpoint in the default profile (the pipelines load once per test).
FAST_EXAMPLES = 25
#: Examples per endpoint under the slow profile.
SLOW_SERVE = 1000
EXAMPLES = min(SLOW_EXAMPLES, SLOW_SERVE) if PROFILE == "slow" else FAST_EXAMPLES
#: What a refusal may be. Examples run in turn, one request at a time, so a busy pipeline
#: (429) or one being recreated (503) would be a bug here.
REFUSALS = {400, 404, 413}
#: Small enough that generated bodies cross it.
JSON_LIMIT = 16 * 1024
NPZ_LIMIT = 64 * 1024

#: Strings that matter to parsers and to the voice's text front end.
words = st.text(
    st.sampled_from("ab .,;:!?-'\"\\/%é\x00\x7f\u2028\U0001f600\n\t0123456789"), max_size=24
)
#: Any JSON value, often of the wrong type for the field it replaces.
anything = json_values | words | st.integers(-(2**40), 2**40) | st.floats()


def _mutated(draw: st.DrawFn, valid: dict[str, Any], fields: Mapping[str, Any]) -> Any:
    """A body made from ``valid``: as is, fields dropped, replaced or added, or not an
    object at all."""
    how = draw(st.sampled_from(("valid", "dropped", "replaced", "added", "other", "mixed")))
    body = dict(valid)
    if how in ("dropped", "mixed"):
        for name in draw(st.lists(st.sampled_from(sorted(body)), max_size=2, unique=True)):
            body.pop(name, None)
    if how in ("replaced", "mixed"):
        for name in draw(st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=3)):
            body[name] = draw(fields[name] | anything)
    if how in ("added", "mixed"):
        body.update(draw(st.dictionaries(words, anything, max_size=3)))
    if how == "other":
        return draw(anything)
    return body


def _encoded(draw: st.DrawFn, body: Any) -> bytes:
    """``body`` as JSON, now and then cut, padded past the limit or not JSON at all."""
    raw = json.dumps(body, allow_nan=True).encode()
    how = draw(st.sampled_from(("json", "json", "json", "cut", "pad", "bytes", "latin")))
    if how == "cut":
        return raw[: draw(st.integers(0, len(raw)))]
    if how == "pad":
        return raw + b" " * draw(st.integers(JSON_LIMIT - len(raw), JSON_LIMIT + 1024))
    if how == "bytes":
        return draw(st.binary(max_size=64))
    if how == "latin":
        return (
            json.dumps(body, ensure_ascii=False)
            .encode("utf-8", "surrogatepass")
            .replace(b"\xc3", b"\xff")
        )
    return raw


SPEECH_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from(("speak", "demo_add", "", "other")),
    "input": st.sampled_from(("Hi.", "One, two.", "", " ", "x" * 5000)) | words,
    "voice": st.sampled_from(("joe", "alloy", "", "JOE")),
    "response_format": st.sampled_from(("wav", "pcm", "mp3", "", "WAV")),
    "speed": st.sampled_from((1.0, 1, 2.0, 0, "1.0", None)),
}
SPEECH_VALID = {"model": "speak", "input": "Hi.", "voice": "joe", "response_format": "pcm"}


@st.composite
def speech_bodies(draw: st.DrawFn) -> bytes:
    return _encoded(draw, _mutated(draw, SPEECH_VALID, SPEECH_FIELDS))


CHAT_MESSAGES = st.sampled_from(
    (
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        [{"role": "user"}],
        [{"role": "robot", "content": "Hi"}],
        [{"role": "assistant", "content": "Hi"}],
        [],
        [{"role": "user", "content": "x" * 200}] * 300,
    )
)
CHAT_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from(("chat", "demo_add", "", "other")),
    "messages": CHAT_MESSAGES,
    "max_tokens": st.sampled_from((1, 2, 0, -1, 10**9, "2", None, 2.5)),
    "temperature": st.sampled_from((0, 0.5, -1, 3, "0", None)),
    "top_p": st.sampled_from((1, 0.5, 0, 2, None)),
    "stream": st.sampled_from((True, False, "true", None)),
    "stream_options": st.sampled_from(({"include_usage": True}, {}, {"x": 1}, "yes")),
    "stop": st.sampled_from(("\n", ["a", "b"], [], [1], None)),
    "seed": st.sampled_from((1, -1, "1", None)),
    "n": st.sampled_from((1, 2, 0, None)),
    "response_format": st.sampled_from(
        (
            {"type": "text"},
            {"type": "json_object"},
            {"type": "json_schema"},
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
            {"type": "xml"},
            "json",
        )
    ),
}
CHAT_VALID = {
    "model": "chat",
    "messages": [{"role": "user", "content": "Hi"}],
    "max_tokens": 2,
    "temperature": 0,
}


@st.composite
def chat_bodies(draw: st.DrawFn) -> bytes:
    body = _mutated(draw, CHAT_VALID, CHAT_FIELDS)
    if isinstance(body, dict) and isinstance(body.get("max_tokens"), int):
        # A valid request answers at once: a large max_tokens is checked by its own test.
        body["max_tokens"] = min(body["max_tokens"], 4)
    if isinstance(body, dict) and "max_tokens" not in body and body.get("model") == "chat":
        body["max_tokens"] = 2
    return _encoded(draw, body)


EMBEDDING_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from(("embed", "speak", "", "other")),
    "input": st.sampled_from(("Hi.", ["a", "b"], [], [""], [1, 2], [[1, 2]], "x" * 20000))
    | words
    | st.lists(words, max_size=4),
    "encoding_format": st.sampled_from(("float", "base64", "", "int8")),
    "dimensions": st.sampled_from((384, 128, 0, "384", None)),
    "user": st.sampled_from(("u", "", 1)),
}
EMBEDDING_VALID = {"model": "embed", "input": ["Hi.", "Hello."]}


@st.composite
def embedding_bodies(draw: st.DrawFn) -> bytes:
    return _encoded(draw, _mutated(draw, EMBEDDING_VALID, EMBEDDING_FIELDS))


def _npz(arrays: Mapping[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


NPZ_VALID = _npz({"a": np.ones((1, 1024), np.float32), "b": np.ones((1, 1024), np.float32)})
NPZ_OTHERS = (
    _npz({"a": np.ones((1, 1024), np.float32)}),
    _npz({"a": np.ones((2, 1024), np.float32), "b": np.ones((2, 1024), np.float32)}),
    _npz({"a": np.ones((1, 1024), np.float64), "b": np.ones((1, 1024), np.float64)}),
    _npz({"a": np.ones((1, 7), np.float32), "b": np.ones((1, 7), np.float32)}),
    _npz({"x": np.ones(3, np.int64)}),
    _npz({}),
)


@st.composite
def npz_bodies(draw: st.DrawFn) -> tuple[str | None, bytes]:
    model = draw(st.sampled_from(("demo_add", "demo_add", "speak", "", None, "other")))
    body = draw(st.sampled_from((NPZ_VALID, *NPZ_OTHERS)))
    how = draw(st.sampled_from(("as is", "as is", "cut", "flipped", "noise", "pad")))
    if how == "cut":
        body = body[: draw(st.integers(0, len(body)))]
    elif how == "flipped":
        data = bytearray(body)
        for _ in range(draw(st.integers(1, 8))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        body = bytes(data)
    elif how == "noise":
        body = draw(st.binary(max_size=256))
    elif how == "pad":
        body += b"\0" * draw(st.integers(NPZ_LIMIT - len(body), NPZ_LIMIT + 1024))
    return model, body


LIMITS = ServeLimits(max_json_bytes=JSON_LIMIT, max_npz_bytes=NPZ_LIMIT)


@pytest.fixture(scope="module")
def voice() -> None:
    from runtime.adapters.voice_export import ensure_voice_bundles

    ensure_voice_bundles("joe")


@pytest.fixture
def served_pipelines(voice: None) -> Iterator[tuple[TestClient, PipelineRegistry]]:
    """The application serving the add, speech and embedding pipelines (workers loaded once per test,
    before the test's private ``TMPDIR``), warmed up by one valid request each (a stage maps
    its shared memory at its first call)."""
    registry = PipelineRegistry(
        [PIPELINES / "add.yaml", PIPELINES / "speak.yaml", PIPELINES / "embed.yaml"],
        topology=discover_topology(),
        selection=DeviceSelection(),
    )
    try:
        app = ServeApp(registry, limits=LIMITS)
        with TestClient(app.asgi, base_url="http://127.0.0.1/v1") as client:
            speech = json.dumps(SPEECH_VALID).encode()
            assert _post(client, "/audio/speech", speech, "application/json")[0] == 200
            graph = _post(client, "/omni/run?model=demo_add", NPZ_VALID, "application/x-npz")
            assert graph[0] == 200
            embedding = json.dumps(EMBEDDING_VALID).encode()
            assert _post(client, "/embeddings", embedding, "application/json")[0] == 200
            yield client, registry
    finally:
        registry.close()


def _settled(registry: PipelineRegistry) -> None:
    deadline = time.monotonic() + 10
    while True:
        statuses = [pipeline.status() for pipeline in registry.pipelines.values()]
        if all(s.in_flight == 0 and s.state == "ready" for s in statuses):
            return
        assert time.monotonic() < deadline, statuses
        time.sleep(0.01)


def _check_answer(status: int, body: bytes) -> None:
    if status == 200:
        return
    assert status in REFUSALS, (status, body[:500])
    error = json.loads(body)["error"]
    assert isinstance(error["code"], str), error
    assert error["code"], error
    assert isinstance(error["message"], str), error
    assert error["message"], error


def _post(client: TestClient, path: str, body: bytes, media: str) -> tuple[int, bytes]:
    with client.stream("POST", path, content=body, headers={"Content-Type": media}) as response:
        return response.status_code, response.read()


def _example(examples: Examples, registry: PipelineRegistry, tmpdir: Path, send: Any) -> None:
    census = Census.take(tmpdir)
    examples.count += 1
    status, body = send()
    _check_answer(status, body)
    _settled(registry)
    leaks = census.leaks(grace_s=2.0)
    assert not leaks.total, leaks.describe()


@pytest.mark.model
@settings(FUZZ, max_examples=EXAMPLES)
@given(body=speech_bodies())
def test_speech_bodies(
    examples: Examples,
    served_pipelines: tuple[TestClient, PipelineRegistry],
    private_tmpdir: Path,
    body: bytes,
) -> None:
    client, registry = served_pipelines
    _example(
        examples,
        registry,
        private_tmpdir,
        lambda: _post(client, "/audio/speech", body, "application/json"),
    )


@pytest.mark.model
@settings(FUZZ, max_examples=EXAMPLES)
@given(body=embedding_bodies())
def test_embedding_bodies(
    examples: Examples,
    served_pipelines: tuple[TestClient, PipelineRegistry],
    private_tmpdir: Path,
    body: bytes,
) -> None:
    client, registry = served_pipelines
    _example(
        examples,
        registry,
        private_tmpdir,
        lambda: _post(client, "/embeddings", body, "application/json"),
    )


@pytest.mark.model
@settings(FUZZ, max_examples=EXAMPLES)
@given(drawn=npz_bodies())
def test_graph_run_bodies(
    examples: Examples,
    served_pipelines: tuple[TestClient, PipelineRegistry],
    private_tmpdir: Path,
    drawn: tuple[str | None, bytes],
) -> None:
    client, registry = served_pipelines
    model, body = drawn
    path = "/omni/run" if model is None else f"/omni/run?model={model}"
    _example(
        examples,
        registry,
        private_tmpdir,
        lambda: _post(client, path, body, "application/x-npz"),
    )


@pytest.fixture
def chat_served(smollm2_model: Path) -> Iterator[tuple[TestClient, PipelineRegistry]]:
    """The application serving the text assistant (loaded once per test, before the test's
    private ``TMPDIR``), warmed up by one answer."""
    registry = PipelineRegistry(
        [PIPELINES / "chat.yaml"], topology=discover_topology(), selection=DeviceSelection()
    )
    try:
        app = ServeApp(registry, limits=LIMITS)
        with TestClient(app.asgi, base_url="http://127.0.0.1/v1") as client:
            warm = json.dumps(CHAT_VALID).encode()
            assert _post(client, "/chat/completions", warm, "application/json")[0] == 200
            yield client, registry
    finally:
        registry.close()


@pytest.mark.vllm
@settings(FUZZ, max_examples=EXAMPLES)
@given(body=chat_bodies())
def test_chat_bodies(
    examples: Examples,
    chat_served: tuple[TestClient, PipelineRegistry],
    private_tmpdir: Path,
    body: bytes,
) -> None:
    client, registry = chat_served
    _example(
        examples,
        registry,
        private_tmpdir,
        lambda: _post(client, "/chat/completions", body, "application/json"),
    )


from tests.runtime.vllm.conftest import smollm2_model, vllm_env  # noqa: E402

__all__ += ["smollm2_model", "vllm_env"]
