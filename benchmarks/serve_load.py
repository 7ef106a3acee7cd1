"""The local server under load: 200 requests from 8 concurrent clients across the speech and
add pipelines of one ``omni-edge serve`` process.

Every fourth request asks for speech (a short sentence as a WAV), the others run the add
graph (an ``.npz`` in and out). Both pipelines run one request at a time and the server runs
with its default queue (``--max-queue 16``), so a request waits its turn there; a 429 (a full
queue) would carry ``Retry-After``, which the clients honour (waiting at most
``RETRY_CAP_S``) before asking again, and ``serve.declared_429`` counts them (the goal: none).
Any other status is a failure. The latency of a request runs from its first attempt to its
answer, retries included; the baseline is the same mix sent one request at a time by a
single client to the same server, before the load. Afterwards the server must hold nothing
for a request (none in flight, the same worker processes and shared-memory segments as
before), and once stopped it must leave no process or segment behind: ``serve.answered`` is
the share of requests answered, and 0 when that leak check fails (the note says what).
"""

from __future__ import annotations

import io
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import httpx
import numpy as np
import psutil
import yaml

from benchmarks import graphs
from benchmarks.base import Benchmark, BenchOptions, NotRunnable
from benchmarks.figures import REPORT_ONLY, Comparator, FigureSpec, Goal, Subject
from benchmarks.stats import Samples, ms, rounded

if TYPE_CHECKING:
    from benchmarks.figures import Figure

LATENCY_P50: Final = FigureSpec(
    key="serve.latency_p50",
    name="Server under load, request latency (p50)",
    unit="ms",
    goal=Goal(REPORT_ONLY),
)
LATENCY_P99: Final = FigureSpec(
    key="serve.latency_p99",
    name="Server under load, request latency (p99)",
    unit="ms",
    goal=Goal(REPORT_ONLY),
)
DECLARED_429: Final = FigureSpec(
    key="serve.declared_429",
    name="Server under load, 429 answers at the default queue (8 clients)",
    unit="answers",
    goal=Goal("0", Comparator.AT_MOST, 0.0, Subject.MEASUREMENT),
)
ANSWERED: Final = FigureSpec(
    key="serve.answered",
    name="Server under load, requests answered (429s retried) with nothing leaked",
    unit="%",
    goal=Goal("100 %", Comparator.AT_LEAST, 100.0, Subject.MEASUREMENT),
)
BASELINE_LABEL: Final = "the same mix sent one request at a time by one client"
CLIENTS: Final = 8
SPEECH_EVERY: Final = 4
SPEECH_TEXT: Final = "The river runs past the mountain."
#: The longest a client waits after a 429 before asking again (the server says 1 s).
RETRY_CAP_S: Final = 0.25
START_TIMEOUT_S: Final = 180.0
STOP_TIMEOUT_S: Final = 60.0
SERVING: Final = re.compile(r"^serving (http://\S+/v1)")


def _add_demo() -> Path:
    """The add demo, its bundle checked."""
    demo = graphs.DEMO_PIPELINES / "add.yaml"
    document = yaml.safe_load(demo.read_text(encoding="utf-8"))
    manifest = (demo.parent / document["stages"][0]["backend"]["manifest"]).resolve()
    if not manifest.is_file():
        raise NotRunnable(f"the add demo's bundle is missing ({manifest}); run make setup")
    return demo


class Server:
    """``omni-edge serve`` in a child process, stopped with SIGINT."""

    def __init__(self, pipelines: list[Path], extra_args: tuple[str, ...] = ()) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runtime.cli",
                "serve",
                *map(str, pipelines),
                "--port",
                "0",
                *extra_args,
            ],
            cwd=graphs.PROJECT_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.process.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        self.url = ""
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            match = SERVING.match(line)
            if match:
                self.url = match.group(1)
                break
        if not self.url:
            self.stop()
            raise NotRunnable("omni-edge serve did not start (run it by hand to see why)")

    def workers(self) -> set[int]:
        return {child.pid for child in psutil.Process(self.process.pid).children(recursive=True)}

    def segments(self) -> set[str]:
        prefix = f"oe-{self.process.pid}-"
        return {entry.name for entry in Path("/dev/shm").glob(f"{prefix}*")}

    def pipelines(self) -> dict[str, Any]:
        answer = httpx.get(f"{self.url}/omni/pipelines", timeout=30)
        answer.raise_for_status()
        return {entry["id"]: entry for entry in answer.json()["data"]}

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode


class Load:
    """The clients' shared counters."""

    def __init__(self, total: int) -> None:
        self._lock = threading.Lock()
        self._next = 0
        self.total = total
        self.latencies: dict[str, list[float]] = {"speech": [], "add": []}
        self.declared_429 = 0
        self.failures: list[str] = []

    def busy(self) -> None:
        with self._lock:
            self.declared_429 += 1

    def answered(self, kind: str, latency_s: float, failure: str | None) -> None:
        with self._lock:
            if failure is None:
                self.latencies[kind].append(latency_s)
            else:
                self.failures.append(failure)

    def take(self) -> int | None:
        with self._lock:
            if self._next >= self.total:
                return None
            self._next += 1
            return self._next - 1


