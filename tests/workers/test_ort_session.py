"""The graph worker's ONNX Runtime core, with real sessions on small real bundles."""

from __future__ import annotations

import hashlib
import io
import json
import threading
import time
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

from runtime.backends.placement import PlacementReport, PlacementViolation, gate_placement
from runtime.contracts.buffers import DType
from runtime.contracts.manifest import REQUIRED_METADATA
from tests.helpers.onnx_graphs import matmul_weights, rewrite_manifest
from tests.workers.support import CPU, ENDLESS_STEPS, identity_of, loop_reference
from workers import ort_placement
from workers.ort_session import (
    METHOD_ASSIGNMENT,
    METHOD_PROFILING,
    Bucket,
    CancellableRunner,
    LoadedGraph,
    TensorSpec,
    WorkerError,
    check_call_inputs,
    create_session,
    load_verified_graph,
    placement_of,
    warm_up,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

AZURE = "AzureExecutionProvider"
#: A cancelled call must end within this many seconds of RunOptions.terminate being set.
#: ONNX Runtime checks the flag between nodes (inside the Loop body too). Measured on 2 shared
#: cores: median 6 ms, worst of 10 runs 16 ms.
CANCEL_BOUND_S = 0.5


def _load(manifest: Path) -> LoadedGraph:
    return load_verified_graph(manifest, identity_of(manifest))


def _cpu_session(manifest: Path) -> tuple[ort.InferenceSession, Bucket]:
    graph = _load(manifest)
    session = create_session(graph, [CPU], [CPU], CPU)
    return session, warm_up(session, graph.example_inputs)


# --- verification ------------------------------------------------------------------------


def test_load_reads_graph_weights_and_inputs_once_verified(matmul_manifest: Path) -> None:
    graph = _load(matmul_manifest)
    root = matmul_manifest.parent
    assert graph.identity == identity_of(matmul_manifest)
    assert graph.graph_bytes == (root / "matmul.onnx").read_bytes()
    assert dict(graph.external_data) == {"weights.bin": (root / "weights.bin").read_bytes()}
    assert graph.input_specs == (TensorSpec("x", DType.FLOAT32, (1, 4)),)


def test_identity_mismatch_is_refused(add_manifest: Path) -> None:
    with pytest.raises(WorkerError) as caught:
        load_verified_graph(add_manifest, "0" * 64)
    assert caught.value.code == "hash_mismatch"
    assert caught.value.subject == "manifest.json"
    assert "0" * 64 in str(caught.value)


def test_tampered_graph_bytes_are_refused(add_manifest: Path) -> None:
    identity = identity_of(add_manifest)
    graph_file = add_manifest.parent / "add.onnx"
    data = bytearray(graph_file.read_bytes())
    data[-1] ^= 0xFF
    graph_file.write_bytes(bytes(data))
    with pytest.raises(WorkerError) as caught:
        load_verified_graph(add_manifest, identity)
    assert caught.value.code == "hash_mismatch"
    assert caught.value.subject == "add.onnx"
    assert "'add.onnx'" in str(caught.value)


@pytest.mark.parametrize("name", ["weights.bin", "inputs.npz"])
def test_tampered_weights_or_inputs_are_refused(matmul_manifest: Path, name: str) -> None:
    identity = identity_of(matmul_manifest)
    with (matmul_manifest.parent / name).open("ab") as stream:
        stream.write(b"\0")
    with pytest.raises(WorkerError) as caught:
        load_verified_graph(matmul_manifest, identity)
    assert caught.value.code == "hash_mismatch"
    assert caught.value.subject == name


def test_external_data_missing_from_manifest_is_refused(matmul_manifest: Path) -> None:
    rewrite_manifest(matmul_manifest, lambda doc: doc["files"].pop("weights.bin"))
    with pytest.raises(WorkerError) as caught:
        _load(matmul_manifest)
    assert caught.value.code == "external_data_not_listed"
    assert "weights.bin" in str(caught.value)


def _replace_listed_file(manifest: Path, name: str, data: bytes) -> None:
    """Overwrite a listed file and list its new hash, as a bundle made that way would."""
    (manifest.parent / name).write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    rewrite_manifest(manifest, lambda doc: doc["files"].__setitem__(name, digest))


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"not a zip archive", "cannot be loaded"),
        (_npy(np.zeros(3, np.float32)), "single array"),
        (_npz(), "holds no arrays"),
        (_npz(a=np.array(["text"]), b=np.zeros(1024, np.float32)), "example input 'a'"),
        (_npz(a=np.array([{"x": 1}], dtype=object)), "cannot be loaded"),
    ],
    ids=["garbage", "npy", "empty", "strings", "pickle"],
)
def test_unusable_example_inputs_are_refused(add_manifest: Path, data: bytes, needle: str) -> None:
    _replace_listed_file(add_manifest, "inputs.npz", data)
    with pytest.raises(WorkerError, match=needle) as caught:
        _load(add_manifest)
    assert caught.value.code == "bad_example_inputs"


