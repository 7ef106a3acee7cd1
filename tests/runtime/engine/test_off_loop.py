"""``RequestContext.off_loop``: a program's calls of one graph stage made from a thread of its
own (``call_direct``), with the stage held for the request until the work returns."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from runtime.contracts import RequestKey
from runtime.engine.orchestrator import Request
from runtime.engine.program import DirectCalls, RequestContext
from runtime.engine.stages import GraphStage
from runtime.errors import RequestCancelled, UsageError
from tests.runtime.engine.inprocess_support import write_inprocess_pipeline
from tests.runtime.engine.support import StageSpec, write_pipeline
from tests.runtime.engine.test_retained_inputs import NBYTES, N, _b, _stages
from tests.runtime.engine.test_retained_inputs import add_manifest as add_manifest  # fixture

if TYPE_CHECKING:
    from pathlib import Path


def _context(runtime: Any) -> RequestContext:
    request = Request(request_id="r1", inputs=None, key=RequestKey("r1"))
    return RequestContext(request, runtime.stages, runtime.events)


def test_direct_calls_run_on_another_thread_hold_the_stage_and_are_recorded(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    async def scenario() -> None:
        pipeline = write_pipeline(tmp_path / "w.yaml", StageSpec(add_manifest, max_io="1MiB"))
        async with _stages(pipeline, options) as runtime:
            ctx = _context(runtime)
            stage = runtime.stages[0]
            assert isinstance(stage, GraphStage)
            assert ctx.direct_calls(0)
            loop_thread = threading.current_thread()
            a = np.arange(N, dtype=np.float32)

            def work(calls: DirectCalls) -> list[float]:
                assert threading.current_thread() is not loop_thread
                assert stage.lock.locked()
                sums = []
                for step in range(3):
                    result = calls({"a": a, "b": _b(step)}, retain=("a",))
                    # The caller's own copy, valid after the slot was freed.
                    assert result.outputs["c"].flags.writeable
                    sums.append(float(result.outputs["c"][1]))
                return sums

            assert await ctx.off_loop(0, work) == [1.0, 2.0, 3.0]
            assert not stage.lock.locked()
            assert stage.client.slot is None  # type: ignore[attr-defined]
            copied = [entry.copied_bytes for entry in ctx.request.stage_metrics]
            # Inputs once (``a`` retained after the first call), the outputs' copy each call.
            assert copied == [3 * NBYTES, 2 * NBYTES, 2 * NBYTES]

            def fails(calls: DirectCalls) -> None:
                raise ValueError("the work failed")

            with pytest.raises(ValueError, match="the work failed"):
                await ctx.off_loop(0, fails)
            assert not stage.lock.locked()

    asyncio.run(scenario())


def test_a_cancelled_task_waits_for_its_work_before_letting_the_stage_go(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    async def scenario() -> None:
        pipeline = write_pipeline(tmp_path / "w.yaml", StageSpec(add_manifest, max_io="1MiB"))
        async with _stages(pipeline, options) as runtime:
            ctx = _context(runtime)
            stage = runtime.stages[0]
            assert isinstance(stage, GraphStage)
            started = threading.Event()
            calls_made: list[float] = []

            def work(calls: DirectCalls) -> None:
                started.set()
                while True:
                    ctx.check_cancelled()
                    calls({"a": _b(1), "b": _b(2)})
                    calls_made.append(time.monotonic())

            task = asyncio.ensure_future(ctx.off_loop(0, work))
            await asyncio.to_thread(started.wait, 10)
            await asyncio.sleep(0.05)
            ctx.request.cancel_requested = True
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not stage.lock.locked()
            count = len(calls_made)
            await asyncio.sleep(0.1)
            assert len(calls_made) == count  # no call after the stage was let go
            assert stage.client.usable
            with pytest.raises(RequestCancelled):
                ctx.check_cancelled()

    asyncio.run(scenario())


def test_an_in_process_stage_is_not_called_off_the_loop(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    async def scenario() -> None:
        pipeline = write_inprocess_pipeline(tmp_path / "i.yaml", [add_manifest], max_io="1MiB")
        async with _stages(pipeline, options) as runtime:
            ctx = _context(runtime)
            assert not ctx.direct_calls(0)
            with pytest.raises(UsageError, match="cannot be called directly"):
                await ctx.off_loop(0, lambda calls: None)

    asyncio.run(scenario())
