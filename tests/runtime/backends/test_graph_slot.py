"""Both graph clients keep one slot's rules: the worker's and the in-process one, side by side.

One call and one retained result hold the slot; a second call is refused with the same
message; acknowledging frees it; cancelling a retained result keeps the stage, cancelling an
active call fences it and retires the stage; closing settles the reservation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import numpy as np
import pytest

from runtime.artifacts import verify_bundle
from runtime.backends.graph import GraphStageClient, GraphStageSpec, GraphTimeouts
from runtime.backends.inprocess import InProcessGraphClient
from runtime.config import RouteConfig
from runtime.contracts import RequestKey
from runtime.errors import RequestCancelled, ResourceUnavailable, StageRetired
from runtime.ledger import ResourceLedger
from tests.workers.support import loop_reference, make_loop_bundle

if TYPE_CHECKING:
    from pathlib import Path

MiB = 1 << 20
#: A step count no test waits for: only cancellation ends such a call.
ENDLESS_STEPS = 10**12
CLIENTS = ("inprocess", "worker")


def _busy(holder: str) -> str:
    return (
        f"stage-0 is busy with {holder}: one call and one retained result at a time; "
        "acknowledge or cancel it first"
    )


@pytest.fixture(scope="module")
def loop_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_loop_bundle(tmp_path_factory.mktemp("loop"))


def _client(
    kind: str, manifest: Path
) -> tuple[GraphStageClient | InProcessGraphClient, ResourceLedger]:
    worker = "inprocess" if kind == "inprocess" else "ort"
    route = RouteConfig("here", "bundled", worker, "cpu", "posix", 4 * MiB)
    spec = GraphStageSpec(name="stage-0", bundle=verify_bundle(manifest), route=route)
    ledger = ResourceLedger(name=f"slot-{kind}")
    ledger.declare_capacities({"machine:ram": 1 << 30})
    reservation = ledger.reserve_plan("test", {"stage-0": {"machine:ram": 64 * MiB}})
    stage = reservation.stages["stage-0"]
    if kind == "inprocess":
        return InProcessGraphClient(spec, ledger=ledger, reservation=stage, generation=1), ledger
    return GraphStageClient(spec, ledger=ledger, reservation=stage, generation=1), ledger


def _slot(client: GraphStageClient | InProcessGraphClient) -> RequestKey | None:
    """The slot's holder, read afresh (a property mypy would otherwise narrow)."""
    return client.slot


def _state(
    client: GraphStageClient | InProcessGraphClient,
) -> tuple[RequestKey | None, tuple[str, ...], bool]:
    """The slot's holder, the inputs kept and whether the stage is usable, read afresh."""
    return client.slot, client.retained_inputs, client.usable


def _inputs(manifest: Path, steps: int) -> dict[str, np.ndarray]:
    with np.load(manifest.parent / "inputs.npz", allow_pickle=False) as archive:
        return {"x": archive["x"], "n": np.array(steps, np.int64)}


@pytest.mark.parametrize("kind", CLIENTS)
def test_both_graph_clients_hold_acknowledge_and_cancel_one_slot_alike(
    kind: str, loop_manifest: Path
) -> None:
    client, ledger = _client(kind, loop_manifest)
    short = _inputs(loop_manifest, 1)

    async def scenario() -> None:
        await client.start()
        first = RequestKey("first")
        result = await client.call(first, short, retain=("x",))
        np.testing.assert_allclose(
            result.outputs["y"], loop_reference(short["x"], 1), rtol=1e-4, atol=1e-5
        )
        assert _slot(client) == first
        assert client.retained_inputs == ("x",)
        with pytest.raises(ResourceUnavailable) as busy:
            await client.call(RequestKey("second"), short)
        assert str(busy.value) == _busy("first")
        # Only the holder's own key, once its call has returned, frees the slot.
        assert client.acknowledge(first.fenced()) is False
        assert client.acknowledge(RequestKey("second")) is False
        assert client.acknowledge(first) is True
        assert client.acknowledge(first) is False
        assert _slot(client) is None
        # The kept input outlives the acknowledgement; the request's end (cancel) drops it.
        assert client.retained_inputs == ("x",)
        await client.call(first, short, retain=("x",))
        await client.cancel(first)
        assert _state(client) == (None, (), True)
        # A cancel of a request that holds nothing changes nothing.
        await client.cancel(RequestKey("nobody"))
        assert _state(client)[2]

        active = RequestKey("active")
        call = asyncio.create_task(client.call(active, _inputs(loop_manifest, ENDLESS_STEPS)))
        while _slot(client) is None:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        assert not call.done()
        with pytest.raises(ResourceUnavailable) as busy:
            await client.call(RequestKey("second"), short)
        assert str(busy.value) == _busy("active")
        assert client.acknowledge(active) is False  # still running
        await client.cancel(active)
        with pytest.raises(RequestCancelled, match=r"^stage-0: call cancelled$"):
            await call
        assert _slot(client) is None
        assert not _state(client)[2]
        assert isinstance(client.failure, StageRetired)
        assert "retired after an active call was cancelled" in str(client.failure)
        with pytest.raises(StageRetired, match="recreate the pipeline"):
            await client.call(RequestKey("later"), short)
        await client.close()
        assert client.record().to_json()["reservation"] is None

    asyncio.run(scenario())
    # The cancelled call stopped within the deadline: nothing stays charged.
    assert ledger.snapshot().is_empty


