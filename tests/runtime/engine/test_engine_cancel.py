"""Cancellation: an active call retires its worker within the stated deadline; a retained
result is only dropped."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime.api import Omni
from runtime.backends.graph import GraphTimeouts
from runtime.engine.outputs import OmniRequestOutput
from runtime.errors import RequestCancelled, StageRetired
from runtime.events import EventBus, WorkerRetired
from runtime.ledger import ResourceLedger
from tests.helpers.engine import engine_of
from tests.runtime.engine.support import (
    ENDLESS_STEPS,
    MISBEHAVING_WORKER,
    StageSpec,
    controller_segments,
    loop_inputs,
    process_gone,
    wait_busy,
    wait_until,
    write_pipeline,
)
from tests.workers.support import loop_reference


def _ignores_sigterm(pid: int) -> bool:
    """Whether ``pid`` ignores SIGTERM (the stubborn worker does once it has the call)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def test_cancelling_an_active_call_retires_the_worker_within_the_deadline(
    loop_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    pipeline = write_pipeline(tmp_path / "loop.yaml", StageSpec(loop_manifest, max_io="4MiB"))
    deadline_s = GraphTimeouts().cancel_retire_s
    assert deadline_s == 3.0
    events = EventBus()
    retired: list[WorkerRetired] = []
    events.subscribe(
        lambda event: retired.append(event) if isinstance(event, WorkerRetired) else None
    )
    ledger = ResourceLedger(name="loop")
    with Omni(pipeline, events=events, ledger=ledger, **options) as omni:
        (client,) = engine_of(omni).clients
        pid = client.pid
        assert pid is not None
        (reservation,) = ledger.snapshot().reservations
        request = engine_of(omni).submit(loop_inputs(loop_manifest, ENDLESS_STEPS))
        wait_busy(pid)
        # The call is running and has not finished: it runs until cancelled.
        pending = request.stream.next_future()
        assert not pending.done()

        started = time.monotonic()
        assert omni.cancel(request.request_id)
        while not process_gone(pid):
            time.sleep(0.005)
        cancel_to_gone_s = time.monotonic() - started
        print(f"cancel to worker gone: {cancel_to_gone_s:.3f} s")
        assert cancel_to_gone_s < deadline_s + 1.0

        assert isinstance(pending.result(10), RequestCancelled)
        assert [(e.stage, e.pid, e.confirmed_gone) for e in retired] == [("stage-0", pid, True)]
        # The worker was confirmed gone, so its reservation is released, not quarantined.
        snapshot = ledger.snapshot()
        assert reservation not in snapshot.reservations
        assert not snapshot.quarantined
        assert not controller_segments()
        # The stage stays unusable until the pipeline is recreated.
        assert not client.usable
        with pytest.raises(StageRetired, match="recreate the pipeline"):
            omni.run(loop_inputs(loop_manifest, 1))
        with pytest.raises(StageRetired):
            omni.run(loop_inputs(loop_manifest, 1))

    with Omni(pipeline, ledger=ledger, **options) as omni:
        inputs = loop_inputs(loop_manifest, 3)
        result = omni.run(inputs)
        np.testing.assert_allclose(result["y"], loop_reference(inputs["x"], 3), rtol=0, atol=1e-5)
    assert ledger.snapshot().is_empty


def test_cancelling_a_retained_result_keeps_the_worker(
    demo_root: Path, options: dict[str, Any]
) -> None:
    events = EventBus()
    retired: list[WorkerRetired] = []
    events.subscribe(
        lambda event: retired.append(event) if isinstance(event, WorkerRetired) else None
    )
    with Omni(demo_root / "pipelines" / "add.yaml", events=events, **options) as omni:
        (client,) = engine_of(omni).clients
        pid = client.pid
        generator = omni.generate()
        output = next(generator)
        assert isinstance(output, OmniRequestOutput)
        assert client.slot is not None

        assert omni.cancel(output.request_id)
        assert client.slot is None
        assert client.usable
        generator.close()

        example = omni.example_inputs()
        np.testing.assert_array_equal(omni.run()["sum"], example["a"] + example["b"])
        assert client.pid == pid
        assert not process_gone(pid)
        assert not retired


def test_a_worker_stuck_in_its_call_is_killed_within_the_deadline(
    demo_root: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    # It ignores the cancel message, the closed stdin and SIGTERM: only SIGKILL ends it.
    pipeline = write_pipeline(
        tmp_path / "stubborn.yaml",
        StageSpec(
            demo_root / "bundles" / "add" / "manifest.json",
            worker=str(MISBEHAVING_WORKER),
            env={"MISBEHAVE": "stubborn"},
        ),
    )
    events = EventBus()
    retired: list[WorkerRetired] = []
    events.subscribe(
        lambda event: retired.append(event) if isinstance(event, WorkerRetired) else None
    )
    ledger = ResourceLedger(name="stubborn")
    with Omni(pipeline, events=events, ledger=ledger, **options) as omni:
        (client,) = engine_of(omni).clients
        pid = client.pid
        assert pid is not None
        request = engine_of(omni).submit()
        pending = request.stream.next_future()
        wait_until(lambda: _ignores_sigterm(pid), "the worker to get stuck in the call")
        assert not pending.done()
        started = time.monotonic()
        assert omni.cancel(request.request_id)
        while not process_gone(pid):
            time.sleep(0.005)
        cancel_to_gone_s = time.monotonic() - started
        print(f"cancel to stubborn worker gone: {cancel_to_gone_s:.3f} s")
        assert cancel_to_gone_s < GraphTimeouts().cancel_retire_s + 1.0
        assert isinstance(pending.result(10), RequestCancelled)
        assert [(e.pid, e.confirmed_gone) for e in retired] == [(pid, True)]
        assert ledger.snapshot().is_empty
        with pytest.raises(StageRetired):
            omni.run()
