"""``Omni.run`` on a graph chain takes the direct way: the caller's thread writes each call
and the loop hands it the result, with no loop task in between. The request is still
admitted, counted, published and cancellable like any other, and nothing is left behind."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime.api import Omni
from runtime.backends.graph import LEARN_TRIES
from runtime.errors import (
    OmniError,
    RequestCancelled,
    ResourceUnavailable,
    StageRetired,
    WorkerDied,
)
from runtime.events import (
    EventBus,
    RequestAdmitted,
    RequestFinished,
    RequestOutputReady,
    StageCallFinished,
)
from tests.helpers.answers import answer_layout_of_another_stage
from tests.helpers.engine import engine_of
from tests.helpers.onnx_graphs import make_bundle
from tests.runtime.engine.support import (
    ENDLESS_STEPS,
    StageSpec,
    controller_segments,
    loop_inputs,
    process_gone,
    wait_busy,
    wait_until,
    write_pipeline,
)
from tests.workers.support import loop_reference


def _pair(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "a": rng.standard_normal((1, 1024)).astype(np.float32),
        "b": rng.standard_normal((1, 1024)).astype(np.float32),
    }


def _recorder(events: EventBus) -> list[object]:
    seen: list[object] = []
    events.subscribe(seen.append)
    return seen


def test_run_takes_the_direct_way_and_records_the_request_like_any_other(
    demo_root: Path, options: dict[str, Any]
) -> None:
    events = EventBus()
    seen = _recorder(events)
    with Omni(demo_root / "pipelines" / "add.yaml", events=events, **options) as omni:
        orchestrator = engine_of(omni)
        (client,) = orchestrator.clients
        inputs = _pair(1)
        launched: list[object] = []
        original = orchestrator._launch
        orchestrator._launch = lambda request: (launched.append(request), original(request))  # type: ignore[method-assign]
        result = omni.run(inputs)
        np.testing.assert_allclose(result["sum"], inputs["a"] + inputs["b"], rtol=1e-6)
        # No loop task ran the request; the slot is free when run() returns.
        assert launched == []
        assert client.slot is None
        # The caller owns its result: a writable array, not a view over the worker's memory.
        assert result["sum"].flags.writeable
        assert result["sum"].flags.owndata
        (request,) = omni.metrics()["requests"]
        assert request["status"] == "completed"
        (stage,) = request["stages"]
        assert stage["stage"] == "stage-0"
        assert stage["run_s"] > 0
        kinds = [type(event) for event in seen]
        order = [
            kind
            for kind in kinds
            if kind in (RequestAdmitted, StageCallFinished, RequestOutputReady, RequestFinished)
        ]
        assert order == [RequestAdmitted, StageCallFinished, RequestOutputReady, RequestFinished]
        finished = [event for event in seen if isinstance(event, RequestFinished)]
        assert finished[0].status == "completed"
        # A second run reuses the slot at once.
        again = omni.run(_pair(2))
        np.testing.assert_allclose(again["sum"], _pair(2)["a"] + _pair(2)["b"], rtol=1e-6)
    assert not controller_segments()


def test_a_request_submitted_during_a_direct_run_is_refused_or_queued_then_runs(
    loop_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    pipeline = write_pipeline(
        tmp_path / "loop.yaml", StageSpec(loop_manifest, max_io="4MiB"), max_queued=1
    )
    steps = 600
    with Omni(pipeline, **options) as omni:
        (client,) = engine_of(omni).clients
        assert client.pid is not None
        outcome: dict[str, Any] = {}

        def direct() -> None:
            outcome["first"] = omni.run(loop_inputs(loop_manifest, steps))

        runner = threading.Thread(target=direct)
        runner.start()
        wait_until(lambda: client.slot is not None, "the direct call to start")
        # One request waits in the queue (max_queued: 1); a third is refused, naming both.
        queued = engine_of(omni).submit(loop_inputs(loop_manifest, 3))
        with pytest.raises(ResourceUnavailable, match="queue holds at most 1"):
            engine_of(omni).submit(loop_inputs(loop_manifest, 3))
        runner.join(120)
        assert not runner.is_alive()
        inputs = loop_inputs(loop_manifest, 3)
        # The queued request is launched on the loop once the direct one finished.
        item = queued.stream.next_future().result(30)
        np.testing.assert_allclose(
            item.outputs["y"], loop_reference(inputs["x"], 3), rtol=1e-5, atol=1e-5
        )
        item.release_stage_buffers()
        assert "y" in outcome["first"]


def test_cancelling_a_direct_run_from_another_thread_retires_the_worker(
    loop_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    pipeline = write_pipeline(tmp_path / "loop.yaml", StageSpec(loop_manifest, max_io="4MiB"))
    events = EventBus()
    seen = _recorder(events)
    with Omni(pipeline, events=events, **options) as omni:
        (client,) = engine_of(omni).clients
        pid = client.pid
        assert pid is not None
        caught: list[BaseException] = []

        def direct() -> None:
            try:
                omni.run(loop_inputs(loop_manifest, ENDLESS_STEPS))
            except BaseException as exc:
                caught.append(exc)

        runner = threading.Thread(target=direct)
        runner.start()
        wait_busy(pid)
        (admitted,) = [event for event in seen if isinstance(event, RequestAdmitted)]
        started = time.monotonic()
        assert omni.cancel(admitted.request_id)
        runner.join(10)
        assert not runner.is_alive()
        assert isinstance(caught[0], RequestCancelled)
        wait_until(lambda: process_gone(pid), "the cancelled worker to be gone", 5.0)
        assert time.monotonic() - started < 5.0
        finished = [event for event in seen if isinstance(event, RequestFinished)]
        assert [event.status for event in finished] == ["cancelled"]
        # As for any cancelled active call, the stage is retired until the pipeline is recreated.
        with pytest.raises(StageRetired):
            omni.run(loop_inputs(loop_manifest, 3))
    assert not controller_segments()


def test_a_worker_killed_during_a_direct_run_fails_it_at_once(
    loop_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    pipeline = write_pipeline(tmp_path / "loop.yaml", StageSpec(loop_manifest, max_io="4MiB"))
    with Omni(pipeline, **options) as omni:
        (client,) = engine_of(omni).clients
        pid = client.pid
        assert pid is not None
        timer = threading.Timer(0.5, os.kill, (pid, signal.SIGKILL))
        timer.start()
        started = time.monotonic()
        with pytest.raises(WorkerDied):
            omni.run(loop_inputs(loop_manifest, ENDLESS_STEPS))
        assert time.monotonic() - started < 5.0
        timer.join()
        assert omni.metrics()["requests"][-1]["status"] == "failed"
    assert not controller_segments()


def test_run_waits_its_turn_behind_an_unconsumed_output(
    demo_root: Path, options: dict[str, Any]
) -> None:
    """With an output of another request still held, run() goes through the loop and is
    refused as before (a graph pipeline admits one request at a time)."""
    with Omni(demo_root / "pipelines" / "add.yaml", **options) as omni:
        held = engine_of(omni).submit(_pair(3))
        output = held.stream.next_future().result(30)
        with pytest.raises(ResourceUnavailable, match="one request at a time"):
            omni.run(_pair(4))
        output.release_stage_buffers()
        wait_until(lambda: not engine_of(omni)._running, "the held request to wind up")
        result = omni.run(_pair(4))
        np.testing.assert_allclose(result["sum"], _pair(4)["a"] + _pair(4)["b"], rtol=1e-6)


def test_closing_the_pipeline_during_a_direct_run_ends_it(
    loop_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    pipeline = write_pipeline(tmp_path / "loop.yaml", StageSpec(loop_manifest, max_io="4MiB"))
    omni = Omni(pipeline, **options)
    (client,) = engine_of(omni).clients
    pid = client.pid
    assert pid is not None
    caught: list[BaseException] = []

    def direct() -> None:
        try:
            omni.run(loop_inputs(loop_manifest, ENDLESS_STEPS))
        except BaseException as exc:
            caught.append(exc)

    runner = threading.Thread(target=direct)
    runner.start()
    wait_busy(pid)
    omni.close()
    runner.join(10)
    assert not runner.is_alive()
    assert isinstance(caught[0], RequestCancelled)
    assert process_gone(pid)
    assert not controller_segments()


def test_direct_runs_read_their_own_results_and_the_loop_takes_the_pipe_back(
    demo_root: Path, options: dict[str, Any]
) -> None:
    with Omni(demo_root / "pipelines" / "add.yaml", **options) as omni:
        (client,) = engine_of(omni).clients
        reader = getattr(client, "_borrowed", None)
        assert reader is None
        omni.run(_pair(1))
        reader = client._borrowed  # type: ignore[attr-defined]
        # The loop lent the pipe: the caller's thread read its result itself.
        assert reader is not None
        assert reader.lent_calls == 1
        # Idle, the loop watches the pipe again, and a request through the loop is served.
        wait_until(lambda: not reader.lent, "the loop to take the pipe back", 2.0)
        outputs = [output for output in omni.generate(_pair(2)) if output.finished]
        np.testing.assert_allclose(
            outputs[-1].outputs["sum"], _pair(2)["a"] + _pair(2)["b"], rtol=1e-6
        )
        assert reader.lent_calls == 1
        # Its last output reaches the caller before the loop ends the request; until then a
        # run takes the loop's way. Direct runs right after it borrow the pipe again.
        engine = engine_of(omni)
        wait_until(lambda: not engine._running, "the request through the loop to end", 5.0)
        for seed in range(3, 8):
            result = omni.run(_pair(seed))
            np.testing.assert_allclose(
                result["sum"], _pair(seed)["a"] + _pair(seed)["b"], rtol=1e-6
            )
        assert reader.lent_calls == 6
    assert not reader.lent
    assert not controller_segments()


def test_a_worker_killed_between_direct_runs_is_noticed_without_a_call(
    demo_root: Path, options: dict[str, Any]
) -> None:
    with Omni(demo_root / "pipelines" / "add.yaml", **options) as omni:
        (client,) = engine_of(omni).clients
        omni.run(_pair(1))
        assert client._borrowed.lent_calls == 1  # type: ignore[attr-defined]
        pid = client.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        # The loop takes the pipe back once no call came, and meets the end of the stream.
        wait_until(lambda: not client.usable, "the stage to notice its worker died", 5.0)
        assert isinstance(client.failure, WorkerDied)
        with pytest.raises((WorkerDied, StageRetired)):
            omni.run(_pair(2))
    assert not controller_segments()


def test_a_direct_run_frees_its_input_slots_before_it_returns(tmp_path: Path) -> None:
    """The worker acknowledges a call's inputs (in its arena slot) in the same write as the
    result; the calling thread takes those acknowledgements itself, so the slot is free by the
    time run() returns, and the loop is never woken for them."""
    n = 16 * 1024  # 64 KiB per input: above the inline limit, so each goes through the arena
    manifest = make_bundle(tmp_path, n=n)
    pipeline = write_pipeline(tmp_path / "big-add.yaml", StageSpec(manifest, max_io="1MiB"))
    rng = np.random.default_rng(7)
    with Omni(pipeline) as omni:
        (client,) = engine_of(omni).clients
        channel = client._channel  # type: ignore[attr-defined]
        handled: list[str] = []
        on_frame = client._on_frame_loop  # type: ignore[attr-defined]

        def counting(frame: Any) -> None:
            handled.append(frame.kind)
            on_frame(frame)

        client._on_frame_loop = counting  # type: ignore[attr-defined]
        for _ in range(20):
            a = rng.standard_normal(n).astype(np.float32)
            b = rng.standard_normal(n).astype(np.float32)
            result = omni.run({"a": a, "b": b})
            np.testing.assert_allclose(result["c"], a + b, rtol=1e-6)
            arena = channel.arena(client.name)
            assert arena is not None
            assert arena.retained_count == 0
        # Every run read its own result (and its acknowledgements) on the calling thread;
        # after the first, by the layout the first answer taught (answers.py).
        assert client._borrowed.lent_calls == 20  # type: ignore[attr-defined]
        assert client.answers_taken == 19  # type: ignore[attr-defined]
        # The second call repeated the first and taught the layout its followers were
        # packed by (calls.py).
        assert client._calls.packed == 18  # type: ignore[attr-defined]
        assert "ack" not in handled
    assert not controller_segments()


def _big_add(tmp_path: Path) -> tuple[Path, int]:
    n = 16 * 1024  # results above the inline limit: they lie in the worker's arena
    manifest = make_bundle(tmp_path, n=n)
    return write_pipeline(tmp_path / "big-add.yaml", StageSpec(manifest, max_io="1MiB")), n


def test_a_subscriber_that_joins_between_runs_gets_every_event_of_the_next(
    demo_root: Path, options: dict[str, Any]
) -> None:
    """Nobody listening, a direct run makes no events (its metrics are kept all the same);
    once someone listens, the next run publishes each one."""
    events = EventBus()
    with Omni(demo_root / "pipelines" / "add.yaml", events=events, **options) as omni:
        assert not events.wanted
        omni.run(_pair(1))
        seen = _recorder(events)
        assert events.wanted
        omni.run(_pair(2))
        order = [
            type(event)
            for event in seen
            if isinstance(
                event, (RequestAdmitted, StageCallFinished, RequestOutputReady, RequestFinished)
            )
        ]
        assert order == [RequestAdmitted, StageCallFinished, RequestOutputReady, RequestFinished]
        assert [r["status"] for r in omni.metrics()["requests"]] == ["completed", "completed"]


def test_a_call_that_does_not_fit_the_packed_layout_goes_the_usual_way(tmp_path: Path) -> None:
    pipeline, n = _big_add(tmp_path)
    rng = np.random.default_rng(5)
    with Omni(pipeline) as omni:
        (client,) = engine_of(omni).clients
        calls = client._calls  # type: ignore[attr-defined]

        def run_and_check(a: np.ndarray, b: np.ndarray) -> None:
            np.testing.assert_allclose(omni.run({"a": a, "b": b})["c"], a + b, rtol=1e-6)

        for _ in range(4):
            run_and_check(rng.standard_normal(n).astype(np.float32), np.ones(n, np.float32))
        assert calls.packed == 2
        # A strided view is sent as its copy, the usual way, and teaches the layout again.
        wide = rng.standard_normal(2 * n).astype(np.float32)
        run_and_check(wide[::2], np.ones(n, np.float32))
        assert calls.packed == 2
        # Another dtype is refused as before, whatever was packed.
        with pytest.raises(OmniError, match=r"float64|dtype"):
            omni.run({"a": np.ones(n, np.float64), "b": np.ones(n, np.float32)})
        run_and_check(rng.standard_normal(n).astype(np.float32), np.ones(n, np.float32))
        assert calls.packed == 3
        arena = client._channel.arena(client.name)  # type: ignore[attr-defined]
        assert arena is not None
        assert arena.retained_count == 0
    assert not controller_segments()


def test_answers_that_stop_matching_their_layout_are_read_the_usual_way_and_relearned(
    tmp_path: Path,
) -> None:
    pipeline, n = _big_add(tmp_path)
    rng = np.random.default_rng(11)
    with Omni(pipeline) as omni:
        (client,) = engine_of(omni).clients

        def run_and_check() -> None:
            a = rng.standard_normal(n).astype(np.float32)
            b = rng.standard_normal(n).astype(np.float32)
            np.testing.assert_allclose(omni.run({"a": a, "b": b})["c"], a + b, rtol=1e-6)

        for _ in range(3):
            run_and_check()
        assert client.answers_taken == 2  # type: ignore[attr-defined]
        # A layout no answer of this worker has (another stage's, another shape).
        foreign = answer_layout_of_another_stage()
        client._answers = foreign  # type: ignore[attr-defined]
        run_and_check()
        assert client.answers_taken == 2, "the answer did not match: read the usual way"  # type: ignore[attr-defined]
        assert client._answers is not foreign  # type: ignore[attr-defined]
        for _ in range(3):
            run_and_check()
        assert client.answers_taken == 5  # type: ignore[attr-defined]
        arena = client._channel.arena(client.name)  # type: ignore[attr-defined]
        assert arena is not None
        assert arena.retained_count == 0
    assert not controller_segments()


def test_a_stage_whose_results_travel_in_the_frame_stops_learning_a_layout(
    demo_root: Path, options: dict[str, Any]
) -> None:
    with Omni(demo_root / "pipelines" / "add.yaml", **options) as omni:
        (client,) = engine_of(omni).clients
        for seed in range(10):
            result = omni.run(_pair(seed))
            np.testing.assert_allclose(
                result["sum"], _pair(seed)["a"] + _pair(seed)["b"], rtol=1e-6
            )
        assert client.answers_taken == 0  # type: ignore[attr-defined]
        assert client._answers is None  # type: ignore[attr-defined]
        # Three tries, then one in every RELEARN_EVERY reads.
        assert client._answer_failures == LEARN_TRIES  # type: ignore[attr-defined]
        assert client._answer_reads == 10  # type: ignore[attr-defined]
