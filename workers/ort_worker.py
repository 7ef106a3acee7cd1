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
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Final

if __package__ in (None, ""):
    # Run by path: put the project root (holding `runtime` and `workers`) first on the path,
    # in place of this folder, whose module names must not shadow top-level ones.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import psutil

from runtime.contracts.buffers import DescriptorError
from runtime.contracts.messages import (
    CONTROLLER_TO_WORKER,
    AckMessage,
    ByeMessage,
    CallMessage,
    CancelMessage,
    ErrorMessage,
    LoadMessage,
    ReadyMessage,
    ResultMessage,
    ShutdownMessage,
)
from runtime.transport.channel import (
    ChannelClosed,
    FramedChannel,
    ProtocolError,
    claim_worker_stdio,
    frame_acks,
)
from runtime.transport.handshake import send_hello
from runtime.transport.shm import ShmError
from workers import ort_session
from workers.errors import WorkerError
from workers.ort_session import (
    Bucket,
    CallOutcome,
    CancellableRunner,
    bucket_shapes,
    check_call_inputs,
    create_session,
    load_verified_graph,
    placement_of,
    warm_up_buckets,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from runtime.contracts.codec import Frame

WORKER_NAME: Final = "ort"
#: Same value as runtime.host.launch.GENERATION_VARIABLE (not imported: the worker stays lean).
GENERATION_VARIABLE: Final = "OMNI_EDGE_WORKER_GENERATION"
#: Names this worker's private temporary directory, which it removes when it exits. Same value
#: as runtime.backends.graph.PRIVATE_TMPDIR_VARIABLE.
PRIVATE_TMPDIR_VARIABLE: Final = "OMNI_EDGE_WORKER_TMPDIR"
#: Prefix of the private temporary directories the controller makes for graph workers.
PRIVATE_TMPDIR_PREFIX: Final = "oe-graph-"
#: Folder name prefix of the temporary profile used where assignment info is unavailable.
PROFILE_PREFIX: Final = "omni-edge-ort-profile-"
EXIT_OK: Final = 0
EXIT_LOAD_FAILED: Final = 3
EXIT_PROTOCOL: Final = 4
EXIT_USAGE: Final = 2


def _generation() -> int:
    raw = os.environ.get(GENERATION_VARIABLE, "")
    if not raw.isdigit():
        raise ValueError(
            f"{GENERATION_VARIABLE}={raw!r}; accepted: the non-negative integer generation the "
            "controller assigned"
        )
    return int(raw)


class GraphWorker:
    """One loaded graph served over one channel. Owns the call runner; the channel belongs to
    the caller of :func:`run`."""

    def __init__(self, channel: FramedChannel, generation: int) -> None:
        self._channel = channel
        self._owner = f"ort-{generation}"
        self._runner: CancellableRunner | None = None
        self._buckets: tuple[Bucket, ...] = ()
        self._max_io_bytes = 0
        self._output_names: tuple[str, ...] = ()
        self._lock = threading.Lock()
        self._running: CallMessage | None = None

    # Loading.

    def load(self, message: LoadMessage) -> ReadyMessage:
        """Verify, create the session, warm up and measure placement; WorkerError on failure."""
        started = time.perf_counter()
        graph = load_verified_graph(message.manifest_path, message.expected_identity)
        shapes = bucket_shapes(graph.manifest, graph.example_inputs)
        with ExitStack() as stack:
            profile_prefix = None
            if not ort_session.ASSIGNMENT_INFO_AVAILABLE:
                # The profile only lives until placement_of has read it.
                folder = stack.enter_context(tempfile.TemporaryDirectory(prefix=PROFILE_PREFIX))
                profile_prefix = Path(folder) / "ort"
            session = create_session(
                graph,
                message.providers,
                message.allowed_providers,
                message.target_provider,
                profile_prefix=profile_prefix,
            )
            loaded = time.perf_counter()
            buckets = warm_up_buckets(session, graph.example_inputs, shapes)
            warmed = time.perf_counter()
            placement = placement_of(session)
        largest = max(buckets, key=lambda one: one.io_nbytes)
        if largest.io_nbytes > message.max_io_bytes:
            raise WorkerError(
                "too_large",
                f"the bucket's inputs plus outputs are {largest.io_nbytes} bytes; accepted: at "
                f"most max_io_bytes = {message.max_io_bytes} (raise it in the route)",
            )
        bucket = buckets[0]
        self._runner = CancellableRunner(session)
        self._buckets = buckets
        self._max_io_bytes = message.max_io_bytes
        self._output_names = tuple(spec.name for spec in bucket.outputs)
        return ReadyMessage(
            placement=dict(placement.counts),
            total_nodes=placement.total,
            placement_method=placement.method,
            inputs=bucket.inputs,
            outputs=bucket.outputs,
            load_s=loaded - started,
            warmup_s=warmed - loaded,
            rss_bytes=psutil.Process().memory_info().rss,
        )

    # Serving.

    def serve(self) -> int:
        """Answer messages until ``shutdown`` or the controller closes the stream."""
        while True:
            try:
                message, frame = self._channel.read_message(CONTROLLER_TO_WORKER)
            except ChannelClosed:
                return EXIT_OK
            if isinstance(message, CallMessage):
                self._call(message, frame)
            elif isinstance(message, CancelMessage):
                self._cancel(message.call_id)
            elif isinstance(message, AckMessage):
                self._channel.acknowledge(message.owner, message.generation)
            elif isinstance(message, ShutdownMessage):
                self.close()
                self._channel.send_message(ByeMessage())
                return EXIT_OK
            else:
                self._send_error(None, "unexpected_message", f"{message.KIND} after load")

    def _call(self, message: CallMessage, frame: Frame) -> None:
        assert self._runner is not None
        assert self._buckets
        try:
            arrays, acks = self._channel.arrays_from_frame(frame, message.input_names)
        except ProtocolError:
            self._channel.send_acks(frame_acks(frame))
            raise
        # The inputs are our own copies now: the producer may release its buffers.
        self._channel.send_acks(acks)
        try:
            check_call_inputs(arrays, self._buckets, self._max_io_bytes)
            with self._lock:
                self._runner.submit(arrays, on_done=lambda outcome: self._finish(message, outcome))
                self._running = message
        except WorkerError as error:
            self._send_error(message.call_id, error.code, error.message)

    def _finish(self, message: CallMessage, outcome: CallOutcome) -> None:
        with self._lock:
            if self._running is message:
                self._running = None
        error = outcome.error
        try:
            if error is None:
                assert outcome.outputs is not None
                outputs = {name: outcome.outputs[name] for name in self._output_names}
                result = ResultMessage(
                    message.call_id,
                    message.request_id,
                    message.epoch,
                    self._output_names,
                    outcome.elapsed_s,
                )
                try:
                    self._channel.send_message(
                        result, outputs, owner=self._owner, generation=message.call_id
                    )
                    return
                except (ProtocolError, ShmError, DescriptorError) as exc:
                    error = WorkerError("result_failed", f"the result cannot be sent: {exc}")
            self._send_error(message.call_id, error.code, error.message)
        except ChannelClosed:
            # The controller is gone; the serve loop sees the same and exits.
            return

    def _cancel(self, call_id: int) -> None:
        with self._lock:
            running = self._running
        if running is not None and running.call_id == call_id and self._runner is not None:
            # The run's own completion answers with code "cancelled".
            self._runner.cancel()
            return
        self._send_error(call_id, "cancelled", f"call {call_id} is not running")

    def _send_error(
        self, call_id: int | None, code: str, text: str, *, fatal: bool = False
    ) -> None:
        self._channel.send_message(ErrorMessage(call_id, code, text, fatal))

    def close(self) -> None:
        """Cancel a running call and join its thread (idempotent)."""
        if self._runner is not None:
            self._runner.close()


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
    if Path(private).name.startswith(PRIVATE_TMPDIR_PREFIX):
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
        channel.close()
        _remove_private_tmpdir()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
