"""Bundles with several fixed input buckets (``metadata.buckets``): parsed, warmed up, served."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from runtime.artifacts import create_bundle
from runtime.contracts.messages import CallMessage, ErrorMessage, ReadyMessage, ResultMessage
from tests.helpers.onnx_graphs import IR_VERSION, OPSET, rewrite_manifest
from tests.workers.support import CPU, identity_of
from workers.ort_session import (
    MAX_BUCKETS,
    WorkerError,
    bucket_inputs,
    bucket_shapes,
    check_call_inputs,
    create_session,
    load_verified_graph,
    warm_up_buckets,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path

    from tests.workers.support import WorkerProcess

BUCKETS = [{"x": [1, 4], "s": [1]}, {"x": [1, 8], "s": [1]}]


def _scale_bundle(tmp_path: Path, buckets: Any = BUCKETS) -> Path:
    """``y = x * s`` with ``x`` float32 [1, n] (n symbolic) and ``s`` float32 [1]."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "s"], ["y"])],
        "scale",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    source = tmp_path / "src"
    source.mkdir()
    onnx.save_model(model, str(source / "scale.onnx"))
    np.savez(
        source / "inputs.npz",
        x=np.arange(4, dtype=np.float32).reshape(1, 4),
        s=np.array([3.0], np.float32),
    )
    metadata = {} if buckets is None else {"buckets": buckets}
    bundle = create_bundle(
        source / "scale.onnx", source / "inputs.npz", tmp_path / "scale", metadata=metadata
    )
    return bundle.manifest_path


def test_bucket_shapes_put_the_example_first(tmp_path: Path) -> None:
    manifest = _scale_bundle(tmp_path, buckets=list(reversed(BUCKETS)))
    graph = load_verified_graph(manifest, identity_of(manifest))
    assert bucket_shapes(graph.manifest, graph.example_inputs) == (
        {"x": (1, 4), "s": (1,)},
        {"x": (1, 8), "s": (1,)},
    )


def test_without_buckets_the_example_is_the_only_bucket(tmp_path: Path) -> None:
    manifest = _scale_bundle(tmp_path, buckets=None)
    graph = load_verified_graph(manifest, identity_of(manifest))
    assert bucket_shapes(graph.manifest, graph.example_inputs) == ({"x": (1, 4), "s": (1,)},)


@pytest.mark.parametrize(
    ("buckets", "detail"),
    [
        ({"x": [1, 4]}, "is dict"),
        ([], "is a list of 0"),
        ([BUCKETS[0]] * (MAX_BUCKETS + 1), f"is a list of {MAX_BUCKETS + 1}"),
        ([{"x": [1, 4]}], "entry 0 names ['x']"),
        ([BUCKETS[0], {"x": [1, 8], "s": [1], "t": [1]}], "entry 1 names"),
        ([BUCKETS[0], {"x": [8], "s": [1]}], "entry 1 gives 'x' the shape [8]"),
        ([BUCKETS[0], {"x": [1, 0], "s": [1]}], "entry 1 gives 'x' the shape [1, 0]"),
        ([BUCKETS[0], {"x": [1, "8"], "s": [1]}], "entry 1 gives 'x' the shape [1, '8']"),
        ([BUCKETS[0], BUCKETS[0]], "entry 1 repeats {s: [1], x: [1, 4]}"),
        ([BUCKETS[1]], "does not list the example inputs' shapes"),
    ],
)
def test_bad_bucket_lists_are_refused(tmp_path: Path, buckets: Any, detail: str) -> None:
    manifest = _scale_bundle(tmp_path, buckets=buckets)
    graph = load_verified_graph(manifest, identity_of(manifest))
    with pytest.raises(WorkerError) as caught:
        bucket_shapes(graph.manifest, graph.example_inputs)
    assert caught.value.code == "bad_manifest"
    assert caught.value.subject == "metadata.buckets"
    assert detail in caught.value.message
    assert "accepted:" in caught.value.message


def test_bucket_inputs_zero_pad_and_cut_the_example() -> None:
    example = {"x": np.array([[1, 2, 3, 4]], np.float32), "s": np.array([3.0], np.float32)}
    padded = bucket_inputs(example, {"x": (1, 6), "s": (1,)})
    np.testing.assert_array_equal(padded["x"], [[1, 2, 3, 4, 0, 0]])
    np.testing.assert_array_equal(padded["s"], [3.0])
    assert padded["x"].dtype == np.float32
    cut = bucket_inputs(example, {"x": (1, 2), "s": (1,)})
    np.testing.assert_array_equal(cut["x"], [[1, 2]])


