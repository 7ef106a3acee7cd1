"""``omni-edge serve`` for real: a server process with graph and speech pipelines in worker
processes, driven with the official ``openai`` client and with plain HTTP.

One server serves the module (loading five workers takes seconds); each test checks what
the server holds afterwards: no request in flight, its worker processes and shared memory
as before (a stage retired by a cancelled call is replaced by the same number of workers).
"""

from __future__ import annotations

import io
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile
from helpers.onnx_graphs import example_inputs, make_bundle

from runtime.engine.orchestrator import STOP_GRACE_S
from runtime.serve.requests import dump_npz
from tests.runtime.engine.support import ENDLESS_STEPS, StageSpec, loop_request_npz, write_pipeline
from tests.runtime.serve.support import API_KEY, REPO, ServeProcess, wait_until
from tests.workers.support import make_loop_bundle

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

RATE = 22050
SPEECH_TEXT = "The river runs past the mountain. It is cold and clear in the morning."
LONG_TEXT = " ".join([SPEECH_TEXT] * 12)
#: Loop steps of a call that lasts seconds (a step is a [1024, 256] x [256, 256] product,
#: under a millisecond on two cores).
QUEUE_STEPS = 4000


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, speak_pipeline: Path
) -> Iterator[ServeProcess]:
    root = tmp_path_factory.mktemp("serve")
    add = write_pipeline(root / "add.yaml", StageSpec(make_bundle(root, kind="add")), name="add")
    loop_manifest = make_loop_bundle(root)
    loop = write_pipeline(root / "loop.yaml", StageSpec(loop_manifest, max_io="4MiB"), name="loop")
    queued = write_pipeline(
        root / "loop-queued.yaml",
        StageSpec(loop_manifest, max_io="4MiB"),
        name="loop_queued",
        max_queued=1,
    )
    # No server queue: these tests see the runtime's own admission (429 at once, the
    # pipeline's max_queued); tests/runtime/serve/test_serve_queue.py covers the queue.
    process = ServeProcess([add, loop, queued, speak_pipeline], extra_args=("--max-queue", "0"))
    try:
        yield process
    finally:
        workers = process.workers()
        status = process.stop()
        stderr = "\n".join(process.stderr)
        assert status == 130, stderr
        assert "stopped; every pipeline was closed" in stderr
        for pid, _ in workers:
            wait_until(lambda pid=pid: not _alive(pid), f"worker {pid} to exit", 10)
        assert not process.segments()


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def client(server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=API_KEY, max_retries=0)


@pytest.fixture(autouse=True)
def settled(server: ServeProcess) -> Iterator[None]:
    """Each test leaves every pipeline ready, nothing in flight, the same number of workers
    and segments."""
    wait_until(lambda: _idle(server), "every pipeline to be ready and idle", 60)
    workers, segments = len(server.workers()), len(server.segments())
    yield
    wait_until(lambda: _idle(server), "every pipeline to be ready and idle", 60)
    wait_until(lambda: len(server.workers()) == workers, f"{workers} worker processes", 30)
    wait_until(lambda: len(server.segments()) == segments, f"{segments} segments", 30)


def _idle(server: ServeProcess) -> bool:
    return all(
        entry["state"] == "ready" and entry["in_flight"] == 0
        for entry in server.pipelines().values()
    )


