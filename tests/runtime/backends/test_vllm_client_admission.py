"""The vLLM stage client's checks before anything starts (no vLLM needed).

Admission, the demand floor and the route are all decided before a process exists; a
refusal leaves no process, no reservation and no temporary directory behind.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import tempfile
from pathlib import Path

import pytest

from runtime.backends import vllm_client
from runtime.backends.vllm_client import (
    VllmRoute,
    VllmStageClient,
    VllmStageSpec,
    engine_floor_bytes,
    start_vllm_stage,
    tree_shm_paths,
)
from runtime.contracts import RequestKey
from runtime.contracts.llm_messages import EngineArgs, SamplingSpec
from runtime.errors import AdmissionRefused, ConfigError, StageRetired
from runtime.host import RouteError
from runtime.ledger import ResourceLedger

GiB = 1 << 30
MiB = 1 << 20


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 3000)
    return model


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Records every worker the client starts (the real spawn still runs)."""
    calls: list[object] = []
    real = vllm_client.spawn_worker

    def spy(spec: object, name: str) -> object:
        calls.append(spec)
        return real(spec, name)  # type: ignore[arg-type]

    monkeypatch.setattr(vllm_client, "spawn_worker", spy)
    return calls


def _tmpdirs() -> set[str]:
    return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("oe-vllm-")}


def _spec(model_dir: Path, demand: int, **route: str) -> VllmStageSpec:
    return VllmStageSpec(
        name="llm",
        model_dir=model_dir,
        engine_args=EngineArgs(kv_cache_memory_bytes=64 * MiB),
        route=VllmRoute(**route),
        demands={"machine:ram": demand},
    )


def test_a_demand_above_capacity_is_refused_before_the_worker_starts(
    model_dir: Path, spawned: list[object]
) -> None:
    ledger = ResourceLedger({"machine:ram": 1 * GiB}, name="test")
    before = _tmpdirs()
    with pytest.raises(AdmissionRefused) as caught:
        asyncio.run(start_vllm_stage(_spec(model_dir, 2 * GiB), ledger=ledger, owner="t"))
    assert caught.value.constraint == "machine:ram"
    assert caught.value.needed == 2 * GiB
    assert caught.value.free == 1 * GiB
    assert caught.value.stages == ("llm",)
    assert spawned == []
    assert ledger.snapshot().is_empty
    assert _tmpdirs() == before


def test_a_demand_below_the_weights_plus_kv_cache_is_refused(
    model_dir: Path, spawned: list[object]
) -> None:
    ledger = ResourceLedger({"machine:ram": 8 * GiB}, name="test")
    with pytest.raises(ConfigError, match="less than its weights plus KV cache") as caught:
        asyncio.run(start_vllm_stage(_spec(model_dir, 32 * MiB), ledger=ledger, owner="t"))
    assert caught.value.key == "resource_budget.demands"
    assert spawned == []
    assert ledger.snapshot().is_empty


def test_a_missing_environment_unwinds_the_reservation(
    model_dir: Path, spawned: list[object], tmp_path: Path
) -> None:
    ledger = ResourceLedger({"machine:ram": 8 * GiB}, name="test")
    before = _tmpdirs()
    with pytest.raises(RouteError, match="omni-edge env create nothing-here"):
        asyncio.run(
            start_vllm_stage(
                _spec(model_dir, 1 * GiB, interpreter="env:nothing-here"),
                ledger=ledger,
                owner="t",
                env_dir=tmp_path / "envs",
            )
        )
    assert spawned == []
    assert ledger.snapshot().is_empty
    assert _tmpdirs() == before


def test_requests_before_start_are_refused(model_dir: Path) -> None:
    ledger = ResourceLedger({"machine:ram": 8 * GiB}, name="test")
    spec = _spec(model_dir, 1 * GiB)
    plan = ledger.reserve_plan("t", {"llm": dict(spec.demands)})
    client = VllmStageClient(spec, ledger=ledger, reservation=plan.stages["llm"], generation=1)

    async def scenario() -> None:
        with pytest.raises(StageRetired, match="llm is not running"):
            await client.generate(RequestKey("r"), "hi", SamplingSpec())
        assert not await client.abort(RequestKey("r"))
        await client.close()
        await client.close()

    asyncio.run(scenario())
    assert client.max_num_seqs == 8
    assert ledger.snapshot().is_empty
    assert client.record().to_json()["reservation"] is None
    # What the studio and the server read: the model folder, no worker's figures yet.
    record = client.record()
    assert (record.model_dir, record.load_s, record.worker_rss_bytes) == (model_dir, None, None)
    assert (record.ep, record.usable, record.placement) == ("cpu", False, None)


def test_engine_floor_counts_weights_and_kv_cache(model_dir: Path) -> None:
    (model_dir / "more.bin").write_bytes(b"\0" * 500)
    (model_dir / "tokenizer.json").write_bytes(b"\0" * 10_000)
    args = EngineArgs(kv_cache_memory_bytes=1000)
    assert engine_floor_bytes(model_dir, args) == 3000 + 500 + 1000
    assert engine_floor_bytes(model_dir, EngineArgs()) == 3500
    assert engine_floor_bytes(model_dir / "absent", args) == 1000


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="POSIX shared memory lives in /dev/shm")
def test_tree_shm_paths_sees_mapped_segments() -> None:
    path = Path("/dev/shm") / f"oe-test-{os.getpid()}-map"
    path.write_bytes(b"\0" * 4096)
    try:
        with path.open("r+b") as handle, mmap.mmap(handle.fileno(), 4096):
            assert str(path) in tree_shm_paths(os.getpid())
        assert str(path) not in tree_shm_paths(os.getpid())
    finally:
        path.unlink()
    assert tree_shm_paths(2**22 + 12345) == set()