@pytest.mark.parametrize("kind", CLIENTS)
def test_closing_with_a_retained_result_frees_the_slot_and_settles_the_reservation(
    kind: str, loop_manifest: Path
) -> None:
    client, ledger = _client(kind, loop_manifest)

    async def scenario() -> None:
        await client.start()
        assert not ledger.snapshot().is_empty
        key = RequestKey("held")
        await client.call(key, _inputs(loop_manifest, 1), retain=("x",))
        assert _slot(client) == key
        await client.close()
        await client.close()
        assert _state(client) == (None, (), False)
        assert client.acknowledge(key) is False
        with pytest.raises(StageRetired, match="not running"):
            await client.call(RequestKey("after"), _inputs(loop_manifest, 1))

    asyncio.run(scenario())
    assert ledger.snapshot().is_empty


#: A loop whose every step is one MatMul of a quarter of a second or more on two cores: a
#: cancelled call is still inside its step when the retirement's deadline (none) has passed.
WIDE_STEP = 2560


@pytest.fixture(scope="module")
def wide_loop_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_loop_bundle(tmp_path_factory.mktemp("wide"), rows=WIDE_STEP, width=WIDE_STEP)


def test_an_in_process_call_running_past_its_deadline_keeps_the_reservation_until_it_ends(
    wide_loop_manifest: Path, caplog: pytest.LogCaptureFixture
) -> None:
    loop_manifest = wide_loop_manifest
    route = RouteConfig("here", "bundled", "inprocess", "cpu", "posix", 64 * MiB)
    spec = GraphStageSpec(name="stage-0", bundle=verify_bundle(loop_manifest), route=route)
    ledger = ResourceLedger(name="slot-quarantine")
    ledger.declare_capacities({"machine:ram": 1 << 30})
    plan = ledger.reserve_plan("test", {"stage-0": {"machine:ram": 64 * MiB}})
    # No time to stop: the retirement settles while the call is still between two nodes.
    client = InProcessGraphClient(
        spec,
        ledger=ledger,
        reservation=plan.stages["stage-0"],
        generation=1,
        timeouts=GraphTimeouts(cancel_retire_s=0.0),
    )

    async def scenario() -> None:
        await client.start()
        # One step's time on this machine now: the cancel lands in the middle of the first.
        started = time.monotonic()
        await client.call(RequestKey("one-step"), _inputs(loop_manifest, 1))
        step_s = time.monotonic() - started
        assert client.acknowledge(RequestKey("one-step"))
        key = RequestKey("endless")
        call = asyncio.create_task(client.call(key, _inputs(loop_manifest, ENDLESS_STEPS)))
        while _slot(client) is None:
            await asyncio.sleep(0.01)
        await asyncio.sleep(step_s / 3)
        await client.cancel(key)
        with pytest.raises(RequestCancelled):
            await call
        # The call stops after the step it is in; its end releases the reservation.
        for _ in range(1000):
            if ledger.snapshot().is_empty:
                break
            await asyncio.sleep(0.01)
        await client.close()

    with caplog.at_level(logging.INFO, logger="omni.backends.inprocess"):
        asyncio.run(scenario())
    assert ledger.snapshot().is_empty
    messages = [record.getMessage() for record in caplog.records]
    assert (
        "an in-process call of stage-0 was still running 0.0 s after it was told to stop"
        in messages
    )
    assert "stage-0: the cancelled in-process call ended; reservation released" in messages