class RawPost:
    """A POST over a socket of its own, so a test can vanish mid-request like a client that
    crashed: :meth:`leave` closes the connection without reading the answer."""

    def __init__(self, server: ServeProcess, path: str, body: bytes, content_type: str) -> None:
        url = httpx.URL(server.url)
        self.sock = socket.create_connection((url.host, url.port), timeout=60)
        head = (
            f"POST {url.path}{path} HTTP/1.1\r\nHost: {url.host}\r\n"
            f"Authorization: Bearer {API_KEY}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        self.sock.sendall(head.encode() + body)

    def read(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                break
            data += chunk
        return data

    def leave(self) -> None:
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


# -- models and keys -------------------------------------------------------------------


def test_models_lists_every_pipeline_with_its_kind(client: openai.OpenAI) -> None:
    models = {model.id: model for model in client.models.list()}
    assert set(models) == {"add", "loop", "loop_queued", "speak"}
    kinds = {name: model.model_extra["kind"] for name, model in models.items()}
    assert kinds == {"add": "graph", "loop": "graph", "loop_queued": "graph", "speak": "speech"}
    assert client.models.retrieve("speak").id == "speak"


def test_an_unknown_model_is_a_404_naming_the_models_served(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.audio.speech.create(model="nope", voice="joe", input="Hello.")
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["code"] == "model_not_found"
    assert error["param"] == "model"
    assert "'nope'" in error["message"]
    assert "add, loop, loop_queued, speak" in error["message"]


def test_requests_without_the_key_get_401(server: ServeProcess) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as plain:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
            response = plain.get("/models", headers=headers)
            assert response.status_code == 401, headers
            error = response.json()["error"]
            assert error["type"] == "authentication_error"
            assert "Authorization: Bearer <key>" in error["message"]
    wrong = openai.OpenAI(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


def test_a_non_loopback_host_needs_a_key_and_the_key_variable_must_hold_one() -> None:
    def serve(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "runtime.cli", "serve", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
        )

    done = serve("--host", "0.0.0.0")
    assert done.returncode == 2
    assert "--host 0.0.0.0 is reachable from other machines" in done.stderr
    assert "--api-key-env VAR" in done.stderr
    done = serve("--host", "0.0.0.0", "--api-key-env", "OMNI_UNSET_KEY_VAR")
    assert done.returncode == 2
    assert "--api-key-env OMNI_UNSET_KEY_VAR: the variable is not set" in done.stderr


# -- speech ----------------------------------------------------------------------------


def test_speech_streams_a_wav_that_decodes(client: openai.OpenAI, tmp_path: Path) -> None:
    target = tmp_path / "speech.wav"
    with client.audio.speech.with_streaming_response.create(
        model="speak", voice="joe", input=SPEECH_TEXT, response_format="wav"
    ) as response:
        assert response.headers["content-type"] == "audio/wav"
        chunks = list(response.iter_bytes())
    assert len(chunks) > 1  # streamed as produced, not in one piece
    body = b"".join(chunks)
    assert body[:4] == b"RIFF"
    assert struct.unpack("<I", body[40:44])[0] == 0xFFFFFFFF  # the streaming size
    target.write_bytes(body)
    audio, rate = soundfile.read(target, dtype="float32")
    assert rate == RATE
    assert audio.ndim == 1
    assert audio.size == (len(body) - 44) // 2
    assert 1.5 < audio.size / RATE < 20
    assert float(np.abs(audio).max()) > 0.05


def test_speech_as_raw_pcm(client: openai.OpenAI) -> None:
    response = client.audio.speech.create(
        model="speak", voice="joe", input="Hello there.", response_format="pcm"
    )
    samples = np.frombuffer(response.content, dtype="<i2")
    assert response.response.headers["content-type"] == "audio/pcm"
    assert samples.size > RATE // 4
    assert np.abs(samples).max() > 1000


def test_speech_refuses_an_unknown_voice_and_format(server: ServeProcess) -> None:
    with server.client() as http:
        response = http.post(
            "/audio/speech", json={"model": "speak", "input": "Hi.", "voice": "alloy"}
        )
        assert response.status_code == 400
        assert response.json()["error"] == {
            "message": "'voice' is 'alloy'; accepted: joe",
            "type": "invalid_request_error",
            "param": "voice",
            "code": "invalid_value",
        }
        response = http.post(
            "/audio/speech",
            json={"model": "speak", "input": "Hi.", "voice": "joe", "response_format": "mp3"},
        )
        assert response.status_code == 400
        assert "accepted: wav, pcm" in response.json()["error"]["message"]
        response = http.post("/audio/speech", json={"model": "add", "input": "Hi.", "voice": "joe"})
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "wrong_model_kind"


def test_a_client_leaving_speech_mid_stream_cancels_it(server: ServeProcess) -> None:
    body = f'{{"model": "speak", "voice": "joe", "input": "{LONG_TEXT}"}}'.encode()
    raw = RawPost(server, "/audio/speech", body, "application/json")
    head = raw.read(400)
    assert head.startswith(b"HTTP/1.1 200")
    assert b"RIFF" in head
    wait_until(lambda: server.pipelines()["speak"]["in_flight"] == 1, "the speech to run")
    raw.leave()
    # The request ends at once; the settled fixture checks the workers and segments after.
    wait_until(lambda: server.pipelines()["speak"]["in_flight"] == 0, "the request to end", 10)
    with server.client() as http:
        response = http.post(
            "/audio/speech", json={"model": "speak", "voice": "joe", "input": "Again."}
        )
        if response.status_code == 503:  # a retired stage is being replaced
            assert response.headers["retry-after"]
            wait_until(lambda: server.pipelines()["speak"]["state"] == "ready", "speak", 60)
            response = http.post(
                "/audio/speech", json={"model": "speak", "voice": "joe", "input": "Again."}
            )
        assert response.status_code == 200


# -- graph runs and flow control -------------------------------------------------------


def test_a_graph_run_takes_an_npz_and_returns_one(server: ServeProcess) -> None:
    inputs = example_inputs("add")
    with server.client() as http:
        response = http.post("/omni/run", params={"model": "add"}, content=dump_npz(inputs))
    assert response.status_code == 200, response.text
    with np.load(io.BytesIO(response.content), allow_pickle=False) as outputs:
        np.testing.assert_allclose(outputs["c"], inputs["a"] + inputs["b"], rtol=1e-6)


def test_graph_input_errors_are_400s_naming_the_input(server: ServeProcess) -> None:
    with server.client() as http:
        response = http.post("/omni/run", params={"model": "add"}, content=b"not an archive")
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "invalid_npz"
        wrong = {"a": np.zeros(3, np.float32), "b": np.zeros(3, np.float32)}
        response = http.post("/omni/run", params={"model": "add"}, content=dump_npz(wrong))
        assert response.status_code == 400
        assert "input 'a' has shape [3]" in response.json()["error"]["message"]
        response = http.post("/omni/run", content=dump_npz(wrong))
        assert response.status_code == 400
        assert "?model=NAME" in response.json()["error"]["message"]


def _start_endless(server: ServeProcess, model: str) -> RawPost:
    raw = RawPost(
        server, f"/omni/run?model={model}", loop_request_npz(ENDLESS_STEPS), "application/x-npz"
    )
    wait_until(lambda: server.pipelines()[model]["in_flight"] == 1, f"{model} to be busy")
    return raw


def test_a_busy_graph_pipeline_answers_429_with_retry_after(server: ServeProcess) -> None:
    raw = _start_endless(server, "loop")
    try:
        with server.client() as http:
            response = http.post("/omni/run", params={"model": "loop"}, content=loop_request_npz(1))
        assert response.status_code == 429
        assert response.headers["retry-after"] == "1"
        error = response.json()["error"]
        assert error["type"] == "rate_limit_error"
        assert error["code"] == "pipeline_busy"
        assert "graph pipelines admit one request at a time" in error["message"]
    finally:
        raw.leave()
    # The endless call is cancelled once it overruns the grace, which retires the worker; the
    # pipeline comes back and serves.
    wait_until(
        lambda: server.pipelines()["loop"]["in_flight"] == 0, "the call to end", STOP_GRACE_S + 20
    )
    wait_until(lambda: server.pipelines()["loop"]["state"] == "ready", "loop to be back", 60)
    with server.client() as http:
        response = http.post("/omni/run", params={"model": "loop"}, content=loop_request_npz(1))
    assert response.status_code == 200


def test_max_queued_lets_a_request_wait_and_the_next_gets_429(server: ServeProcess) -> None:
    answers: list[httpx.Response] = []

    def post(steps: int) -> None:
        with server.client() as http:
            answers.append(
                http.post(
                    "/omni/run", params={"model": "loop_queued"}, content=loop_request_npz(steps)
                )
            )

    # A call of some seconds, and one that waits for it in the pipeline's queue.
    first = threading.Thread(target=post, args=(QUEUE_STEPS,))
    first.start()
    wait_until(lambda: server.pipelines()["loop_queued"]["in_flight"] == 1, "the first call")
    second = threading.Thread(target=post, args=(1,))
    second.start()
    try:
        wait_until(
            lambda: server.pipelines()["loop_queued"]["in_flight"] == 2, "a request to queue"
        )
        with server.client() as http:
            response = http.post(
                "/omni/run", params={"model": "loop_queued"}, content=loop_request_npz(1)
            )
        assert response.status_code == 429
        assert response.headers["retry-after"] == "1"
        assert "the queue holds at most 1" in response.json()["error"]["message"]
    finally:
        first.join(120)
        second.join(120)
    assert [answer.status_code for answer in answers] == [200, 200], [a.text for a in answers]


def test_a_client_leaving_a_call_lets_it_end_and_keeps_the_workers(
    server: ServeProcess,
) -> None:
    before = server.workers()
    # A call of about a second: well within the grace, even on a busy machine.
    raw = RawPost(
        server, "/omni/run?model=loop", loop_request_npz(QUEUE_STEPS // 4), "application/x-npz"
    )
    wait_until(lambda: server.pipelines()["loop"]["in_flight"] == 1, "loop to be busy")
    raw.leave()
    # The request stops between calls: its call of some seconds runs to its end, and no
    # worker is retired for it.
    wait_until(lambda: server.pipelines()["loop"]["in_flight"] == 0, "the call to end", 30)
    assert server.pipelines()["loop"]["state"] == "ready"
    assert server.pipelines()["loop"]["finished"]["cancelled"] >= 1
    assert server.workers() == before
    with server.client() as http:
        response = http.post("/omni/run", params={"model": "loop"}, content=loop_request_npz(1))
    assert response.status_code == 200


def test_a_client_leaving_an_endless_call_has_it_cancelled_after_the_grace(
    server: ServeProcess,
) -> None:
    before = server.workers()
    raw = _start_endless(server, "loop")
    left = time.monotonic()
    raw.leave()
    wait_until(
        lambda: server.pipelines()["loop"]["in_flight"] == 0, "the call to end", STOP_GRACE_S + 20
    )
    # Stopped first: the call went on for the grace, then was cancelled.
    assert time.monotonic() - left >= STOP_GRACE_S - 0.5
    # The worker that ran the call was retired: the pipeline is recreated with a new one.
    assert server.pipelines()["loop"]["state"] in ("restarting", "ready")
    wait_until(lambda: server.pipelines()["loop"]["state"] == "ready", "loop to be back", 60)
    wait_until(lambda: len(server.workers()) == len(before), "the workers to be replaced", 30)
    assert server.workers() != before


# -- limits ----------------------------------------------------------------------------


def test_an_oversized_body_is_a_413_naming_the_limit(server: ServeProcess) -> None:
    with server.client() as http:
        response = http.post(
            "/audio/speech",
            content=b"{" + b" " * (2 << 20) + b"}",
            headers={"Content-Type": "application/json"},
        )
    assert response.status_code == 413
    assert "accepted: at most 1048576" in response.json()["error"]["message"]


def test_bad_json_and_unknown_fields_are_400s(server: ServeProcess) -> None:
    with server.client() as http:
        response = http.post("/chat/completions", content=b"{nope")
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "invalid_json"
        response = http.post(
            "/chat/completions",
            json={"model": "add", "messages": [{"role": "user", "content": "hi"}], "best_of": 2},
        )
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "best_of"
        response = http.post(
            "/chat/completions",
            json={"model": "add", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert response.status_code == 400
        assert "the model 'add' is a graph pipeline" in response.json()["error"]["message"]
        response = http.get("/nothing/here")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "unknown_url"