def test_external_data_outside_the_bundle_is_refused(tmp_path: Path) -> None:
    weights = numpy_helper.from_array(np.zeros(2, np.float32), "w")
    set_external_data(weights, location="../outside.bin", offset=0, length=8)
    weights.data_location = TensorProto.EXTERNAL
    weights.ClearField("raw_data")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "escape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        initializer=[weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (tmp_path / "outside.bin").write_bytes(b"\0" * 8)
    files = {"graph.onnx": model.SerializeToString(), "inputs.npz": _npz(x=np.zeros(2, np.float32))}
    for name, data in files.items():
        (bundle / name).write_bytes(data)
    metadata = dict.fromkeys(REQUIRED_METADATA, "test")
    metadata.update(graph_file="graph.onnx", example_inputs_file="inputs.npz")
    document = {
        "schema_version": 1,
        "component": "escape",
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
        "metadata": metadata,
    }
    manifest = bundle / "manifest.json"
    manifest.write_text(json.dumps(document))
    with pytest.raises(WorkerError, match="leaves the bundle") as caught:
        _load(manifest)
    assert caught.value.code == "external_data_not_listed"
    assert caught.value.subject == "../outside.bin"


def test_missing_listed_file_is_refused(add_manifest: Path) -> None:
    (add_manifest.parent / "inputs.npz").unlink()
    with pytest.raises(WorkerError) as caught:
        _load(add_manifest)
    assert caught.value.code == "missing_file"
    assert caught.value.subject == "inputs.npz"


def test_missing_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkerError) as caught:
        load_verified_graph(tmp_path / "manifest.json", "0" * 64)
    assert caught.value.code == "missing_file"


