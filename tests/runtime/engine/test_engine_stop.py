"""Stopping a request whose caller went away (``RequestHandle.stop``): it ends between stage
calls, the call in progress completes so no worker is retired, nothing it produces waits for
an acknowledgement, and one that overruns the grace is cancelled as usual."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from runtime.api import Omni
from runtime.events import EventBus, RequestFinished, WorkerRetired
from runtime.ledger import ResourceLedger
from tests.helpers.engine import engine_of
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

#: Loop steps of a call that runs for a while (under a second on two cores).
SOME_STEPS = 600


def _recorder(events: EventBus) -> list[Any]:
    seen: list[Any] = []
    events.subscribe(
        lambda event: (
            seen.append(event) if isinstance(event, (RequestFinished, WorkerRetired)) else None
        )
    )
    return seen


def test_a_stopped_request_ends_after_its_call_and_keeps_the_worker(
    loop_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    pipeline = write_pipeline(tmp_path / "loop.yaml", StageSpec(loop_manifest, max_io="4MiB"))
    events = EventBus()
    seen = _recorder(events)
    ledger = ResourceLedger(name="loop")
    with Omni(pipeline, events=events, ledger=ledger, **options) as omni:
        (client,) = engine_of(omni).clients
        pid = client.pid
        assert pid is not None
        handle = omni.session.submit(loop_inputs(loop_manifest, SOME_STEPS))
        wait_busy(pid)
        assert handle.stop()
        assert not handle.stop()  # idempotent
        wait_until(lambda: any(isinstance(e, RequestFinished) for e in seen), "the end", 30)
        (finished,) = [e for e in seen if isinstance(e, RequestFinished)]
        assert finished.status == "cancelled"
        assert "caller went away" in finished.message
        assert not [e for e in seen if isinstance(e, WorkerRetired)]
        assert client.usable
        assert client.pid == pid
        # Its output was acknowledged as it came: the pipeline serves the next request.
        result = omni.run(loop_inputs(loop_manifest, 1))
        assert result
    assert ledger.snapshot().is_empty
    assert not controller_segments()


def test_a_stopped_request_that_overruns_the_grace_is_cancelled(
    loop_manifest: Path, tmp_path: Path, options: dict[str, Any], caplog: Any
) -> None:
    pipeline = write_pipeline(tmp_path / "loop.yaml", StageSpec(loop_manifest, max_io="4MiB"))
    events = EventBus()
    seen = _recorder(events)
    with Omni(pipeline, events=events, **options) as omni:
        (client,) = engine_of(omni).clients
        pid = client.pid
        assert pid is not None
        handle = omni.session.submit(loop_inputs(loop_manifest, ENDLESS_STEPS))
        wait_busy(pid)
        stopped = time.monotonic()
        assert handle.stop(grace_s=0.5)
        wait_until(lambda: process_gone(pid), "the worker to be retired", 30)
        assert time.monotonic() - stopped >= 0.5
        wait_until(lambda: any(isinstance(e, RequestFinished) for e in seen), "the end", 30)
        (finished,) = [e for e in seen if isinstance(e, RequestFinished)]
        assert finished.status == "cancelled"
        assert "did not stop within 0.5 s; cancelling it" in caplog.text
        # The retirement is announced once the worker's reservation is settled, which may
        # come after the request ended.
        wait_until(lambda: any(isinstance(e, WorkerRetired) for e in seen), "the retirement", 30)
        assert [e.stage for e in seen if isinstance(e, WorkerRetired)] == ["stage-0"]
        assert not client.usable


def test_a_stopped_request_still_queued_never_runs(
    loop_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    pipeline = write_pipeline(
        tmp_path / "loop.yaml", StageSpec(loop_manifest, max_io="4MiB"), max_queued=1
    )
    events = EventBus()
    seen = _recorder(events)
    with Omni(pipeline, events=events, **options) as omni:
        (client,) = engine_of(omni).clients
        assert client.pid is not None
        running = omni.session.submit(loop_inputs(loop_manifest, SOME_STEPS))
        wait_busy(client.pid)
        queued = omni.session.submit(loop_inputs(loop_manifest, SOME_STEPS))
        assert queued.stop()
        wait_until(
            lambda: (
                [e.request_id for e in seen if isinstance(e, RequestFinished)]
                == [queued.request_id]
            ),
            "the queued request to end first",
            10,
        )
        outputs = list(running)
        assert outputs[-1].finished
        wait_until(
            lambda: len([e for e in seen if isinstance(e, RequestFinished)]) == 2,
            "the running request to be wound up",
            10,
        )
        statuses = {e.request_id: e.status for e in seen if isinstance(e, RequestFinished)}
        assert statuses == {queued.request_id: "cancelled", running.request_id: "completed"}
        # The stopped request made no call: the worker ran only the first one.
        metrics = omni.metrics()["requests"]
        calls = {m["request_id"]: len(m["stages"]) for m in metrics}
        assert calls.get(queued.request_id, 0) == 0
