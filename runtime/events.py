"""Runtime events: plain frozen values the orchestrator publishes.

Subscribers (the CLI's progress output, the studio's bridge) receive them on the
orchestrator's thread and must not block; the studio hops them onto the GUI thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.records import ExecutionPlan, StageRecord

log = logging.getLogger("omni.engine.events")


@dataclass(frozen=True, slots=True)
class Event:
    """Base of every runtime event."""

    at: float = field(default_factory=time.monotonic, kw_only=True)


@dataclass(frozen=True, slots=True)
class StageStarting(Event):
    stage: str
    route: str


@dataclass(frozen=True, slots=True)
class StageReady(Event):
    stage: str
    record: StageRecord
    #: Seconds from the stage's ``StageStarting`` to ready.
    elapsed_s: float = 0.0


@dataclass(frozen=True, slots=True)
class PipelineReady(Event):
    pipeline: str
    execution_plan: ExecutionPlan


@dataclass(frozen=True, slots=True)
class RequestAdmitted(Event):
    request_id: str
    queued: bool


@dataclass(frozen=True, slots=True)
class StageCallFinished(Event):
    request_id: str
    stage: str
    queue_s: float
    run_s: float
    transfer_s: float
    bytes_in: int
    bytes_out: int
    #: Tensor bytes copied for the call, on both sides of the pipe.
    copied_bytes: int = 0


@dataclass(frozen=True, slots=True)
class RequestOutputReady(Event):
    request_id: str
    stage: str
    index: int
    finished: bool


@dataclass(frozen=True, slots=True)
class RequestFinished(Event):
    request_id: str
    status: str  # "completed" | "cancelled" | "failed"
    message: str = ""


@dataclass(frozen=True, slots=True)
class WorkerRetired(Event):
    stage: str
    pid: int
    reason: str
    confirmed_gone: bool


@dataclass(frozen=True, slots=True)
class PipelineClosed(Event):
    pipeline: str


@dataclass(frozen=True, slots=True)
class LoadingStage:
    """A stage of a pipeline being loaded, as the loading views name it."""

    stage: str
    #: What serves it, in words: "vLLM worker", "graph worker", "in process", "remote server".
    kind: str
    #: What it loads: the model's or the bundle's name ("" when it has none to show).
    model: str = ""


@dataclass(frozen=True, slots=True)
class PipelineLoading(Event):
    """A pipeline's stages begin to load (before anything is verified or reserved)."""

    pipeline: str
    stages: tuple[LoadingStage, ...]


@dataclass(frozen=True, slots=True)
class StageWorkerUp(Event):
    """A stage's worker process answered its handshake and now loads its model."""

    stage: str
    pid: int


@dataclass(frozen=True, slots=True)
class StageFailed(Event):
    """A stage's start failed or was cancelled (the whole load is then unwound)."""

    stage: str
    message: str
    #: Seconds from the stage's ``StageStarting`` to the failure.
    elapsed_s: float


@dataclass(frozen=True, slots=True)
class PipelineLoadFailed(Event):
    """Loading a pipeline failed or was cancelled; everything it started was unwound."""

    pipeline: str
    message: str
    cancelled: bool = False


Subscriber = Callable[[Event], None]