def _add_body() -> bytes:
    rng = np.random.default_rng(0)
    buffer = io.BytesIO()
    np.savez(
        buffer,
        a=rng.standard_normal((1, 1024)).astype(np.float32),
        b=rng.standard_normal((1, 1024)).astype(np.float32),
    )
    return buffer.getvalue()


def _client(url: str, load: Load, add_body: bytes) -> None:
    with httpx.Client(base_url=url, timeout=120) as http:
        while (index := load.take()) is not None:
            kind = "speech" if index % SPEECH_EVERY == 0 else "add"
            started = time.perf_counter()
            while True:
                if kind == "speech":
                    answer = http.post(
                        "/audio/speech",
                        json={"model": "speak", "voice": "joe", "input": SPEECH_TEXT},
                    )
                    ok = answer.status_code == 200 and answer.content[:4] == b"RIFF"
                else:
                    answer = http.post("/omni/run", params={"model": "demo_add"}, content=add_body)
                    ok = answer.status_code == 200 and answer.content[:2] == b"PK"
                if answer.status_code == 429 and answer.headers.get("retry-after"):
                    load.busy()
                    time.sleep(min(float(answer.headers["retry-after"]), RETRY_CAP_S))
                    continue
                break
            failure = None if ok else f"{kind}: {answer.status_code} {answer.text[:200]}"
            load.answered(kind, time.perf_counter() - started, failure)


def _run_clients(url: str, load: Load, clients: int) -> float:
    body = _add_body()
    threads = [
        threading.Thread(target=_client, args=(url, load, body), name=f"client-{n}")
        for n in range(clients)
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def measure(options: BenchOptions) -> list[Figure]:
    requests = options.count(200, 40)
    server = Server([_add_demo(), graphs.DEMO_PIPELINES / "speak.yaml"])
    try:
        workers_before, segments_before = server.workers(), server.segments()
        alone = Load(options.count(40, 12))
        _run_clients(server.url, alone, 1)
        load = Load(requests)
        wall_s = _run_clients(server.url, load, CLIENTS)
        in_flight = sum(entry["in_flight"] for entry in server.pipelines().values())
        workers_after, segments_after = server.workers(), server.segments()
    finally:
        status = server.stop()
    left = {pid for pid in workers_before | workers_after if psutil.pid_exists(pid)}
    left_segments = server.segments()
    every = load.latencies["speech"] + load.latencies["add"]
    single = alone.latencies["speech"] + alone.latencies["add"]
    if not every or not single:
        raise NotRunnable(f"no request succeeded: {(load.failures + alone.failures)[:3]}")
    samples, baseline = Samples(tuple(every)), Samples(tuple(single))
    leak = {
        "in_flight_after": in_flight,
        "workers_unchanged": workers_after == workers_before,
        "segments_unchanged": segments_after == segments_before,
        "exit_status": status,
        "processes_left_after_stop": len(left),
        "segments_left_after_stop": len(left_segments),
    }
    leaked = bool(
        in_flight != 0
        or workers_after != workers_before
        or segments_after != segments_before
        or left
        or left_segments
    )

    def p50(values: list[float]) -> float:
        return rounded(ms(Samples(tuple(values)).p50)) if values else 0.0

    details: dict[str, Any] = {
        "requests": requests,
        "clients": CLIENTS,
        "speech_requests": len(load.latencies["speech"]),
        "add_requests": len(load.latencies["add"]),
        "declared_429": load.declared_429,
        "failed": len(load.failures) + len(alone.failures),
        "wall_s": rounded(wall_s),
        "requests_per_s": rounded(len(every) / wall_s),
        "speech_p50_ms": p50(load.latencies["speech"]),
        "add_p50_ms": p50(load.latencies["add"]),
        "alone_speech_p50_ms": p50(alone.latencies["speech"]),
        "alone_add_p50_ms": p50(alone.latencies["add"]),
        **leak,
    }
    answered = 0.0 if leaked else 100.0 * len(every) / requests
    answered_alone = 100.0 * len(single) / alone.total
    note = ""
    if leaked:
        note = f"the leak check failed: {leak}"
    elif load.failures:
        note = f"{len(load.failures)} requests failed, e.g. {load.failures[0]}"
    queued = (
        "Eight clients share two pipelines that each run one request at a time: a request "
        "waits in its pipeline's queue, so its latency adds the requests ahead of it to its own."
    )
    busy_note = ""
    if load.declared_429:
        busy_note = (
            f"{load.declared_429} answers were 429 although at most {CLIENTS} requests wait "
            "for a queue of 16"
        )
    return [
        LATENCY_P50.measured(ms(samples.p50), ms(baseline.p50), BASELINE_LABEL, details, queued),
        LATENCY_P99.measured(ms(samples.p99), ms(baseline.p99), BASELINE_LABEL, details, queued),
        DECLARED_429.measured(float(load.declared_429), None, BASELINE_LABEL, details, busy_note),
        ANSWERED.measured(answered, answered_alone, BASELINE_LABEL, details, note),
    ]


BENCHMARK: Final = Benchmark("serve", (LATENCY_P50, LATENCY_P99, DECLARED_429, ANSWERED), measure)
