"""The bridge's conversions and the studio's plain values, without a window."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.bridge import (
    RequestTracker,
    bundle_pipeline_text,
    error_info,
    input_kind,
    output_items,
    pipeline_for_bundle,
)
from app.inputs import InputFileError, read_inputs, read_npz
from app.models import (
    AudioChunk,
    ErrorAction,
    InputKind,
    RunState,
    TensorResults,
    TextChunk,
    Tolerance,
    compare_outputs,
)
from app.settings import StudioSettings
from app.widgets.pipelines import droppable_paths
from runtime.config import load_pipeline, parse_pipeline
from runtime.devices import discover_topology
from runtime.engine.outputs import OmniRequestOutput
from runtime.engine.stage_runtime import StageStartError
from runtime.errors import (
    AdmissionRefused,
    ConfigError,
    DeviceExcluded,
    PlacementRefused,
    VerificationError,
    WorkerDied,
)


def _output(
    outputs: dict[str, object], index: int = 0, finished: bool = False
) -> OmniRequestOutput:
    return OmniRequestOutput(
        request_id="req-1",
        stage="decoder",
        outputs=outputs,
        finished=finished,
        index=index,  # type: ignore[arg-type]
    )


def test_a_pcm_output_becomes_an_audio_chunk_with_its_own_copy() -> None:
    pcm = np.linspace(-0.5, 0.5, 2205, dtype=np.float32)
    output = _output(
        {"pcm": pcm, "sample_rate": np.array(22050), "chunk_index": np.array(3)}, index=3
    )
    (chunk,) = output_items(output, received_s=0.25)
    assert isinstance(chunk, AudioChunk)
    assert (chunk.chunk_index, chunk.sample_rate, chunk.received_s) == (3, 22050, 0.25)
    assert chunk.duration_s == pytest.approx(0.1)
    pcm[:] = 0  # the runtime may reuse its buffer once the output is released
    assert chunk.pcm[0] == pytest.approx(-0.5)


def test_text_and_tensor_outputs_are_told_apart() -> None:
    (text,) = output_items(_output({"text": np.array("Hello")}, finished=True), 0.0)
    assert isinstance(text, TextChunk)
    assert (text.text, text.finished) == ("Hello", True)
    (tensors,) = output_items(_output({"sum": np.ones((1, 4), np.float32)}, finished=True), 0.0)
    assert isinstance(tensors, TensorResults)
    assert list(tensors.arrays) == ["sum"]


def test_a_pcm_chunk_without_a_usable_chunk_index_is_refused() -> None:
    output = _output(
        {"pcm": np.zeros(4, np.float32), "sample_rate": 16000, "chunk_index": np.arange(2)}
    )
    with pytest.raises(ValueError, match="expected one number"):
        output_items(output, 0.0)


def test_the_tracker_measures_first_audio_and_real_time_factor() -> None:
    tracker = RequestTracker("req-1", submitted_at=100.0)
    tracker.add_call("acoustic", 0.001, 0.050, 0.002)
    for index, received in enumerate((0.12, 0.30, 0.48)):
        pcm = np.zeros(11025, np.float32)  # 0.5 s at 22050 Hz
        output = _output({"pcm": pcm, "sample_rate": 22050, "chunk_index": index}, index=index)
        (chunk,) = output_items(output, received)
        assert isinstance(chunk, AudioChunk)
        tracker.add_audio(chunk)
        tracker.add_call("decoder", 0.0, 0.030, 0.001)
    tracker.finish("completed", 100.5)
    metrics = tracker.snapshot(now=200.0)
    assert metrics.first_audio_s == pytest.approx(0.12)
    assert metrics.audio_s == pytest.approx(1.5)
    assert metrics.chunks == 3
    assert metrics.real_time_factor == pytest.approx(0.48 / 1.5)
    assert metrics.elapsed_s == pytest.approx(0.5)
    decoder = next(stage for stage in metrics.stages if stage.stage == "decoder")
    assert (decoder.calls, decoder.run_s) == (3, pytest.approx(0.09))


def test_errors_map_to_the_action_that_helps() -> None:
    admission = AdmissionRefused(
        "machine:ram needs 4 GiB", constraint="machine:ram", needed=4, free=1
    )
    assert error_info(admission).action is ErrorAction.OPEN_DEVICES
    assert error_info(admission).message == "machine:ram needs 4 GiB"
    assert error_info(DeviceExcluded("excluded")).action is ErrorAction.OPEN_DEVICES
    placement = StageStartError("stage-0", PlacementRefused("1 node on Azure"))
    info = error_info(placement)
    assert (info.action, info.kind) == (ErrorAction.SHOW_PLAN, "PlacementRefused")
    assert "1 node on Azure" in info.message
    assert (
        error_info(VerificationError("bad hash", code="hash_mismatch", subject="a")).action
        is ErrorAction.SHOW_MANIFEST
    )
    assert error_info(WorkerDied("gone")).action is ErrorAction.SHOW_LOG
    assert error_info(ConfigError("bad", file="p.yaml", line=3)).action is None
    assert error_info(RuntimeError("boom")).title == "Unexpected RuntimeError"


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


def test_graph_pipelines_take_tensors(demo_root: Path) -> None:
    kind, text = input_kind(load_pipeline(demo_root / "pipelines" / "add.yaml"))
    assert (kind, text) == (InputKind.TENSORS, "")


def test_a_bare_bundle_becomes_a_valid_one_stage_pipeline(demo_root: Path) -> None:
    manifest = demo_root / "bundles" / "add" / "manifest.json"
    text = bundle_pipeline_text(manifest, "add", 9000, 8 << 30)
    config = parse_pipeline(text, source="bundle.yaml", base_dir=demo_root)
    assert config.pipeline == "bundle_add"
    assert config.stages[0].backend.manifest == manifest
    path = pipeline_for_bundle(manifest, discover_topology())
    assert path.is_file()
    assert load_pipeline(path).stages[0].resource_budget.demands["machine:ram"] > 128 << 20


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
