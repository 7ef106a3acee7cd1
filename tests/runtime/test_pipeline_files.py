"""The pipeline files the runtime writes for a caller: a bare bundle's one-stage pipeline."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from runtime.config import GraphBackendConfig, load_pipeline, parse_pipeline
from runtime.devices import discover_topology
from runtime.pipeline_files import (
    BUNDLE_BASE_DEMAND,
    bundle_pipeline_text,
    is_manifest_path,
    pipeline_for_bundle,
)
from runtime.pipeline_input import TENSOR_INPUT, example_text, input_kind
from tests.workers.support import make_loop_bundle

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    data = tmp_path / "data"
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(data))
    return data


def test_a_bundle_text_is_a_valid_one_stage_cpu_pipeline(tmp_path: Path) -> None:
    manifest = make_loop_bundle(tmp_path)
    text = bundle_pipeline_text(manifest, "loop", 9000, 8 << 30)
    config = parse_pipeline(text, source="bundle.yaml", base_dir=tmp_path)
    assert config.pipeline == "bundle_loop"
    (stage,) = config.stages
    assert isinstance(stage.backend, GraphBackendConfig)
    assert stage.backend.manifest == manifest
    assert stage.resource_budget.demands["machine:ram"] == BUNDLE_BASE_DEMAND + 2 * 9000
    assert stage.resource_budget.capacities["machine:ram"] == 8 << 30
    # A machine reporting less memory than the bundle asks for still gets a pipeline that parses.
    small = parse_pipeline(
        bundle_pipeline_text(manifest, "loop", 9000, 1024), source="b.yaml", base_dir=tmp_path
    )
    budget = small.stages[0].resource_budget
    assert budget.capacities["machine:ram"] == budget.demands["machine:ram"]
    assert (input_kind(config), example_text(config)) == (TENSOR_INPUT, None)


def test_a_bundle_pipeline_is_written_once_into_the_data_folder(
    tmp_path: Path, data_dir: Path
) -> None:
    manifest = make_loop_bundle(tmp_path)
    path = pipeline_for_bundle(manifest, discover_topology())
    assert path.parent == data_dir / "bundle-pipelines"
    assert load_pipeline(path).stages[0].resource_budget.demands["machine:ram"] > BUNDLE_BASE_DEMAND
    written = path.stat().st_mtime_ns
    assert pipeline_for_bundle(manifest, discover_topology()) == path
    assert path.stat().st_mtime_ns == written
    assert is_manifest_path(manifest)
    assert is_manifest_path(manifest.parent)
    assert not is_manifest_path(path)
