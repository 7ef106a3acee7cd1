"""Inputs a graph stage keeps between calls of one request (``retain``).

A decoder called once per token with the same large context (Whisper's cross-attention keys
and values) would copy it into the worker's input slot on every call; a retained input is
copied once, its arena slot pinned, and later calls of the request send the same slot. The
slot goes when the request ends or is cancelled, when the caller passes another array, when
another request calls the stage, and with the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from runtime.backends.graph import GraphStageClient
from runtime.backends.inprocess import InProcessGraphClient
from runtime.config import load_pipeline
from runtime.contracts import RequestKey
from runtime.engine.orchestrator import Request
from runtime.engine.program import RequestContext
from runtime.engine.stage_runtime import StageRuntime
from runtime.engine.stages import GraphStage
from runtime.events import EventBus
from runtime.ledger import ResourceLedger
from runtime.transport.shm import process_retained
from tests.helpers.onnx_graphs import make_bundle
from tests.runtime.engine.inprocess_support import write_inprocess_pipeline
from tests.runtime.engine.support import StageSpec, write_pipeline

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

#: Above the arena threshold (16 KiB), so inputs go through the stage's arena.
N = 8192
NBYTES = 4 * N


@pytest.fixture(scope="module")
def add_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_bundle(tmp_path_factory.mktemp("add"), kind="add", name="add", n=N)


@contextlib.asynccontextmanager
async def _stages(pipeline: Path, options: dict[str, Any]) -> AsyncIterator[StageRuntime]:
    runtime = StageRuntime(
        load_pipeline(pipeline),
        ledger=ResourceLedger(name="retained"),
        events=EventBus(),
        topology=options["topology"],
        selection=options["selection"],
    )
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.close()


def _worker_pipeline(tmp_path: Path, manifest: Path) -> Path:
    return write_pipeline(tmp_path / "worker.yaml", StageSpec(manifest, max_io="1MiB"))


def _client(runtime: StageRuntime) -> GraphStageClient:
    stage = runtime.stages[0]
    assert isinstance(stage, GraphStage)
    assert isinstance(stage.client, GraphStageClient)
    return stage.client


def _b(value: float) -> np.ndarray:
    return np.full(N, value, np.float32)


async def _settled(client: GraphStageClient) -> int:
    """The input buffers the controller still keeps once the worker's acks have arrived."""
    channel = client._channel
    assert channel is not None
    for _ in range(100):
        await asyncio.sleep(0.01)
        if channel.retained_count == len(client.retained_inputs):
            break
    return channel.retained_count


