"""Runtime events: plain frozen values the orchestrator publishes.

Subscribers (the CLI's progress output, the studio's bridge) receive them on the
orchestrator's thread and must not block; the studio hops them onto the GUI thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
    record: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PipelineReady(Event):
    pipeline: str
    execution_plan: dict[str, Any]


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

    def publish(self, event: Event) -> None:
        with self._lock:
            subscribers = tuple(self._subscribers)
        for callback in subscribers:
            try:
                callback(event)
            except Exception:  # a subscriber's bug must not break the runtime
                log.exception("event subscriber %r failed on %s", callback, type(event).__name__)