def test_symlink_leaving_the_bundle_is_refused(add_manifest: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.npz"
    inputs = add_manifest.parent / "inputs.npz"
    outside.write_bytes(inputs.read_bytes())
    inputs.unlink()
    inputs.symlink_to(outside)
    with pytest.raises(WorkerError) as caught:
        _load(add_manifest)
    assert caught.value.code == "symlink_escape"
    assert caught.value.subject == "inputs.npz"


def test_session_uses_the_verified_bytes_not_the_file_on_disk(matmul_manifest: Path) -> None:
    graph = _load(matmul_manifest)
    weights = matmul_manifest.parent / "weights.bin"
    # Changing the file after verification must not reach the session.
    weights.write_bytes(b"\0" * weights.stat().st_size)
    session = create_session(graph, [CPU], [CPU], CPU)
    x = graph.example_inputs["x"]
    (y,) = session.run(None, {"x": x})
    np.testing.assert_allclose(y, x @ matmul_weights(), rtol=1e-6)


@pytest.mark.parametrize(
    ("allow_spinning", "expected"),
    [
        (True, {"session.force_spinning_stop": "1"}),
        (False, {"session.intra_op.allow_spinning": "0"}),
    ],
)
def test_pools_spin_within_runs_only_or_not_at_all(
    add_manifest: Path, allow_spinning: bool, expected: dict[str, str]
) -> None:
    """A pool allowed to spin stops when each run ends; one that may not sleeps when idle."""
    graph = _load(add_manifest)
    session = create_session(
        graph, [CPU], [CPU], CPU, intra_op_threads=2, allow_spinning=allow_spinning
    )
    options = session.get_session_options()

    def entry(key: str) -> str | None:
        try:
            return str(options.get_session_config_entry(key))
        except RuntimeError:  # ONNX Runtime raises for a key that was never set
            return None

    for key in ("session.force_spinning_stop", "session.intra_op.allow_spinning"):
        assert entry(key) == expected.get(key), key
    assert session.run(None, graph.example_inputs), "the session runs with these options"


# --- providers and placement -------------------------------------------------------------


def test_placement_on_cpu_counts_every_node(matmul_manifest: Path) -> None:
    session, _ = _cpu_session(matmul_manifest)
    counts = placement_of(session)
    assert counts.method == METHOD_ASSIGNMENT
    assert dict(counts.counts) == {CPU: counts.total}
    assert counts.total >= 1
    report = PlacementReport(counts.counts, counts.total, counts.method, CPU)
    assert report.fraction_on_target == 1.0
    gate_placement(
        report,
        allowed_providers=[CPU],
        target_provider=CPU,
        min_fraction_on_target=1.0,
        stage="stage-0",
    )


def test_placement_from_profile_when_assignment_is_not_recorded(
    add_manifest: Path, tmp_path: Path
) -> None:
    graph = _load(add_manifest)
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    session = create_session(graph, [CPU], [CPU], CPU, profile_prefix=profiles / "ort")
    warm_up(session, graph.example_inputs)
    counts = placement_of(session)
    assert counts.method == METHOD_PROFILING
    assert dict(counts.counts) == {CPU: 1}
    assert list(profiles.iterdir()) == [], "the profile file is removed once read"


def test_without_assignment_info_a_profile_prefix_is_required(
    add_manifest: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ort_placement, "ASSIGNMENT_INFO_AVAILABLE", False)
    with pytest.raises(WorkerError, match="profile_prefix") as caught:
        create_session(_load(add_manifest), [CPU], [CPU], CPU)
    assert caught.value.code == "placement_unavailable"


def test_placement_of_an_unreadable_profile_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "profile.json"
    bad.write_text(json.dumps([{"cat": "Session", "name": "model_loading"}]))
    with pytest.raises(WorkerError) as caught:
        placement_of(bad)
    assert caught.value.code == "placement_unavailable"
    bad.write_text("{not json")
    with pytest.raises(WorkerError) as caught:
        placement_of(bad)
    assert caught.value.code == "placement_unavailable"


def test_placement_of_a_session_that_recorded_nothing_is_refused(add_manifest: Path) -> None:
    session = ort.InferenceSession(str(add_manifest.parent / "add.onnx"), providers=[CPU])
    with pytest.raises(WorkerError) as caught:
        placement_of(session)
    assert caught.value.code == "placement_unavailable"


def test_absent_provider_names_the_available_ones(add_manifest: Path) -> None:
    graph = _load(add_manifest)
    cuda = "CUDAExecutionProvider"
    assert cuda not in ort.get_available_providers()
    with pytest.raises(WorkerError) as caught:
        create_session(graph, [cuda], [cuda], cuda)
    assert caught.value.code == "provider_absent"
    assert caught.value.subject == cuda
    for provider in ort.get_available_providers():
        assert provider in str(caught.value)


def test_cpu_fallback_is_disabled_when_cpu_is_not_allowed(add_manifest: Path) -> None:
    # The Azure provider runs no standard operator, so every node would need the CPU.
    graph = _load(add_manifest)
    with pytest.raises(WorkerError) as caught:
        create_session(graph, [AZURE], [AZURE], AZURE)
    assert caught.value.code == "session_failed"
    assert "CPU fallback is disabled" in str(caught.value)


def test_allowed_cpu_partition_is_reported_and_gated(add_manifest: Path) -> None:
    graph = _load(add_manifest)
    session = create_session(graph, [AZURE], [AZURE, CPU], AZURE)
    warm_up(session, graph.example_inputs)
    counts = placement_of(session)
    assert dict(counts.counts) == {CPU: 1}
    report = PlacementReport(counts.counts, counts.total, counts.method, AZURE)
    assert report.fraction_on_target == 0.0
    with pytest.raises(
        PlacementViolation, match=r"0 of 1 nodes \(0\.000\).*CPUExecutionProvider 1/1"
    ):
        gate_placement(
            report,
            allowed_providers=[AZURE, CPU],
            target_provider=AZURE,
            min_fraction_on_target=1.0,
            stage="stage-0",
        )


@pytest.mark.parametrize(
    ("providers", "allowed", "target", "needle"),
    [
        ([], [CPU], CPU, "names no execution provider"),
        ([CPU, CPU], [CPU], CPU, "repeat a name"),
        ([CPU], [CPU], AZURE, "target provider 'AzureExecutionProvider'"),
        ([AZURE, CPU], [AZURE], AZURE, "not in allowed_providers"),
    ],
)
def test_contradictory_routes_are_refused(
    add_manifest: Path, providers: list[str], allowed: list[str], target: str, needle: str
) -> None:
    graph = _load(add_manifest)
    with pytest.raises(WorkerError, match=needle) as caught:
        create_session(graph, providers, allowed, target)
    assert caught.value.code == "bad_route"


def test_python_side_provider_fallback_is_off(add_manifest: Path) -> None:
    session, _ = _cpu_session(add_manifest)
    assert session._enable_fallback is False


# --- warm-up and input checks ------------------------------------------------------------


def test_warm_up_returns_the_bucket(add_manifest: Path) -> None:
    _, bucket = _cpu_session(add_manifest)
    vector = (1024,)
    assert bucket.inputs == (
        TensorSpec("a", DType.FLOAT32, vector),
        TensorSpec("b", DType.FLOAT32, vector),
    )
    assert bucket.outputs == (TensorSpec("c", DType.FLOAT32, vector),)
    assert bucket.io_nbytes == 3 * 4096


def test_warm_up_refuses_examples_that_do_not_name_the_graph_inputs(add_manifest: Path) -> None:
    graph = _load(add_manifest)
    session = create_session(graph, [CPU], [CPU], CPU)
    with pytest.raises(WorkerError, match=r"missing \['b'\]") as caught:
        warm_up(session, {"a": graph.example_inputs["a"], "z": graph.example_inputs["b"]})
    assert caught.value.code == "bad_example_inputs"


def test_warm_up_failure_is_reported(add_manifest: Path) -> None:
    graph = _load(add_manifest)
    session = create_session(graph, [CPU], [CPU], CPU)
    wrong = {name: array.astype(np.float64) for name, array in graph.example_inputs.items()}
    with pytest.raises(WorkerError) as caught:
        warm_up(session, wrong)
    assert caught.value.code == "warmup_failed"


ADD_BUCKET = Bucket(
    inputs=(TensorSpec("a", DType.FLOAT32, (1024,)), TensorSpec("b", DType.FLOAT32, (1024,))),
    outputs=(TensorSpec("c", DType.FLOAT32, (1024,)),),
)


def _add_inputs() -> dict[str, np.ndarray]:
    return {"a": np.zeros(1024, np.float32), "b": np.ones(1024, np.float32)}


def test_matching_inputs_pass() -> None:
    check_call_inputs(_add_inputs(), ADD_BUCKET, max_io_bytes=3 * 4096)


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        (lambda arrays: arrays.update(z=arrays.pop("b")), ["'z'", "a: float32[1024]"]),
        (lambda arrays: arrays.pop("b"), ["'b' is missing", "b: float32[1024]"]),
        (
            lambda arrays: arrays.update(a=arrays["a"].astype(np.float64)),
            ["'a'", "float64", "accepted: float32"],
        ),
        (
            lambda arrays: arrays.update(b=np.ones((1, 1024), np.float32)),
            ["'b'", "[1, 1024]", "exactly [1024]"],
        ),
    ],
    ids=["unknown-name", "missing", "dtype", "shape"],
)
def test_inputs_outside_the_bucket_are_refused(
    change: Callable[[dict[str, np.ndarray]], object], needles: list[str]
) -> None:
    arrays = _add_inputs()
    change(arrays)
    with pytest.raises(WorkerError) as caught:
        check_call_inputs(arrays, ADD_BUCKET, max_io_bytes=1 << 20)
    assert caught.value.code == "bad_input"
    for needle in needles:
        assert needle in str(caught.value)