def test_a_retained_input_is_copied_once_and_read_in_place_after(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    async def scenario() -> None:
        async with _stages(_worker_pipeline(tmp_path, add_manifest), options) as runtime:
            client = _client(runtime)
            key = RequestKey("r1")
            a = np.arange(N, dtype=np.float32)
            copied = []
            for step in range(3):
                result = await client.call(key, {"a": a, "b": _b(step)}, retain=("a",))
                np.testing.assert_array_equal(result.outputs["c"], a + step)
                copied.append(result.copied_bytes)
                assert client.acknowledge(key)
            # The first call copies both inputs; the next ones only ``b``.
            assert copied == [2 * NBYTES, NBYTES, NBYTES]
            assert client.retained_inputs == ("a",)
            assert await _settled(client) == 1
            # A changed array under the same name is copied, and the old slot goes.
            changed = a * 2
            result = await client.call(key, {"a": changed, "b": _b(1)}, retain=("a",))
            np.testing.assert_array_equal(result.outputs["c"], changed + 1)
            assert result.copied_bytes == 2 * NBYTES
            client.acknowledge(key)
            assert await _settled(client) == 1
            # The same array passed without ``retain`` is copied, and its kept slot freed.
            result = await client.call(key, {"a": changed, "b": _b(1)})
            assert result.copied_bytes == 2 * NBYTES
            client.acknowledge(key)
            assert client.retained_inputs == ()
            assert await _settled(client) == 0

    asyncio.run(scenario())


def test_the_kept_slot_goes_at_request_end_cancel_and_another_request(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    async def scenario() -> None:
        async with _stages(_worker_pipeline(tmp_path, add_manifest), options) as runtime:
            client = _client(runtime)
            baseline = process_retained()
            a = np.ones(N, np.float32)
            # The request ends: the orchestrator cancels its key on every stage.
            await client.call(RequestKey("r1"), {"a": a, "b": _b(1)}, retain=("a",))
            client.acknowledge(RequestKey("r1"))
            await client.cancel(RequestKey("r1"))
            assert client.retained_inputs == ()
            assert await _settled(client) == 0
            assert process_retained() == baseline
            # Cancelled while its result is still held.
            await client.call(RequestKey("r2"), {"a": a, "b": _b(1)}, retain=("a",))
            await client.cancel(RequestKey("r2"))
            assert client.retained_inputs == ()
            assert await _settled(client) == 0
            assert process_retained() == baseline
            # Another request's call frees what the first kept; the stage stays usable.
            await client.call(RequestKey("r3"), {"a": a, "b": _b(1)}, retain=("a",))
            client.acknowledge(RequestKey("r3"))
            result = await client.call(RequestKey("r4"), {"a": a, "b": _b(2)})
            assert result.copied_bytes == 2 * NBYTES
            client.acknowledge(RequestKey("r4"))
            assert client.retained_inputs == ()
            assert await _settled(client) == 0
            assert client.usable

    asyncio.run(scenario())


def test_the_kept_slot_goes_with_a_dead_worker(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    async def scenario() -> None:
        async with _stages(_worker_pipeline(tmp_path, add_manifest), options) as runtime:
            client = _client(runtime)
            baseline = process_retained()
            key = RequestKey("r1")
            await client.call(key, {"a": np.ones(N, np.float32), "b": _b(1)}, retain=("a",))
            client.acknowledge(key)
            pid = client.record().to_json()["worker"]["pid"]
            os.kill(int(pid), signal.SIGKILL)
            for _ in range(500):
                if not client.usable:
                    break
                await asyncio.sleep(0.01)
            assert not client.usable
            assert client.retained_inputs == ()
            for _ in range(500):
                if process_retained() == baseline:
                    break
                await asyncio.sleep(0.01)
            assert process_retained() == baseline

    asyncio.run(scenario())


@pytest.mark.parametrize("worker", ["ort", "inprocess"])
def test_the_request_context_passes_retain_and_metrics_show_the_single_copy(
    worker: str, add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    async def scenario() -> None:
        pipeline = (
            _worker_pipeline(tmp_path, add_manifest)
            if worker == "ort"
            else write_inprocess_pipeline(tmp_path / "one.yaml", [add_manifest], max_io="1MiB")
        )
        async with _stages(pipeline, options) as runtime:
            request = Request(request_id="r1", inputs=None, key=RequestKey("r1"))
            ctx = RequestContext(request, runtime.stages, runtime.events)
            a = np.arange(N, dtype=np.float32)
            for step in range(3):
                result = await ctx.call(0, {"a": a, "b": _b(step)}, retain=("a",), hold=True)
                np.testing.assert_array_equal(result.outputs["c"], a + step)
                ctx.release(0)
            # Another array under the kept name is copied (and kept in its place).
            changed = a + 10
            result = await ctx.call(0, {"a": changed, "b": _b(0)}, retain=("a",), hold=True)
            np.testing.assert_array_equal(result.outputs["c"], changed)
            ctx.release(0)
            copied = [entry.copied_bytes for entry in request.stage_metrics]
            assert copied == [2 * NBYTES, NBYTES, NBYTES, 2 * NBYTES]
            client = runtime.stages[0].client  # type: ignore[union-attr]
            assert isinstance(client, GraphStageClient | InProcessGraphClient)
            assert client.retained_inputs == ("a",)
            await runtime.stages[0].cancel(request.key)
            assert client.retained_inputs == ()

    asyncio.run(scenario())


@pytest.fixture(scope="module")
def loop_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.workers.support import make_loop_bundle

    return make_loop_bundle(tmp_path_factory.mktemp("loop"))


def test_cancelling_an_active_call_on_a_kept_slot_retires_the_worker_and_frees_it(
    loop_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    from tests.runtime.engine.support import ENDLESS_STEPS, process_gone, wait_busy

    async def scenario() -> None:
        pipeline = write_pipeline(tmp_path / "loop.yaml", StageSpec(loop_manifest, max_io="4MiB"))
        async with _stages(pipeline, options) as runtime:
            client = _client(runtime)
            baseline = process_retained()
            with np.load(loop_manifest.parent / "inputs.npz", allow_pickle=False) as archive:
                x = archive["x"]
            key = RequestKey("r1")
            first = await client.call(key, {"x": x, "n": np.array(1, np.int64)}, retain=("x",))
            assert first.copied_bytes == x.nbytes
            client.acknowledge(key)
            assert client.retained_inputs == ("x",)
            pid = int(client.record().to_json()["worker"]["pid"])
            call = asyncio.ensure_future(
                client.call(key, {"x": x, "n": np.array(ENDLESS_STEPS, np.int64)}, retain=("x",))
            )
            await asyncio.to_thread(wait_busy, pid)
            await client.cancel(key)
            with pytest.raises(Exception, match="cancelled"):
                await call
            assert client.retained_inputs == ()
            assert not client.usable
            for _ in range(500):
                if process_gone(pid) and process_retained() == baseline:
                    break
                await asyncio.sleep(0.01)
            assert process_gone(pid)
            assert process_retained() == baseline

    asyncio.run(scenario())


def test_a_retained_input_without_room_in_the_arena_is_copied_each_call(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    """The arena holds two calls' inputs; what does not fit goes the way it went before
    arenas (inline in the frame, for these sizes), so nothing is kept and every call sends
    it again (the results stay right)."""

    async def scenario() -> None:
        async with _stages(_worker_pipeline(tmp_path, add_manifest), options) as runtime:
            client = _client(runtime)
            channel = client._channel
            assert channel is not None
            arena = channel.arena(client.name)
            assert arena is not None
            # Fill the arena so no slot is free for this call's inputs.
            filler = arena.allocate(arena.size)
            assert filler is not None
            try:
                key = RequestKey("r1")
                a = np.arange(N, dtype=np.float32)
                for step in range(2):
                    result = await client.call(key, {"a": a, "b": _b(step)}, retain=("a",))
                    np.testing.assert_array_equal(result.outputs["c"], a + step)
                    # Inline in the frame: no shared-memory copy counted, and nothing pinned.
                    assert result.copied_bytes == 0
                    assert arena.retained_count == 1  # the filler alone
                    client.acknowledge(key)
                assert client.retained_inputs == ()
            finally:
                arena.acknowledge(filler[0].generation)
            await client.cancel(RequestKey("r1"))
            assert await _settled(client) == 0

    asyncio.run(scenario())
