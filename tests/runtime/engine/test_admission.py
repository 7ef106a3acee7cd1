"""One admission: ``plan`` reports every refusal of :func:`runtime.admission.resolve`, loading
raises the first one's error, so the two never disagree; and a bundle is hashed once per load.

Each bad pipeline below is planned, then loaded by a real :class:`StageRuntime` (the one the
orchestrator drives): the plan's first refusal is exactly what loading raises, and the
refused load leaves no process and no reservation behind.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import time
from collections import Counter
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import pytest

import runtime.artifacts
import runtime.config.loader
from runtime.admission import GraphPlacement, resolve
from runtime.config import load_pipeline
from runtime.devices import ConstraintInfo, DeviceSelection, Topology
from runtime.engine.stage_runtime import StageRuntime
from runtime.errors import (
    AdmissionRefused,
    ConfigError,
    DeviceExcluded,
    OmniError,
    UsageError,
    VerificationError,
)
from runtime.events import EventBus
from runtime.host import RouteError
from runtime.ledger import ResourceLedger
from tests.runtime.engine.support import StageSpec, child_pids, write_pipeline

if TYPE_CHECKING:
    from collections.abc import Callable

GiB = 1 << 30
RAM = "machine:ram"


@dataclasses.dataclass(frozen=True)
class Case:
    """A pipeline that cannot load, on the machine and selection it is checked against."""

    path: Path
    topology: Topology
    selection: DeviceSelection


def _machine_with_ram(machine: Topology, capacity: int) -> Topology:
    info = machine.constraints[RAM]
    constraints = dict(machine.constraints)
    constraints[RAM] = ConstraintInfo(RAM, capacity, capacity, info.devices)
    return dataclasses.replace(
        machine, constraints=MappingProxyType(constraints), source="small-machine.yaml"
    )


def _copy_bundle(demo_root: Path, tmp_path: Path, name: str = "add") -> Path:
    target = tmp_path / f"bundle-{name}"
    shutil.copytree(demo_root / "bundles" / name, target)
    return target / "manifest.json"


def _graph(tmp_path: Path, manifest: Path, **spec: Any) -> Path:
    return write_pipeline(tmp_path / "bad.yaml", StageSpec(manifest, **spec), name="bad")


def _llm(tmp_path: Path, backend: str, demand: str = "3GiB") -> Path:
    path = tmp_path / "llm.yaml"
    path.write_text(
        "pipeline: llm\nasync_chunk: false\nstages:\n  - stage_id: 0\n    backend:\n"
        f"{backend}"
        "    resource_budget:\n"
        "      capacities: {machine:ram: 64GiB}\n"
        f"      demands: {{machine:ram: {demand}}}\n",
        encoding="utf-8",
    )
    return path


def _excluded_device(demo_root: Path, tmp_path: Path, machine: Topology) -> Case:
    path = _graph(tmp_path, demo_root / "bundles" / "add" / "manifest.json")
    cpu = machine.devices[0].physical_id
    return Case(path, machine, DeviceSelection().exclude(machine, cpu))


def _missing_file(demo_root: Path, tmp_path: Path, machine: Topology) -> Case:
    manifest = _copy_bundle(demo_root, tmp_path)
    (manifest.parent / "inputs.npz").unlink()
    return Case(_graph(tmp_path, manifest), machine, DeviceSelection())


def _corrupt_and_missing(demo_root: Path, tmp_path: Path, machine: Topology) -> Case:
    """Two broken files: the plan lists both, loading raises the one it meets first."""
    manifest = _copy_bundle(demo_root, tmp_path)
    files = sorted(p for p in manifest.parent.iterdir() if p.name != "manifest.json")
    files[0].write_bytes(files[0].read_bytes() + b"\0")
    files[-1].unlink()
    return Case(_graph(tmp_path, manifest), machine, DeviceSelection())


def _over_its_own_capacity(demo_root: Path, tmp_path: Path, machine: Topology) -> Case:
    manifest = demo_root / "bundles" / "add" / "manifest.json"
    path = _graph(tmp_path, manifest, capacity="256MiB", demand="512MiB")
    return Case(path, machine, DeviceSelection())


def _over_the_machine(demo_root: Path, tmp_path: Path, machine: Topology) -> Case:
    manifest = demo_root / "bundles" / "add" / "manifest.json"
    path = _graph(tmp_path, manifest, capacity="6GiB", demand="3GiB")
    return Case(path, _machine_with_ram(machine, 2 * GiB), DeviceSelection())


def _everything_wrong(demo_root: Path, tmp_path: Path, machine: Topology) -> Case:
    """A device refusal, a broken bundle and a capacity refusal at once."""
    manifest = _copy_bundle(demo_root, tmp_path)
    (manifest.parent / "inputs.npz").unlink()
    path = _graph(tmp_path, manifest, capacity="256MiB", demand="512MiB")
    cpu = machine.devices[0].physical_id
    return Case(path, machine, DeviceSelection().exclude(machine, cpu))


def _missing_environment(demo_root: Path, tmp_path: Path, machine: Topology) -> Case:
    backend = (
        "      name: native.vllm.v1\n      model: tiny\n"
        "      route: {interpreter: 'env:not-created'}\n"
    )
    return Case(_llm(tmp_path, backend), machine, DeviceSelection())


def _below_the_weights(demo_root: Path, tmp_path: Path, machine: Topology) -> Case:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}", encoding="utf-8")
    with (model / "model.safetensors").open("wb") as weights:
        weights.truncate(2 * GiB)  # sparse: its size counts, not its disk
    backend = (
        "      name: native.vllm.v1\n      model: model\n"
        "      engine: {kv_cache_memory_bytes: 1GiB}\n"
        "      route: {interpreter: bundled}\n"
    )
    return Case(_llm(tmp_path, backend, demand="2GiB"), machine, DeviceSelection())


def _remote_without_key(demo_root: Path, tmp_path: Path, machine: Topology) -> Case:
    assert "OMNI_TEST_UNSET_KEY" not in os.environ
    backend = (
        "      name: native.vllm.v1\n"
        "      route: {url: 'http://127.0.0.1:9/v1', model: m, api_key_env: OMNI_TEST_UNSET_KEY}\n"
    )
    return Case(_llm(tmp_path, backend, demand="0"), machine, DeviceSelection())


BAD: dict[str, tuple[Callable[[Path, Path, Topology], Case], type[OmniError], str]] = {
    "excluded device": (_excluded_device, DeviceExcluded, "device"),
    "missing bundle file": (_missing_file, VerificationError, "bundle"),
    "two broken files": (_corrupt_and_missing, VerificationError, "bundle"),
    "over its own capacity": (_over_its_own_capacity, AdmissionRefused, "capacity"),
    "over the machine's memory": (_over_the_machine, AdmissionRefused, "capacity"),
    "everything wrong": (_everything_wrong, DeviceExcluded, "device"),
    "missing environment": (_missing_environment, RouteError, "route"),
    "below the weights": (_below_the_weights, ConfigError, "model"),
    "remote without its key": (_remote_without_key, ConfigError, "route"),
}


def _load(
    config: Any,
    case: Case,
    ledger: ResourceLedger,
    check: Callable[[StageRuntime], None] = lambda stages: None,
    **extra: Any,
) -> None:
    """Start every stage of ``config`` (raising what loading raises), ``check`` the started
    stages, close them, all on one event loop."""
    stages = StageRuntime(
        config,
        ledger=ledger,
        events=EventBus(),
        topology=case.topology,
        selection=case.selection,
        env_dir=case.path.parent / "envs",
        **extra,
    )

    async def start_and_close() -> None:
        await stages.start()
        try:
            check(stages)
        finally:
            await stages.close()

    asyncio.run(start_and_close())


@pytest.mark.parametrize("name", list(BAD))
def test_the_plans_first_refusal_is_what_loading_raises(
    name: str,
    demo_root: Path,
    tmp_path: Path,
    machine: Topology,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OMNI_TEST_UNSET_KEY", raising=False)
    make, error_type, kind = BAD[name]
    case = make(demo_root, tmp_path, machine)
    config = load_pipeline(case.path)
    resolution = resolve(config, case.topology, case.selection, env_dir=case.path.parent / "envs")
    assert not resolution.admitted
    first = resolution.refusals[0]
    assert (type(first.error), first.kind) == (error_type, kind)
    assert first.text == first.prefix + first.message
    children = child_pids()
    ledger = ResourceLedger(name="admission")
    with pytest.raises(OmniError) as caught:
        _load(config, case, ledger)
    assert type(caught.value) is error_type
    assert str(caught.value) == first.message
    assert child_pids() == children
    assert not ledger.snapshot().reservations
    with pytest.raises(error_type) as again:
        resolution.raise_first()
    assert again.value is first.error


def test_plan_lists_every_refusal_in_the_order_loading_meets_them(
    demo_root: Path, tmp_path: Path, machine: Topology
) -> None:
    from runtime.planning import plan_pipeline

    case = _everything_wrong(demo_root, tmp_path, machine)
    plan = plan_pipeline(case.path, topology=case.topology, selection=case.selection)
    assert [refusal.kind for refusal in plan.refused] == ["device", "bundle", "capacity"]
    device, bundle, capacity = plan.refusals
    assert device.startswith("device: ")
    assert bundle.startswith("stage-0: ")
    assert "inputs.npz" in bundle
    assert capacity == (
        "admission: machine:ram needs 512.0 MiB for stage-0 but its declared capacity is "
        "256.0 MiB (short by 256.0 MiB)"
    )
    assert plan.to_json()["refusals"] == list(plan.refusals)
    # With the device allowed again the bundle is what loading meets first.
    allowed = plan_pipeline(case.path, topology=case.topology, selection=DeviceSelection())
    assert [refusal.kind for refusal in allowed.refused] == ["bundle", "capacity"]
    assert allowed.refused[0].error.__class__ is VerificationError


def _counting(monkeypatch: pytest.MonkeyPatch) -> tuple[Counter[Path], Counter[str]]:
    """Count each file hashed and each pipeline file parsed from now on."""
    hashed: Counter[Path] = Counter()
    parsed: Counter[str] = Counter()
    hash_and_size = runtime.artifacts._hash_and_size
    parse = runtime.config.loader._parse

    def counted_hash(path: Path, *args: Any, **kwargs: Any) -> tuple[str, int]:
        hashed[Path(path)] += 1
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


def settle(folder: Path) -> None:
    """Wait until every file under ``folder`` last changed more than the file system's clock
    tick ago: only then may a report of it stand for hashing it again."""
    newest = max(
        max(path.stat().st_mtime_ns, path.stat().st_ctime_ns)
        for path in folder.rglob("*")
        if path.is_file()
    )
    wait = newest / 1e9 + runtime.artifacts.STAMP_GRANULARITY_S + 0.05 - time.time()
    if wait > 0:
        time.sleep(wait)


def _listed_files(config: Any) -> set[Path]:
    files: set[Path] = set()
    for stage in config.stages:
        bundle = runtime.artifacts.verify_bundle(stage.backend.manifest)
        files.update(bundle.path(name).resolve() for name in bundle.manifest.files)
    # What the test counts starts afresh: no report of this check stands for hashing again.
    runtime.artifacts.forget_bundle_reports()
    return files


def test_plan_then_load_hashes_each_bundle_file_once(
    demo_root: Path, tmp_path: Path, machine: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime.planning import plan_pipeline

    path = demo_root / "pipelines" / "mlp-chain.yaml"
    expected = _listed_files(load_pipeline(path))
    assert len(expected) >= 4  # two bundles, each with its graph and example inputs
    settle(demo_root / "bundles")
    hashed, parsed = _counting(monkeypatch)
    config = load_pipeline(path)
    plan = plan_pipeline(config, topology=machine, selection=DeviceSelection())
    assert plan.admitted, plan.refusals
    case = Case(path, machine, DeviceSelection())
    ledger = ResourceLedger(name="admission")
    started: list[int] = []
    prior = {"resolution": plan.resolution}
    _load(config, case, ledger, lambda stages: started.append(len(stages.clients)), **prior)
    assert started == [len(config.stages)]
    assert {file.resolve() for file in hashed} == expected
    assert set(hashed.values()) == {1}, hashed
    assert list(parsed.values()) == [1]
    assert ledger.snapshot().is_empty


def test_stages_that_share_a_bundle_hash_it_once(
    demo_root: Path, tmp_path: Path, machine: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = demo_root / "bundles" / "add" / "manifest.json"
    one = load_pipeline(write_pipeline(tmp_path / "one.yaml", StageSpec(manifest)))
    (stage,) = one.stages
    config = dataclasses.replace(one, stages=(stage, dataclasses.replace(stage, stage_id=1)))
    expected = _listed_files(config)
    hashed, _parsed = _counting(monkeypatch)
    resolution = resolve(config, machine, DeviceSelection())
    assert resolution.admitted, [r.text for r in resolution.refusals]
    first, again = (stage.placement for stage in resolution.stages)
    assert isinstance(first, GraphPlacement)
    assert isinstance(again, GraphPlacement)
    assert first.bundle == again.bundle
    assert {file.resolve() for file in hashed} == expected
    assert set(hashed.values()) == {1}


def test_a_broken_bundle_seen_before_is_checked_again_when_loading(
    demo_root: Path, tmp_path: Path, machine: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only sound reports are lent to loading: a bundle repaired after ``plan`` loads."""
    from runtime.planning import plan_pipeline

    manifest = _copy_bundle(demo_root, tmp_path)
    npz = manifest.parent / "inputs.npz"
    kept = npz.read_bytes()
    npz.unlink()
    path = _graph(tmp_path, manifest)
    plan = plan_pipeline(path, topology=machine, selection=DeviceSelection())
    assert [refusal.kind for refusal in plan.refused] == ["bundle"]
    npz.write_bytes(kept)
    case = Case(path, machine, DeviceSelection())
    ledger = ResourceLedger(name="admission")
    started: list[int] = []
    prior = {"resolution": plan.resolution}
    _load(plan.config, case, ledger, lambda stages: started.append(len(stages.clients)), **prior)
    assert started == [1]
    assert ledger.snapshot().is_empty


