"""The studio's description of a pipeline reads each file once: the pipeline file is parsed
once and each bundle hashed once, and loading what was described hashes nothing again."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import runtime.artifacts
import runtime.config.loader
from app.presenters import describe_pipeline
from runtime.devices import DeviceSelection, discover_topology
from runtime.engine.stage_runtime import StageRuntime
from runtime.events import EventBus
from runtime.ledger import ResourceLedger


def _count(monkeypatch: pytest.MonkeyPatch) -> tuple[Counter[Path], Counter[str]]:
    hashed: Counter[Path] = Counter()
    parsed: Counter[str] = Counter()
    hash_and_size = runtime.artifacts._hash_and_size
    parse = runtime.config.loader._parse

    def counted_hash(path: Path, *args: Any, **kwargs: Any) -> tuple[str, int]:
        hashed[Path(path).resolve()] += 1
        return hash_and_size(path, *args, **kwargs)

    def counted_parse(text: str, **kwargs: Any) -> Any:
        parsed[str(kwargs.get("source"))] += 1
        return parse(text, **kwargs)

    monkeypatch.setattr(runtime.artifacts, "_hash_and_size", counted_hash)
    monkeypatch.setattr(runtime.config.loader, "_parse", counted_parse)
    return hashed, parsed


@pytest.fixture(autouse=True)
def _fine_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test folders are on file systems that stamp changes to the nanosecond (tmpfs,
    ext4): a tick of 0.2 s stands in for FAT's 2 s, which would make each settle wait 2 s."""
    monkeypatch.setattr(runtime.artifacts, "STAMP_GRANULARITY_S", 0.2)


def _settle(folder: Path) -> None:
    """Wait until every file under ``folder`` last changed more than the file system's clock
    tick ago (a report of files changed more recently never stands for hashing them)."""
    newest = max(
        max(path.stat().st_mtime_ns, path.stat().st_ctime_ns)
        for path in folder.rglob("*")
        if path.is_file()
    )
    wait = newest / 1e9 + runtime.artifacts.STAMP_GRANULARITY_S + 0.05 - time.time()
    if wait > 0:
        time.sleep(wait)


def _bundle_files(manifest: Path) -> set[Path]:
    bundle = runtime.artifacts.verify_bundle(manifest)
    return {bundle.path(name).resolve() for name in bundle.manifest.files}


@pytest.mark.parametrize("opened", ["pipelines/mlp-chain.yaml", "bundles/add/manifest.json"])
def test_describing_then_loading_hashes_each_bundle_once_and_parses_once(
    opened: str, demo_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topology = discover_topology()
    path = demo_root / opened
    _settle(demo_root / "bundles")
    hashed, parsed = _count(monkeypatch)
    described = describe_pipeline(path, topology, DeviceSelection())
    assert described.plan is not None
    assert described.plan.admitted, described.plan.refusals
    assert described.info.example_inputs  # read from the bundle verified once
    assert list(parsed.values()) == [1]
    hashed_then = dict(hashed)
    files: set[Path] = set()
    for stage in described.config.stages:
        files |= _bundle_files(stage.backend.manifest)
    assert set(hashed_then) == files
    assert set(hashed_then.values()) == {1}
    hashed.clear()  # count loading on its own from here
    parsed.clear()
    ledger = ResourceLedger(name="studio")
    stages = StageRuntime(
        described.config,
        ledger=ledger,
        events=EventBus(),
        topology=topology,
        selection=DeviceSelection(),
        resolution=described.plan.resolution,
    )

    async def start_and_close() -> int:
        await stages.start()
        try:
            return len(stages.clients)
        finally:
            await stages.close()

    assert asyncio.run(start_and_close()) == len(described.config.stages)
    assert not hashed
    assert not parsed
    assert ledger.snapshot().is_empty


def test_the_studio_loads_what_it_described_through_the_session_without_hashing_again(
    demo_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bridge hands the described plan's resolution to ``PipelineSession``: loading the
    opened pipeline through the front door hashes no bundle and parses no file again."""
    from runtime.api import PipelineSession

    topology = discover_topology()
    _settle(demo_root / "bundles")
    hashed, parsed = _count(monkeypatch)
    described = describe_pipeline(
        demo_root / "pipelines/mlp-chain.yaml", topology, DeviceSelection()
    )
    assert described.plan is not None
    hashed.clear()
    parsed.clear()
    ledger = ResourceLedger(name="studio")
    with PipelineSession(
        described.config,
        ledger=ledger,
        topology=topology,
        selection=DeviceSelection(),
        resolution=described.plan.resolution,
    ) as session:  # entering loads
        assert session.usable
        outputs = session.run()
    assert outputs
    assert not hashed
    assert not parsed
    assert ledger.snapshot().is_empty
