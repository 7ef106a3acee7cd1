"""Build the demo artifact bundles the pipelines in ``assets/pipelines`` use.

    python assets/build_demos.py [--out DIR]      (default: assets/bundles)

Bundles: ``add`` (``sum = a + b`` over float32 [1, 1024]), ``mlp-stage0`` (``h = relu(x @ W0 +
b0)``, x [1, 256] -> h [1, 512], weights as ONNX external data in ``weights.bin``) and
``mlp-stage1`` (``y = h @ W1 + b1``, h [1, 512] -> y [1, 16]).

The output is deterministic: fixed seeds, fixed archive timestamps, sorted manifests, so the
same environment writes the same bytes every time. Each bundle is built in a staging folder
first; an existing bundle that verifies and whose manifest is byte-identical is left alone,
anything else is replaced. Before bundling, each graph's ONNX Runtime output on its example
inputs is checked against a NumPy reference.
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
DEFAULT_OUT: Final = REPO_ROOT / "assets" / "bundles"
#: Opset and IR version every ONNX Runtime this project supports (>= 1.24) loads.
OPSET: Final = 17
IR_VERSION: Final = 8
ADD_SEED: Final = 1001
MLP_SEED: Final = 2002
ADD_WIDTH: Final = 1024
MLP_IN: Final = 256
MLP_HIDDEN: Final = 512
MLP_OUT: Final = 16
WEIGHTS_FILE: Final = "weights.bin"
INPUTS_FILE: Final = "inputs.npz"
#: Largest allowed gap between ONNX Runtime's output and the NumPy reference.
REFERENCE_ATOL: Final = 1e-4
#: Zip entries need a timestamp; a fixed one keeps the archive's bytes reproducible.
_ZIP_TIME: Final = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class DemoGraph:
    """One demo: its model, example inputs, NumPy reference outputs and manifest metadata."""

    name: str
    graph_file: str
    model: onnx.ModelProto
    external_weights: bool
    inputs: Mapping[str, np.ndarray]
    reference: Mapping[str, np.ndarray]
    layout: str
    checkpoint_revision: str


@dataclass(frozen=True, slots=True)
class BuildResult:
    """What happened to one bundle: ``built``, ``replaced`` or ``unchanged``."""

    name: str
    status: str
    manifest_path: Path
    identity: str


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="omni-edge-studio assets/build_demos.py",
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def _float_input(name: str, shape: Sequence[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def add_demo() -> DemoGraph:
    rng = np.random.default_rng(ADD_SEED)
    a = rng.standard_normal((1, ADD_WIDTH)).astype(np.float32)
    b = rng.standard_normal((1, ADD_WIDTH)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["sum"], name="add")],
        "add",
        [_float_input("a", (1, ADD_WIDTH)), _float_input("b", (1, ADD_WIDTH))],
        [_float_input("sum", (1, ADD_WIDTH))],
    )
    return DemoGraph(
        name="add",
        graph_file="add.onnx",
        model=_model(graph),
        external_weights=False,
        inputs={"a": a, "b": b},
        reference={"sum": a + b},
        layout="row vectors [batch 1, features]",
        checkpoint_revision=f"synthetic (no weights); example inputs seed {ADD_SEED}",
    )


@dataclass(frozen=True, slots=True)
class _MlpParams:
    x: np.ndarray
    w0: np.ndarray
    b0: np.ndarray
    w1: np.ndarray
    b1: np.ndarray

    @property
    def h(self) -> np.ndarray:
        return np.asarray(np.maximum(self.x @ self.w0 + self.b0, np.float32(0)), np.float32)

    @property
    def y(self) -> np.ndarray:
        return np.asarray(self.h @ self.w1 + self.b1, np.float32)


def _mlp_params() -> _MlpParams:
    rng = np.random.default_rng(MLP_SEED)

    def normal(shape: tuple[int, ...], scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return _MlpParams(
        x=normal((1, MLP_IN), 1.0),
        w0=normal((MLP_IN, MLP_HIDDEN), float(np.sqrt(2.0 / MLP_IN))),
        b0=normal((MLP_HIDDEN,), 0.01),
        w1=normal((MLP_HIDDEN, MLP_OUT), float(np.sqrt(1.0 / MLP_HIDDEN))),
        b1=normal((MLP_OUT,), 0.01),
    )


def mlp_stage0_demo() -> DemoGraph:
    params = _mlp_params()
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W0"], ["xw"], name="matmul0"),
            helper.make_node("Add", ["xw", "b0"], ["pre"], name="bias0"),
            helper.make_node("Relu", ["pre"], ["h"], name="relu0"),
        ],
        "mlp_stage0",
        [_float_input("x", (1, MLP_IN))],
        [_float_input("h", (1, MLP_HIDDEN))],
        initializer=[
            numpy_helper.from_array(params.w0, "W0"),
            numpy_helper.from_array(params.b0, "b0"),
        ],
    )
    return DemoGraph(
        name="mlp-stage0",
        graph_file="mlp_stage0.onnx",
        model=_model(graph),
        external_weights=True,
        inputs={"x": params.x},
        reference={"h": params.h},
        layout="row vectors [batch 1, features]; W0 [in 256, out 512]",
        checkpoint_revision=f"synthetic random weights, seed {MLP_SEED}",
    )


def mlp_stage1_demo() -> DemoGraph:
    params = _mlp_params()
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["h", "W1"], ["hw"], name="matmul1"),
            helper.make_node("Add", ["hw", "b1"], ["y"], name="bias1"),
        ],
        "mlp_stage1",
        [_float_input("h", (1, MLP_HIDDEN))],
        [_float_input("y", (1, MLP_OUT))],
        initializer=[
            numpy_helper.from_array(params.w1, "W1"),
            numpy_helper.from_array(params.b1, "b1"),
        ],
    )
    return DemoGraph(
        name="mlp-stage1",
        graph_file="mlp_stage1.onnx",
        model=_model(graph),
        external_weights=False,
        # Stage 1's example is exactly what stage 0 hands over for stage 0's example.
        inputs={"h": params.h},
        reference={"y": params.y},
        layout="row vectors [batch 1, features]; W1 [in 512, out 16]",
        checkpoint_revision=f"synthetic random weights, seed {MLP_SEED}",
    )


DEMOS: Final[Mapping[str, Callable[[], DemoGraph]]] = {
    "add": add_demo,
    "mlp-stage0": mlp_stage0_demo,
    "mlp-stage1": mlp_stage1_demo,
}


def write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """An .npz that ``numpy.load`` reads, with fixed timestamps so its bytes are reproducible."""
    with zipfile.ZipFile(path, "x", compression=zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.ascontiguousarray(array), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16
            archive.writestr(info, buffer.getvalue())


def _save_graph(demo: DemoGraph, folder: Path) -> Path:
    path = folder / demo.graph_file
    if demo.external_weights:
        onnx.save_model(
            demo.model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=WEIGHTS_FILE,
            size_threshold=0,
        )
    else:
        onnx.save_model(demo.model, str(path))
    return path


def check_against_reference(demo: DemoGraph, graph_path: Path) -> float:
    """Run the saved graph on CPU; return the largest gap to the NumPy reference."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(graph_path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    results = dict(zip(names, session.run(None, dict(demo.inputs)), strict=True))
    if set(results) != set(demo.reference):
        raise RuntimeError(
            f"{demo.name}: outputs {sorted(results)} differ from the reference's "
            f"{sorted(demo.reference)}"
        )
    worst = max(
        float(np.max(np.abs(results[name] - expected))) for name, expected in demo.reference.items()
    )
    if worst > REFERENCE_ATOL:
        raise RuntimeError(
            f"{demo.name}: ONNX Runtime differs from the NumPy reference by {worst}; accepted: "
            f"at most {REFERENCE_ATOL}"
        )
    return worst


