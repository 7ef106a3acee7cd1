"""A graph stage run by ONNX Runtime in the controller's own process (``worker: inprocess``).

For tests and for stages a user trusts: the bundle, the session and every call live in this
process, so a crash of ONNX Runtime or a graph that never ends takes the controller with
it, and nothing keeps the stage's memory apart. In return a call costs no pipe, no shared
memory and no process start.

It keeps the graph client's contract (:class:`~runtime.backends.base.GraphClient`): the
bundle is verified here and again on the bytes the session loads, calls are checked
against the fixed buckets and ``max_io_bytes``, one call and one retained result occupy the
slot until acknowledged (the same :class:`~runtime.backends.graph_slot.GraphSlot` as a
worker's client), and cancelling fences the request at once. Cancelling an active
call asks ONNX Runtime to stop between nodes (``RunOptions.terminate``) and retires the
stage, which then raises :class:`~runtime.errors.StageRetired` until the pipeline is
recreated; its reservation is released once the call has stopped, or quarantined while it
runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

from runtime.artifacts import load_example_inputs
from runtime.backends.base import (
    CallResult,
    StageRecord,
    WorkerRecord,
    check_usable,
    reservation_record,
)
from runtime.backends.graph import BACKEND_NAME
from runtime.backends.graph_detail import GraphStageDetail
from runtime.backends.graph_errors import worker_error
from runtime.backends.graph_slot import GraphSlot
from runtime.backends.graph_spec import GraphTimeouts
from runtime.backends.kept_inputs import KeptCopies
from runtime.backends.placement import PlacementReport, gate_placement
from runtime.backends.retirement import resolve_quarantine, settle_reservation
from runtime.errors import ModelError, RequestCancelled, StageRetired, UsageError

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping
    from typing import Any

    import numpy as np

    from runtime.backends.graph_spec import GraphStageSpec
    from runtime.contracts import RequestKey
    from runtime.contracts.ep_device import AppliedDevice
    from runtime.contracts.messages import TensorSpec
    from runtime.errors import OmniError
    from runtime.events import EventBus
    from runtime.ledger import ResourceLedger, StageReservation
    from workers.ort_session import Bucket, CallOutcome, CancellableRunner

__all__ = ["INPROCESS_WORKER", "InProcessGraphClient"]

log = logging.getLogger("omni.backends.inprocess")

#: The route ``worker`` that runs a graph stage in the controller's process.
INPROCESS_WORKER: Final = "inprocess"


class InProcessGraphClient:
    """The engine's client for one ``external.graph.v1`` stage run in this process."""

    def __init__(
        self,
        spec: GraphStageSpec,
        *,
        ledger: ResourceLedger,
        reservation: StageReservation,
        generation: int,
        events: EventBus | None = None,
        timeouts: GraphTimeouts | None = None,
    ) -> None:
        self.spec = spec
        self.route = spec.route
        self.bundle = spec.bundle
        self.generation = generation
        self.timeouts = timeouts or GraphTimeouts()
        self._name = spec.name
        self._ledger = ledger
        self._reservation: StageReservation | None = reservation
        # Accepted for a uniform constructor: no worker, so no WorkerRetired to publish.
        self._events = events
        self._loop: asyncio.AbstractEventLoop | None = None
        self._buckets: tuple[Bucket, ...] = ()
        #: Seconds to load and to warm up, once started.
        self._load_s: float | None = None
        self._applied_device: AppliedDevice | None = None
        self._warmup_s: float | None = None
        self._runner: CancellableRunner | None = None
        self._placement: PlacementReport | None = None
        self._failure: OmniError | None = None
        self._closed = False
        self._slot = GraphSlot(self)
        self._retained: Mapping[str, np.ndarray] | None = None
        #: Inputs kept between calls of one request (copied once, reused while passed again).
        self._kept = KeptCopies()
        self._retire_task: asyncio.Task[None] | None = None
        #: The reservation quarantined while a cancelled call runs on past its deadline.
        self._quarantined: str | None = None

    # -- state -----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def usable(self) -> bool:
        return self._failure is None and not self._closed and self._runner is not None

    @property
    def failure(self) -> OmniError | None:
        return self._failure

    @property
    def pid(self) -> int:
        """This process: the stage has no worker of its own."""
        return os.getpid()

    @property
    def buckets(self) -> tuple[Bucket, ...]:
        return self._buckets

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self.buckets[0].inputs if self.buckets else ()

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self.buckets[0].outputs if self.buckets else ()

    @property
    def slot(self) -> RequestKey | None:
        """The request holding this stage's slot (in flight or retained), if any."""
        return self._slot.holder

    def example_inputs(self) -> dict[str, np.ndarray]:
        return load_example_inputs(self.bundle)

    # -- start -----------------------------------------------------------------------

    async def start(self) -> StageRecord:
        """Verify and load the bundle, warm up every bucket and pass the placement gate."""
        # Imported here: only a pipeline with an in-process stage loads ONNX Runtime here.
        from workers.errors import WorkerError
        from workers.ort_session import CancellableRunner, open_graph

        if self._loop is not None:
            raise UsageError(f"{self.name}: start() was already called")
        self._loop = asyncio.get_running_loop()
        route = self.route
        target = route.target_provider
        providers = (target, *(p for p in route.allowed_providers if p != target))
        threads = self.spec.threads
        try:
            opened = await self._loop.run_in_executor(
                None,
                lambda: open_graph(
                    self.bundle.manifest_path,
                    self.bundle.identity,
                    providers,
                    route.allowed_providers,
                    target,
                    max_io_bytes=route.max_io_bytes,
                    intra_op_threads=0 if threads is None else threads.intra_op_threads,
                    allow_spinning=True if threads is None else threads.allow_spinning,
                    device=self.spec.load_device(),
                    provider_options=route.provider_options,
                    ep_library=route.ep_library,
                ),
            )
        except WorkerError as exc:
            raise worker_error(
                self.name,
                exc.code,
                exc.message,
                cpu_allowed="CPUExecutionProvider" in route.allowed_providers,
            ) from None
        report = PlacementReport(
            counts=dict(opened.placement.counts),
            total_nodes=opened.placement.total,
            method=opened.placement.method,
            target_provider=target,
        )
        self._placement = report
        gate_placement(
            report,
            allowed_providers=route.allowed_providers,
            target_provider=target,
            min_fraction_on_target=route.min_fraction_on_target,
            stage=self.name,
        )
        self._buckets = opened.buckets
        self._load_s, self._warmup_s = opened.load_s, opened.warmup_s
        self._applied_device = opened.device
        # The runner holds the session; dropping it at retirement frees the model's memory.
        self._runner = CancellableRunner(opened.session, name=f"{self.name}-call")
        return self.record()

    def record(self) -> StageRecord:
        """This stage's entry of ``execution_plan`` (labelled B: backend execution)."""
        threads = self.spec.threads
        detail = GraphStageDetail(
            spec=self.spec,
            worker=WorkerRecord(pid=os.getpid(), generation=self.generation, in_process=True),
            reservation=reservation_record(self._reservation),
            placement=self._placement,
            inputs=self.inputs,
            outputs=self.outputs,
            load_s=self._load_s,
            warmup_s=self._warmup_s,
            # The controller's memory, not the stage's: nothing separates the two.
            worker_rss_bytes=None,
            applied_intra_op_threads=None if threads is None else threads.intra_op_threads,
            applied_allow_spinning=None if threads is None else threads.allow_spinning,
            arenas=None,
            usable=self.usable,
            failure=None if self._failure is None else str(self._failure),
            applied_device=self._applied_device,
        )
        return StageRecord(stage=self.name, backend=BACKEND_NAME, detail=detail)

    # -- calls -----------------------------------------------------------------------

    async def call(
        self,
        key: RequestKey,
        inputs: Mapping[str, np.ndarray],
        *,
        on_sent: Callable[[], None] | None = None,
        retain: Collection[str] = (),
    ) -> CallResult:
        """One call. The inputs are copied once (as into a worker's buffers) before
        ``on_sent`` runs; the result's arrays are read-only and this stage's own, valid until
        :meth:`acknowledge` (or :meth:`cancel`) frees the slot. An input named in ``retain``
        keeps its copy: the same array object passed again by the request is not copied."""
        from workers.errors import WorkerError
        from workers.ort_session import check_call_inputs

        check_usable(self.name, self._failure, running=self.usable)
        slot = self._slot
        slot.check_free()
        runner, loop = self._runner, self._loop
        assert runner is not None
        assert loop is not None
        arrays, copied = self._kept.copy(key, inputs, retain)
        try:
            check_call_inputs(arrays, self.buckets, self.route.max_io_bytes)
        except WorkerError as refused:
            raise ModelError(f"{self.name}: {refused.code}: {refused.message}") from None
        bytes_in = sum(int(array.nbytes) for array in arrays.values())
        future: asyncio.Future[CallOutcome] = loop.create_future()

        def done(outcome: CallOutcome) -> None:
            # On the call's thread; a loop closed meanwhile has nobody left to tell.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._on_done, future, outcome)

        slot.take(key, call=future)
        started = time.perf_counter()
        try:
            runner.submit(arrays, on_done=done)
            del arrays
            if on_sent is not None:
                on_sent()
            outcome = await future
        except BaseException:
            # cancel() and close() free the slot themselves; here the caller stopped waiting.
            if slot.call is future:
                slot.free()
                if future.cancelled() or not future.done():
                    # The call still runs and nobody takes its result: stop it as cancel() would
                    # (a task cancelled while it waited cancelled the future with it).
                    self._retire_after_cancel()
            raise
        if slot.call is future:
            slot.ended()
        if outcome.error is not None or outcome.outputs is None:
            if slot.holder == key:
                slot.free()
            error = outcome.error
            code, text = (
                ("model_error", "no outputs") if error is None else (error.code, error.message)
            )
            if code == "cancelled":
                raise RequestCancelled(f"{self.name}: call cancelled")
            raise ModelError(f"{self.name}: {code}: {text}")
        outputs = dict(outcome.outputs)
        for array in outputs.values():
            array.flags.writeable = False
        retained = MappingProxyType(outputs)
        if slot.holder == key:
            self._retained = retained
        return CallResult(
            key=key,
            outputs=retained,
            run_s=outcome.elapsed_s,
            round_trip_s=time.perf_counter() - started,
            bytes_in=bytes_in,
            bytes_out=sum(int(array.nbytes) for array in outputs.values()),
            copied_bytes=copied,
        )

    @property
    def retained_inputs(self) -> tuple[str, ...]:
        """The names of the inputs kept now."""
        return self._kept.names

    def _on_done(self, future: asyncio.Future[CallOutcome], outcome: CallOutcome) -> None:
        """On the loop: a call ended (a cancelled one's outcome is dropped)."""
        if not future.done():
            future.set_result(outcome)
        if self._quarantined is not None:
            reservation_id, self._quarantined = self._quarantined, None
            if resolve_quarantine(self._ledger, reservation_id, stage=self.name):
                log.info("%s: the cancelled in-process call ended; reservation released", self.name)

    @property
    def direct_calls(self) -> bool:
        """Calls run on this stage's own thread and report to the loop: never direct."""
        return False

    def call_direct(
        self,
        key: RequestKey,
        inputs: Mapping[str, np.ndarray],
        *,
        on_sent: Callable[[], None] | None = None,
        retain: Collection[str] = (),
    ) -> CallResult:
        raise UsageError(f"{self.name} runs in this process: its calls go through the loop")

    def acknowledge(self, key: RequestKey) -> bool:
        """Free the slot of ``key``'s retained result; its arrays are no longer this stage's."""
        return self._slot.acknowledge(key)

    async def cancel(self, key: RequestKey) -> None:
        """Fence ``key``'s request; an active call is asked to stop and the stage retired."""
        await self._slot.cancel(key)

    # -- what the slot asks of this stage ------------------------------------------------

    def _free_result(self) -> None:
        self._retained = None

    def _drop_kept(self, request_id: str) -> None:
        self._kept.release(request_id)

    def _fence(self, key: RequestKey, call: asyncio.Future[Any] | None) -> None:
        if call is not None and not call.done():
            call.set_exception(RequestCancelled(f"{self.name}: call cancelled"))

    async def _retire_cancelled(self) -> None:
        # ONNX Runtime is asked to stop between nodes; the stage goes either way.
        self._retire_after_cancel()
        await self._retire()

    def _retire_after_cancel(self) -> None:
        if self._failure is None:
            self._failure = StageRetired(f"{self.name}: retired after an active call was cancelled")
        if self._retire_task is None and self._loop is not None:
            self._retire_task = self._loop.create_task(self._retire_once())

    # -- retirement ------------------------------------------------------------------

    async def close(self) -> None:
        """Stop a running call and settle the stage's reservation. Idempotent."""
        self._closed = True
        running = self._slot.close()
        self._kept.release()
        if running is not None and not running.done():
            running.set_exception(StageRetired(f"{self.name} was closed"))
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        await self._retire()

    async def _retire(self) -> None:
        if self._retire_task is None:
            assert self._loop is not None
            self._retire_task = self._loop.create_task(self._retire_once())
        await asyncio.shield(self._retire_task)

    async def _retire_once(self) -> None:
        runner = self._runner
        stopped = True
        if runner is not None:
            runner.cancel()
            deadline = self.timeouts.cancel_retire_s
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, runner.close, deadline)
            stopped = not runner.busy
            self._runner = None
        reservation, self._reservation = self._reservation, None
        if reservation is None:
            return
        why = None
        if not stopped:
            why = (
                f"an in-process call of {self.name} was still running "
                f"{self.timeouts.cancel_retire_s} s after it was told to stop"
            )
            log.warning("%s", why)
            # Resolved when the call ends (``_on_done``): no process to watch here.
            self._quarantined = reservation.id
        settle_reservation(self._ledger, reservation, why, stage=self.name)
