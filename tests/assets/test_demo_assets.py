"""The demo bundles and pipelines: deterministic builds, real sessions, honest budgets."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from runtime.adapters.tensor import mlp_handoff
from runtime.artifacts import verify_bundle
from runtime.config import load_pipeline
from runtime.contracts.buffers import DType
from runtime.contracts.messages import ReadyMessage, TensorSpec
from runtime.planning import plan_pipeline
from tests.workers.support import CPU, identity_of, running_worker
from workers.ort_session import (
    CancellableRunner,
    create_session,
    load_verified_graph,
    placement_of,
    warm_up,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_DEMOS = REPO_ROOT / "assets" / "build_demos.py"
PIPELINES = REPO_ROOT / "assets" / "pipelines"
NAMES = ("add", "mlp-stage0", "mlp-stage1")


def _load_builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_demos", BUILD_DEMOS)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_demos"] = module
    spec.loader.exec_module(module)
    return module


builder = _load_builder()


def _files(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "bundles"
    builder.build_all(out)
    return out


def test_the_script_and_a_second_build_write_the_same_bytes(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    first = tmp_path / "first"
    run = subprocess.run(
        [sys.executable, str(BUILD_DEMOS), "--out", str(first)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert [line.split(":")[0] for line in run.stdout.splitlines()] == list(NAMES)
    assert all(" built " in line for line in run.stdout.splitlines())
    second = tmp_path / "second"
    results = builder.build_all(second)
    assert [result.status for result in results] == ["built"] * 3
    assert _files(first) == _files(second), "two builds give byte-identical bundles"
    assert sorted(path.name for path in first.iterdir()) == sorted(NAMES), "no staging left"


def test_a_verified_identical_bundle_is_left_alone(tmp_path: Path) -> None:
    builder.build_all(tmp_path)
    before = {path: path.stat().st_mtime_ns for path in tmp_path.rglob("*") if path.is_file()}
    results = builder.build_all(tmp_path)
    assert [result.status for result in results] == ["unchanged"] * 3
    after = {path: path.stat().st_mtime_ns for path in tmp_path.rglob("*") if path.is_file()}
    assert after == before, "nothing was rewritten"


def test_a_changed_bundle_is_replaced(tmp_path: Path) -> None:
    (result,) = builder.build_all(tmp_path, ["mlp-stage0"])
    weights = tmp_path / "mlp-stage0" / "weights.bin"
    original = weights.read_bytes()
    weights.write_bytes(b"\0" * len(original))
    (again,) = builder.build_all(tmp_path, ["mlp-stage0"])
    assert again.status == "replaced"
    assert again.identity == result.identity
    assert weights.read_bytes() == original
    verify_bundle(again.manifest_path)
    assert [path.name for path in tmp_path.iterdir()] == ["mlp-stage0"], "no staging left"


EXPECTED_BUCKETS = {
    "add": (
        (TensorSpec("a", DType.FLOAT32, (1, 1024)), TensorSpec("b", DType.FLOAT32, (1, 1024))),
        (TensorSpec("sum", DType.FLOAT32, (1, 1024)),),
    ),
    "mlp-stage0": (
        (TensorSpec("x", DType.FLOAT32, (1, 256)),),
        (TensorSpec("h", DType.FLOAT32, (1, 512)),),
    ),
    "mlp-stage1": (
        (TensorSpec("h", DType.FLOAT32, (1, 512)),),
        (TensorSpec("y", DType.FLOAT32, (1, 16)),),
    ),
}


@pytest.mark.parametrize("name", NAMES)
def test_each_bundle_verifies_and_runs_on_the_cpu(bundles: Path, name: str) -> None:
    manifest = bundles / name / "manifest.json"
    verified = verify_bundle(manifest)
    assert verified.component == name
    graph = load_verified_graph(manifest, identity_of(manifest))
    if name == "mlp-stage0":
        assert list(graph.external_data) == ["weights.bin"]
    else:
        assert not graph.external_data
    session = create_session(graph, [CPU], [CPU], CPU)
    bucket = warm_up(session, graph.example_inputs)
    assert (bucket.inputs, bucket.outputs) == EXPECTED_BUCKETS[name]
    placement = placement_of(session)
    assert dict(placement.counts) == {CPU: placement.total}


def test_the_mlp_chain_through_its_handoff_matches_numpy(bundles: Path) -> None:
    runners = []
    for name in ("mlp-stage0", "mlp-stage1"):
        manifest = bundles / name / "manifest.json"
        graph = load_verified_graph(manifest, identity_of(manifest))
        runners.append(CancellableRunner(create_session(graph, [CPU], [CPU], CPU)))
    params = builder._mlp_params()
    try:
        hidden = runners[0].run({"x": params.x})
        handed = mlp_handoff(hidden)["tensors"]
        final = runners[1].run(handed)
    finally:
        for runner in runners:
            runner.close()
    np.testing.assert_allclose(hidden["h"], params.h, atol=1e-4)
    np.testing.assert_allclose(final["y"], params.y, atol=1e-4)


def _copy_pipelines(root: Path) -> Path:
    folder = root / "pipelines"
    folder.mkdir()
    for path in PIPELINES.glob("*.yaml"):
        shutil.copy(path, folder / path.name)
    return folder


@pytest.mark.parametrize(
    ("file", "stages"), [("add.yaml", ["add"]), ("mlp-chain.yaml", ["mlp-stage0", "mlp-stage1"])]
)
def test_pipelines_parse_against_their_bundles(
    tmp_path: Path, file: str, stages: list[str]
) -> None:
    builder.build_all(tmp_path / "bundles", stages)
    config = load_pipeline(_copy_pipelines(tmp_path) / file)
    assert config.async_chunk is False
    assert [stage.backend.manifest for stage in config.stages] == [
        tmp_path / "bundles" / name / "manifest.json" for name in stages
    ]
    for stage in config.stages:
        route = stage.backend.route
        assert (route.interpreter, route.worker, route.ep, route.os_domain) == (
            "bundled",
            "ort",
            "cpu",
            "posix",
        )
        assert route.allowed_providers == (CPU,)
        assert route.min_fraction_on_target == 1.0
        assert dict(stage.resource_budget.capacities) == {"machine:ram": 2 << 30}
    transforms = [stage.custom_process_input_func for stage in config.stages]
    expected = [None] if len(stages) == 1 else [None, "runtime.adapters.tensor:mlp_handoff"]
    assert transforms == expected
    assert config.source is not None
    plan = plan_pipeline(config.source)
    assert plan.admitted, plan.refusals


@pytest.mark.parametrize(
    ("file", "index", "name"),
    [
        ("add.yaml", 0, "add"),
        ("mlp-chain.yaml", 0, "mlp-stage0"),
        ("mlp-chain.yaml", 1, "mlp-stage1"),
    ],
)
def test_budgets_cover_a_real_worker_with_headroom(
    bundles: Path, file: str, index: int, name: str
) -> None:
    # Next to the built bundles, the pipeline's "../bundles/..." paths resolve to them.
    folder = bundles.parent / "pipelines"
    folder.mkdir(exist_ok=True)
    shutil.copy(PIPELINES / file, folder / file)
    stage = load_pipeline(folder / file).stages[index]
    route = stage.backend.route
    with running_worker() as worker:
        worker.channel.send_message(
            worker.load_message(stage.backend.manifest, max_io_bytes=route.max_io_bytes)
        )
        ready, _ = worker.read()
        assert isinstance(ready, ReadyMessage), ready
        demand = stage.resource_budget.demands["machine:ram"]
        assert ready.rss_bytes * 1.5 <= demand, (
            f"{name}: a loaded worker holds {ready.rss_bytes} bytes; demand {demand} leaves "
            "less than 50% headroom"
        )
