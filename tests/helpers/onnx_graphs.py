"""Small real ONNX graphs and bundles for tests.

The graphs are built with ``onnx.helper`` and run under ONNX Runtime's CPU provider. The
functions return the paths they wrote so tests can build on them.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from runtime.artifacts import create_bundle

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path

#: Opset and IR version every ONNX Runtime this project supports can load.
OPSET = 17
IR_VERSION = 8
MATMUL_IN = 4
MATMUL_OUT = 3
EXTERNAL_WEIGHTS = "weights.bin"


def _save(model: onnx.ModelProto, path: Path, *, external_weights: bool = False) -> Path:
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    if external_weights:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=EXTERNAL_WEIGHTS,
            size_threshold=0,
        )
    else:
        onnx.save_model(model, str(path))
    return path


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


def make_add_graph(path: Path, n: int = 1024) -> Path:
    """``c = a + b`` over float32 vectors of length ``n``."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"])],
        "add",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [n]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [n]),
        ],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n])],
    )
    return _save(_model(graph), path)


def matmul_weights() -> np.ndarray:
    """The fixed weight matrix of :func:`make_matmul_graph`."""
    return np.arange(MATMUL_IN * MATMUL_OUT, dtype=np.float32).reshape(MATMUL_IN, MATMUL_OUT)


def make_matmul_graph(path: Path, external_weights: bool) -> Path:
    """``y = x @ W`` with ``x`` float32 [1, 4] and ``W`` a [4, 3] initializer.

    With ``external_weights`` the initializer is saved to ``weights.bin`` next to the graph.
    """
    weights = helper.make_tensor(
        "W",
        TensorProto.FLOAT,
        [MATMUL_IN, MATMUL_OUT],
        matmul_weights().tobytes(),
        raw=True,
    )
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, MATMUL_IN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, MATMUL_OUT])],
        initializer=[weights],
    )
    return _save(_model(graph), path, external_weights=external_weights)


def example_inputs(kind: str, n: int = 1024) -> dict[str, np.ndarray]:
    """Inputs matching :func:`make_add_graph` (``kind="add"``) or :func:`make_matmul_graph`."""
    rng = np.random.default_rng(0)
    if kind == "add":
        return {
            "a": rng.standard_normal(n).astype(np.float32),
            "b": rng.standard_normal(n).astype(np.float32),
        }
    if kind == "matmul":
        return {"x": rng.standard_normal((1, MATMUL_IN)).astype(np.float32)}
    raise ValueError(f"unknown graph kind {kind!r}; accepted: 'add', 'matmul'")


def write_inputs(path: Path, arrays: Mapping[str, np.ndarray]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return path


def make_bundle(
    tmp_path: Path,
    *,
    kind: str = "add",
    external_weights: bool = False,
    n: int = 1024,
    name: str = "bundle",
    component: str | None = None,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Build a graph and its inputs under ``tmp_path/src-<name>``, bundle them into
    ``tmp_path/<name>`` with :func:`runtime.artifacts.create_bundle`, and return the manifest path.
    """
    source = tmp_path / f"src-{name}"
    if kind == "add":
        graph = make_add_graph(source / "add.onnx", n)
    elif kind == "matmul":
        graph = make_matmul_graph(source / "matmul.onnx", external_weights)
    else:
        raise ValueError(f"unknown graph kind {kind!r}; accepted: 'add', 'matmul'")
    inputs = write_inputs(source / "inputs.npz", example_inputs(kind, n))
    bundle = create_bundle(graph, inputs, tmp_path / name, component=component, metadata=metadata)
    return bundle.manifest_path


def rewrite_manifest(manifest_path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Load a manifest document, let ``change`` edit it in place, and write it back."""
    document = json.loads(manifest_path.read_text(encoding="utf-8"))
    change(document)
    manifest_path.write_text(json.dumps(document, indent=2), encoding="utf-8")
