"""Flow control: one request at a time, a bounded queue, and slots held until acknowledged."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from runtime.api import Omni
from runtime.contracts import RequestKey
from runtime.engine.outputs import END, OmniRequestOutput
from runtime.errors import RequestCancelled, ResourceUnavailable
from runtime.events import EventBus, RequestAdmitted
from tests.helpers.engine import engine_of
from tests.runtime.engine.support import (
    StageSpec,
    call_stage,
    on_loop,
    wait_until,
    write_pipeline,
)

if TYPE_CHECKING:
    from pathlib import Path

    from runtime.engine.orchestrator import Request

RESULT_TIMEOUT_S = 30.0


def _pair(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal((1, 1024)).astype(np.float32) for name in ("a", "b")}


def _output(request: Request) -> OmniRequestOutput:
    item = request.stream.next_future().result(RESULT_TIMEOUT_S)
    assert isinstance(item, OmniRequestOutput), item
    return item


def _end(request: Request) -> None:
    assert request.stream.next_future().result(RESULT_TIMEOUT_S) is END


def test_a_second_request_is_refused_while_the_first_output_is_unconsumed(
    demo_root: Path, options: dict[str, Any]
) -> None:
    with Omni(demo_root / "pipelines" / "add.yaml", **options) as omni:
        first = omni.generate(_pair(1))
        output = next(first)
        with pytest.raises(ResourceUnavailable, match=output.request_id):
            next(omni.generate(_pair(2)))
        with pytest.raises(ResourceUnavailable, match="one request at a time"):
            engine_of(omni).submit(_pair(2))
        # Advancing the first generator acknowledges its output and ends its request.
        assert next(first, None) is None
        pair = _pair(3)
        np.testing.assert_array_equal(omni.run(pair)["sum"], pair["a"] + pair["b"])


def test_max_queued_one_queues_one_request_and_refuses_a_third(
    demo_root: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    pipeline = write_pipeline(
        tmp_path / "queued.yaml",
        StageSpec(demo_root / "bundles" / "add" / "manifest.json"),
        max_queued=1,
    )
    events = EventBus()
    admitted: list[RequestAdmitted] = []
    events.subscribe(
        lambda event: admitted.append(event) if isinstance(event, RequestAdmitted) else None
    )
    with Omni(pipeline, events=events, **options) as omni:
        orchestrator = engine_of(omni)
        (client,) = orchestrator.clients
        first_pair, second_pair = _pair(11), _pair(12)
        first = orchestrator.submit(first_pair, request_id="req-first")
        first_output = _output(first)
        second = orchestrator.submit(second_pair, request_id="req-second")
        with pytest.raises(ResourceUnavailable, match="the queue holds at most 1"):
            orchestrator.submit(_pair(13), request_id="req-third")
        assert [(event.request_id, event.queued) for event in admitted] == [
            ("req-first", False),
            ("req-second", True),
        ]
        # The queued request does not run while the first output is unconsumed.
        time.sleep(0.3)
        waiting = second.stream.next_future()
        assert not waiting.done()
        assert client.slot == RequestKey("req-first")

        first_output.release_stage_buffers()
        _end(first)
        item = waiting.result(RESULT_TIMEOUT_S)
        assert isinstance(item, OmniRequestOutput)
        assert item.request_id == "req-second"
        np.testing.assert_array_equal(item.outputs["sum"], second_pair["a"] + second_pair["b"])
        np.testing.assert_array_equal(
            first_output.outputs["sum"], first_pair["a"] + first_pair["b"]
        )
        item.release_stage_buffers()
        _end(second)
        assert client.slot is None

        # A queued request that is cancelled leaves the queue; the running one is untouched.
        running = orchestrator.submit(_pair(14), request_id="req-running")
        running_output = _output(running)
        queued = orchestrator.submit(_pair(15), request_id="req-queued")
        assert omni.cancel("req-queued")
        assert isinstance(queued.stream.next_future().result(RESULT_TIMEOUT_S), RequestCancelled)
        assert client.slot == RequestKey("req-running")
        # Its place in the queue is free again.
        requeued = orchestrator.submit(_pair(16), request_id="req-requeued")
        running_output.release_stage_buffers()
        _end(running)
        requeued_output = _output(requeued)
        assert requeued_output.request_id == "req-requeued"
        requeued_output.release_stage_buffers()
        _end(requeued)


def test_the_stage_slot_is_held_until_the_output_is_acknowledged(
    demo_root: Path, options: dict[str, Any]
) -> None:
    with Omni(demo_root / "pipelines" / "mlp-chain.yaml", **options) as omni:
        orchestrator = engine_of(omni)
        first_stage, last_stage = orchestrator.clients
        request = orchestrator.submit(request_id="req-held")
        output = _output(request)
        # Stage 0's result was copied into the handoff and acknowledged; stage 1 keeps its slot.
        assert first_stage.slot is None
        assert last_stage.slot == RequestKey("req-held")
        time.sleep(0.2)
        assert last_stage.slot == RequestKey("req-held")
        with pytest.raises(ResourceUnavailable, match="req-held"):
            orchestrator.submit()
        # A direct call on the stage is refused too: one call and one retained result.
        with pytest.raises(ResourceUnavailable, match="acknowledge or cancel it first"):
            call_stage(orchestrator, last_stage, RequestKey("req-other"), output.outputs)

        output.release_stage_buffers()
        wait_until(lambda: last_stage.slot is None, "stage 1 to free its slot")
        _end(request)
        assert omni.run()["y"].shape == (1, 16)


def test_stale_acknowledgements_are_ignored(demo_root: Path, options: dict[str, Any]) -> None:
    with Omni(demo_root / "pipelines" / "add.yaml", **options) as omni:
        orchestrator = engine_of(omni)
        (client,) = orchestrator.clients
        old = orchestrator.submit(_pair(21), request_id="req-old")
        old_output = _output(old)
        # Cancelling a delivered, unacknowledged request frees the slot (its epoch is fenced).
        assert omni.cancel("req-old")
        assert client.slot is None
        assert isinstance(old.stream.next_future().result(RESULT_TIMEOUT_S), RequestCancelled)

        pair = _pair(22)
        current = orchestrator.submit(pair, request_id="req-current")
        current_output = _output(current)
        key = RequestKey("req-current")
        assert client.slot == key
        # The cancelled request's late acknowledgement frees nothing.
        old_output.release_stage_buffers()
        time.sleep(0.1)
        assert client.slot == key
        # Neither does an acknowledgement for the old request or for another epoch.
        assert on_loop(orchestrator, lambda: client.acknowledge(RequestKey("req-old"))) is False
        assert on_loop(orchestrator, lambda: client.acknowledge(RequestKey("req-old", 1))) is False
        assert on_loop(orchestrator, lambda: client.acknowledge(key.fenced())) is False
        assert client.slot == key
        with pytest.raises(ResourceUnavailable):
            orchestrator.submit()

        current_output.release_stage_buffers()
        _end(current)
        assert client.slot is None
        np.testing.assert_array_equal(current_output.outputs["sum"], pair["a"] + pair["b"])
