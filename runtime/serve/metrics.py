"""The server's Prometheus metrics (``GET /metrics``), one registry per application.

Not :mod:`runtime.metrics` (the engine's per-call and per-request figures): these count what
the HTTP server answered. Each :class:`ServeMetrics` has its own ``CollectorRegistry`` (not
``prometheus_client``'s global one), so several servers in one process keep apart.

- ``omni_requests_total{endpoint,model,status}``: answered requests (``endpoint`` is the
  route's path, ``model`` empty where none was named, ``status`` the HTTP status; 499: the
  client went away first).
- ``omni_request_duration_seconds{endpoint}``: a histogram of the time until the answer
  started (a streamed answer goes on after; a queued request's wait counts).
- ``omni_queue_depth{model}`` and ``omni_in_flight{model}``: read live at each scrape.
- ``omni_tokens_total{model,kind}``: prompt and completion tokens of chat answers.
- ``omni_audio_seconds_total{model,direction}``: speech produced (``out``) and audio
  transcribed or heard (``in``), realtime conversations' included.
- ``omni_realtime_sessions_total{model,outcome}``: ``/v1/realtime`` connections, accepted
  or refused; ``omni_realtime_responses_total{model,status}``: their responses by how they
  ended (completed, cancelled).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from prometheus_client.core import Metric

#: The media type of the exposition.
CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
#: Request durations' buckets, in seconds: from a graph call to a long spoken answer.
BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _Live:
    """The gauges read when scraped: (model, queued, in flight) for each pipeline."""

    def __init__(self, read: Callable[[], Iterable[tuple[str, int, int]]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "omni_queue_depth", "Requests waiting in the pipeline's queue", labels=["model"]
        )
        in_flight = GaugeMetricFamily(
            "omni_in_flight", "Requests the pipeline runs now", labels=["model"]
        )
        for model, queued, running in self._read():
            depth.add_metric([model], queued)
            in_flight.add_metric([model], running)
        yield depth
        yield in_flight


class ServeMetrics:
    """The metrics of one server; ``live`` gives each pipeline's queue depth and requests in
    flight when scraped. Every method is cheap and thread-safe."""

    def __init__(self, live: Callable[[], Iterable[tuple[str, int, int]]]) -> None:
        self.registry = CollectorRegistry()
        self._requests = Counter(
            "omni_requests",
            "Requests answered, by endpoint, model and HTTP status",
            ["endpoint", "model", "status"],
            registry=self.registry,
        )
        self._duration = Histogram(
            "omni_request_duration_seconds",
            "Time until the answer started, by endpoint",
            ["endpoint"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self._tokens = Counter(
            "omni_tokens",
            "Chat tokens, by model and kind (prompt, completion)",
            ["model", "kind"],
            registry=self.registry,
        )
        self._audio = Counter(
            "omni_audio_seconds",
            "Seconds of audio, by model and direction (out: speech, in: transcription)",
            ["model", "direction"],
            registry=self.registry,
        )
        self._sessions = Counter(
            "omni_realtime_sessions",
            "Realtime connections, by model and outcome (accepted, refused)",
            ["model", "outcome"],
            registry=self.registry,
        )
        self._responses = Counter(
            "omni_realtime_responses",
            "Realtime responses, by model and how they ended (completed, cancelled)",
            ["model", "status"],
            registry=self.registry,
        )
        self.registry.register(_Live(live))

    def request(self, endpoint: str, model: str | None, status: int, duration_s: float) -> None:
        self._requests.labels(endpoint, model or "", str(status)).inc()
        self._duration.labels(endpoint).observe(duration_s)

    def tokens(self, model: str, *, prompt: int, completion: int) -> None:
        if prompt > 0:
            self._tokens.labels(model, "prompt").inc(prompt)
        if completion > 0:
            self._tokens.labels(model, "completion").inc(completion)

    def audio(self, model: str, direction: str, seconds: float) -> None:
        if seconds > 0:
            self._audio.labels(model, direction).inc(seconds)

    def realtime_session(self, model: str | None, outcome: str) -> None:
        self._sessions.labels(model or "", outcome).inc()

    def realtime_response(self, model: str, status: str) -> None:
        self._responses.labels(model, status).inc()

    def exposition(self) -> bytes:
        """The text format a Prometheus scraper reads."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