def test_calls_match_any_warmed_bucket_and_nothing_else(tmp_path: Path) -> None:
    manifest = _scale_bundle(tmp_path)
    graph = load_verified_graph(manifest, identity_of(manifest))
    session = create_session(graph, [CPU], [CPU], CPU)
    buckets = warm_up_buckets(
        session, graph.example_inputs, bucket_shapes(graph.manifest, graph.example_inputs)
    )
    assert [bucket.outputs[0].shape for bucket in buckets] == [(1, 4), (1, 8)]
    s = np.array([2.0], np.float32)
    wide = {"x": np.ones((1, 8), np.float32), "s": s}
    assert check_call_inputs(wide, buckets, 1 << 20) is buckets[1]
    assert (
        check_call_inputs({"x": np.ones((1, 4), np.float32), "s": s}, buckets, 1 << 20)
        is (buckets[0])
    )
    with pytest.raises(WorkerError) as caught:
        check_call_inputs({"x": np.ones((1, 6), np.float32), "s": s}, buckets, 1 << 20)
    assert caught.value.code == "bad_input"
    assert "one of the fixed buckets" in caught.value.message
    assert "x: float32[1, 4], s: float32[1] | x: float32[1, 8], s: float32[1]" in (
        caught.value.message
    )
    with pytest.raises(WorkerError) as caught:
        check_call_inputs({"x": np.ones((1, 8), np.float64), "s": s}, buckets, 1 << 20)
    assert caught.value.code == "bad_input"
    with pytest.raises(WorkerError) as caught:
        check_call_inputs(wide, buckets, 40)
    assert caught.value.code == "too_large"


def _call(worker: WorkerProcess, call_id: int, arrays: Mapping[str, np.ndarray]) -> object:
    worker.channel.send_message(CallMessage(call_id, "req", 0, tuple(arrays)), dict(arrays))
    message, frame = worker.read()
    if isinstance(message, ResultMessage):
        outputs, acks = worker.channel.arrays_from_frame(frame, message.output_names)
        worker.channel.send_acks(acks)
        return outputs["y"]
    return message


def test_worker_serves_every_bucket(
    spawn_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    manifest = _scale_bundle(tmp_path)
    worker = spawn_worker()
    worker.channel.send_message(worker.load_message(manifest))
    ready, _ = worker.read()
    assert isinstance(ready, ReadyMessage), ready
    # The ready message describes the example's bucket; the others are served too.
    assert [spec.shape for spec in ready.inputs] == [(1, 4), (1,)]
    s = np.array([2.0], np.float32)
    for call_id, width in enumerate((8, 4, 8), start=1):
        x = np.arange(width, dtype=np.float32).reshape(1, width)
        np.testing.assert_array_equal(_call(worker, call_id, {"x": x, "s": s}), x * 2)
    refused = _call(worker, 9, {"x": np.ones((1, 5), np.float32), "s": s})
    assert isinstance(refused, ErrorMessage)
    assert refused.code == "bad_input"
    assert "[1, 5]" in refused.message
    np.testing.assert_array_equal(_call(worker, 10, {"x": np.ones((1, 4), np.float32), "s": s}), 2)


def test_worker_checks_max_io_bytes_against_the_largest_bucket(
    spawn_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    manifest = _scale_bundle(tmp_path)
    worker = spawn_worker()
    # The example bucket moves 36 bytes, the wide one 68: 40 fits only the example.
    worker.channel.send_message(worker.load_message(manifest, max_io_bytes=40))
    error, _ = worker.read()
    assert isinstance(error, ErrorMessage)
    assert error.fatal
    assert error.code == "too_large"
    assert "68 bytes" in error.message
    assert worker.exit_code() != 0


def test_worker_refuses_a_malformed_bucket_list(
    spawn_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    manifest = _scale_bundle(tmp_path)
    rewrite_manifest(manifest, lambda doc: doc["metadata"].update(buckets=[BUCKETS[1]]))
    worker = spawn_worker()
    worker.channel.send_message(worker.load_message(manifest))
    error, _ = worker.read()
    assert isinstance(error, ErrorMessage)
    assert error.fatal
    assert error.code == "bad_manifest"
    assert "metadata.buckets" in error.message