def test_inputs_plus_outputs_above_max_io_bytes_are_refused() -> None:
    with pytest.raises(WorkerError) as caught:
        check_call_inputs(_add_inputs(), ADD_BUCKET, max_io_bytes=3 * 4096 - 1)
    assert caught.value.code == "too_large"
    message = str(caught.value)
    assert "a 4096, b 4096" in message
    assert "12288 bytes" in message
    assert "max_io_bytes = 12287" in message


# --- running and cancelling --------------------------------------------------------------


def test_runner_returns_the_outputs(add_manifest: Path) -> None:
    graph = _load(add_manifest)
    session = create_session(graph, [CPU], [CPU], CPU)
    runner = CancellableRunner(session)
    try:
        outputs = runner.run(graph.example_inputs)
        np.testing.assert_array_equal(
            outputs["c"], graph.example_inputs["a"] + graph.example_inputs["b"]
        )
        assert not runner.busy
        assert runner.cancel() is False, "nothing runs, so nothing is cancelled"
    finally:
        runner.close()


def test_runner_reports_a_model_error(add_manifest: Path) -> None:
    session, _ = _cpu_session(add_manifest)
    runner = CancellableRunner(session)
    try:
        with pytest.raises(WorkerError) as caught:
            runner.run({"a": np.zeros(3, np.float32), "b": np.zeros(1024, np.float32)})
        assert caught.value.code == "model_error"
    finally:
        runner.close()


