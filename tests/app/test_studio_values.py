"""The studio's plain values, input files, dropped paths and settings, without a window."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.inputs import InputFileError, read_inputs, read_npz
from app.models import RunState, Tolerance, compare_outputs
from app.settings import StudioSettings
from app.widgets.pipelines import droppable_paths


def test_outputs_compare_with_a_reference() -> None:
    outputs = {"y": np.array([1.0, 2.0, 3.0], np.float32)}
    (same,) = compare_outputs(outputs, {"y": np.array([1.0, 2.0, 3.0 + 1e-7])})
    assert same.ok
    (off,) = compare_outputs(outputs, {"y": np.array([1.0, 2.0, 3.5])}, Tolerance(1e-3, 0.0))
    assert not off.ok
    assert off.max_abs == pytest.approx(0.5)
    assert "exceeds atol" in off.problem
    (missing,) = compare_outputs(outputs, {"z": np.zeros(3)})
    assert not missing.ok
    assert "no output named 'z'" in missing.problem
    (shape,) = compare_outputs(outputs, {"y": np.zeros(4)})
    assert "shape (3,)" in shape.problem


def test_input_files_must_match_the_example_inputs(tmp_path: Path) -> None:
    examples = {"a": np.zeros((1, 4), np.float32), "b": np.zeros((1, 4), np.float32)}
    good = tmp_path / "good.npz"
    np.savez(good, a=np.ones((1, 4), np.float32), b=np.ones((1, 4), np.float32))
    assert read_inputs(good, examples)["a"].sum() == 4
    missing = tmp_path / "missing.npz"
    np.savez(missing, a=np.ones((1, 4), np.float32))
    with pytest.raises(InputFileError, match="missing b; the pipeline takes a float32"):
        read_inputs(missing, examples)
    shaped = tmp_path / "shaped.npz"
    np.savez(shaped, a=np.ones((1, 5), np.float32), b=np.ones((1, 4), np.float32))
    with pytest.raises(
        InputFileError,
        match=r"input 'a' is float32 \(1, 5\), but the pipeline takes float32 \(1, 4\)",
    ):
        read_inputs(shaped, examples)
    pickled = tmp_path / "objects.npz"
    np.savez(pickled, a=np.array([{"x": 1}], dtype=object))
    with pytest.raises(InputFileError, match=r"not a NumPy \.npz archive of plain arrays"):
        read_npz(pickled)
    with pytest.raises(InputFileError, match="no such file"):
        read_npz(tmp_path / "absent.npz")


def test_dropped_files_are_pipelines_manifests_or_bundle_folders(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text("{}")
    found = droppable_paths([str(tmp_path / "p.yaml"), str(tmp_path / "notes.txt"), str(bundle)])
    assert found == [tmp_path / "p.yaml", bundle / "manifest.json"]


def test_run_states_decide_the_buttons() -> None:
    assert [state for state in RunState if state.can_run] == [RunState.READY, RunState.LOADED]
    assert [state for state in RunState if state.can_cancel] == [RunState.LOADING, RunState.RUNNING]


def test_settings_round_trip(tmp_path: Path) -> None:
    settings = StudioSettings(tmp_path / "studio.ini")
    settings.last_pipeline = tmp_path / "a.yaml"
    for name in ("a", "b", "a"):
        settings.add_recent(tmp_path / f"{name}.yaml")
    settings.allowed_devices = ["CPU-1"]
    settings.audio_device = "null (ALSA)"
    settings.sync()
    again = StudioSettings(tmp_path / "studio.ini")
    assert again.last_pipeline == tmp_path / "a.yaml"
    assert again.recent == [tmp_path / "a.yaml", tmp_path / "b.yaml"]
    assert again.allowed_devices == ["CPU-1"]
    assert again.audio_device == "null (ALSA)"
    again.allowed_devices = None
    assert again.allowed_devices is None
