"""Graphs, bundles and pipelines the benchmarks build for themselves in a temporary folder.

Every bundle goes through :func:`runtime.artifacts.create_bundle`, so the pipelines verify
and load exactly as a user's would; the pipelines use the same route as the demos (bundled
interpreter, ``ort`` worker, CPU only).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper

from runtime.artifacts import create_bundle
from runtime.host import default_project_root

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from runtime.artifacts import VerifiedBundle

OPSET: Final = 17
IR_VERSION: Final = 8
CPU: Final = "CPUExecutionProvider"
MiB: Final = 1 << 20
#: The project checkout the suite runs from (demo pipelines, bundles and README live here).
PROJECT_ROOT: Final = default_project_root()
DEMO_PIPELINES: Final = PROJECT_ROOT / "assets" / "pipelines"
#: Elements of the large handoff tensor: float32 [1, 2097152] is exactly 8 MiB.
HANDOFF_ELEMENTS: Final = 2 * 1024 * 1024
HANDOFF_SEED_WIDTH: Final = 1024


def python_executable() -> str:
    """The interpreter that runs this suite (and, through ``bundled`` routes, its workers)."""
    return sys.executable


def finish_model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="omni-edge-studio benchmarks",
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def _float(name: str, shape: Sequence[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def write_bundle(
    folder: Path, name: str, model: onnx.ModelProto, inputs: Mapping[str, np.ndarray]
) -> VerifiedBundle:
    """Save ``model`` and its example ``inputs`` and bundle them into ``folder/name``."""
    source = folder / f"{name}-source"
    source.mkdir(parents=True)
    graph_path = source / f"{name}.onnx"
    onnx.save_model(model, str(graph_path))
    inputs_path = source / "inputs.npz"
    np.savez(inputs_path, allow_pickle=False, **inputs)
    return create_bundle(graph_path, inputs_path, folder / name, component=name)


def add_model(width: int = 1024, seed: int = 11) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``sum = a + b`` over float32 [1, width] (the demo ``add`` graph's shape)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((1, width)).astype(np.float32)
    b = rng.standard_normal((1, width)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["sum"], name="add")],
        "bench_add",
        [_float("a", (1, width)), _float("b", (1, width))],
        [_float("sum", (1, width))],
    )
    return finish_model(graph), {"a": a, "b": b}


def matmul_model(
    rows: int, width: int, seed: int = 7
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``y = x @ W`` with x float32 [rows, width] and W [width, width] held in the graph."""
    rng = np.random.default_rng(seed)
    weights = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    x = rng.standard_normal((rows, width)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="matmul")],
        "bench_matmul",
        [_float("x", (rows, width))],
        [_float("y", (rows, width))],
        initializer=[numpy_helper.from_array(weights, "W")],
    )
    return finish_model(graph), {"x": x}


def scale_model(
    elements: int, factor: float = 2.0
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``y = x * factor`` over float32 [1, elements]: one pass over the tensor, no state."""
    x = np.linspace(-1.0, 1.0, elements, dtype=np.float32).reshape(1, -1)
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "factor"], ["y"], name="scale")],
        "bench_scale",
        [_float("x", (1, elements))],
        [_float("y", (1, elements))],
        initializer=[numpy_helper.from_array(np.array(factor, np.float32), "factor")],
    )
    return finish_model(graph), {"x": x}


def pass_y_as_x(outputs: Mapping[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """Handoff of a chain of :func:`scale_model` stages: one stage's ``y`` is the next's ``x``."""
    return {"tensors": {"x": outputs["y"]}}


def fan_out_model(
    elements: int = HANDOFF_ELEMENTS,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Stage 0 of the handoff chain: x [1, 1024] tiled into ``big`` [1, elements] (8 MiB)."""
    repeats = elements // HANDOFF_SEED_WIDTH
    x = np.linspace(-1.0, 1.0, HANDOFF_SEED_WIDTH, dtype=np.float32).reshape(1, -1)
    graph = helper.make_graph(
        [helper.make_node("Tile", ["x", "repeats"], ["big"], name="tile")],
        "bench_fan_out",
        [_float("x", (1, HANDOFF_SEED_WIDTH))],
        [_float("big", (1, elements))],
        initializer=[numpy_helper.from_array(np.array([1, repeats], np.int64), "repeats")],
    )
    return finish_model(graph), {"x": x}


def reduce_model(
    elements: int = HANDOFF_ELEMENTS,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Stage 1 of the handoff chain: ``big`` [1, elements] -> its maximum [1, 1]."""
    seed = np.linspace(-1.0, 1.0, HANDOFF_SEED_WIDTH, dtype=np.float32)
    big = np.tile(seed, (1, elements // HANDOFF_SEED_WIDTH))
    graph = helper.make_graph(
        [helper.make_node("ReduceMax", ["big"], ["peak"], name="reduce_max", keepdims=1)],
        "bench_reduce",
        [_float("big", (1, elements))],
        [_float("peak", (1, 1))],
    )
    return finish_model(graph), {"big": big}


@dataclass(frozen=True, slots=True)
class StageSpec:
    """One stage of a benchmark pipeline."""

    bundle: VerifiedBundle
    max_io_bytes: int
    handoff: str | None = None


def write_pipeline(path: Path, name: str, stages: Sequence[StageSpec]) -> Path:
    """Write a linear-chain pipeline YAML with the demos' CPU route for every stage."""
    documents = []
    for index, stage in enumerate(stages):
        entry: dict[str, object] = {"stage_id": index}
        if index > 0:
            entry["engine_input_source"] = [index - 1]
            entry["custom_process_input_func"] = stage.handoff
        if index == len(stages) - 1 and len(stages) > 1:
            entry["final_output"] = True
        entry["backend"] = {
            "name": "external.graph.v1",
            "manifest": str(stage.bundle.manifest_path),
            "route": {
                "name": "local-cpu",
                "interpreter": "bundled",
                "worker": "ort",
                "ep": "cpu",
                "os_domain": "posix",
                "max_io_bytes": stage.max_io_bytes,
                "min_fraction_on_target": 1.0,
                "allowed_providers": [CPU],
            },
        }
        entry["resource_budget"] = {
            "capacities": {"machine:ram": "4GiB"},
            "demands": {"machine:ram": "256MiB"},
        }
        documents.append(entry)
    document = {"pipeline": name, "async_chunk": False, "stages": documents}
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def demo_pipeline(name: str) -> Path:
    """A bundled demo pipeline (``add``, ``mlp-chain``, ``speak``)."""
    return DEMO_PIPELINES / f"{name}.yaml"