def test_usage_error_of_a_missing_remote_module_is_a_route_refusal(
    tmp_path: Path, machine: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    import runtime.admission

    monkeypatch.setattr(runtime.admission, "REMOTE_LLM_MODULE", "runtime.no_such_module")
    backend = "      name: native.vllm.v1\n      route: {url: 'http://127.0.0.1:9/v1', model: m}\n"
    config = load_pipeline(_llm(tmp_path, backend, demand="0"))
    resolution = resolve(config, machine, DeviceSelection())
    (refusal,) = resolution.refusals
    assert (refusal.kind, type(refusal.error)) == ("route", UsageError)
    assert "runtime.no_such_module, which this installation does not have" in refusal.text


@pytest.mark.parametrize("change", ["same bytes", "other bytes"])
def test_a_bundle_written_after_plan_is_hashed_again_when_loading(
    change: str, demo_root: Path, tmp_path: Path, machine: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime.planning import plan_pipeline

    manifest = _copy_bundle(demo_root, tmp_path)
    path = _graph(tmp_path, manifest)
    settle(manifest.parent)
    plan = plan_pipeline(path, topology=machine, selection=DeviceSelection())
    assert plan.admitted
    npz = manifest.parent / "inputs.npz"
    data = npz.read_bytes()
    files = _listed_files(plan.config)
    npz.write_bytes(data if change == "same bytes" else data[:-1] + bytes([data[-1] ^ 1]))
    hashed, _parsed = _counting(monkeypatch)
    case = Case(path, machine, DeviceSelection())
    ledger = ResourceLedger(name="admission")
    if change == "same bytes":
        started: list[int] = []
        prior = {"resolution": plan.resolution}
        _load(
            plan.config, case, ledger, lambda stages: started.append(len(stages.clients)), **prior
        )
        assert started == [1]
        # The bundle with the written file is verified again, each of its files once.
        assert {file.resolve() for file in hashed} == files
        assert set(hashed.values()) == {1}
        return
    with pytest.raises(VerificationError) as caught:
        _load(plan.config, case, ledger, resolution=plan.resolution)
    again = plan_pipeline(path, topology=machine, selection=DeviceSelection())
    assert str(caught.value) == again.refused[0].message
    assert "hash_mismatch" == caught.value.code
    assert not ledger.snapshot().reservations


def test_a_bundle_changed_moments_before_plan_is_hashed_again_when_loading(
    demo_root: Path, tmp_path: Path, machine: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change in the same tick of the file system's clock as a later one would leave the
    stat alike: a report of files changed that recently never stands for hashing them."""
    from runtime.planning import plan_pipeline

    manifest = _copy_bundle(demo_root, tmp_path)
    path = _graph(tmp_path, manifest)
    plan = plan_pipeline(path, topology=machine, selection=DeviceSelection())
    assert plan.admitted
    (report,) = plan.resolution.bundles.values() if plan.resolution else ()
    assert not report.unchanged()
    hashed, _parsed = _counting(monkeypatch)
    started: list[int] = []
    case = Case(path, machine, DeviceSelection())
    prior = {"resolution": plan.resolution}
    ledger = ResourceLedger(name="admission")
    _load(plan.config, case, ledger, lambda stages: started.append(len(stages.clients)), **prior)
    assert started == [1]
    assert set(hashed.values()) == {1}
    assert len(hashed) == len(report.files)