class EventBus:
    """Thread-safe fan-out of events to subscribers; a failing subscriber is logged."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: list[Subscriber] = []

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        with self._lock:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    @property
    def wanted(self) -> bool:
        """Whether anyone listens now: a hot path skips making events nobody receives."""
        return bool(self._subscribers)

    def publish(self, event: Event) -> None:
        with self._lock:
            subscribers = tuple(self._subscribers)
        for callback in subscribers:
            try:
                callback(event)
            except Exception:  # a subscriber's bug must not break the runtime
                log.exception("event subscriber %r failed on %s", callback, type(event).__name__)


# ------------------------------------------------------------------ loading progress

#: A stage's loading phases, in order; "ready" and "failed" end it.
LOAD_PHASES = ("preparing", "starting worker", "starting", "loading", "ready", "failed")


def _seconds(value: float) -> str:
    """0.4 s below ten seconds, 12 s above (the precision a waiting person reads)."""
    return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"


@dataclass(frozen=True, slots=True)
class StageProgress:
    """Where one stage's load is: its phase, since when, and how long it took once done."""

    stage: str
    kind: str
    phase: str
    #: Monotonic time its load began (its ``StageStarting``; the pipeline's start before that).
    since: float
    #: Seconds it took, once ready or failed.
    elapsed_s: float | None = None
    message: str = ""
    model: str = ""

    @property
    def done(self) -> bool:
        return self.phase in ("ready", "failed")

    @property
    def label(self) -> str:
        """``stage-0 · smollm2-135m-instruct (vLLM worker)``: the stage, what it loads, how."""
        model = f" · {self.model}" if self.model else ""
        return f"{self.stage}{model} ({self.kind})"

    def seconds(self, now: float) -> float:
        return self.elapsed_s if self.elapsed_s is not None else max(0.0, now - self.since)

    def line(self, now: float) -> str:
        """``assistant (vLLM worker): loading… 12 s`` or ``voice (graph worker): ready 0.4 s``."""
        if self.done:
            return f"{self.label}: {self.phase} {_seconds(self.seconds(now))}"
        return f"{self.label}: {self.phase}… {_seconds(self.seconds(now))}"


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """A pipeline's load as the views show it; ``status`` is loading, ready or failed."""

    pipeline: str
    status: str
    started: float
    stages: tuple[StageProgress, ...]
    #: Seconds from the start to ready or failed (None while loading).
    elapsed_s: float | None = None
    message: str = ""

    @property
    def loading(self) -> bool:
        return self.status == "loading"

    @property
    def waiting_on(self) -> tuple[StageProgress, ...]:
        """The stages not ready yet."""
        return tuple(stage for stage in self.stages if not stage.done)

    def seconds(self, now: float) -> float:
        return self.elapsed_s if self.elapsed_s is not None else max(0.0, now - self.started)

    def lines(self, now: float) -> list[str]:
        return [stage.line(now) for stage in self.stages]

    def summary(self, now: float) -> str:
        """One line: what is still loading and for how long, or how the load ended."""
        took = _seconds(self.seconds(now))
        if self.status == "ready":
            return f"{len(self.stages)} stage(s) loaded in {took}"
        if self.status == "failed":
            return f"loading stopped after {took}: {self.message}"
        waiting = self.waiting_on
        if not waiting:
            return f"loading… {took}"
        names = ", ".join(f"{s.label} {s.phase}" for s in waiting)
        return f"loading: {names}… {took}"


class LoadProgress:
    """Folds the loading events of one pipeline into each stage's phase: the command line's
    waiting line and the studio's loading view read it. Not thread-safe: feed it from one
    thread."""

    def __init__(self) -> None:
        self._snapshot: LoadSnapshot | None = None

    @property
    def snapshot(self) -> LoadSnapshot | None:
        """The current load (None before a ``PipelineLoading``)."""
        return self._snapshot

    def update(self, event: Event) -> bool:
        """Apply ``event``; True when the snapshot changed."""
        snapshot = self._snapshot
        if isinstance(event, PipelineLoading):
            stages = tuple(
                StageProgress(stage.stage, stage.kind, "preparing", event.at, model=stage.model)
                for stage in event.stages
            )
            self._snapshot = LoadSnapshot(event.pipeline, "loading", event.at, stages)
            return True
        if snapshot is None or not snapshot.loading:
            return False
        if isinstance(event, PipelineReady):
            self._snapshot = replace(
                snapshot, status="ready", elapsed_s=event.at - snapshot.started
            )
            return True
        if isinstance(event, PipelineLoadFailed):
            self._snapshot = replace(
                snapshot,
                status="failed",
                elapsed_s=event.at - snapshot.started,
                message=event.message,
            )
            return True
        stage = getattr(event, "stage", None)
        index = next((i for i, s in enumerate(snapshot.stages) if s.stage == stage), None)
        if index is None:
            return False
        current = snapshot.stages[index]
        if isinstance(event, StageStarting):
            worker = current.kind.endswith("worker")
            phase = "starting worker" if worker else "starting"
            updated = replace(current, phase=phase, since=event.at)
        elif isinstance(event, StageWorkerUp):
            updated = replace(current, phase="loading")
        elif isinstance(event, StageReady):
            updated = replace(current, phase="ready", elapsed_s=event.elapsed_s)
        elif isinstance(event, StageFailed):
            updated = replace(
                current, phase="failed", elapsed_s=event.elapsed_s, message=event.message
            )
        else:
            return False
        stages = (*snapshot.stages[:index], updated, *snapshot.stages[index + 1 :])
        self._snapshot = replace(snapshot, stages=stages)
        return True
