"""The pipeline files the runtime writes for a caller: a bare bundle's one-stage pipeline, and
what a pipeline names that is made on first use (the speech recogniser), made before it loads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from runtime.cli import main
from runtime.config import GraphBackendConfig, load_pipeline, parse_pipeline
from runtime.devices import discover_topology
from runtime.errors import EXIT_OK, ConfigError
from runtime.pipeline_files import (
    BUNDLE_BASE_DEMAND,
    bundle_pipeline_text,
    export_missing_voices,
    is_manifest_path,
    pipeline_for_bundle,
)
from runtime.pipeline_input import TENSOR_INPUT, example_text, input_kind
from tests.workers.support import make_loop_bundle


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


TRANSCRIBE = Path(__file__).resolve().parents[2] / "assets" / "pipelines" / "transcribe.yaml"
RECOGNISER_LINE = "exporting speech recogniser whisper 'tiny.en'"


# A second recogniser export: make test covers it at a smaller scale, with the run test below
# (the same first-use export, then a transcript) and test_whisper.py's first-use export.
@pytest.mark.slow
@pytest.mark.model
def test_plan_on_a_fresh_data_folder_makes_the_recogniser_first_with_progress(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from runtime.adapters.whisper_export import missing_recognisers

    assert missing_recognisers(TRANSCRIBE) == ["tiny.en"]
    assert main(["plan", str(TRANSCRIBE)]) == EXIT_OK
    captured = capsys.readouterr()
    assert RECOGNISER_LINE in captured.err
    assert "validated against the NumPy reference" in captured.err
    assert "admitted" in captured.out
    assert (data_dir / "recognisers" / "whisper-tiny.en" / "decoder" / "manifest.json").is_file()
    assert missing_recognisers(TRANSCRIBE) == []
    # Made once: the next caller finds the bundles and exports nothing.
    lines: list[str] = []
    assert export_missing_voices(TRANSCRIBE, lines.append) == []
    assert lines == []


@pytest.mark.model
def test_run_on_a_fresh_data_folder_makes_the_recogniser_then_transcribes(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["run", str(TRANSCRIBE), "--out", str(out)]) == EXIT_OK
    assert RECOGNISER_LINE in capsys.readouterr().err
    with np.load(out / "outputs.npz") as outputs:
        text = str(outputs["text"])
    # The example request: the bundled voice speaking a sentence the recogniser gets right.
    assert text.strip() == "The quick brown fox jumps over the lazy dog."


def test_a_pipeline_naming_an_unknown_recogniser_is_left_for_loading_to_report(
    data_dir: Path, tmp_path: Path
) -> None:
    pipeline = tmp_path / "ghost.yaml"
    pipeline.write_text(
        TRANSCRIBE.read_text(encoding="utf-8").replace("whisper-tiny.en", "whisper-ghost"),
        encoding="utf-8",
    )
    lines: list[str] = []
    assert export_missing_voices(pipeline, lines.append) == []
    assert lines == []
    assert not (data_dir / "recognisers").exists()
    with pytest.raises(ConfigError, match=r"whisper-ghost/encoder/manifest\.json' does not exist"):
        load_pipeline(pipeline)