def _metadata(demo: DemoGraph) -> dict[str, str]:
    return {
        "checkpoint_revision": demo.checkpoint_revision,
        "precision": "float32",
        "layout": demo.layout,
        "exporter": f"assets/build_demos.py (onnx {onnx.__version__}, opset {OPSET})",
        "calibration": "not applicable",
        "validation": (
            "ONNX Runtime CPU output on the example inputs matches a NumPy float32 reference "
            f"within {REFERENCE_ATOL}"
        ),
    }


def build_bundle(name: str, out: Path) -> BuildResult:
    """Build one demo bundle into ``out/<name>`` unless an identical verified one is there."""
    from runtime.artifacts import create_bundle, verify_bundle
    from runtime.errors import VerificationError

    demo = DEMOS[name]()
    target = out / name
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=f".{name}-staging-") as staging_dir:
        staging = Path(staging_dir)
        source = staging / "source"
        source.mkdir()
        graph_path = _save_graph(demo, source)
        check_against_reference(demo, graph_path)
        inputs_path = source / INPUTS_FILE
        write_npz(inputs_path, demo.inputs)
        staged = create_bundle(
            graph_path, inputs_path, staging / "bundle", component=name, metadata=_metadata(demo)
        )
        staged_manifest = staged.manifest_path.read_bytes()
        status = "built"
        if target.exists() or target.is_symlink():
            try:
                existing = verify_bundle(target)
            except VerificationError:
                existing = None
            if existing is not None and existing.manifest_path.read_bytes() == staged_manifest:
                return BuildResult(name, "unchanged", existing.manifest_path, existing.identity)
            # The old bundle moves into the staging folder, which is removed on exit.
            shutil.move(str(target), str(staging / "previous"))
            status = "replaced"
        shutil.move(str(staged.root), str(target))
    manifest_path = target / staged.manifest_path.name
    return BuildResult(name, status, manifest_path, staged.identity)


def build_all(out: Path = DEFAULT_OUT, names: Sequence[str] = tuple(DEMOS)) -> list[BuildResult]:
    return [build_bundle(name, out) for name in names]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the demo artifact bundles.")
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default: {DEFAULT_OUT})"
    )
    args = parser.parse_args(argv)
    for result in build_all(args.out):
        print(f"{result.name}: {result.status} {result.manifest_path} identity {result.identity}")
    return 0


if __name__ == "__main__":
    # Run by path, the folder on sys.path is assets/; the runtime package lives one level up.
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    sys.exit(main())
