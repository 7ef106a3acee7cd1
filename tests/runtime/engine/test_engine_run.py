"""The graph-stage engine end to end: start-up, exact outputs, the handoff, both APIs."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort
import psutil
import pytest

from runtime.adapters.tensor import mlp_handoff
from runtime.api import AsyncOmni, Omni
from runtime.artifacts import verify_bundle
from runtime.contracts import RequestKey
from runtime.events import (
    Event,
    EventBus,
    PipelineLoading,
    PipelineReady,
    StageReady,
    StageStarting,
    StageWorkerUp,
)
from runtime.ledger import ResourceLedger
from tests.helpers.engine import engine_of
from tests.runtime.engine.support import (
    CPU,
    child_pids,
    controller_segments,
    process_gone,
    wait_until,
)

if TYPE_CHECKING:
    from pathlib import Path


def _inputs(bundle: Path) -> dict[str, np.ndarray]:
    with np.load(bundle / "inputs.npz", allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def test_add_starts_reports_its_plan_and_returns_the_exact_sum(
    demo_root: Path, options: dict[str, Any]
) -> None:
    bundle = demo_root / "bundles" / "add"
    ledger = ResourceLedger(name="add")
    events = EventBus()
    seen: list[Event] = []
    events.subscribe(seen.append)
    with Omni(
        demo_root / "pipelines" / "add.yaml", ledger=ledger, events=events, **options
    ) as omni:
        # The load is announced first, then the stage's worker starts, answers and loads.
        assert [type(event) for event in seen] == [
            PipelineLoading,
            StageStarting,
            StageWorkerUp,
            StageReady,
            PipelineReady,
        ]
        (client,) = engine_of(omni).clients
        typed = omni.execution_plan
        plan = typed.to_json()
        (stage,) = plan["stages"]
        assert plan["pipeline"] == "demo_add"
        assert plan["label"] == "B"
        assert stage["stage"] == "stage-0"
        assert stage["backend"] == "external.graph.v1"
        assert stage["usable"] is True
        assert stage["manifest"]["identity"] == verify_bundle(bundle).identity
        placement = stage["placement"]
        assert set(placement["counts"]) == {CPU}
        assert placement["counts"][CPU] == placement["total_nodes"] >= 1
        assert placement["fraction_on_target"] == 1.0
        assert [spec["name"] for spec in stage["inputs"]] == ["a", "b"]
        assert stage["outputs"] == [{"name": "sum", "dtype": "float32", "shape": [1, 1024]}]
        # The worker is a live child of this process, and its stage holds a reservation.
        pid = stage["worker"]["pid"]
        assert pid == client.pid
        assert psutil.Process(pid).ppid() == os.getpid()
        (reservation,) = ledger.snapshot().reservations
        assert reservation.id == stage["reservation"]["id"]
        assert reservation.amounts == {"machine:ram": 128 << 20}
        # The typed record the studio reads says what its JSON says.
        record = typed.stage("stage-0")
        assert record.worker is not None
        assert record.worker.pid == pid
        assert record.reservation is not None
        assert record.reservation.id == reservation.id
        assert record.placement is not None
        assert record.placement.counts == placement["counts"]
        assert (record.route_name, record.ep) == (stage["route"]["name"], stage["route"]["ep"])
        assert (record.load_s, record.warmup_s) == (stage["load_s"], stage["warmup_s"])
        assert record.worker_rss_bytes == stage["worker_rss_bytes"] > 0
        assert typed.worker_pids == (pid,)

        example = _inputs(bundle)
        result = omni.run()
        assert result["sum"].dtype == np.float32
        np.testing.assert_array_equal(result["sum"], example["a"] + example["b"])

        # Other inputs of the same bucket: the same exact arithmetic, not a replayed answer.
        rng = np.random.default_rng(5)
        a, b = (rng.standard_normal((1, 1024)).astype(np.float32) for _ in range(2))
        np.testing.assert_array_equal(omni.run({"a": a, "b": b})["sum"], a + b)
        assert client.pid == pid
    assert process_gone(pid)
    assert ledger.snapshot().is_empty
    assert not child_pids()


def test_mlp_chain_equals_both_graphs_run_in_process(
    demo_root: Path, options: dict[str, Any]
) -> None:
    bundles = demo_root / "bundles"
    x = _inputs(bundles / "mlp-stage0")["x"]
    stage0 = ort.InferenceSession(str(bundles / "mlp-stage0" / "mlp_stage0.onnx"), providers=[CPU])
    stage1 = ort.InferenceSession(str(bundles / "mlp-stage1" / "mlp_stage1.onnx"), providers=[CPU])
    (h,) = stage0.run(["h"], {"x": x})
    (expected,) = stage1.run(["y"], dict(mlp_handoff({"h": h})["tensors"]))

    with Omni(demo_root / "pipelines" / "mlp-chain.yaml", **options) as omni:
        first, second = engine_of(omni).clients
        assert first.pid != second.pid
        result = omni.run()
        metrics = omni.metrics()
    assert set(result) == {"y"}
    assert result["y"].shape == (1, 16)
    np.testing.assert_array_equal(result["y"], expected)
    assert metrics["stages"]["stage-0"]["calls"] == 1
    assert metrics["stages"]["stage-1"]["calls"] == 1
    # Stage 0 moved x (1 KiB) in and h (2 KiB) out; stage 1 moved h in and y (64 B) out.
    assert metrics["stages"]["stage-0"]["bytes_in"] == 1024
    assert metrics["stages"]["stage-0"]["bytes_out"] == 2048
    assert metrics["stages"]["stage-1"]["bytes_out"] == 64


def test_sync_generate_yields_the_final_output_and_frees_the_slot_after_it(
    demo_root: Path, options: dict[str, Any]
) -> None:
    example = _inputs(demo_root / "bundles" / "add")
    with Omni(demo_root / "pipelines" / "add.yaml", **options) as omni:
        (client,) = engine_of(omni).clients
        outputs = []
        for output in omni.generate(request_id="req-sync"):
            # Delivered but not yet acknowledged: the stage still holds the request.
            assert client.slot == RequestKey("req-sync")
            np.testing.assert_array_equal(output.outputs["sum"], example["a"] + example["b"])
            outputs.append(output)
        (output,) = outputs
        assert output.request_id == "req-sync"
        assert output.stage == "stage-0"
        assert output.finished
        # The acknowledgement went to the loop when iteration ended; the loop frees the slot.
        wait_until(lambda: client.slot is None, "the slot freed after the acknowledgement", 5.0)
        (finished,) = omni.metrics()["requests"]
        assert (finished["request_id"], finished["status"]) == ("req-sync", "completed")
        assert [entry["stage"] for entry in finished["stages"]] == ["stage-0"]


def test_async_api_runs_and_generates(demo_root: Path, options: dict[str, Any]) -> None:
    bundles = demo_root / "bundles"
    example = _inputs(bundles / "add")
    ledger = ResourceLedger(name="async")

    async def main() -> tuple[int | None, dict[str, np.ndarray], list[Any]]:
        async with AsyncOmni(
            demo_root / "pipelines" / "add.yaml", ledger=ledger, **options
        ) as omni:
            (client,) = engine_of(omni).clients
            result = await omni.run()
            outputs = [output async for output in omni.generate(request_id="req-async")]
            # The final output's acknowledgement frees the slot once the loop has it.
            for _ in range(500):
                if client.slot is None:
                    break
                await asyncio.sleep(0.01)
            assert client.slot is None
            return client.pid, result, outputs

    pid, result, outputs = asyncio.run(main())
    np.testing.assert_array_equal(result["sum"], example["a"] + example["b"])
    (output,) = outputs
    assert output.request_id == "req-async"
    assert output.finished
    np.testing.assert_array_equal(output.outputs["sum"], example["a"] + example["b"])
    assert pid is not None
    assert process_gone(pid)
    assert ledger.snapshot().is_empty


def _run_then_fail(omni: Omni) -> None:
    with omni:
        omni.run()
        raise RuntimeError("leaving the block")


def test_context_manager_closes_everything_even_when_the_block_raises(
    demo_root: Path, options: dict[str, Any]
) -> None:
    ledger = ResourceLedger(name="chain")
    omni = Omni(demo_root / "pipelines" / "mlp-chain.yaml", ledger=ledger, **options)
    pids = [client.pid for client in engine_of(omni).clients]
    assert len(ledger.snapshot().reservations) == 2
    assert set(pids) <= child_pids()
    with pytest.raises(RuntimeError, match="leaving the block"):
        _run_then_fail(omni)
    assert not engine_of(omni).running
    assert all(pid is not None and process_gone(pid) for pid in pids)
    assert not child_pids()
    assert ledger.snapshot().is_empty
    assert not controller_segments()
