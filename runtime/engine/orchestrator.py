"""The orchestrator: one pipeline's stages, driven by an asyncio loop in its own thread.

It admits one graph request at a time (the seed's rule; extra work gets
``ResourceUnavailable`` unless the pipeline sets a bounded ``max_queued``); a pipeline with
a language-model stage admits up to that stage's ``max_num_seqs`` at once, and its graph
stages take them in turn. It moves each request through the stages with the pipeline's
program, copies handoffs before acknowledging, publishes typed events and owns every
worker through its ``StageRuntime``. All public methods are thread-safe and never run on
the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import ctypes
import functools
import logging
import sys
import threading
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from runtime.backends.inprocess import INPROCESS_WORKER
from runtime.config import LlmBackendConfig, RemoteLlmRoute
from runtime.contracts import RequestKey, new_request_id
from runtime.engine.inputs import InputStream
from runtime.engine.outputs import END
from runtime.engine.program import (
    ChainProgram,
    PipelineProgram,
    RequestContext,
    StreamingProgram,
    load_program,
    streams_input,
)
from runtime.engine.program_traits import (
    concurrent_requests,
    concurrent_stages,
    single_thread_stages,
    solo_stages,
)
from runtime.engine.request import Request as Request
from runtime.engine.stage_runtime import StageRuntime
from runtime.engine.stages import GraphStage
from runtime.errors import (
    ExecutionError,
    OmniError,
    RequestCancelled,
    ResourceUnavailable,
    UsageError,
)
from runtime.events import (
    EventBus,
    LoadingStage,
    PipelineClosed,
    PipelineLoadFailed,
    PipelineLoading,
    PipelineReady,
    RequestAdmitted,
    RequestFinished,
)
from runtime.ledger import ResourceLedger
from runtime.metrics import RequestMetrics, SessionMetrics
from runtime.records import ExecutionPlan

if TYPE_CHECKING:
    import numpy as np

    from runtime.admission import Resolution
    from runtime.backends.base import StageClient
    from runtime.backends.graph import GraphTimeouts
    from runtime.config import PipelineConfig
    from runtime.devices import DeviceSelection, Topology

log = logging.getLogger("omni.engine.orchestrator")
#: How long a stopped request may take to reach the end of its stage call before it is
#: cancelled (which retires a worker whose call still runs).
STOP_GRACE_S: Final = 10.0

#: How long ``close`` waits for the loop thread after everything was retired.
JOIN_DEADLINE_S = 10.0


#: glibc's mallopt parameter for the size above which allocations are mapped on their own.
_M_MMAP_THRESHOLD = -3
#: glibc's initial threshold, kept fixed (see :func:`_fix_mmap_threshold`).
MMAP_THRESHOLD_BYTES = 128 << 10


@functools.cache
def _fix_mmap_threshold() -> None:
    """Keep glibc from raising its mmap threshold after a large array is freed (Linux only).

    Once raised, arrays of that size come from per-thread arenas that keep them after they
    are freed, so a busy controller's resident memory grows (a 1,000-request soak grew by
    300 MB); fixed at glibc's initial value, large arrays are mapped and returned each time.
    """
    if sys.platform != "linux":
        return
    # The process's own symbols include the C library's; musl has no mallopt.
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


class LoadCancelled(OmniError):
    """``Orchestrator.start`` was stopped by ``cancel_start``; everything it began is unwound."""


def loading_stages(config: PipelineConfig) -> tuple[LoadingStage, ...]:
    """Each stage with what serves it, in words, as the loading views name it."""
    stages = []
    for stage in config.stages:
        backend = stage.backend
        model: str | None
        if isinstance(backend, LlmBackendConfig):
            route = backend.route
            if isinstance(route, RemoteLlmRoute):
                kind, model = "remote server", route.model
            else:
                kind = "vLLM worker"
                model = backend.model.name if isinstance(backend.model, Path) else backend.model
        else:
            kind = "in process" if backend.route.worker == INPROCESS_WORKER else "graph worker"
            # A bundle is named by its folder (a voice's "acoustic", the demo's "add").
            model = backend.manifest.parent.name
        stages.append(LoadingStage(stage.name, kind, model or ""))
    return tuple(stages)


class Orchestrator:
    """Runs one pipeline. Start it, submit requests, cancel, close."""

    def __init__(
        self,
        config: PipelineConfig,
        *,
        ledger: ResourceLedger | None = None,
        events: EventBus | None = None,
        topology: Topology | None = None,
        selection: DeviceSelection | None = None,
        timeouts: GraphTimeouts | None = None,
        resolution: Resolution | None = None,
    ) -> None:
        self.config = config
        self.ledger = ledger if ledger is not None else ResourceLedger(name=config.pipeline)
        self.events = events if events is not None else EventBus()
        self.program: PipelineProgram = load_program(config)
        self._runtime = StageRuntime(
            config,
            ledger=self.ledger,
            events=self.events,
            topology=topology,
            selection=selection,
            timeouts=timeouts,
            concurrent=concurrent_stages(self.program, config),
            solo=solo_stages(self.program, config),
            requests=concurrent_requests(self.program),
            single_thread=single_thread_stages(self.program, config),
            resolution=resolution,
        )
        self._lock = threading.Lock()
        #: Notified whenever a request is wound up (see :meth:`metrics`).
        self._finished = threading.Condition(self._lock)
        self._running: list[Request] = []
        #: Requests run at once, known once the stages started (see StageRuntime.concurrency).
        self._concurrency = 1
        self._queue: deque[Request] = deque()
        self._requests: dict[str, Request] = {}
        #: Cancels of stopped requests that overran their grace (kept until done).
        self._overdue: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._state = "new"  # new -> running -> closed
        #: The stages as started (none before ``start``).
        self._execution_plan = ExecutionPlan(pipeline=config.pipeline)
        self._completed: list[RequestMetrics] = []
        #: ``cancel_start`` was called; the start task it cancels, once it runs.
        self._start_cancelled = False
        self._start_task: asyncio.Task[Any] | None = None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> ExecutionPlan:
        """Start the loop thread and every stage; blocks until ready or raises (unwound).

        Publishes ``PipelineLoading`` first, each stage's phases as it goes, then
        ``PipelineReady`` or ``PipelineLoadFailed``. ``cancel_start`` from another thread
        makes it raise :class:`LoadCancelled` once everything it began is unwound."""
        pipeline = self.config.pipeline
        with self._lock:
            if self._state != "new":
                raise UsageError(f"pipeline {pipeline} was already started")
            self._state = "starting"
        self.events.publish(PipelineLoading(pipeline=pipeline, stages=loading_stages(self.config)))
        _fix_mmap_threshold()
        ready: cf.Future[asyncio.AbstractEventLoop] = cf.Future()
        self._thread = threading.Thread(
            target=self._run_loop, args=(ready,), name=f"omni-{pipeline}", daemon=True
        )
        self._thread.start()
        self._loop = ready.result()
        try:
            asyncio.run_coroutine_threadsafe(self._start_stages(), self._loop).result()
        except BaseException as exc:
            self._stop_loop()
            with self._lock:
                self._state = "closed"
                cancelled = self._start_cancelled
            message = "cancelled" if cancelled else str(exc) or type(exc).__name__
            self.events.publish(
                PipelineLoadFailed(pipeline=pipeline, message=message, cancelled=cancelled)
            )
            if cancelled:
                raise LoadCancelled(f"loading pipeline {pipeline} was cancelled") from None
            raise
        self._execution_plan = self._runtime.execution_plan()
        with self._lock:
            self._concurrency = self._runtime.concurrency
            self._state = "running"
        self.events.publish(
            PipelineReady(pipeline=self.config.pipeline, execution_plan=self._execution_plan)
        )
        return self._execution_plan

    async def _start_stages(self) -> None:
        with self._lock:
            if self._start_cancelled:
                raise asyncio.CancelledError
            self._start_task = asyncio.current_task()
        await self._runtime.start()

    def cancel_start(self) -> bool:
        """Stop a start under way, from any thread, without waiting: the stages begun so far
        are retired and their reservations settled before ``start`` raises
        :class:`LoadCancelled`. False once the pipeline runs or is closed (close it instead)."""
        with self._lock:
            if self._state not in ("new", "starting"):
                return False
            self._start_cancelled = True
            task, loop = self._start_task, self._loop
        if task is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(task.cancel)
        return True

    def _run_loop(self, ready: cf.Future[asyncio.AbstractEventLoop]) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        ready.set_result(loop)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

    def _stop_loop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None and thread is not threading.current_thread():
            thread.join(JOIN_DEADLINE_S)
            if thread.is_alive():
                log.error("orchestrator thread of %s did not stop", self.config.pipeline)

    def close(self) -> None:
        """Cancel every request, retire every worker, settle the ledger, stop the thread."""
        with self._lock:
            if self._state in ("closed", "closing", "new"):
                self._state = "closed"
                return
            self._state = "closing"
        assert self._loop is not None
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result()
        finally:
            self._stop_loop()
            with self._lock:
                self._state = "closed"
            self.events.publish(PipelineClosed(pipeline=self.config.pipeline))

    async def _shutdown(self) -> None:
        requests = list(self._requests.values())
        # A request whose final output was consumed is winding up: let it finish.
        consumed = [r.task for r in requests if r.final_consumed and r.task is not None]
        if consumed:
            await asyncio.wait(consumed, timeout=JOIN_DEADLINE_S)
        for request in requests:
            if request.task is None or not request.task.done():
                await self._cancel(request, "the pipeline was closed")
        await self._runtime.close()

    def __enter__(self) -> Orchestrator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- information -----------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._state == "running"

    @property
    def execution_plan(self) -> ExecutionPlan:
        return self._execution_plan

    @property
    def clients(self) -> list[StageClient]:
        """Each stage's backend client, in stage order."""
        return list(self._runtime.clients)

    @property
    def concurrency(self) -> int:
        """How many requests run at once (1 for graph pipelines unless their program says
        otherwise)."""
        return self._concurrency

    def example_inputs(self) -> dict[str, np.ndarray]:
        """The first stage's example inputs (the default request of a graph chain)."""
        return self._runtime.example_inputs()

    def metrics(self) -> SessionMetrics:
        """Per-stage metrics of every finished request, and totals per stage.

        A request whose final output was consumed is counted once the loop has wound it up
        (this waits for that, briefly)."""
        with self._finished:
            self._finished.wait_for(
                lambda: not any(request.final_consumed for request in self._running),
                timeout=JOIN_DEADLINE_S,
            )
            completed = tuple(self._completed)
        return SessionMetrics.of(self.config.pipeline, completed)

    # -- requests (any thread) -------------------------------------------------------

    def submit(
        self, inputs: Any = None, *, request_id: str | None = None, streaming: bool = False
    ) -> Request:
        """Admit a request or raise ``ResourceUnavailable`` (nothing is queued silently).

        ``inputs`` is what the pipeline's program accepts: a mapping of arrays for a graph
        chain (None: the first stage's example inputs), text for a speech adapter, ...
        With ``streaming`` the request takes more input after it started (``request.input``,
        fed from any thread); ``inputs``, when given, is its first chunk.
        """
        request_id = request_id or new_request_id()
        stream: InputStream | None = None
        first: Any = None
        if streaming:
            program = self._streaming()
            first = None if inputs is None else program.prepare_chunk(inputs)
            stream = InputStream(request_id)
            if self._loop is not None:
                stream.bind(self._loop)
            prepared: Any = None
        else:
            prepared = self.program.prepare(inputs)
        request = Request(
            request_id=request_id, inputs=prepared, key=RequestKey(request_id), input=stream
        )
        with self._lock:
            if self._state != "running":
                raise UsageError(f"pipeline {self.config.pipeline} is not running ({self._state})")
            if request_id in self._requests:
                raise UsageError(f"request id {request_id} is already in use")
            active = sum(1 for running in self._running if not running.final_consumed)
            if active < self._concurrency:
                self._running.append(request)
                queued = False
            elif len(self._queue) < self.config.max_queued:
                self._queue.append(request)
                queued = True
            else:
                if self.config.max_queued:
                    limit = f"the queue holds at most {self.config.max_queued}"
                elif self._concurrency == 1:
                    limit = "graph pipelines admit one request at a time"
                elif all(isinstance(stage, GraphStage) for stage in self._runtime.stages):
                    limit = (
                        f"its program runs {self._concurrency} requests at a time "
                        "(concurrent_requests)"
                    )
                else:
                    limit = (
                        f"it admits {self._concurrency} requests at a time, the max_num_seqs "
                        "of its language-model stage"
                    )
                busy = ", ".join(
                    running.request_id for running in self._running if not running.final_consumed
                )
                raise ResourceUnavailable(
                    f"pipeline {self.config.pipeline} is busy with {busy} "
                    f"({limit}); consume or cancel one, then retry"
                )
            self._requests[request_id] = request
        self.events.publish(RequestAdmitted(request_id=request_id, queued=queued))
        if stream is not None and first is not None:
            stream.feed_threadsafe(first)
        if not queued:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._launch, request)
        return request

    def _streaming(self) -> StreamingProgram:
        """The program, where it takes input after the start; UsageError otherwise."""
        program = self.program
        if not streams_input(program):
            raise UsageError(
                f"pipeline {self.config.pipeline} takes its input whole "
                f"({type(program).__name__}); streaming=True is accepted only by pipelines "
                "whose program streams input (a graph chain, the transcription adapter)"
            )
        return program

    def feed(self, request: Request, chunk: Any) -> None:
        """More input for a streaming request, from any thread (checked here by the program)."""
        stream = request.input
        if stream is None:
            raise UsageError(
                f"request {request.request_id} was not submitted with streaming=True; "
                "feed() and end_input() are accepted only by streaming requests"
            )
        if request.cancel_requested or request.stream.closed:
            raise UsageError(f"request {request.request_id} has ended; it takes no more input")
        stream.feed_threadsafe(self._streaming().prepare_chunk(chunk))

    def end_input(self, request: Request) -> None:
        """No more input for a streaming request (any thread); idempotent."""
        if request.input is None:
            raise UsageError(
                f"request {request.request_id} was not submitted with streaming=True; "
                "feed() and end_input() are accepted only by streaming requests"
            )
        if not request.cancel_requested:
            request.input.end_threadsafe()

    def run_direct(self, inputs: Any = None) -> dict[str, np.ndarray] | None:
        """Run one request of a graph chain on the calling thread and return its final
        outputs (copied), or None where this way is not open: a program other than the
        chain, a stage whose calls cannot be made directly, another request admitted or
        queued, or a call from the loop's own thread. The caller then submits as usual.

        The request is admitted, counted, cancellable and published like any other; only its
        calls are written from this thread and its results handed to it by the loop, with no
        loop task in between."""
        program = self.program
        if not isinstance(program, ChainProgram) or threading.current_thread() is self._thread:
            return None
        graph = [stage for stage in self._runtime.stages if isinstance(stage, GraphStage)]
        if len(graph) != len(self._runtime.stages) or not all(
            stage.client.direct_calls for stage in graph
        ):
            return None
        request_id = new_request_id()
        request = Request(
            request_id=request_id, inputs=program.prepare(inputs), key=RequestKey(request_id)
        )
        with self._lock:
            if self._state != "running":
                raise UsageError(f"pipeline {self.config.pipeline} is not running ({self._state})")
            if self._running or self._queue:
                return None
            self._running.append(request)
            self._requests[request_id] = request
        if self.events.wanted:
            self.events.publish(RequestAdmitted(request_id=request_id, queued=False))
        status, message = "failed", ""
        try:
            outputs = program.run_direct(request, graph, self.events)
            status = "completed"
            return outputs
        except RequestCancelled as exc:
            status, message = "cancelled", str(exc)
            raise
        except OmniError as exc:
            message = str(exc)
            raise
        except BaseException as exc:
            # Interrupted while a call runs: fence it (retiring its worker) before leaving.
            status, message = "cancelled", f"{type(exc).__name__} while the request ran"
            self.cancel(request_id)
            raise
        finally:
            self._finish(request, status, message)

    def cancel(self, request_id: str, *, wait: bool = True) -> bool:
        """Cancel a request; returns False when it is unknown or already finished."""
        with self._lock:
            request = self._requests.get(request_id)
            if request is None or self._state != "running":
                return False
            request.cancel_requested = True
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(
            self._cancel(request, f"request {request_id} was cancelled"), self._loop
        )
        if wait:
            future.result()
        return True

    def stop(self, request_id: str, *, grace_s: float = STOP_GRACE_S) -> bool:
        """End a request between stage calls, for a caller that went away; never blocks.

        No new stage call or generation step of it starts, the call in progress (if any)
        completes, so no worker is retired for it, and every output is acknowledged as it
        comes; the request then ends cancelled. One still running after ``grace_s`` is
        cancelled as by :meth:`cancel`. False when the request is unknown, finished or
        already stopped."""
        with self._lock:
            request = self._requests.get(request_id)
            if request is None or self._state != "running" or request.stopped is not None:
                return False
            request.cancel_requested = True
            request.stopped = f"request {request_id} was stopped: its caller went away"
        request.stream.discard()
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._stop, request, grace_s)
        except RuntimeError:  # the loop has closed: the request ended with it
            return False
        return True

    # -- requests (loop) -------------------------------------------------------------

    def _stop(self, request: Request, grace_s: float) -> None:
        reason = request.stopped or f"request {request.request_id} was stopped"
        if request.input is not None:
            # Wakes a program waiting for the next chunk; a call in progress goes on.
            request.input.fail(RequestCancelled(reason))
        with self._lock:
            queued = request in self._queue
            if queued:
                self._queue.remove(request)
        if queued:
            request.cancelled = True
            request.stream.put(RequestCancelled(reason))
            self._finish(request, "cancelled", reason)
            return
        assert self._loop is not None

        loop = self._loop

        def overdue() -> None:
            with self._lock:
                running = self._requests.get(request.request_id) is request
            if running:
                log.warning(
                    "request %s did not stop within %g s; cancelling it",
                    request.request_id,
                    grace_s,
                )
                task = loop.create_task(
                    self._cancel(request, f"{reason}; it did not stop within {grace_s:g} s")
                )
                self._overdue.add(task)
                task.add_done_callback(self._overdue.discard)

        loop.call_later(grace_s, overdue)

    def _launch(self, request: Request) -> None:
        assert self._loop is not None
        request.task = self._loop.create_task(self._execute(request))

    async def _execute(self, request: Request) -> None:
        stages = self._runtime.stages
        status, message = "completed", ""
        context = RequestContext(request, stages, self.events)
        try:
            if request.input is not None:
                await self._streaming().run_streaming(context, request.input)
            else:
                await self.program.run(context, request.inputs)
            request.stream.put(END)
            if request.stopped is not None:
                # Its last call ended the work, but nobody took the outputs.
                status, message = "cancelled", request.stopped
        except asyncio.CancelledError:
            status, message = "cancelled", "cancelled"
        except RequestCancelled as exc:
            status, message = "cancelled", str(exc)
            request.stream.put(exc)
        except OmniError as exc:
            status, message = "failed", str(exc)
            request.stream.put(exc)
        except Exception as exc:  # the request's top level reports what it caught
            log.exception("request %s failed", request.request_id)
            status, message = "failed", f"{type(exc).__name__}: {exc}"
            request.stream.put(ExecutionError(message))
        finally:
            await context.aclose()
            for stage in stages:
                await stage.cancel(request.key)
            self._finish(request, status, message)

    async def _cancel(self, request: Request, reason: str) -> None:
        if request.cancelled or request.stream.closed:
            return
        request.cancelled = True
        request.cancel_requested = True
        request.stream.put(RequestCancelled(reason))
        if request.input is not None:
            # Wakes a program waiting for the next chunk.
            request.input.fail(RequestCancelled(reason))
        old_key = request.key
        request.key = old_key.fenced()
        with self._lock:
            queued = request in self._queue
            if queued:
                self._queue.remove(request)
        if queued:
            self._finish(request, "cancelled", reason)
            return
        for stage in self._runtime.stages:
            await stage.cancel(old_key)
        if request.task is not None and not request.task.done():
            request.task.cancel()
            await asyncio.gather(request.task, return_exceptions=True)

    def _finish(self, request: Request, status: str, message: str) -> None:
        following: list[Request] = []
        if request.input is not None:
            request.input.fail(RequestCancelled(f"request {request.request_id} has ended"))
        with self._lock:
            self._requests.pop(request.request_id, None)
            if request in self._running:
                self._running.remove(request)
            while self._queue and len(self._running) < self._concurrency:
                admitted = self._queue.popleft()
                self._running.append(admitted)
                following.append(admitted)
            self._completed.append(
                RequestMetrics(request.request_id, status, tuple(request.stage_metrics))
            )
            del self._completed[:-1000]
            self._finished.notify_all()
        if self.events.wanted:
            self.events.publish(
                RequestFinished(request_id=request.request_id, status=status, message=message)
            )
        if not following:
            return
        assert self._loop is not None
        on_loop = threading.current_thread() is self._thread
        for admitted in following:
            if admitted.task is None:
                if on_loop:
                    self._launch(admitted)
                else:
                    self._loop.call_soon_threadsafe(self._launch, admitted)
