"""The ONNX Runtime graph worker process: verify -> load -> warm up -> report placement -> serve.

Run as ``python -m workers.ort_worker`` or ``python workers/ort_worker.py``. The worker
speaks the graph-worker protocol (:mod:`runtime.contracts.messages`) on its stdin/stdout
through a :class:`~runtime.transport.channel.FramedChannel`; everything else it prints goes
to stderr. Its generation comes from ``OMNI_EDGE_WORKER_GENERATION``.

1. ``hello`` announces the protocol, features, pid and generation.
2. ``load`` re-verifies the bundle on the bytes it loads, creates the session on the route's
   providers, warms up with the example inputs and answers ``ready`` with the real placement
   split; any failure is a fatal ``error`` and the process exits.
3. ``call`` runs one call at a time on the fixed bucket; ``cancel`` terminates a running call
   between nodes (answered by a non-fatal ``error`` with code ``cancelled``); ``ack`` releases
   a result buffer; ``shutdown`` cancels what runs, answers ``bye`` and exits.

The placement gate itself runs in the controller, which sees the split in ``ready``.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Final

if __package__ in (None, ""):
    # Run by path: put the project root (holding `runtime` and `workers`) first on the path,
    # in place of this folder, whose module names must not shadow top-level ones.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import numpy as np
import onnxruntime as ort

from runtime.contracts.buffers import DescriptorError
from runtime.contracts.codec import Frame, FrameDecoder, FrameError, encode_frame_parts
from runtime.contracts.messages import (
    CONTROLLER_TO_WORKER,
    AckMessage,
    ByeMessage,
    CallMessage,
    CancelMessage,
    ErrorMessage,
    LoadMessage,
    MessageError,
    ReadyMessage,
    ResultMessage,
    ShutdownMessage,
    decode_message,
)
from runtime.contracts.process import (
    EXIT_LOAD_FAILED,
    EXIT_OK,
    EXIT_PROTOCOL,
    EXIT_USAGE,
    GENERATION_VARIABLE,
    GRAPH_TMPDIR_PREFIX,
    PRIVATE_TMPDIR_VARIABLE,
)
from runtime.transport import numpy_dtype
from runtime.transport.answers import AnswerLayout, pack_run_s, prepare_answer, send_answer
from runtime.transport.arena import arena_size_for
from runtime.transport.awake import AwakeWait
from runtime.transport.calls import Call, CallLayout
from runtime.transport.channel import (
    ARENA_THRESHOLD,
    ChannelClosed,
    FramedChannel,
    ProtocolError,
    frame_acks,
)
from runtime.transport.handshake import process_rss_bytes, send_hello
from runtime.transport.shm import ShmError, sweep_segments
from runtime.transport.stdio import claim_worker_stdio
from workers.errors import WorkerError
from workers.ort_session import (
    ORT_ERRORS,
    Bucket,
    check_call_inputs,
    open_graph,
    spec_nbytes,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from runtime.contracts.messages import Message
    from runtime.transport.arena import ArenaSlot, ShmArena
    from runtime.transport.frame_io import PreparedFrame

WORKER_NAME: Final = "ort"
#: The run option naming a captured device graph (ONNX Runtime's ``gpu_graph_id``).
GRAPH_ID_ENTRY: Final = "gpu_graph_id"
#: How often the watcher looks for a cancel while calls come (the cancel latency it adds).
WATCH_INTERVAL_S: Final = 0.005
#: How long without a call before the watcher parks until the next one.
PARK_AFTER_S: Final = 1.0
#: Answers the worker tries to learn a layout from before it stops trying.
ANSWER_TRIES: Final = 3
#: Calls whose layout could not be learned before a worker tries only one in
#: :data:`CALL_RELEARN_EVERY` (calls.py).
CALL_TRIES: Final = 3
CALL_RELEARN_EVERY: Final = 64
#: The most sets of input slots whose arrays a call layout keeps (a caller uses one or two).
CALL_VIEWS: Final = 8
#: The most arrays over output slots a worker keeps (one or two per output, in practice).
OUTPUT_VIEWS: Final = 32


def _generation() -> int:
    raw = os.environ.get(GENERATION_VARIABLE, "")
    if not raw.isdigit():
        raise ValueError(
            f"{GENERATION_VARIABLE}={raw!r}; accepted: the non-negative integer generation the "
            "controller assigned"
        )
    return int(raw)


class GraphWorker:
    """One loaded graph served over one channel; the channel belongs to the caller of :func:`run`.

    The thread that reads a call runs it (:meth:`serve`); while it runs, a watcher thread reads
    what else arrives (cancel, acknowledgements, shutdown) and sets ONNX Runtime's
    ``RunOptions.terminate`` for a cancel. Inputs are read in place from the controller's
    arena; outputs of a fixed bucket are written by ONNX Runtime straight into this worker's
    arena (I/O binding), other outputs are copied there once.
    """

    def __init__(self, channel: FramedChannel, generation: int) -> None:
        self._channel = channel
        self._owner = f"ort-{generation}"
        self._session: ort.InferenceSession | None = None
        self._arena: ShmArena | None = None
        self._outputs_follow_inputs = False
        self._buckets: tuple[Bucket, ...] = ()
        self._max_io_bytes = 0
        self._output_names: tuple[str, ...] = ()
        self._session_output_names: list[str] = []
        self._lock = threading.Lock()
        self._running: CallMessage | None = None
        self._options: ort.RunOptions | None = None
        self._cancelled = False
        self._wake = threading.Event()
        self._parked = False
        self._last_call_end = 0.0
        self._stopping = False
        self._shutdown_requested = False
        self._pending: deque[Frame | ProtocolError] = deque()
        self._watcher: threading.Thread | None = None
        self._awake = AwakeWait(None, 0.0)
        #: The layout of this worker's answers, learned from one it sent (answers.py).
        self._answers: AnswerLayout | None = None
        self._answer_tries = 0
        #: The I/O binding of the last call over arena memory, with where its inputs and
        #: outputs lie (and their dtypes and shapes): back-to-back calls reuse their slots,
        #: and so the binding.
        self._binding: tuple[tuple[object, ...], ort.IOBinding] | None = None
        #: The layout of the controller's calls, learned from one it sent (calls.py), and
        #: per set of input offsets the arrays over them and where they lie.
        self._calls: CallLayout | None = None
        self._call_layout_signature: tuple[object, ...] | None = None
        self._call_bucket: Bucket | None = None
        self._call_failures = 0
        self._call_count = 0
        self._call_signature: tuple[object, ...] | None = None
        self._call_views: dict[
            tuple[int, ...], tuple[dict[str, np.ndarray], tuple[object, ...] | None]
        ] = {}
        #: How the last bucket's outputs are placed (name, bytes, dtype, shape), and the
        #: array over each output slot used (by offset, dtype and shape).
        self._plan_bucket: Bucket | None = None
        self._output_plan: tuple[tuple[str, int, np.dtype, tuple[int, ...]], ...] = ()
        self._output_views: dict[tuple[int, np.dtype, tuple[int, ...]], np.ndarray] = {}
        #: Calls read by their layout, not decoded.
        self.calls_by_layout = 0
        #: Run options of the last run, reused while no run was cancelled.
        self._spare_options: ort.RunOptions | None = None

    # Loading.

    def load(self, message: LoadMessage) -> ReadyMessage:
        """Verify, create the session, warm up and measure placement; WorkerError on failure."""
        opened = open_graph(
            message.manifest_path,
            message.expected_identity,
            message.providers,
            message.allowed_providers,
            message.target_provider,
            max_io_bytes=message.max_io_bytes,
            intra_op_threads=message.intra_op_threads,
            allow_spinning=message.allow_spinning,
            device=message.device,
            provider_options=message.provider_options,
            ep_library=message.ep_library,
        )
        session, buckets, placement = opened.session, opened.buckets, opened.placement
        self._awake = AwakeWait(self._channel.read_fd, message.spin_wait_us * 1e-6)
        bucket = buckets[0]
        self._session = session
        self._outputs_follow_inputs = outputs_follow_inputs(session)
        self._session_output_names = [value.name for value in session.get_outputs()]
        self._buckets = buckets
        self._max_io_bytes = message.max_io_bytes
        self._output_names = tuple(spec.name for spec in bucket.outputs)
        # Room for the retained result plus the next call's outputs, in the largest bucket.
        sizes = [spec_nbytes(spec) for spec in max(buckets, key=_output_bytes).outputs]
        if any(size > ARENA_THRESHOLD for size in sizes):
            try:
                self._arena = self._channel.open_arena(self._owner, arena_size_for(sizes))
            except ShmError as exc:
                # Results then travel in single segments, as before arenas.
                print(f"ort worker: no output arena: {exc}", file=sys.stderr)
        return ReadyMessage(
            placement=dict(placement.counts),
            total_nodes=placement.total,
            placement_method=placement.method,
            inputs=bucket.inputs,
            outputs=bucket.outputs,
            load_s=opened.load_s,
            warmup_s=opened.warmup_s,
            rss_bytes=process_rss_bytes(),
            intra_op_threads=message.intra_op_threads,
            allow_spinning=message.allow_spinning,
            arena_bytes=0 if self._arena is None else self._arena.size,
            max_input_bytes=max(one.input_nbytes for one in buckets),
            arena_name=None if self._arena is None else self._arena.name,
            device=opened.device,
        )

    # Serving.

    def serve(self) -> int:
        """Answer messages until ``shutdown`` or the controller closes the stream."""
        self._watcher = threading.Thread(target=self._watch, name="ort-watch", daemon=True)
        self._watcher.start()
        while True:
            if not self._pending and not self._channel.has_frames:
                self._awake.wait()
            try:
                item = self._channel.read_frame(pending=self._pending, whole=self._match_call)
            except ChannelClosed:
                return EXIT_OK
            if isinstance(item, ProtocolError):
                raise item
            if isinstance(item, Call):
                self._awake.arrived()
                self._call_packed(item)
                if self._shutdown_requested:
                    return self._bye()
                continue
            message = self._decode(item)
            if isinstance(message, CallMessage):
                self._awake.arrived()
                self._call(message, item)
                if self._shutdown_requested:
                    return self._bye()
            elif isinstance(message, CancelMessage):
                self._send_error(
                    message.call_id, "cancelled", f"call {message.call_id} is not running"
                )
            elif isinstance(message, AckMessage):
                self._channel.acknowledge(message.owner, message.generation)
            elif isinstance(message, ShutdownMessage):
                return self._bye()
            else:
                self._send_error(None, "unexpected_message", f"{message.KIND} after load")

    def _decode(self, frame: Frame) -> Message:
        try:
            return decode_message(frame, CONTROLLER_TO_WORKER)
        except MessageError as exc:
            raise ProtocolError(
                str(exc).removeprefix(f"{exc.code}: "), code=exc.code, channel=self._channel.name
            ) from exc

    def _bye(self) -> int:
        self.close()
        self._channel.send_message(ByeMessage())
        return EXIT_OK

    def _watch(self) -> None:
        """While calls run: read and act on what arrives; hand anything else to serve().

        The watcher looks every :data:`WATCH_INTERVAL_S` while calls come, so a call
        shorter than that never wakes it; after :data:`PARK_AFTER_S` without a call it
        parks until the next one starts."""
        channel = self._channel
        while not self._is_stopping():
            if self._running is None:
                if time.monotonic() - self._last_call_end > PARK_AFTER_S:
                    self._parked = True
                    if self._running is None:
                        self._wake.wait(PARK_AFTER_S)
                    self._wake.clear()
                    self._parked = False
                else:
                    time.sleep(WATCH_INTERVAL_S)
                continue
            if not channel.wait_readable(0):
                time.sleep(WATCH_INTERVAL_S)
                continue
            frame: Frame | None
            try:
                frame = channel.try_read_frame(lambda: self._running is not None)
            except ChannelClosed:
                self.cancel_running()
                return
            except ProtocolError as error:
                self._pending.append(error)
                self.cancel_running()
                return
            if frame is None:
                # serve() reads now, or the call just ended.
                time.sleep(WATCH_INTERVAL_S)
                continue
            try:
                message = self._decode(frame)
            except ProtocolError as error:
                self._pending.append(error)
                self.cancel_running()
                return
            if isinstance(message, CancelMessage):
                with self._lock:
                    running = self._running
                if running is not None and running.call_id == message.call_id:
                    self.cancel_running()
                else:
                    self._send_error(
                        message.call_id, "cancelled", f"call {message.call_id} is not running"
                    )
            elif isinstance(message, AckMessage):
                channel.acknowledge(message.owner, message.generation)
            elif isinstance(message, ShutdownMessage):
                self._shutdown_requested = True
                self.cancel_running()
            elif isinstance(message, CallMessage) and self._running is not None:
                # One call at a time: refuse this one now, and free its input buffers.
                self._send_error(
                    message.call_id,
                    "busy",
                    f"call {self._running.call_id} is running; accepted: one call at a time",
                    acks=frame_acks(frame),
                )
            else:
                self._pending.append(frame)

    def _is_stopping(self) -> bool:
        return self._stopping

    def cancel_running(self) -> bool:
        """Terminate the running call between nodes; False when none runs."""
        with self._lock:
            if self._running is None or self._options is None:
                return False
            self._cancelled = True
            self._options.terminate = True
            return True

    def _call(self, message: CallMessage, frame: Frame) -> None:
        try:
            arrays, acks = self._channel.arrays_from_frame(frame, message.input_names, copy=False)
        except ProtocolError:
            self._channel.send_acks(frame_acks(frame))
            raise
        copied = sum(
            int(array.nbytes)
            for array, descriptor in zip(arrays.values(), frame.buffers, strict=True)
            if not descriptor.inline and not descriptor.in_arena
        )
        self._learn_call(message, frame)
        self._run_call(message, arrays, acks, copied, _arena_places(message, frame))

    # Calls read by their layout (runtime/transport/calls.py).

    def _match_call(self, data: memoryview) -> Call | None:
        """Offered each read that starts at a frame boundary: a whole call of the learned
        layout, or None (the decoder reads it: another kind of frame, another layout, or a
        call written together with other frames)."""
        layout = self._calls
        return None if layout is None else layout.match(data)

    def _learn_call(self, message: CallMessage, frame: Frame) -> None:
        """Learn the layout of the controller's calls from one decoded the usual way, when
        none is known or this call's inputs (names, owners, arenas, dtypes, shapes) or request
        id length differ from the known one's and repeat the last call's (a stage whose calls
        change every time is not worth it); a stage whose calls have no such layout is tried
        one call in :data:`CALL_RELEARN_EVERY`."""
        signature = (
            message.input_names,
            len(message.request_id.encode("utf-8")),
            *((d.owner, d.location, d.dtype, d.shape) for d in frame.buffers),
        )
        repeated, self._call_signature = signature == self._call_signature, signature
        self._call_count += 1
        if (
            not repeated
            or signature == self._call_layout_signature
            or not self._channel.binary_headers
            or (self._call_failures >= CALL_TRIES and self._call_count % CALL_RELEARN_EVERY)
        ):
            return
        layout = None
        if frame.buffers and all(descriptor.in_arena for descriptor in frame.buffers):
            parts = encode_frame_parts(
                "call",
                message.to_body(),
                [(descriptor, None) for descriptor in frame.buffers],
                binary_header=True,
            )
            layout = CallLayout.learn(b"".join(bytes(part) for part in parts))
        if layout is None:
            self._call_failures += 1
            return
        self._calls, self._call_layout_signature, self._call_failures = layout, signature, 0
        self._call_views.clear()
        self._call_bucket = None

    def _call_packed(self, call: Call) -> None:
        """A call read by its layout: its inputs read in place (the arrays over each set of
        input slots made once), then run as any other."""
        layout = call.layout
        message = CallMessage(call.call_id, call.request_id, call.epoch, layout.input_names)
        acks = call.acks
        found = self._call_views.get(call.offsets)
        if found is None:
            buffers = call.buffers
            frame = Frame("call", {}, buffers, (None,) * len(buffers))
            try:
                arrays, _ = self._channel.arrays_from_frame(frame, layout.input_names, copy=False)
            except ProtocolError:
                self._channel.send_acks(acks)
                raise
            if len(self._call_views) >= CALL_VIEWS:
                self._call_views.clear()
            found = self._call_views[call.offsets] = (arrays, _arena_places(message, frame))
        arrays, places = found
        self.calls_by_layout += 1
        # Every call of the layout has the same inputs' dtypes and shapes: one bucket.
        bucket = self._call_bucket
        if bucket is None:
            bucket = self._call_bucket = self._checked_bucket(message, arrays, acks)
            if bucket is None:
                return
        self._run_call(message, dict(arrays), acks, 0, places, bucket)

    def _checked_bucket(
        self, message: CallMessage, arrays: dict[str, np.ndarray], acks: list[tuple[str, int]]
    ) -> Bucket | None:
        """The bucket the call's inputs fit, or None once the call was refused (answered)."""
        try:
            return check_call_inputs(arrays, self._buckets, self._max_io_bytes)
        except WorkerError as refused:
            self._send_error(message.call_id, refused.code, refused.message, acks=acks)
            return None

    def _run_call(
        self,
        message: CallMessage,
        arrays: dict[str, np.ndarray],
        acks: list[tuple[str, int]],
        copied: int,
        places: tuple[object, ...] | None,
        bucket: Bucket | None = None,
    ) -> None:
        """Run a call whose inputs are read (``bucket``: the one already checked) and answer it."""
        assert self._session is not None
        if bucket is None:
            bucket = self._checked_bucket(message, arrays, acks)
            if bucket is None:
                return
        placed = self._place_outputs(bucket)
        options, self._spare_options = self._spare_options, None
        if options is None:
            options = ort.RunOptions()
            # A failed or cancelled call is reported as a value; ORT need not log it too.
            options.log_severity_level = 4
            # ONNX Runtime's Python side looks this entry up on every run_with_iobinding, and
            # a missing entry costs it a raised and caught exception (about 40 us here); "0"
            # is the value it assumes when the entry is missing.
            options.add_run_config_entry(GRAPH_ID_ENTRY, "0")
        # Outputs placed in the arena are known before the run, and so is their answer but
        # for the run's time: packed by the layout of an earlier one now, or else encoded now;
        # once the run ends the worker only writes the time into it and sends it.
        packed = self._pack_answer(message, placed, copied, acks)
        prepared = (
            None if packed is not None else self._prepare_result(message, placed, copied, acks)
        )
        with self._lock:
            self._running = message
            self._options = options
            self._cancelled = False
        if self._parked:
            self._wake.set()
        started = time.perf_counter()
        outputs: dict[str, np.ndarray] | None = None
        failure: str | None = None
        try:
            outputs = self._run(arrays, placed, options, places)
        except ORT_ERRORS as exc:
            failure = f"ONNX Runtime failed the call: {exc}"
        finally:
            elapsed = time.perf_counter() - started
            self._last_call_end = time.monotonic()
            with self._lock:
                self._running = None
                self._options = None
                cancelled = self._cancelled
            if not cancelled:
                # Never told to terminate (a cancel sets both under the lock): the next run
                # may use the same options.
                self._spare_options = options
        # The inputs were read in place: the controller may reuse their slots now.
        del arrays
        if outputs is None:
            if prepared is not None:
                # Releases the placed outputs' slots with it.
                prepared.withdraw()
            else:
                self._release_placed(placed)
            if cancelled:
                code, text = "cancelled", "the call was cancelled while it ran"
            else:
                code, text = "model_error", failure or "the call produced no outputs"
            self._send_error(message.call_id, code, text, acks=acks)
            return
        if packed is not None:
            data, run_s_at = packed
            try:
                pack_run_s(data, run_s_at, elapsed)
            except ValueError as exc:
                self._release_placed(placed)
                self._send_error(
                    message.call_id, "result_failed", f"the result cannot be sent: {exc}", acks=acks
                )
                return
            self._awake.sent()
            self._channel.write_frames(data)
            return
        if prepared is not None:
            self._awake.sent()
            try:
                send_answer(self._channel, prepared, run_s=elapsed)
            except ValueError as exc:
                self._send_error(
                    message.call_id, "result_failed", f"the result cannot be sent: {exc}", acks=acks
                )
                return
            self._learn_answers(prepared)
            return
        if placed is None and self._arena is not None:
            # Outputs ONNX Runtime allocated itself are copied once, into the arena.
            copied += sum(
                int(outputs[name].nbytes)
                for name in self._output_names
                if outputs[name].nbytes > ARENA_THRESHOLD
            )
        result = ResultMessage(
            message.call_id,
            message.request_id,
            message.epoch,
            self._output_names,
            elapsed,
            copied,
        )
        try:
            self._awake.sent()
            self._channel.send_message(
                result,
                {name: outputs[name] for name in self._output_names},
                owner=self._owner,
                generation=message.call_id,
                placed=None if placed is None else {n: slot for n, (slot, _) in placed.items()},
                acks=acks,
            )
        except (ProtocolError, ShmError, DescriptorError) as exc:
            self._release_placed(placed)
            self._send_error(
                message.call_id, "result_failed", f"the result cannot be sent: {exc}", acks=acks
            )

    def _answer_fits(
        self,
        message: CallMessage,
        placed: dict[str, tuple[ArenaSlot, np.ndarray]] | None,
        acks: list[tuple[str, int]],
    ) -> bool:
        """Whether this call's answer has the layout learned from an earlier one: the same
        acknowledgements' owners, request id length and outputs (dtype, shape) in place."""
        layout = self._answers
        if layout is None or placed is None or tuple(placed) != layout.output_names:
            return False
        if tuple(owner for owner, _ in acks) != layout.ack_owners:
            return False
        if len(message.request_id.encode("utf-8")) != layout.request_id_size:
            return False
        return all(
            view.shape == shape and view.dtype == numpy_dtype(dtype)
            for (_, view), (dtype, shape) in zip(placed.values(), layout.buffer_specs, strict=True)
        )

    def _pack_answer(
        self,
        message: CallMessage,
        placed: dict[str, tuple[ArenaSlot, np.ndarray]] | None,
        copied: int,
        acks: list[tuple[str, int]],
    ) -> tuple[bytearray, int] | None:
        """This call's answer packed by the learned layout before the run (its run time
        zero, to be written at the offset returned), or None: no layout, or one this call's
        answer does not take."""
        layout = self._answers
        if layout is None or placed is None or not self._answer_fits(message, placed, acks):
            return None
        slots = [slot for slot, _ in placed.values()]
        try:
            data = layout.pack(
                [generation for _, generation in acks],
                message.call_id,
                message.epoch,
                0.0,
                copied,
                message.request_id.encode("utf-8"),
                [slot.generation for slot in slots],
                [slot.offset for slot in slots],
            )
        except ValueError:
            return None
        return bytearray(data), layout.run_s_at

    def _learn_answers(self, prepared: PreparedFrame) -> None:
        """Learn the layout of the answer just sent (a few tries: a stage whose answers have
        none stops trying)."""
        if self._answers is not None or self._answer_tries >= ANSWER_TRIES:
            return
        self._answer_tries += 1
        data = b"".join(bytes(chunk) for chunk in prepared.chunks)
        try:
            frames = FrameDecoder(self._channel.limits).feed(data)
        except FrameError:
            return
        self._answers = AnswerLayout.learn(data, frames)

    def _prepare_result(
        self,
        message: CallMessage,
        placed: dict[str, tuple[ArenaSlot, np.ndarray]] | None,
        copied: int,
        acks: list[tuple[str, int]],
    ) -> PreparedFrame | None:
        """The result of a call whose outputs are all placed, encoded before the run (with
        the input acknowledgements ahead of it); None where it is sent the usual way."""
        if placed is None:
            return None
        result = ResultMessage(
            message.call_id, message.request_id, message.epoch, self._output_names, 0.0, copied
        )
        try:
            return prepare_answer(
                self._channel,
                result,
                {name: view for name, (_, view) in placed.items()},
                owner=self._owner,
                generation=message.call_id,
                placed={name: slot for name, (slot, _) in placed.items()},
                acks=acks,
            )
        except (ProtocolError, ShmError, DescriptorError, ValueError):
            # Sent the usual way after the run, which reports what is wrong.
            return None

    def _place_outputs(self, bucket: Bucket) -> dict[str, tuple[ArenaSlot, np.ndarray]] | None:
        """Arena slots for every output of ``bucket``, or None: no arena, no room now, or
        output shapes that depend on the inputs' values (known only after the run). The
        array over a slot is made once per offset, dtype and shape."""
        arena = self._arena
        if arena is None or not self._outputs_follow_inputs:
            return None
        if bucket is self._plan_bucket:
            plan = self._output_plan
        else:
            plan = tuple(
                (
                    spec.name,
                    spec_nbytes(spec),
                    np.dtype(spec.dtype.value),
                    tuple(int(dim) for dim in spec.shape if isinstance(dim, int)),
                )
                for spec in bucket.outputs
            )
            if all(nbytes <= ARENA_THRESHOLD for _, nbytes, _, _ in plan):
                # Every output travels inline in the result frame: nothing to place.
                plan = ()
            self._plan_bucket, self._output_plan = bucket, plan
        if not plan:
            return None
        views = self._output_views
        placed: dict[str, tuple[ArenaSlot, np.ndarray]] = {}
        for name, nbytes, dtype, shape in plan:
            found = arena.allocate(nbytes)
            if found is None:
                self._release_placed(placed)
                return None
            slot, raw = found
            key = (slot.offset, dtype, shape)
            view = views.get(key)
            if view is None:
                if len(views) >= OUTPUT_VIEWS:
                    views.clear()
                view = views[key] = raw.view(dtype).reshape(shape)
            placed[name] = (slot, view)
        return placed

    def _release_placed(self, placed: dict[str, tuple[ArenaSlot, np.ndarray]] | None) -> None:
        if placed and self._arena is not None:
            for slot, _ in placed.values():
                self._arena.acknowledge(slot.generation)

    def _run(
        self,
        inputs: dict[str, np.ndarray],
        placed: dict[str, tuple[ArenaSlot, np.ndarray]] | None,
        options: ort.RunOptions,
        places: tuple[object, ...] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run the call; with ``placed`` outputs, through an I/O binding kept while the call's
        memory is the last one's: ``places`` names where the inputs lie in the controller's
        arena (read from their descriptors: no array is asked for its address), and the
        output slots' offsets say where the outputs go."""
        session = self._session
        assert session is not None
        if placed is None:
            names = self._session_output_names
            results = session.run(names, inputs, options)
            return {name: np.asarray(value) for name, value in zip(names, results, strict=True)}
        outputs = tuple(
            (name, slot.offset, view.dtype.str, view.shape) for name, (slot, view) in placed.items()
        )
        bound: list[tuple[str, np.ndarray]] | None = None
        if places is None:
            bound = [(name, np.ascontiguousarray(array)) for name, array in inputs.items()]
            places = tuple(
                (name, array.ctypes.data, array.dtype.str, array.shape) for name, array in bound
            )
        key = (places, outputs)
        cached = self._binding
        if cached is not None and cached[0] == key:
            binding = cached[1]
        else:
            if bound is None:
                bound = [(name, np.ascontiguousarray(array)) for name, array in inputs.items()]
            binding = session.io_binding()
            for name, array in bound:
                binding.bind_input(
                    name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data
                )
            for name, (_, view) in placed.items():
                binding.bind_output(name, "cpu", 0, view.dtype, list(view.shape), view.ctypes.data)
            self._binding = (key, binding)
        session.run_with_iobinding(binding, options)
        return {name: view for name, (_, view) in placed.items()}

    def _send_error(
        self,
        call_id: int | None,
        code: str,
        text: str,
        *,
        fatal: bool = False,
        acks: list[tuple[str, int]] | None = None,
    ) -> None:
        self._channel.send_message(ErrorMessage(call_id, code, text, fatal), acks=acks or ())

    def close(self) -> None:
        """Cancel a running call and stop the watcher (idempotent)."""
        self._stopping = True
        self.cancel_running()
        self._wake.set()
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(1.0)
        # The arrays over the controller's arena let its mapping go.
        self._call_views.clear()
        self._calls = self._call_bucket = None
        self._output_views.clear()


def _arena_places(message: CallMessage, frame: Frame) -> tuple[object, ...] | None:
    """Where each input of the call lies when every one is in the controller's arena (its
    arena, offset, dtype and shape): the same places mean the same memory as the last call."""
    buffers = frame.buffers
    if not all(descriptor.in_arena for descriptor in buffers):
        return None
    return tuple(
        (name, d.location, d.offset, d.dtype, d.shape)
        for name, d in zip(message.input_names, buffers, strict=True)
    )


def _output_bytes(bucket: Bucket) -> int:
    return bucket.output_nbytes


def outputs_follow_inputs(session: ort.InferenceSession) -> bool:
    """Whether every output's shape is fixed by the input shapes alone (each dimension a
    number or a symbol an input declares), so a bucket's outputs can be placed before the
    run. A graph whose output sizes depend on input values (a voice's durations) cannot."""
    symbols = {dim for value in session.get_inputs() for dim in value.shape if isinstance(dim, str)}
    return all(
        isinstance(dim, int) or (isinstance(dim, str) and dim in symbols)
        for value in session.get_outputs()
        for dim in value.shape
    )


def run(channel: FramedChannel, generation: int) -> int:
    """The worker's whole life on an open channel; returns the process exit status."""
    send_hello(channel, worker=WORKER_NAME, generation=generation)
    worker = GraphWorker(channel, generation)
    try:
        try:
            first, _ = channel.read_message(CONTROLLER_TO_WORKER)
        except ChannelClosed:
            return EXIT_OK
        if isinstance(first, ShutdownMessage):
            channel.send_message(ByeMessage())
            return EXIT_OK
        if not isinstance(first, LoadMessage):
            channel.send_message(
                ErrorMessage(None, "unexpected_message", f"expected load, got {first.KIND}", True)
            )
            return EXIT_PROTOCOL
        if first.shm_prefix is not None:
            channel.enable_shm(first.shm_prefix)
        channel.binary_headers = first.binary_headers
        try:
            ready = worker.load(first)
        except WorkerError as error:
            channel.send_message(ErrorMessage(None, error.code, error.message, True))
            return EXIT_LOAD_FAILED
        channel.send_message(ready)
        return worker.serve()
    except ProtocolError as error:
        try:
            channel.send_message(ErrorMessage(None, error.code, error.detail, True))
        except ChannelClosed:
            pass
        return EXIT_PROTOCOL
    except ChannelClosed:
        return EXIT_OK
    finally:
        worker.close()


def _remove_private_tmpdir() -> None:
    """Remove the temporary directory the controller made for this worker alone, if any.

    The controller removes it too once the worker is retired; this covers a controller that
    was killed and can no longer do so. Only a folder that is both ``TMPDIR`` and named like
    the controller's private folders is removed.
    """
    private = os.environ.get(PRIVATE_TMPDIR_VARIABLE)
    if not private or private != os.environ.get("TMPDIR"):
        return
    if Path(private).name.startswith(GRAPH_TMPDIR_PREFIX):
        shutil.rmtree(private, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: claim stdio for frames, then :func:`run`."""
    del argv  # The worker takes no arguments: its instructions arrive in ``load``.
    try:
        generation = _generation()
    except ValueError as exc:
        print(f"ort worker: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # The controller owns shutdown; a terminal's Ctrl+C must not kill the worker mid-frame.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    frames_in, frames_out = claim_worker_stdio()
    channel = FramedChannel(
        frames_in, frames_out, name=f"ort-worker-{generation}", same_domain=True
    )
    try:
        return run(channel, generation)
    finally:
        prefix = channel.shm_prefix
        channel.close()
        if prefix is not None:
            # Whatever lives under this worker's prefix (the controller's input arena too)
            # goes with it, also when the controller was killed and cannot remove it.
            sweep_segments(prefix)
        _remove_private_tmpdir()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
