"""The in-process graph client checks what the worker checks, on the bytes it loads."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import numpy as np
import pytest

from runtime.artifacts import verify_bundle
from runtime.backends.graph import GraphStageSpec
from runtime.backends.inprocess import InProcessGraphClient
from runtime.config import RouteConfig
from runtime.contracts import RequestKey
from runtime.errors import ConfigError, StageRetired, VerificationError
from runtime.ledger import ResourceLedger
from tests.helpers.onnx_graphs import make_bundle

if TYPE_CHECKING:
    from pathlib import Path

MiB = 1 << 20


def _client(
    manifest: Path, *, max_io_bytes: int = MiB
) -> tuple[InProcessGraphClient, ResourceLedger]:
    route = RouteConfig("here", "bundled", "inprocess", "cpu", "posix", max_io_bytes)
    spec = GraphStageSpec(name="stage-0", bundle=verify_bundle(manifest), route=route)
    ledger = ResourceLedger(name="inprocess-client")
    ledger.declare_capacities({"machine:ram": 1 << 30})
    plan = ledger.reserve_plan("test", {"stage-0": {"machine:ram": 64 * MiB}})
    client = InProcessGraphClient(
        spec, ledger=ledger, reservation=plan.stages["stage-0"], generation=1
    )
    return client, ledger


def test_a_graph_changed_after_verification_is_refused_when_loaded(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path, kind="add", name="add")
    client, ledger = _client(manifest)
    graph = manifest.parent / "add.onnx"
    graph.write_bytes(graph.read_bytes() + b"\0")

    async def scenario() -> None:
        with pytest.raises(VerificationError, match="hash_mismatch") as caught:
            await client.start()
        assert caught.value.code == "hash_mismatch"
        assert not client.usable
        with pytest.raises(StageRetired, match="stage-0 is not running"):
            await client.call(RequestKey("r"), {})
        await client.close()

    asyncio.run(scenario())
    assert ledger.snapshot().is_empty


def test_a_bucket_above_max_io_bytes_is_refused_at_start(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path, kind="add", name="add")
    client, ledger = _client(manifest, max_io_bytes=1024)

    async def scenario() -> None:
        with pytest.raises(ConfigError, match=r"too_large: .* max_io_bytes = 1024"):
            await client.start()
        await client.close()

    asyncio.run(scenario())
    assert ledger.snapshot().is_empty


def test_a_closed_client_refuses_calls_and_releases_its_reservation(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path, kind="add", name="add")
    client, ledger = _client(manifest)

    async def scenario() -> None:
        started = await client.start()
        assert started.worker is not None
        assert started.worker.in_process
        assert started.worker_rss_bytes is None  # the controller's memory is not the stage's
        record = started.to_json()
        assert record["worker"]["in_process"] is True
        assert record["reservation"]["amounts"] == {"machine:ram": 64 * MiB}
        inputs = client.example_inputs()
        result = await client.call(RequestKey("r"), inputs)
        np.testing.assert_allclose(result.outputs["c"], inputs["a"] + inputs["b"])
        await client.close()
        await client.close()
        assert client.slot is None
        with pytest.raises(StageRetired, match="not running"):
            await client.call(RequestKey("s"), inputs)
        closed = client.record().to_json()
        assert closed["reservation"] is None
        assert (closed["usable"], [spec["name"] for spec in closed["inputs"]]) == (
            False,
            ["a", "b"],
        )

    asyncio.run(scenario())
    assert ledger.snapshot().is_empty
