"""The graph worker as a real process, driven over its framed stdio channel."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort
import pytest

from runtime.backends.placement import PlacementReport, gate_placement
from runtime.contracts.buffers import DType
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
    ShutdownMessage,
    TensorSpec,
)
from runtime.host.launch import GENERATION_VARIABLE
from runtime.transport.channel import FramedChannel
from tests.helpers.onnx_graphs import make_bundle
from tests.workers.support import (
    CPU,
    ENDLESS_STEPS,
    LOOP_ROWS,
    LOOP_WIDTH,
    REPO_ROOT,
    WorkerProcess,
    identity_of,
    loop_reference,
)
from workers import ort_session, ort_worker
from workers.ort_session import PROFILE_PREFIX
from workers.ort_worker import (
    EXIT_LOAD_FAILED,
    EXIT_OK,
    EXIT_PROTOCOL,
    EXIT_USAGE,
    GraphWorker,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from runtime.contracts.codec import Frame

#: Seconds from sending ``cancel`` to receiving the ``cancelled`` error from a worker process
#: (measured on 2 shared cores: median 6 ms, worst of 10 runs 25 ms).
CANCEL_BOUND_S = 1.5


def _ready(worker: WorkerProcess, manifest: Path) -> ReadyMessage:
    worker.channel.send_message(worker.load_message(manifest))
    message, _ = worker.read()
    assert isinstance(message, ReadyMessage), message
    return message


def _call(
    worker: WorkerProcess, call_id: int, arrays: Mapping[str, np.ndarray]
) -> tuple[object, dict[str, np.ndarray]]:
    worker.channel.send_message(CallMessage(call_id, "req-1", 0, tuple(arrays)), arrays)
    message, frame = worker.read()
    if not isinstance(message, ResultMessage):
        return message, {}
    outputs, acks = worker.channel.arrays_from_frame(frame, message.output_names)
    worker.channel.send_acks(acks)
    return message, outputs


def _shutdown(worker: WorkerProcess) -> None:
    worker.channel.send_message(ShutdownMessage())
    message, _ = worker.read()
    assert isinstance(message, ByeMessage)
    assert worker.exit_code() == EXIT_OK


def test_generation_variable_matches_the_launcher() -> None:
    assert ort_worker.GENERATION_VARIABLE == GENERATION_VARIABLE


@pytest.mark.parametrize("by_path", [False, True], ids=["module", "path"])
def test_worker_loads_reports_placement_and_serves(
    spawn_worker: Callable[..., WorkerProcess], add_manifest: Path, by_path: bool
) -> None:
    worker = spawn_worker(by_path=by_path)
    ready = _ready(worker, add_manifest)
    assert ready.placement == {CPU: ready.total_nodes}
    assert ready.placement_method == "assignment_info"
    assert ready.inputs == (
        TensorSpec("a", DType.FLOAT32, (1024,)),
        TensorSpec("b", DType.FLOAT32, (1024,)),
    )
    assert ready.outputs == (TensorSpec("c", DType.FLOAT32, (1024,)),)
    assert ready.rss_bytes > 0
    report = PlacementReport.from_ready(ready, target_provider=CPU)
    gate_placement(
        report,
        allowed_providers=[CPU],
        target_provider=CPU,
        min_fraction_on_target=1.0,
        stage="stage-0",
    )
    a = np.arange(1024, dtype=np.float32)
    b = np.full(1024, 0.5, np.float32)
    for call_id in (1, 2):
        result, outputs = _call(worker, call_id, {"a": a, "b": b})
        assert isinstance(result, ResultMessage)
        assert result.call_id == call_id
        np.testing.assert_array_equal(outputs["c"], a + b)
    _shutdown(worker)


def test_worker_serves_external_weights(
    spawn_worker: Callable[..., WorkerProcess], matmul_manifest: Path
) -> None:
    worker = spawn_worker()
    _ready(worker, matmul_manifest)
    x = np.ones((1, 4), np.float32)
    _, outputs = _call(worker, 1, {"x": x})
    np.testing.assert_allclose(outputs["y"], x @ np.arange(12, dtype=np.float32).reshape(4, 3))
    _shutdown(worker)


def test_worker_refuses_a_tampered_bundle(
    spawn_worker: Callable[..., WorkerProcess], add_manifest: Path
) -> None:
    identity = identity_of(add_manifest)
    with (add_manifest.parent / "add.onnx").open("ab") as stream:
        stream.write(b"\0")
    worker = spawn_worker()
    worker.channel.send_message(worker.load_message(add_manifest, identity=identity))
    message, _ = worker.read()
    assert isinstance(message, ErrorMessage)
    assert (message.code, message.fatal, message.call_id) == ("hash_mismatch", True, None)
    assert "add.onnx" in message.message
    assert worker.exit_code() == EXIT_LOAD_FAILED


def test_worker_refuses_an_absent_provider(
    spawn_worker: Callable[..., WorkerProcess], add_manifest: Path
) -> None:
    worker = spawn_worker()
    cuda = "CUDAExecutionProvider"
    worker.channel.send_message(worker.load_message(add_manifest, providers=(cuda,)))
    message, _ = worker.read()
    assert isinstance(message, ErrorMessage)
    assert (message.code, message.fatal) == ("provider_absent", True)
    for provider in ort.get_available_providers():
        assert provider in message.message
    assert worker.exit_code() == EXIT_LOAD_FAILED


def test_worker_refuses_a_bucket_above_max_io_bytes(
    spawn_worker: Callable[..., WorkerProcess], add_manifest: Path
) -> None:
    worker = spawn_worker()
    worker.channel.send_message(worker.load_message(add_manifest, max_io_bytes=1000))
    message, _ = worker.read()
    assert isinstance(message, ErrorMessage)
    assert (message.code, message.fatal) == ("too_large", True)
    assert "12288" in message.message
    assert worker.exit_code() == EXIT_LOAD_FAILED


def test_a_bad_call_is_refused_and_the_worker_keeps_serving(
    spawn_worker: Callable[..., WorkerProcess], add_manifest: Path
) -> None:
    worker = spawn_worker()
    _ready(worker, add_manifest)
    wrong = {"a": np.zeros(1024, np.float64), "b": np.zeros(1024, np.float32)}
    message, _ = _call(worker, 1, wrong)
    assert isinstance(message, ErrorMessage)
    assert (message.code, message.fatal, message.call_id) == ("bad_input", False, 1)
    assert "'a'" in message.message
    assert "float64" in message.message
    good = {"a": np.zeros(1024, np.float32), "b": np.ones(1024, np.float32)}
    result, outputs = _call(worker, 2, good)
    assert isinstance(result, ResultMessage)
    np.testing.assert_array_equal(outputs["c"], good["b"])
    _shutdown(worker)


def test_cancel_terminates_a_running_call_and_the_worker_survives(
    spawn_worker: Callable[..., WorkerProcess], loop_manifest: Path
) -> None:
    # The loop's 1 MiB state travels through shared memory both ways.
    worker = spawn_worker(shm=True)
    ready = _ready(worker, loop_manifest)
    assert [spec.name for spec in ready.inputs] == ["x", "n"]
    x = np.random.default_rng(3).standard_normal((LOOP_ROWS, LOOP_WIDTH)).astype(np.float32)
    endless: dict[str, np.ndarray] = {"x": x, "n": np.array(ENDLESS_STEPS, np.int64)}
    worker.channel.send_message(CallMessage(1, "req-1", 0, ("x", "n")), endless)
    time.sleep(0.3)
    worker.channel.send_message(CallMessage(2, "req-2", 0, ("x", "n")), endless)
    busy, _ = worker.read()
    assert isinstance(busy, ErrorMessage)
    assert (busy.code, busy.call_id, busy.fatal) == ("busy", 2, False)
    sent = time.monotonic()
    worker.channel.send_message(CancelMessage(1))
    cancelled, _ = worker.read()
    latency = time.monotonic() - sent
    assert isinstance(cancelled, ErrorMessage)
    assert (cancelled.code, cancelled.call_id, cancelled.fatal) == ("cancelled", 1, False)
    assert latency < CANCEL_BOUND_S, f"cancel took {latency:.3f} s"
    # The same worker completes the next call; its result arrives in shared memory.
    result, outputs = _call(worker, 3, {"x": x, "n": np.array(3, np.int64)})
    assert isinstance(result, ResultMessage)
    np.testing.assert_allclose(outputs["y"], loop_reference(x, 3), rtol=1e-4, atol=1e-5)
    assert worker.channel.retained_count == 0, "the worker acknowledged every input buffer"
    worker.channel.send_message(CancelMessage(3))
    late, _ = worker.read()
    assert isinstance(late, ErrorMessage)
    assert (late.code, late.fatal) == ("cancelled", False)
    assert "not running" in late.message
    _shutdown(worker)


def test_a_result_prepared_before_its_run_is_withdrawn_when_the_run_is_cancelled(
    spawn_worker: Callable[..., WorkerProcess], loop_manifest: Path
) -> None:
    """With binary headers, the answer to a call whose outputs are placed in the arena is
    encoded before the run (the first ones), or packed by the layout learned from one of them
    (the next ones), and sent with the run's time once the run ends. A cancelled run sends
    none, and its output slots are free again either way: the arena holds two sets of
    outputs, so after two cancelled calls the next call's outputs are still written in place
    (nothing copied)."""
    worker = spawn_worker(shm=True)
    worker.channel.send_message(worker.load_message(loop_manifest, binary_headers=True))
    ready, _ = worker.read()
    assert isinstance(ready, ReadyMessage)
    assert ready.arena_bytes > 0
    x = np.random.default_rng(5).standard_normal((LOOP_ROWS, LOOP_WIDTH)).astype(np.float32)
    endless: dict[str, np.ndarray] = {"x": x, "n": np.array(ENDLESS_STEPS, np.int64)}
    call_ids = iter(range(1, 100))

    def cancel_two() -> None:
        for _ in range(2):
            call_id = next(call_ids)
            worker.channel.send_message(CallMessage(call_id, "req-1", 0, ("x", "n")), endless)
            time.sleep(0.2)
            worker.channel.send_message(CancelMessage(call_id))
            cancelled, _ = worker.read()
            assert isinstance(cancelled, ErrorMessage)
            assert (cancelled.code, cancelled.call_id) == ("cancelled", call_id)

    def call_twice(request_id: str = "req-1") -> None:
        for _ in range(2):
            call_id = next(call_ids)
            arrays: dict[str, np.ndarray] = {"x": x, "n": np.array(2, np.int64)}
            started = time.perf_counter()
            worker.channel.send_message(CallMessage(call_id, request_id, 0, ("x", "n")), arrays)
            result, frame = worker.read()
            elapsed = time.perf_counter() - started
            assert isinstance(result, ResultMessage)
            assert (result.call_id, result.request_id) == (call_id, request_id)
            outputs, acks = worker.channel.arrays_from_frame(frame, result.output_names)
            worker.channel.send_acks(acks)
            # The input (a single segment: this controller has no arena) was copied; the
            # outputs were written in place.
            assert result.copied_bytes == x.nbytes
            # The run's own time, filled in after the run (not a placeholder).
            assert 0 < result.run_s < elapsed
            np.testing.assert_allclose(outputs["y"], loop_reference(x, 2), rtol=1e-4, atol=1e-5)

    cancel_two()  # answers encoded before their runs, withdrawn
    call_twice()  # the first teaches the layout, the second is packed by it
    cancel_two()  # answers to be packed: none sent
    call_twice()
    call_twice("req-with-a-longer-id")  # another layout: encoded before the run again
    assert worker.channel.retained_count == 0
    _shutdown(worker)


def test_inputs_in_another_arena_slot_are_bound_again(
    spawn_worker: Callable[..., WorkerProcess], loop_manifest: Path
) -> None:
    """The worker keeps its I/O binding while a call's inputs lie where the last call's did
    (the same slot of the controller's arena) and binds again when they move: each result is
    computed from the call's own input."""
    worker = spawn_worker(shm=True)
    arena = worker.channel.open_arena("controller", 4 << 20)
    assert arena is not None
    _ready(worker, loop_manifest)
    rng = np.random.default_rng(9)
    held = None
    for step in range(6):
        if step == 2:
            # The next inputs land after this slot, at another offset.
            held = arena.allocate(LOOP_ROWS * LOOP_WIDTH * 4)
        if step == 4 and held is not None:
            arena.acknowledge(held[0].generation)
        x = rng.standard_normal((LOOP_ROWS, LOOP_WIDTH)).astype(np.float32)
        result, outputs = _call(worker, step + 1, {"x": x, "n": np.array(1, np.int64)})
        assert isinstance(result, ResultMessage)
        np.testing.assert_allclose(outputs["y"], loop_reference(x, 1), rtol=1e-4, atol=1e-5)
    assert arena.retained_count == 0
    _shutdown(worker)


def _answer(controller: FramedChannel) -> tuple[ResultMessage, Frame]:
    """The next result on ``controller``, the acknowledgements before it taken."""
    while True:
        message, frame = controller.read_message(WORKER_TO_CONTROLLER, timeout_s=30)
        if isinstance(message, AckMessage):
            assert controller.acknowledge(message.owner, message.generation)
            continue
        assert isinstance(message, ResultMessage), message
        return message, frame


def test_calls_repeating_the_last_one_are_read_by_their_layout(tmp_path: Path) -> None:
    """A worker learns the layout of a call repeated with the same inputs in the
    controller's arena, and reads the next ones by it (calls.py), wherever in the arena their
    inputs lie: each result is computed from its call's own inputs. A call of another shape
    is decoded as before."""
    n = 16 * 1024  # 64 KiB per input: above the inline limit, so each goes through the arena
    manifest = make_bundle(tmp_path, kind="add", name="big", n=n)
    prefix = f"oe-test-{os.getpid()}-{secrets.token_hex(4)}-"
    to_worker, to_controller = os.pipe(), os.pipe()
    both = {"shm_prefix": prefix, "same_domain": True}
    controller = FramedChannel(
        os.fdopen(to_controller[0], "rb"), os.fdopen(to_worker[1], "wb"), name="c", **both
    )
    channel = FramedChannel(
        os.fdopen(to_worker[0], "rb"), os.fdopen(to_controller[1], "wb"), name="w", **both
    )
    controller.binary_headers = channel.binary_headers = True
    arena = controller.open_arena("stage-0", 1 << 20)
    assert arena is not None
    worker = GraphWorker(channel, generation=1)
    serving: threading.Thread | None = None
    try:
        load = LoadMessage(
            str(manifest), identity_of(manifest), (CPU,), (CPU,), CPU, 1 << 22, 1.0, prefix
        )
        worker.load(load)
        worker_arena = channel.arena("ort-1")
        assert worker_arena is not None
        serving = threading.Thread(target=worker.serve, daemon=True)
        serving.start()
        rng = np.random.default_rng(4)
        held = None
        for step in range(8):
            if step == 4:
                # The next inputs land after this slot, at other offsets.
                held = arena.allocate(n * 4)
            a = rng.standard_normal(n).astype(np.float32)
            b = rng.standard_normal(n).astype(np.float32)
            controller.send_message(
                CallMessage(step + 1, "req-1", 0, ("a", "b")), {"a": a, "b": b}, owner="stage-0"
            )
            result, frame = _answer(controller)
            assert result.call_id == step + 1
            outputs, acks = controller.arrays_from_frame(frame, result.output_names)
            controller.send_acks(acks)
            np.testing.assert_allclose(outputs["c"], a + b, rtol=1e-6)
            # The next call comes once the worker took the acknowledgement (written apart:
            # a read of both frames at once is decoded the usual way).
            deadline = time.monotonic() + 30
            while worker_arena.retained_count and time.monotonic() < deadline:
                time.sleep(0.001)
        # The second call repeated the first and taught the layout.
        assert worker.calls_by_layout == 6
        small = np.ones(n // 2, np.float32)
        controller.send_message(
            CallMessage(9, "req-1", 0, ("a", "b")), {"a": small, "b": small}, owner="stage-0"
        )
        refused, _ = controller.read_message(WORKER_TO_CONTROLLER, timeout_s=30)
        while isinstance(refused, AckMessage):
            assert controller.acknowledge(refused.owner, refused.generation)
            refused, _ = controller.read_message(WORKER_TO_CONTROLLER, timeout_s=30)
        assert isinstance(refused, ErrorMessage)
        assert worker.calls_by_layout == 6
        if held is not None:
            assert arena.acknowledge(held[0].generation)
        assert arena.retained_count == 0
        controller.send_message(ShutdownMessage())
        bye, _ = controller.read_message(WORKER_TO_CONTROLLER, timeout_s=30)
        assert isinstance(bye, ByeMessage)
    finally:
        # The worker's loop ends at the end of its stream.
        controller.close()
        if serving is not None:
            serving.join(30)
        worker.close()
        channel.close()


def test_a_result_held_by_the_controller_keeps_its_slot_while_the_next_call_runs(
    spawn_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    """Outputs go to a free slot of the worker's arena: while the controller holds one
    result, the next call's outputs are written to the other slot, each result intact."""
    n = 16 * 1024  # 64 KiB per output: above the inline limit, placed in the worker's arena
    manifest = make_bundle(tmp_path, kind="add", name="big", n=n)
    worker = spawn_worker(shm=True)
    worker.channel.send_message(worker.load_message(manifest, binary_headers=True))
    ready, _ = worker.read()
    assert isinstance(ready, ReadyMessage)
    rng = np.random.default_rng(8)
    held: list[tuple[np.ndarray, dict[str, np.ndarray], list[tuple[str, int]]]] = []
    for call_id in range(1, 7):
        a = rng.standard_normal(n).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        worker.channel.send_message(CallMessage(call_id, "req-1", 0, ("a", "b")), {"a": a, "b": b})
        result, frame = worker.read()
        assert isinstance(result, ResultMessage)
        outputs, acks = worker.channel.arrays_from_frame(frame, result.output_names, copy=False)
        held.append((a + b, outputs, acks))
        if len(held) == 2:
            # Both results, read in place, are still each call's own.
            for expected, kept, _ in held:
                np.testing.assert_allclose(kept["c"], expected, rtol=1e-6)
            for _, _, acks_held in held:
                worker.channel.send_acks(acks_held)
            held.clear()
    assert worker.channel.retained_count == 0
    _shutdown(worker)


def test_worker_without_a_generation_exits_with_a_usage_error() -> None:
    env = {key: value for key, value in os.environ.items() if key != GENERATION_VARIABLE}
    env["PYTHONPATH"] = str(REPO_ROOT)
    run = subprocess.run(
        [sys.executable, "-m", "workers.ort_worker"],
        env=env,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == EXIT_USAGE
    assert GENERATION_VARIABLE in run.stderr
    assert run.stdout == ""


def test_shutdown_before_load_says_bye(spawn_worker: Callable[..., WorkerProcess]) -> None:
    _shutdown(spawn_worker())


def test_a_call_before_load_is_fatal(spawn_worker: Callable[..., WorkerProcess]) -> None:
    worker = spawn_worker()
    arrays = {"a": np.zeros(4, np.float32)}
    worker.channel.send_message(CallMessage(1, "req-1", 0, ("a",)), arrays)
    message, _ = worker.read()
    assert isinstance(message, ErrorMessage)
    assert (message.code, message.fatal) == ("unexpected_message", True)
    assert "expected load, got call" in message.message
    assert worker.exit_code() == EXIT_PROTOCOL


def test_a_second_load_is_refused_without_stopping_the_worker(
    spawn_worker: Callable[..., WorkerProcess], add_manifest: Path
) -> None:
    worker = spawn_worker()
    _ready(worker, add_manifest)
    worker.channel.send_message(worker.load_message(add_manifest))
    message, _ = worker.read()
    assert isinstance(message, ErrorMessage)
    assert (message.code, message.fatal) == ("unexpected_message", False)
    _shutdown(worker)


def test_garbage_on_the_stream_is_a_fatal_protocol_error(
    spawn_worker: Callable[..., WorkerProcess],
) -> None:
    worker = spawn_worker()
    stdin = worker.process.stdin
    assert stdin is not None
    stdin.write(b"this is not a frame at all")
    stdin.flush()
    message, _ = worker.read()
    assert isinstance(message, ErrorMessage)
    assert (message.code, message.fatal) == ("bad_magic", True)
    assert worker.exit_code() == EXIT_PROTOCOL


def test_placement_falls_back_to_a_profile_that_is_removed(
    add_manifest: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ort_session, "ASSIGNMENT_INFO_AVAILABLE", False)
    temp = Path(tempfile.gettempdir())
    before = {path.name for path in temp.glob(f"{PROFILE_PREFIX}*")}
    reader, writer = os.pipe()
    channel = FramedChannel(os.fdopen(reader, "rb"), os.fdopen(writer, "wb"), name="test")
    worker = GraphWorker(channel, generation=1)
    try:
        load = LoadMessage(
            str(add_manifest), identity_of(add_manifest), (CPU,), (CPU,), CPU, 1 << 20, 1.0, None
        )
        ready = worker.load(load)
    finally:
        worker.close()
        channel.close()
    assert ready.placement_method == "profiling"
    assert ready.placement == {CPU: 1}
    assert {path.name for path in temp.glob(f"{PROFILE_PREFIX}*")} == before


def test_results_never_acknowledged_hit_the_shared_memory_limit(
    spawn_worker: Callable[..., WorkerProcess], loop_manifest: Path
) -> None:
    worker = spawn_worker(shm=True)
    _ready(worker, loop_manifest)
    x = np.zeros((LOOP_ROWS, LOOP_WIDTH), np.float32)
    one_step: dict[str, np.ndarray] = {"x": x, "n": np.array(1, np.int64)}
    # Each 1 MiB result stays retained until acknowledged; the limit is 64 MiB per process.
    failure = None
    for call_id in range(80):
        worker.channel.send_message(CallMessage(call_id, "req", 0, ("x", "n")), one_step)
        message, _ = worker.read()
        if isinstance(message, ErrorMessage):
            failure = message
            break
        assert isinstance(message, ResultMessage)
    assert failure is not None, "80 unacknowledged 1 MiB results fit in shared memory"
    assert (failure.code, failure.fatal) == ("result_failed", False)
    assert "limit" in failure.message
    _shutdown(worker)
