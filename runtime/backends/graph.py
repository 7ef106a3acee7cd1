"""``external.graph.v1``: one complete, stateless graph call per request, in a worker process.

The client owns its worker process, its framed channel and its stage reservation. It
keeps the flow rules of its :class:`~runtime.backends.graph_slot.GraphSlot`, shared with the
in-process client: one in-flight call and one retained result per client; delivery does not
free the slot, acknowledgement does; cancelling fences the request at once, and cancelling
an *active* call retires the worker (the stage then stays unusable until the pipeline is
recreated).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from runtime.artifacts import load_example_inputs
from runtime.backends.base import (
    CallResult,
    StageRecord,
    check_usable,
)
from runtime.backends.borrowed import BorrowedReader
from runtime.backends.graph_detail import ArenaRecord, GraphStageDetail
from runtime.backends.graph_errors import worker_error
from runtime.backends.graph_slot import GraphSlot

# Re-exported: the engine and callers import the stage's spec and deadlines from here.
from runtime.backends.graph_spec import GraphStageSpec as GraphStageSpec
from runtime.backends.graph_spec import GraphTimeouts as GraphTimeouts
from runtime.backends.kept_inputs import ArenaKept
from runtime.backends.placement import PlacementReport, gate_placement
from runtime.backends.worker_client import (
    WorkerStageClient,
    route_other_domain,
    worker_launch_spec,
)
from runtime.contracts import FrameLimits, RequestKey
from runtime.contracts.binary import FEATURE as BINARY_FEATURE
from runtime.contracts.buffers import BufferDescriptor, DescriptorError
from runtime.contracts.codec import Frame
from runtime.contracts.messages import (
    WORKER_TO_CONTROLLER,
    AckMessage,
    ByeMessage,
    CallMessage,
    CancelMessage,
    ErrorMessage,
    LoadMessage,
    ReadyMessage,
    ResultMessage,
    decode_message,
)
from runtime.contracts.process import GRAPH_TMPDIR_PREFIX, PRIVATE_TMPDIR_VARIABLE
from runtime.errors import (
    ConfigError,
    ExecutionError,
    ModelError,
    OmniError,
    RequestCancelled,
    StageRetired,
)
from runtime.host import spawn_worker
from runtime.transport.answers import AnswerLayout
from runtime.transport.arena import ArenaSlot, arena_size_for
from runtime.transport.calls import CallPacker
from runtime.transport.channel import ARENA_THRESHOLD, ChannelClosed, ProtocolError, frame_acks
from runtime.transport.shm import ShmError, new_prefix, sweep_segments

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping

    from runtime.contracts.messages import Message, TensorSpec
    from runtime.events import EventBus
    from runtime.host import LaunchSpec, RetireOutcome
    from runtime.host.crossdomain import OtherDomain
    from runtime.ledger import ResourceLedger, StageReservation

log = logging.getLogger("omni.backends.graph")

BACKEND_NAME = "external.graph.v1"
#: Reads of answers without a layout before a stage stops trying to learn one ...
LEARN_TRIES = 3
#: ... and then tries once in this many.
RELEARN_EVERY = 64


@dataclass(frozen=True, slots=True)
class _SentCall:
    """A call frame on its way: when it went out, its input bytes and the bytes copied."""

    started: float
    bytes_in: int
    copied: int


class _Ran(NamedTuple):
    """What a result read by its layout tells of the run (a ``ResultMessage``'s figures)."""

    run_s: float
    copied_bytes: int


class GraphStageClient(WorkerStageClient[ReadyMessage]):
    """The engine's client for one ``external.graph.v1`` stage, served by a worker process."""

    _CLOSE_REASON = "pipeline closed"

    def __init__(
        self,
        spec: GraphStageSpec,
        *,
        ledger: ResourceLedger,
        reservation: StageReservation,
        generation: int,
        events: EventBus | None = None,
        timeouts: GraphTimeouts | None = None,
        other_domain: OtherDomain | None = None,
    ) -> None:
        super().__init__(spec.name, ledger, reservation, generation, events)
        #: Given for a worker behind another domain's launcher; else found from the route.
        self._other = other_domain
        self.spec = spec
        self.route = spec.route
        self.bundle = spec.bundle
        self.timeouts: GraphTimeouts = timeouts or GraphTimeouts()
        self._shm_prefix: str | None = None
        self._placement: PlacementReport | None = None
        self._inputs: tuple[TensorSpec, ...] = ()
        self._outputs: tuple[TensorSpec, ...] = ()
        self._call_id = 0
        self._pending: dict[int, tuple[RequestKey, asyncio.Future[Any] | cf.Future[Any]]] = {}
        # The layout of the worker's answers to direct calls, once learned.
        self._answers: AnswerLayout | None = None
        #: This stage's calls packed by their layout (:mod:`runtime.transport.calls`).
        self._calls = CallPacker()
        self._answers_missed = False
        self._answer_reads = 0
        self._answer_failures = 0
        #: Direct calls whose answer was read by its layout, without the decoder.
        self.answers_taken = 0
        self._slot = GraphSlot(self)
        # The retained result's shared buffers, acknowledged when its slot is freed.
        self._result_acks: list[tuple[str, int]] = []
        self.threads = spec.threads
        # Direct calls read their results themselves while the loop lends them the pipe.
        self._borrowed: BorrowedReader | None = None
        #: Inputs kept in the arena between calls of one request, by input name.
        self._kept = ArenaKept(spec.name, lambda: self._channel)

    # -- state -----------------------------------------------------------------------

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self._inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self._outputs

    @property
    def arena_names(self) -> frozenset[str]:
        """The persistent arenas this stage keeps while it runs: its inputs' and its worker's."""
        names = set()
        inputs = None if self._channel is None else self._channel.arena(self.name)
        if inputs is not None:
            names.add(inputs.name)
        if self._ready is not None and self._ready.arena_name is not None:
            names.add(self._ready.arena_name)
        return frozenset(names)

    @property
    def slot(self) -> RequestKey | None:
        """The request holding this stage's slot (in flight or retained), if any."""
        return self._slot.holder

    def example_inputs(self) -> dict[str, np.ndarray]:
        return load_example_inputs(self.bundle)

    # -- start -----------------------------------------------------------------------

    def _launch_spec(self) -> LaunchSpec:
        extra = {} if self._tmpdir is None else _temp_variables(self._tmpdir, self.route.os_domain)
        return worker_launch_spec(
            self.route, generation=self.generation, extra_env=extra, other=self._other
        )

    def _worker_path(self, path: Path) -> str:
        """``path`` as the worker sees it (translated for a worker in the other domain)."""
        if self._other is None:
            return str(path)
        try:
            return self._other.path(str(path))
        except ValueError as exc:
            raise ConfigError(f"{self.name}: the worker cannot reach {path}: {exc}") from None

    async def start(self) -> StageRecord:
        """Spawn, handshake, load, warm up and pass the placement gate."""
        self._loop = asyncio.get_running_loop()
        if self._other is None:
            self._other = route_other_domain(self.route)
        same_domain = self._other is None
        if same_domain:
            # Whatever the worker or its libraries leave in TMPDIR goes when it is retired.
            self._tmpdir = Path(tempfile.mkdtemp(prefix=f"{GRAPH_TMPDIR_PREFIX}{self.generation}-"))
        worker = self._spawn(self._launch_spec(), spawn_worker)
        if same_domain:
            self._shm_prefix = new_prefix(os.getpid(), self.generation)
        # Room for the largest call (inputs plus outputs) and its header.
        limits = FrameLimits(max_total_bytes=max(self.route.max_io_bytes, 1 << 20) + (2 << 20))
        self._open_channel(worker, limits, shm_prefix=self._shm_prefix, same_domain=same_domain)
        channel = await self._handshake()
        target = self.route.target_provider
        providers = (target, *(p for p in self.route.allowed_providers if p != target))
        load = LoadMessage(
            manifest_path=self._worker_path(self.bundle.manifest_path),
            expected_identity=self.bundle.identity,
            providers=providers,
            allowed_providers=tuple(self.route.allowed_providers),
            target_provider=target,
            max_io_bytes=self.route.max_io_bytes,
            min_fraction_on_target=self.route.min_fraction_on_target,
            shm_prefix=self._shm_prefix,
            intra_op_threads=0 if self.threads is None else self.threads.intra_op_threads,
            allow_spinning=True if self.threads is None else self.threads.allow_spinning,
            binary_headers=BINARY_FEATURE in self.peer_features,
            spin_wait_us=0 if self.threads is None else self.threads.spin_wait_us,
            device=self.spec.load_device(),
            provider_options=self.route.provider_options,
            ep_library=self.route.ep_library,
        )
        # Calls go out with binary headers to a worker that offered them.
        channel.binary_headers = BINARY_FEATURE in self.peer_features
        channel.send_message(load, owner=self.name, generation=self.generation)
        assert self._load_future is not None
        try:
            message = await asyncio.wait_for(self._load_future, self.timeouts.load_s)
        except TimeoutError:
            raise ExecutionError(
                f"{self.name}: the worker did not finish loading within {self.timeouts.load_s} s"
            ) from None
        assert isinstance(message, ReadyMessage)
        report = PlacementReport(
            counts=dict(message.placement),
            total_nodes=message.total_nodes,
            method=message.placement_method,
            target_provider=target,
        )
        self._placement = report
        gate_placement(
            report,
            allowed_providers=self.route.allowed_providers,
            target_provider=target,
            min_fraction_on_target=self.route.min_fraction_on_target,
            stage=self.name,
        )
        self._inputs = message.inputs
        self._outputs = message.outputs
        if message.max_input_bytes > ARENA_THRESHOLD:
            # Inputs go to this arena, mapped and touched once; room for two calls' inputs.
            sizes = [spec_bytes(spec) for spec in self._inputs]
            scale = max(1.0, message.max_input_bytes / max(1, sum(sizes)))
            try:
                channel.open_arena(self.name, arena_size_for([int(n * scale) for n in sizes]))
            except ShmError as exc:
                log.warning("%s: inputs go through single segments: %s", self.name, exc)
        self._ready = message
        return self.record()

    def record(self) -> StageRecord:
        """This stage's entry of ``execution_plan`` (labelled B: backend execution)."""
        ready = self._ready
        detail = GraphStageDetail(
            spec=self.spec,
            worker=self._worker_record(self._launch_spec),
            reservation=self._reservation_record(),
            placement=self._placement,
            inputs=self._inputs,
            outputs=self._outputs,
            load_s=None if ready is None else ready.load_s,
            warmup_s=None if ready is None else ready.warmup_s,
            worker_rss_bytes=None if ready is None else ready.rss_bytes,
            applied_intra_op_threads=None if ready is None else ready.intra_op_threads,
            applied_allow_spinning=None if ready is None else ready.allow_spinning,
            arenas=self._arena_record(),
            usable=self.usable,
            failure=None if self._failure is None else str(self._failure),
            applied_device=None if ready is None else ready.device,
        )
        return StageRecord(stage=self.name, backend=BACKEND_NAME, detail=detail)

    def _arena_record(self) -> ArenaRecord | None:
        ready, channel = self._ready, self._channel
        if ready is None or channel is None:
            return None
        inputs = channel.arena(self.name)
        return ArenaRecord(
            inputs_bytes=0 if inputs is None else inputs.size, outputs_bytes=ready.arena_bytes
        )

    # -- frames from the worker ----------------------------------------------------------

    def _on_frame_loop(self, frame: Frame) -> None:
        """On the loop (POSIX): decode, read the result's buffers in place, dispatch."""
        channel = self._channel
        assert channel is not None
        try:
            message = decode_message(frame, WORKER_TO_CONTROLLER)
            arrays: dict[str, np.ndarray] = {}
            acks: list[tuple[str, int]] = []
            if isinstance(message, ResultMessage):
                arrays, acks = channel.arrays_from_frame(frame, message.output_names, copy=False)
        except (ValueError, ExecutionError) as exc:
            self._refuse_frame(frame, exc)
            return
        self._on_message(message, arrays, frame, acks)

    def _refuse_frame(self, frame: Frame, exc: ValueError | ExecutionError) -> None:
        channel = self._channel
        acks = frame_acks(frame)
        if acks and channel is not None:
            try:
                channel.send_acks(acks, from_loop=channel.loop_reading)
            except ExecutionError:
                pass
        self._fail(self._frame_error(exc))

    def _frame_error(self, exc: ValueError | ExecutionError) -> ExecutionError:
        """What a frame that could not be read makes of the worker: a protocol error."""
        if isinstance(exc, ExecutionError):
            return exc
        return ProtocolError(str(exc), code=getattr(exc, "code", "bad_message"), channel=self.name)

    def _on_frame_thread(self, frame: Frame) -> None:
        """Reader thread: decode, copy buffers out and acknowledge them, then hop to the loop."""
        channel = self._channel
        assert channel is not None
        assert self._loop is not None
        try:
            message = decode_message(frame, WORKER_TO_CONTROLLER)
            arrays: dict[str, np.ndarray] = {}
            if isinstance(message, ResultMessage):
                arrays, acks = channel.arrays_from_frame(frame, message.output_names)
                channel.send_acks(acks)
        except (ValueError, ExecutionError) as exc:
            acks = frame_acks(frame)
            if acks:
                try:
                    channel.send_acks(acks)
                except ExecutionError:
                    pass
            self._loop.call_soon_threadsafe(self._fail, self._frame_error(exc))
            return
        self._loop.call_soon_threadsafe(self._on_message, message, arrays, frame, [])

    def _on_message(
        self,
        message: Message,
        arrays: dict[str, np.ndarray],
        frame: Frame,
        acks: list[tuple[str, int]],
    ) -> None:
        if isinstance(message, ReadyMessage):
            self._on_ready(message)
            return
        if isinstance(message, ResultMessage):
            entry = self._pending.get(message.call_id)
            if entry is None:
                log.info("%s: dropped a stale result of call %d", self.name, message.call_id)
                self._send_acks(acks)
                return
            if entry[0].epoch != message.epoch:
                # Call ids are never reused and fencing drops the pending call, so only a
                # broken worker mislabels one; dropping it would leave the call waiting forever.
                self._fail(
                    ProtocolError(
                        f"the result of call {message.call_id} carries epoch {message.epoch}; "
                        f"the call was sent with epoch {entry[0].epoch}",
                        code="wrong_epoch",
                        channel=self.name,
                    )
                )
                return
            del self._pending[message.call_id]
            self._deliver(entry[1], message, arrays, acks)
            return
        if isinstance(message, ErrorMessage):
            self._on_error(message)
            return
        if isinstance(message, ByeMessage):
            self._on_bye()
            return
        if isinstance(message, AckMessage):
            self._release(message)

    def _release(self, ack: AckMessage) -> None:
        """Free the buffer ``ack`` names (a stale or unknown one is ignored)."""
        assert self._channel is not None
        if not self._channel.acknowledge(ack.owner, ack.generation):
            log.debug(
                "%s: ignored a stale acknowledgement %s/%s", self.name, ack.owner, ack.generation
            )

    def _send_acks(self, acks: list[tuple[str, int]]) -> None:
        """Tell the worker its result buffers are free (nothing to do once it is gone)."""
        channel = self._channel
        if not acks or channel is None or self._failure is not None:
            return
        try:
            channel.send_acks(acks, from_loop=channel.loop_reading)
        except ExecutionError as exc:
            log.debug("%s: acknowledgements not sent: %s", self.name, exc)

    def _on_error(self, message: ErrorMessage) -> None:
        if message.call_id is None or message.fatal:
            error = worker_error(
                self.name,
                message.code,
                message.message,
                cpu_allowed="CPUExecutionProvider" in self.route.allowed_providers,
            )
            self._on_worker_error(error, fatal=message.fatal)
            return
        entry = self._pending.pop(message.call_id, None)
        if entry is None:
            return
        _, future = entry
        if future.done():
            return
        if message.code == "cancelled":
            future.set_exception(RequestCancelled(f"{self.name}: call cancelled"))
        else:
            future.set_exception(ModelError(f"{self.name}: {message.code}: {message.message}"))

    def _log_failure(self, error: OmniError) -> None:
        log.warning("%s: %s", self.name, error)

    def _fail_waiting(self, error: OmniError) -> None:
        self._kept.forget()
        for _, future in list(self._pending.values()):
            if not future.done():
                future.set_exception(error)
        self._pending.clear()

    # -- calls -----------------------------------------------------------------------

    async def call(
        self,
        key: RequestKey,
        inputs: Mapping[str, np.ndarray],
        *,
        on_sent: Callable[[], None] | None = None,
        retain: Collection[str] = (),
    ) -> CallResult:
        """One call. The inputs are copied once, into this stage's arena (or inline into the
        frame) before the call goes out; ``on_sent`` runs right after that, so a caller may
        let go of the arrays it passed. The result's arrays are read-only views over the
        worker's buffers, valid until :meth:`acknowledge` (or :meth:`cancel`) frees the slot.

        Inputs named in ``retain`` keep their arena slot after the call: a later call of the
        same request that passes the very same array object (unchanged: it is not compared
        by value) sends that slot again instead of copying it. The slot is freed when the
        request ends or is cancelled (:meth:`cancel`), when a call passes another array under
        that name, or when another request calls this stage.
        """
        assert self._loop is not None
        if self._borrowed is not None and self._borrowed.lent:
            await self._borrowed.take_back(self.timeouts.shutdown_s)
        future: asyncio.Future[Any] = self._loop.create_future()
        assert self._channel is not None
        sent = self._send_call(
            key, inputs, future, from_loop=self._channel.loop_reading, retain=retain
        )
        try:
            if on_sent is not None:
                on_sent()
            result, arrays = await future
        except BaseException:
            self._call_failed(key)
            raise
        return self._call_result(key, sent, result, arrays)

    @property
    def direct_calls(self) -> bool:
        """Whether :meth:`call_direct` may be used: the loop reads this stage's results."""
        channel = self._channel
        return channel is not None and channel.loop_reading

    def call_direct(
        self,
        key: RequestKey,
        inputs: Mapping[str, np.ndarray],
        *,
        on_sent: Callable[[], None] | None = None,
        retain: Collection[str] = (),
    ) -> CallResult:
        """:meth:`call` from a thread other than the loop's, blocking it until the result.

        The call frame is written from the calling thread, and the loop lends it the pipe
        (:mod:`runtime.backends.borrowed`): the thread reads its result itself, with no loop
        task and no hop between threads. Cancelling the request (from any thread) fails the
        wait with RequestCancelled, as for :meth:`call`; so does the worker's death with its
        error."""
        future: cf.Future[Any] = cf.Future()
        borrowed = self._borrowed_reader()
        with borrowed.lock:
            # The pipe is lent before the call goes out: its result is this thread's to read.
            lent = borrowed.borrow()
            sent = self._send_call(key, inputs, future, from_loop=False, retain=retain)
            borrowed.awake.sent()
            try:
                if on_sent is not None:
                    on_sent()
                if lent:
                    borrowed.wait(future)
                    borrowed.awake.arrived()
                result, arrays = future.result()
            except OmniError:
                self._call_failed(key)
                raise
            finally:
                borrowed.called()
        # Anything else (KeyboardInterrupt) leaves the call running: the caller cancels the
        # request, which fences the call and retires the worker as for any active call.
        return self._call_result(key, sent, result, arrays)

    def _borrowed_reader(self) -> BorrowedReader:
        reader = self._borrowed
        if reader is None:
            assert self._channel is not None
            assert self._loop is not None
            reader = self._borrowed = BorrowedReader(
                self._channel,
                self._loop,
                take=self._take_result,
                on_frame=self._on_frame_loop,
                usable=lambda: self.usable and not self._closed,
                spin_wait_s=0.0 if self.threads is None else self.threads.spin_wait_us * 1e-6,
                take_whole=self._take_answer,
                learn=self._learn_answer,
            )
        return reader

    def _learn_answer(self, data: memoryview, frames: list[Frame]) -> None:
        """On a thread the pipe is lent to: learn the layout of the worker's answers from one
        read the usual way (:mod:`runtime.transport.answers`), when none is known or the one
        known stopped matching. A stage whose answers have no such layout (inline results)
        stops trying after a few reads, then tries once in every :data:`RELEARN_EVERY`."""
        if not frames or frames[-1].kind != "result":
            return
        if self._answers is not None and not self._answers_missed:
            return
        self._answer_reads += 1
        if self._answer_failures >= LEARN_TRIES and self._answer_reads % RELEARN_EVERY:
            return
        layout = AnswerLayout.learn(data, frames)
        if layout is None:
            self._answer_failures += 1
            return
        self._answers, self._answers_missed, self._answer_failures = layout, False, 0

    def _take_answer(self, data: memoryview) -> bool:
        """On a thread the pipe is lent to: a whole answer of the known layout to a direct
        call waiting for it, taken without the decoder (True); anything else (another layout,
        another call's result, bytes that are not whole frames) is read the usual way."""
        layout = self._answers
        if layout is None:
            return False
        answer = layout.match(data)
        if answer is None:
            self._answers_missed = True
            return False
        entry = self._pending.get(answer.call_id)
        if entry is None or entry[0].epoch != answer.epoch or isinstance(entry[1], asyncio.Future):
            return False
        key, future = entry
        channel = self._channel
        assert channel is not None
        if answer.request_id != key.request_id.encode("utf-8"):
            return False

        def read(buffers: tuple[BufferDescriptor, ...]) -> dict[str, np.ndarray]:
            frame = Frame("result", {}, buffers, (None,) * len(buffers))
            return channel.arrays_from_frame(frame, layout.output_names, copy=False)[0]

        try:
            arrays = layout.outputs(answer, read)
        except (ValueError, ExecutionError):
            # The usual way reads it again and reports what is wrong with it.
            return False
        for owner, generation in answer.acks:
            if not channel.acknowledge(owner, generation):
                log.debug("%s: ignored a stale acknowledgement %s/%s", self.name, owner, generation)
        self._pending.pop(answer.call_id, None)
        self.answers_taken += 1
        self._deliver(future, _Ran(answer.run_s, answer.copied_bytes), arrays, answer.buffer_acks)
        return True

    def _take_result(self, frame: Frame) -> bool:
        """On a thread the pipe is lent to: deliver the result of a direct call waiting for
        it, or release the input buffer an acknowledgement names (True); anything else is the
        loop's (False).

        The worker acknowledges a call's inputs in the same write as its result; taking
        those here keeps the loop asleep (waking it for each one cost a third runnable
        thread on the cores the worker's pool had just used)."""
        channel = self._channel
        assert channel is not None
        if frame.kind not in ("ack", "result"):
            return False
        try:
            message = decode_message(frame, WORKER_TO_CONTROLLER)
        except ValueError:
            return False
        if isinstance(message, AckMessage):
            self._release(message)
            return True
        if not isinstance(message, ResultMessage):
            return False
        entry = self._pending.get(message.call_id)
        if entry is None or entry[0].epoch != message.epoch or isinstance(entry[1], asyncio.Future):
            return False
        try:
            arrays, acks = channel.arrays_from_frame(frame, message.output_names, copy=False)
        except (ValueError, ExecutionError):
            return False
        self._pending.pop(message.call_id, None)
        self._deliver(entry[1], message, arrays, acks)
        return True

    def _deliver(
        self,
        future: asyncio.Future[Any] | cf.Future[Any],
        message: ResultMessage | _Ran,
        arrays: dict[str, np.ndarray],
        acks: list[tuple[str, int]],
    ) -> None:
        """A call's result, on the loop or on the thread the pipe is lent to: its buffers stay
        the slot's until it is freed, or go back at once when nobody waits for it any more."""
        if future.done():
            self._send_acks(acks)
            return
        self._result_acks = acks
        future.set_result((message, arrays))

    def _send_call(
        self,
        key: RequestKey,
        inputs: Mapping[str, np.ndarray],
        future: asyncio.Future[Any] | cf.Future[Any],
        *,
        from_loop: bool,
        retain: Collection[str] = (),
    ) -> _SentCall:
        check_usable(self.name, self._failure, running=self.usable)
        self._slot.check_free()
        assert self._channel is not None
        self._call_id += 1
        call_id = self._call_id
        calls = self._calls
        # A direct call repeating the last one goes out packed by its layout (calls.py).
        packed = not from_loop and not retain and calls.fits(inputs)
        message = None
        if not packed:
            message = CallMessage(call_id, key.request_id, key.epoch, tuple(inputs))
        self._pending[call_id] = (key, future)
        self._slot.take(key)
        channel = self._channel
        bytes_in = 0
        for array in inputs.values():
            bytes_in += int(np.asarray(array).nbytes)
        started = time.perf_counter()
        placed, pin = self._kept.slots(key, inputs, retain)
        slots: dict[str, ArenaSlot] = {}
        try:
            copied = None
            if packed and not placed and not pin:
                copied = calls.send(
                    channel,
                    inputs,
                    call_id=call_id,
                    epoch=key.epoch,
                    request_id=key.request_id,
                    slots=slots,
                )
            if copied is None:
                if message is None:
                    message = CallMessage(call_id, key.request_id, key.epoch, tuple(inputs))
                if from_loop or placed or pin or not calls.repeated(inputs):
                    copied = channel.send_message(
                        message,
                        inputs,
                        owner=self.name,
                        generation=call_id,
                        from_loop=from_loop,
                        placed=placed,
                        pin=pin,
                        slots=slots,
                    )
                else:
                    body = message.to_body()
                    prepared = channel.prepare(
                        "call", body, inputs, self.name, call_id, (), None, (), (), slots
                    )
                    channel.write_prepared(prepared)
                    copied = prepared.copied
                    calls.learn(prepared.chunks)
        except (ExecutionError, DescriptorError) as exc:
            # The call never reached the worker: nothing will answer it.
            self._pending.pop(call_id, None)
            self._slot.ended()
            if self._slot.holder == key:
                self._slot.free()
            if isinstance(exc, ChannelClosed):
                raise self._failure or self._died("stopped reading its input") from None
            if isinstance(exc, DescriptorError):
                raise ModelError(f"{self.name}: bad_input: {exc}") from exc
            raise
        self._kept.keep(key, inputs, pin, slots)
        return _SentCall(started, bytes_in, copied)

    def release_retained(self, request_id: str | None = None) -> int:
        """Free the inputs kept for ``request_id`` (every request's when None); how many."""
        return self._kept.release(request_id)

    @property
    def retained_inputs(self) -> tuple[str, ...]:
        """The names of the inputs kept in the arena now."""
        return self._kept.names

    def _call_failed(self, key: RequestKey) -> None:
        self._slot.ended()
        if self._slot.holder == key and (self._failure is not None or not self._pending):
            self._slot.free()

    def _call_result(
        self,
        key: RequestKey,
        sent: _SentCall,
        result: ResultMessage | _Ran,
        arrays: dict[str, np.ndarray],
    ) -> CallResult:
        self._slot.ended()
        bytes_out = 0
        for array in arrays.values():
            bytes_out += array.nbytes
        return CallResult(
            key=key,
            outputs=arrays,
            run_s=result.run_s,
            round_trip_s=time.perf_counter() - sent.started,
            bytes_in=sent.bytes_in,
            bytes_out=bytes_out,
            copied_bytes=sent.copied + result.copied_bytes,
        )

    def _take_result_acks(self) -> list[tuple[str, int]]:
        acks, self._result_acks = self._result_acks, []
        return acks

    def acknowledge(self, key: RequestKey) -> bool:
        """Free the slot of ``key``'s retained result; its arrays are no longer valid."""
        return self._slot.acknowledge(key)

    async def cancel(self, key: RequestKey) -> None:
        """Fence ``key``'s request; an active call is asked to stop and the worker retired."""
        await self._slot.cancel(key)

    # -- what the slot asks of this stage ------------------------------------------------

    def _free_result(self) -> None:
        self._send_acks(self._take_result_acks())

    def _drop_kept(self, request_id: str) -> None:
        self.release_retained(request_id)

    def _fence(self, key: RequestKey, call: asyncio.Future[Any] | None) -> None:
        # Each waiting call of the request fails now; the worker is asked to stop between nodes.
        for call_id, (pending_key, future) in list(self._pending.items()):
            if pending_key.request_id == key.request_id:
                del self._pending[call_id]
                if self._channel is not None:
                    try:
                        self._channel.send_message(
                            CancelMessage(call_id),
                            owner=self.name,
                            from_loop=self._channel.loop_reading,
                        )
                    except ExecutionError:
                        pass
                if not future.done():
                    future.set_exception(RequestCancelled(f"{self.name}: call cancelled"))

    async def _retire_cancelled(self) -> None:
        if self._failure is None:
            self._failure = StageRetired(
                f"{self.name}: its worker was retired after an active call was cancelled"
            )
        await self._retire(str(self._failure), self.timeouts.cancel_retire_s)

    # -- retirement ------------------------------------------------------------------

    async def _after_retire(self, outcome: RetireOutcome | None) -> None:
        # The layouts go with the channel: the arrays over the worker's arena let it go.
        self._answers, self._calls = None, CallPacker()
        if self._shm_prefix is not None:
            sweep_segments(self._shm_prefix)
        self._remove_tmpdir(outcome)
        self._settle_reservation(outcome)

    def _remove_tmpdir(self, outcome: RetireOutcome | None) -> None:
        tmpdir = self._tmpdir
        if tmpdir is None:
            return
        if outcome is not None and not outcome.confirmed_gone:
            log.warning(
                "%s: kept %s, which a surviving worker process may still use", self.name, tmpdir
            )
            return
        self._tmpdir = None
        shutil.rmtree(tmpdir, ignore_errors=True)

    def _settle_reservation(self, outcome: RetireOutcome | None) -> None:
        tmpdir, prefix = self._tmpdir, self._shm_prefix

        def cleanup() -> None:
            if prefix is not None:
                sweep_segments(prefix)
            if tmpdir is not None:
                shutil.rmtree(tmpdir, ignore_errors=True)

        self._settle(
            None if outcome is None else outcome.quarantine_reason,
            () if outcome is None else outcome.survivor_identities,
            cleanup,
        )

    async def close(self) -> None:
        """As for any worker; the loop takes the pipe back first (the bye arrives on it)."""
        borrowed = self._borrowed
        if borrowed is not None:
            await borrowed.take_back(self.timeouts.shutdown_s)
        try:
            await super().close()
        finally:
            if borrowed is not None:
                borrowed.close()

    def _close_waiting(self) -> None:
        self.release_retained()
        for _, future in list(self._pending.values()):
            if not future.done():
                future.set_exception(StageRetired(f"{self.name} was closed"))
        self._pending.clear()
        self._slot.close()


def _temp_variables(tmpdir: Path, os_domain: str) -> dict[str, str]:
    """The variables that point a worker's temporary files at ``tmpdir``, its own folder."""
    variables = {"TMPDIR": str(tmpdir), PRIVATE_TMPDIR_VARIABLE: str(tmpdir)}
    if os_domain == "windows":
        variables.update({"TEMP": str(tmpdir), "TMP": str(tmpdir)})
    return variables


def spec_bytes(spec: TensorSpec) -> int:
    """The bytes of a tensor of fixed shape (unknown dimensions count as 1)."""
    count = 1
    for dim in spec.shape:
        count *= max(1, dim) if isinstance(dim, int) else 1
    return count * spec.dtype.itemsize
