"""The orchestrator on graph stages run in this process: admission, cancellation,
acknowledgement and the caller's side of the output stream, in a few seconds.

The stages are real (``worker: inprocess``: the bundle verified, ONNX Runtime sessions in
this process, the graph client's slot rules); only the worker process is absent.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from runtime.api import Omni
from runtime.backends.inprocess import InProcessGraphClient
from runtime.contracts import RequestKey
from runtime.engine.outputs import END, OmniRequestOutput
from runtime.errors import RequestCancelled, ResourceUnavailable, StageRetired
from runtime.events import EventBus, RequestAdmitted, RequestFinished
from runtime.ledger import ResourceLedger
from tests.helpers.engine import engine_of
from tests.helpers.onnx_graphs import make_bundle
from tests.runtime.engine.inprocess_support import BURST_PROGRAM, write_inprocess_pipeline
from tests.runtime.engine.support import (
    ENDLESS_STEPS,
    call_stage,
    child_pids,
    loop_inputs,
    on_loop,
    wait_until,
)
from tests.workers.support import loop_reference

if TYPE_CHECKING:
    from pathlib import Path

    from runtime.engine.orchestrator import Request
    from runtime.events import Event


@pytest.fixture(scope="module")
def add_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_bundle(tmp_path_factory.mktemp("add"), kind="add", name="add")


def _next(request: Request, timeout_s: float = 10.0) -> OmniRequestOutput | BaseException:
    item = request.stream.next_future().result(timeout_s)
    assert isinstance(item, OmniRequestOutput | BaseException), item
    return item


def _ends(request: Request, timeout_s: float = 10.0) -> None:
    assert request.stream.next_future().result(timeout_s) is END


def _graph_client(omni: Omni, index: int = 0) -> InProcessGraphClient:
    client = engine_of(omni).clients[index]
    assert isinstance(client, InProcessGraphClient)
    return client


def test_a_chain_runs_in_this_process_with_the_graph_contract(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    pipeline = write_inprocess_pipeline(tmp_path / "chain.yaml", [add_manifest, add_manifest])
    children = child_pids()
    with Omni(pipeline, **options) as omni:
        for client in engine_of(omni).clients:
            assert client.usable
        plan = omni.execution_plan.to_json()
        assert [stage["worker"]["pid"] for stage in plan["stages"]] == [os.getpid()] * 2
        assert all(stage["worker"]["in_process"] for stage in plan["stages"])
        assert plan["stages"][0]["inputs"] == [
            {"name": "a", "dtype": "float32", "shape": [1024]},
            {"name": "b", "dtype": "float32", "shape": [1024]},
        ]
        assert plan["stages"][0]["placement"]["fraction_on_target"] == 1.0
        inputs = omni.example_inputs()
        result = omni.run(inputs)
        np.testing.assert_allclose(result["c"], 2 * (inputs["a"] + inputs["b"]), rtol=1e-6)
        assert child_pids() == children
        stages = omni.metrics()["stages"]
        assert (stages["stage-0"]["calls"], stages["stage-1"]["calls"]) == (1, 1)
        assert stages["stage-0"]["bytes_in"] == 2 * 4 * 1024
        assert all(client.slot is None for client in map(_graph_client, [omni] * 2, [0, 1]))


def test_a_call_outside_the_bucket_is_a_model_error_that_keeps_the_stage(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    pipeline = write_inprocess_pipeline(tmp_path / "one.yaml", [add_manifest])
    with Omni(pipeline, **options) as omni:
        bad = {"a": np.zeros(8, np.float32), "b": np.zeros(8, np.float32)}
        request = engine_of(omni).submit(bad)
        error = _next(request)
        assert isinstance(error, BaseException)
        assert "bad_input" in str(error)
        assert "exactly [1024]" in str(error)
        assert _graph_client(omni).usable
        assert omni.run()["c"].shape == (1024,)


def test_a_second_request_is_refused_while_the_first_holds_the_pipeline(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    pipeline = write_inprocess_pipeline(tmp_path / "one.yaml", [add_manifest])
    with Omni(pipeline, **options) as omni:
        first = engine_of(omni).submit(None)
        output = _next(first)
        assert isinstance(output, OmniRequestOutput)
        # The final output is delivered, not acknowledged: the slot and the pipeline are held.
        assert _graph_client(omni).slot == first.key
        with pytest.raises(ResourceUnavailable, match="one request at a time"):
            engine_of(omni).submit(None)
        output.release_stage_buffers()
        _ends(first)
        wait_until(lambda: _graph_client(omni).slot is None, "the slot to be free")
        second = engine_of(omni).submit(None)
        assert isinstance(_next(second), OmniRequestOutput)


def test_with_max_queued_a_request_waits_and_one_beyond_is_refused(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    pipeline = write_inprocess_pipeline(tmp_path / "q.yaml", [add_manifest], max_queued=1)
    events = EventBus()
    admitted: list[Event] = []
    events.subscribe(
        lambda event: admitted.append(event) if isinstance(event, RequestAdmitted) else None
    )
    with Omni(pipeline, events=events, **options) as omni:
        first = engine_of(omni).submit(None)
        held = _next(first)
        assert isinstance(held, OmniRequestOutput)
        second = engine_of(omni).submit(None)
        with pytest.raises(ResourceUnavailable, match="the queue holds at most 1"):
            engine_of(omni).submit(None)
        assert [(e.request_id, e.queued) for e in admitted] == [  # type: ignore[attr-defined]
            (first.request_id, False),
            (second.request_id, True),
        ]
        # Nothing of the queued request runs while the first holds the stage.
        assert second.task is None
        assert _graph_client(omni).slot == first.key
        held.release_stage_buffers()
        output = _next(second)
        assert isinstance(output, OmniRequestOutput)
        assert output.request_id == second.request_id
        output.release_stage_buffers()


def test_cancelling_before_the_first_output_runs_no_call_and_keeps_the_stage(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    pipeline = write_inprocess_pipeline(tmp_path / "q.yaml", [add_manifest], max_queued=1)
    events = EventBus()
    finished: list[Event] = []
    events.subscribe(
        lambda event: finished.append(event) if isinstance(event, RequestFinished) else None
    )
    with Omni(pipeline, events=events, **options) as omni:
        first = engine_of(omni).submit(None)
        held = _next(first)
        assert isinstance(held, OmniRequestOutput)
        queued = engine_of(omni).submit(None)
        assert omni.cancel(queued.request_id)
        cancelled = _next(queued)
        assert isinstance(cancelled, RequestCancelled)
        held.release_stage_buffers()
        wait_until(lambda: len(finished) == 2, "both requests to finish")
        assert [(e.request_id, e.status) for e in finished] == [  # type: ignore[attr-defined]
            (queued.request_id, "cancelled"),
            (first.request_id, "completed"),
        ]
        calls = [len(r["stages"]) for r in omni.metrics()["requests"]]
        assert calls == [0, 1]
        assert _graph_client(omni).usable


def test_cancelling_mid_call_stops_it_and_retires_the_stage(
    loop_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    pipeline = write_inprocess_pipeline(tmp_path / "loop.yaml", [loop_manifest], max_io="4MiB")
    ledger = ResourceLedger(name="inprocess-loop")
    with Omni(pipeline, ledger=ledger, **options) as omni:
        client = _graph_client(omni)
        request = engine_of(omni).submit(loop_inputs(loop_manifest, ENDLESS_STEPS))
        wait_until(lambda: client.slot is not None, "the endless call to start")
        pending = request.stream.next_future()
        time.sleep(0.05)
        assert not pending.done()
        started = time.monotonic()
        assert omni.cancel(request.request_id)
        cancel_s = time.monotonic() - started
        assert isinstance(pending.result(5), RequestCancelled)
        # The call stopped between nodes within the deadline, so nothing stays charged.
        assert cancel_s < client.timeouts.cancel_retire_s
        assert ledger.snapshot().is_empty
        assert not client.usable
        assert omni.execution_plan.stages[0].usable is True  # the plan taken at start
        assert client.record().usable is False
        later = engine_of(omni).submit(loop_inputs(loop_manifest, 1))
        error = _next(later)
        assert isinstance(error, StageRetired)
        assert "recreate the pipeline" in str(error)


def test_a_stale_acknowledgement_is_ignored(
    loop_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    pipeline = write_inprocess_pipeline(tmp_path / "loop.yaml", [loop_manifest], max_io="4MiB")
    with Omni(pipeline, **options) as omni:
        client = _graph_client(omni)
        older = RequestKey("direct")
        current = older.fenced()
        inputs = loop_inputs(loop_manifest, 2)
        result = call_stage(engine_of(omni), client, current, inputs)
        np.testing.assert_allclose(
            result.outputs["y"], loop_reference(inputs["x"], 2), rtol=1e-4, atol=1e-5
        )
        assert not result.outputs["y"].flags.writeable
        # An acknowledgement of an older epoch, or of another request, frees nothing.
        assert on_loop(engine_of(omni), lambda: client.acknowledge(older)) is False
        assert on_loop(engine_of(omni), lambda: client.acknowledge(RequestKey("x"))) is False
        assert client.slot == current
        with pytest.raises(ResourceUnavailable, match="busy with direct"):
            call_stage(engine_of(omni), client, RequestKey("other"), inputs)
        assert on_loop(engine_of(omni), lambda: client.acknowledge(current)) is True
        assert on_loop(engine_of(omni), lambda: client.acknowledge(current)) is False
        assert client.slot is None


def test_leaving_the_generator_early_cancels_the_request_and_frees_the_stage(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    pipeline = write_inprocess_pipeline(
        tmp_path / "burst.yaml",
        [add_manifest],
        adapter={"name": BURST_PROGRAM, "options": {"count": 4}},
    )
    with Omni(pipeline, **options) as omni:
        outputs = omni.generate(None)
        first = next(outputs)
        assert (first.index, first.finished) == (0, False)
        outputs.close()
        (finished,) = omni.metrics()["requests"]
        assert finished["status"] == "cancelled"
        # The call had ended and its slot was freed, so the stage stays usable.
        client = _graph_client(omni)
        assert client.slot is None
        assert client.usable
        assert len(list(omni.generate(None))) == 4
