"""The server's queue per pipeline and its Prometheus metrics, on a real ``omni-edge serve``.

A request to a busy pipeline waits in the pipeline's bounded FIFO queue (``--max-queue``,
16 by default) and is answered when its turn comes; only a full queue answers 429 with
``Retry-After``. A queued client that disconnects leaves the queue and its request never
runs; stopping the server fails the waiters with a 503. ``GET /metrics`` counts what was
answered, in Prometheus' text format.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from runtime.errors import UsageError
from runtime.serve import PipelineRegistry, ServeApp, ServeOptions
from runtime.serve.endpoints import ENDPOINTS, PATHS
from runtime.serve.requests import dump_npz
from tests.runtime.engine.conftest import demo_root
from tests.runtime.engine.support import StageSpec, loop_request_npz, write_pipeline
from tests.runtime.serve.support import API_KEY, REPO, ServeProcess, wait_until
from tests.workers.support import make_loop_bundle

__all__ = ["demo_root"]

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

#: Loop steps of a call that lasts seconds (a step is a [1024, 256] x [256, 256] product).
LONG_STEPS = 4000
#: Loop steps of a call that lasts a noticeable moment (tens of milliseconds).
SHORT_STEPS = 150
CLIENTS = 10


def _stop_cleanly(process: ServeProcess) -> None:
    workers = process.workers()
    status = process.stop()
    assert status == 130, "\n".join(process.stderr)
    for pid, _ in workers:
        wait_until(lambda pid=pid: not _alive(pid), f"worker {pid} to exit", 10)
    assert not process.segments()


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="module")
def loop_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("queue")
    return write_pipeline(
        root / "loop.yaml", StageSpec(make_loop_bundle(root), max_io="4MiB"), name="loop"
    )


@pytest.fixture(scope="module")
def server(loop_pipeline: Path, demo_root: Path, speak_pipeline: Path) -> Iterator[ServeProcess]:
    """The default queue, an API key."""
    process = ServeProcess([loop_pipeline, demo_root / "pipelines" / "add.yaml", speak_pipeline])
    try:
        yield process
    finally:
        _stop_cleanly(process)


@pytest.fixture(scope="module")
def small_server(loop_pipeline: Path) -> Iterator[ServeProcess]:
    """A queue of one, no API key."""
    process = ServeProcess([loop_pipeline], api_key=None, extra_args=("--max-queue", "1"))
    try:
        yield process
    finally:
        _stop_cleanly(process)


class Poster:
    """``POST /v1/omni/run?model=loop`` from a thread of its own: the answer and when it came."""

    def __init__(self, server: ServeProcess, steps: int) -> None:
        self.server = server
        self.steps = steps
        self.response: httpx.Response | None = None
        self.error: BaseException | None = None
        self.answered_at = 0.0
        self.thread = threading.Thread(target=self._post, daemon=True)
        self.thread.start()

    def _post(self) -> None:
        try:
            with self.server.client() as http:
                self.response = http.post(
                    "/omni/run", params={"model": "loop"}, content=loop_request_npz(self.steps)
                )
            self.answered_at = time.monotonic()
        except BaseException as exc:  # the test reads it
            self.error = exc

    def join(self) -> httpx.Response:
        self.thread.join(180)
        assert self.error is None, self.error
        assert self.response is not None, "no answer within 180 s"
        return self.response


def _loop(server: ServeProcess) -> dict[str, object]:
    return server.pipelines()["loop"]


def _settled(server: ServeProcess) -> None:
    wait_until(
        lambda: _loop(server)["in_flight"] == 0 and _loop(server)["queued"] == 0,
        "the loop pipeline to be idle",
        30,
    )


def _finished_total(server: ServeProcess) -> dict[str, int]:
    finished = _loop(server)["finished"]
    assert isinstance(finished, dict)
    return finished


# -- the queue -----------------------------------------------------------------------------


def test_pipelines_report_the_queue_and_its_size(
    server: ServeProcess, small_server: ServeProcess
) -> None:
    entry = _loop(server)
    assert (entry["queued"], entry["max_queue"]) == (0, 16)
    assert (_loop(small_server)["queued"], _loop(small_server)["max_queue"]) == (0, 1)


def test_ten_clients_on_a_one_at_a_time_pipeline_all_get_200_at_the_default_queue(
    server: ServeProcess,
) -> None:
    before = server.workers()
    first = Poster(server, LONG_STEPS)
    wait_until(lambda: _loop(server)["in_flight"] == 1, "the first call to run")
    others = [Poster(server, 1) for _ in range(CLIENTS)]
    # Every one of them waits in the queue while the first call runs.
    wait_until(lambda: _loop(server)["queued"] == CLIENTS, f"{CLIENTS} requests to queue", 60)
    assert _loop(server)["in_flight"] == 1
    responses = [first.join(), *(poster.join() for poster in others)]
    assert [r.status_code for r in responses] == [200] * (CLIENTS + 1), [
        r.text for r in responses if r.status_code != 200
    ]
    for response in responses:
        outputs = np.load(io.BytesIO(response.content))
        assert outputs[outputs.files[0]].shape == (1024, 256)
    _settled(server)
    assert server.workers() == before


def test_waiting_requests_run_in_arrival_order(server: ServeProcess) -> None:
    first = Poster(server, LONG_STEPS)
    wait_until(lambda: _loop(server)["in_flight"] == 1, "the first call to run")
    waiting = []
    for position in range(1, 7):
        waiting.append(Poster(server, SHORT_STEPS))
        wait_until(lambda position=position: _loop(server)["queued"] == position, "a waiter")
    assert first.join().status_code == 200
    for poster in waiting:
        assert poster.join().status_code == 200
    # One at a time, each a noticeable moment long: answers come back in arrival order.
    order = sorted(range(len(waiting)), key=lambda i: waiting[i].answered_at)
    assert order == list(range(len(waiting)))
    _settled(server)


def test_a_queued_client_that_disconnects_leaves_the_queue_and_never_runs(
    server: ServeProcess,
) -> None:
    from tests.runtime.serve.test_serve_http import RawPost

    before = _finished_total(server)
    first = Poster(server, LONG_STEPS)
    wait_until(lambda: _loop(server)["in_flight"] == 1, "the first call to run")
    gone = RawPost(server, "/omni/run?model=loop", loop_request_npz(1), "application/x-npz")
    wait_until(lambda: _loop(server)["queued"] == 1, "the request to queue")
    gone.leave()
    wait_until(lambda: _loop(server)["queued"] == 0, "the gone client to leave the queue", 10)
    # It left while the first call still ran: it took no slot.
    assert _loop(server)["in_flight"] == 1
    assert first.join().status_code == 200
    _settled(server)
    after = _finished_total(server)
    # Only the first request was ever admitted: the gone one neither ran nor was cancelled.
    assert after["completed"] == before["completed"] + 1, after
    assert after["cancelled"] == before["cancelled"], after
    assert after["failed"] == before["failed"], after


def test_a_full_queue_answers_429_naming_the_queue(small_server: ServeProcess) -> None:
    first = Poster(small_server, LONG_STEPS)
    wait_until(lambda: _loop(small_server)["in_flight"] == 1, "the first call to run")
    second = Poster(small_server, 1)
    wait_until(lambda: _loop(small_server)["queued"] == 1, "the second to queue")
    with small_server.client() as http:
        response = http.post("/omni/run", params={"model": "loop"}, content=loop_request_npz(1))
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    error = response.json()["error"]
    assert error["type"] == "rate_limit_error"
    assert error["code"] == "queue_full"
    assert "pipeline loop is busy and its queue is full" in error["message"]
    assert "--max-queue 1" in error["message"]
    assert first.join().status_code == 200
    assert second.join().status_code == 200
    _settled(small_server)


def test_stopping_the_server_fails_the_waiting_requests_with_503(loop_pipeline: Path) -> None:
    process = ServeProcess([loop_pipeline], extra_args=("--max-queue", "4"))
    try:
        first = Poster(process, LONG_STEPS)
        wait_until(lambda: _loop(process)["in_flight"] == 1, "the first call to run")
        waiting = [Poster(process, 1) for _ in range(3)]
        wait_until(lambda: _loop(process)["queued"] == 3, "three to queue")
    finally:
        _stop_cleanly(process)
    for poster in waiting:
        response = poster.join()
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["code"] == "server_stopping"
        assert "the server is stopping" in error["message"]
    # The running call was answered or cut by the stop; never left hanging.
    first.thread.join(60)
    assert not first.thread.is_alive()


# -- metrics -------------------------------------------------------------------------------


def _scrape(
    server: ServeProcess, **headers: str
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with server.client() as http:
        response = http.get(f"{server.url.removesuffix('/v1')}/metrics", headers=headers or None)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_count_requests_durations_tokens_of_audio_and_queue_depth(
    server: ServeProcess,
) -> None:
    before = _scrape(server)
    with server.client() as http:
        inputs = dump_npz(
            {"a": np.ones((1, 1024), np.float32), "b": np.ones((1, 1024), np.float32)}
        )
        for _ in range(3):
            assert http.post("/omni/run", params={"model": "demo_add"}, content=inputs).is_success
        refused = http.post("/omni/run", params={"model": "demo_add"}, content=b"not an npz")
        assert refused.status_code == 400
    client = openai.OpenAI(base_url=server.url, api_key=API_KEY, max_retries=0)
    speech = client.audio.speech.create(
        model="speak", voice="joe", input="Hello there.", response_format="pcm"
    )
    spoken_s = len(speech.content) / 2 / 22050
    after = _scrape(server)

    def delta(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    run = "/v1/omni/run"
    assert delta("omni_requests_total", endpoint=run, model="demo_add", status="200") == 3
    assert delta("omni_requests_total", endpoint=run, model="demo_add", status="400") == 1
    assert (
        delta("omni_requests_total", endpoint="/v1/audio/speech", model="speak", status="200") == 1
    )
    assert delta("omni_request_duration_seconds_count", endpoint=run) == 4
    assert delta("omni_request_duration_seconds_bucket", endpoint=run, le="+Inf") == 4
    # A graph call on this machine is answered within ten seconds.
    assert delta("omni_request_duration_seconds_bucket", endpoint=run, le="10.0") == 4
    assert delta("omni_request_duration_seconds_sum", endpoint=run) > 0
    out = delta("omni_audio_seconds_total", model="speak", direction="out")
    assert out == pytest.approx(spoken_s, rel=1e-6)
    assert out > 0.3
    assert _value(after, "omni_queue_depth", model="loop") == 0
    assert _value(after, "omni_in_flight", model="loop") == 0

    # The gauges are live: one call running, one waiting.
    first = Poster(server, LONG_STEPS)
    wait_until(lambda: _loop(server)["in_flight"] == 1, "the first call to run")
    second = Poster(server, 1)
    wait_until(lambda: _loop(server)["queued"] == 1, "the second to queue")
    busy = _scrape(server)
    assert _value(busy, "omni_queue_depth", model="loop") == 1
    assert _value(busy, "omni_in_flight", model="loop") == 1
    assert first.join().status_code == 200
    assert second.join().status_code == 200
    _settled(server)
    idle = _scrape(server)
    assert _value(idle, "omni_queue_depth", model="loop") == 0
    assert _value(idle, "omni_in_flight", model="loop") == 0


def test_metrics_need_the_key_when_the_server_has_one(server: ServeProcess) -> None:
    base = server.url.removesuffix("/v1")
    response = httpx.get(f"{base}/metrics", timeout=30)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert _scrape(server, Authorization=f"Bearer {API_KEY}")


def test_metrics_are_open_when_the_server_has_no_key(small_server: ServeProcess) -> None:
    response = httpx.get(f"{small_server.url.removesuffix('/v1')}/metrics", timeout=30)
    assert response.status_code == 200
    names = {family.name for family in text_string_to_metric_families(response.text)}
    assert {
        "omni_requests",
        "omni_request_duration_seconds",
        "omni_queue_depth",
        "omni_in_flight",
    } <= names


# -- in one process ------------------------------------------------------------------------


def test_two_applications_in_one_process_keep_their_metrics_apart() -> None:
    first = ServeApp(PipelineRegistry([]))
    second = ServeApp(PipelineRegistry([]))
    first.metrics.request("/v1/models", None, 200, 0.01)
    assert b'omni_requests_total{endpoint="/v1/models",model="",status="200"} 1.0' in (
        first.metrics.exposition()
    )
    assert b"omni_requests_total{" not in second.metrics.exposition()


def test_every_route_is_listed_among_the_endpoints_and_every_endpoint_is_routed() -> None:
    app = ServeApp(PipelineRegistry([]))
    routes = {route.path for route in app.asgi.routes}  # type: ignore[attr-defined]
    listed = {endpoint.path.replace("{model}", "{model:path}") for endpoint in ENDPOINTS}
    assert routes == listed, (routes - listed, listed - routes)
    assert "/metrics" in PATHS


@pytest.mark.parametrize("value", [-1, 10_001])
def test_max_queue_out_of_range_is_refused_naming_what_is_accepted(value: int) -> None:
    with pytest.raises(UsageError, match=rf"--max-queue {value}; accepted: 0 \(no queue"):
        ServeOptions(max_queue=value)


def test_the_command_refuses_a_negative_max_queue_before_loading() -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "serve", "--max-queue", "-1", "--port", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "--max-queue -1; accepted: 0 (no queue" in result.stderr
    assert "starting" not in result.stderr
