"""One request's state as the loop holds it: what the orchestrator admits and the program
moves through the stages (its own module, so that neither of the two imports the other)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime.engine.outputs import OutputStream

if TYPE_CHECKING:
    import asyncio

    from runtime.contracts import RequestKey
    from runtime.engine.inputs import InputStream
    from runtime.metrics import StageCallMetrics

__all__ = ["Request"]


@dataclass(eq=False)
class Request:
    """One request's state, owned by the loop (``stream`` is the thread-safe part)."""

    request_id: str
    inputs: Any
    key: RequestKey
    stream: OutputStream = field(default_factory=OutputStream)
    submitted_at: float = field(default_factory=time.perf_counter)
    task: asyncio.Task[None] | None = None
    cancelled: bool = False
    #: Set by any thread the moment a cancel is asked for, before the loop gets to it.
    cancel_requested: bool = False
    #: Why the request was stopped (its caller went away), when it was.
    stopped: str | None = None
    #: Set by the caller's thread when it acknowledges the request's final output: the
    #: request no longer counts against admission while the loop winds it up.
    final_consumed: bool = False
    stage_metrics: list[StageCallMetrics] = field(default_factory=list)
    #: The chunks fed after the start, for a request submitted with ``streaming=True``.
    input: InputStream | None = None