def _endless(graph: LoadedGraph) -> dict[str, np.ndarray]:
    return {"x": graph.example_inputs["x"], "n": np.array(ENDLESS_STEPS, np.int64)}


def test_cancel_terminates_a_running_call_within_the_bound(loop_manifest: Path) -> None:
    graph = _load(loop_manifest)
    session = create_session(graph, [CPU], [CPU], CPU)
    runner = CancellableRunner(session)
    finished = threading.Event()
    try:
        call = runner.submit(_endless(graph), on_done=lambda _: finished.set())
        time.sleep(0.2)
        assert runner.busy
        with pytest.raises(WorkerError) as busy:
            runner.submit(graph.example_inputs)
        assert busy.value.code == "busy"
        cancelled_at = time.monotonic()
        assert runner.cancel() is True
        outcome = call.outcome(timeout=30)
        latency = time.monotonic() - cancelled_at
        assert outcome.error is not None
        assert outcome.error.code == "cancelled"
        assert outcome.outputs is None
        assert latency < CANCEL_BOUND_S, f"cancel took {latency:.3f} s"
        assert finished.wait(5)
        # The session stays usable: the next call on the same runner completes.
        x = graph.example_inputs["x"]
        outputs = runner.run({"x": x, "n": np.array(2, np.int64)})
        np.testing.assert_allclose(outputs["y"], loop_reference(x, 2), rtol=1e-4, atol=1e-5)
    finally:
        runner.close()


def test_close_cancels_and_refuses_new_calls(loop_manifest: Path) -> None:
    graph = _load(loop_manifest)
    session = create_session(graph, [CPU], [CPU], CPU)
    runner = CancellableRunner(session)
    call = runner.submit(_endless(graph))
    time.sleep(0.1)
    runner.close()
    runner.close()
    assert call.done()
    error = call.outcome().error
    assert error is not None
    assert error.code == "cancelled"
    with pytest.raises(WorkerError) as caught:
        runner.submit(graph.example_inputs)
    assert caught.value.code == "busy"
