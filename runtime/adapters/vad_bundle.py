"""Silero VAD as a verified graph bundle, made once from the ``silero-vad`` wheel.

The wheel (MIT) ships ``silero_vad/data/silero_vad.onnx`` (2.3 MB); the project installs it
without its torch dependency (``pip install --no-deps``), so the package itself is never
imported (its ``__init__`` imports torch): the file is found through the distribution's
record and checked against the sha256 the wheel's RECORD lists before it is bundled.

I/O of the graph (one call per 32 ms chunk at 16 kHz)::

    input float32[1, 576]  state float32[2, 1, 128]  sr int64[]  ->  output float32[1, 1]
                                                                     stateN float32[2, 1, 128]

``input`` is the 512-sample chunk with the previous chunk's last 64 samples in front (zeros
before the first); ``state`` is the previous call's ``stateN`` (zeros before the first); ``sr``
is 16000. The graph worker is stateless: the caller carries both from call to call
(:class:`runtime.adapters.vad.VadStream`).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

import runtime
from runtime.adapters.staged import install_staged
from runtime.artifacts import VerifiedBundle, create_bundle, verify_bundle
from runtime.contracts.manifest import MANIFEST_NAME
from runtime.errors import UsageError, VerificationError
from runtime.paths import data_dir

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = [
    "CHUNK_SAMPLES",
    "CONTEXT_SAMPLES",
    "SAMPLE_RATE",
    "STATE_SHAPE",
    "VAD_FORMAT",
    "VadModelMissing",
    "VadSource",
    "default_vad_dir",
    "ensure_vad_bundle",
    "export_vad_bundle",
    "find_vad_model",
    "initial_state",
    "model_inputs",
]

#: The rate the graph runs at, the samples of one chunk (32 ms) and of the context before it.
SAMPLE_RATE: Final = 16000
CHUNK_SAMPLES: Final = 512
CONTEXT_SAMPLES: Final = 64
STATE_SHAPE: Final = (2, 1, 128)
#: The graph inside the wheel and the wheel's distribution name.
PACKAGE: Final = "silero-vad"
MODEL_FILE: Final = "silero_vad/data/silero_vad.onnx"
#: Bumped when the bundle's layout or metadata change; an older bundle is made again.
VAD_FORMAT: Final = 1
_INPUTS_FILE: Final = "inputs.npz"


class VadModelMissing(UsageError):
    """The ``silero-vad`` wheel is not installed, or its model file does not match its record."""


@dataclass(frozen=True, slots=True)
class VadSource:
    """The installed wheel's model file, checked against the hash its RECORD lists."""

    path: Path
    version: str
    sha256: str

    @property
    def revision(self) -> str:
        return f"{PACKAGE}=={self.version} {MODEL_FILE} sha256:{self.sha256}"


def find_vad_model() -> VadSource:
    """The ``silero_vad.onnx`` the installed ``silero-vad`` wheel ships, its bytes checked."""
    install = f"pip install --no-deps {PACKAGE} (the model needs no torch)"
    try:
        distribution = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise VadModelMissing(
            f"the voice activity model needs the {PACKAGE} wheel, which is not installed; "
            f"install it with: {install}"
        ) from None
    recorded = next((entry for entry in distribution.files or () if str(entry) == MODEL_FILE), None)
    if recorded is None or recorded.hash is None or recorded.hash.mode != "sha256":
        raise VadModelMissing(
            f"{PACKAGE} {distribution.version} lists no sha256 for {MODEL_FILE}; accepted: a "
            f"wheel that ships it ({install})"
        )
    path = Path(str(distribution.locate_file(MODEL_FILE)))
    try:
        digest = hashlib.sha256(path.read_bytes()).digest()
    except OSError as error:
        raise VadModelMissing(
            f"{path} from {PACKAGE} {distribution.version} cannot be read ({error}); reinstall "
            f"it: {install}"
        ) from None
    expected = base64.urlsafe_b64decode(recorded.hash.value + "=" * (-len(recorded.hash.value) % 4))
    if digest != expected:
        raise VadModelMissing(
            f"{path} does not match the sha256 {PACKAGE} {distribution.version} recorded for it "
            f"(the file was changed); reinstall it: {install}"
        )
    return VadSource(path=path, version=distribution.version, sha256=digest.hex())


def initial_state() -> np.ndarray:
    """The recurrent state before the first chunk."""
    return np.zeros(STATE_SHAPE, dtype=np.float32)


def model_inputs(window: np.ndarray, state: np.ndarray) -> dict[str, np.ndarray]:
    """One call's inputs: ``window`` is the 64 context samples then the 512-sample chunk."""
    return {
        "input": np.ascontiguousarray(window, dtype=np.float32).reshape(
            1, CONTEXT_SAMPLES + CHUNK_SAMPLES
        ),
        "state": state,
        "sr": np.array(SAMPLE_RATE, dtype=np.int64),
    }


def _example_inputs() -> dict[str, np.ndarray]:
    # A 440 Hz tone: any chunk of the right shape warms the graph up the same way.
    t = np.arange(CONTEXT_SAMPLES + CHUNK_SAMPLES) / SAMPLE_RATE
    window = (0.1 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)
    return model_inputs(window, initial_state())


def _check_graph(path: Path) -> dict[str, Any]:
    """Run the graph once on the example and check its outputs' shapes and range."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    probability, state = session.run(["output", "stateN"], _example_inputs())
    if probability.shape != (1, 1) or state.shape != STATE_SHAPE:
        raise VerificationError(
            f"{path} gave outputs of shapes {probability.shape} and {state.shape}; accepted: "
            f"(1, 1) and {STATE_SHAPE} (the Silero VAD v5 graph)",
            code="bad_graph",
            subject=str(path),
        )
    value = float(probability[0, 0])
    if not 0.0 <= value <= 1.0:
        raise VerificationError(
            f"{path} gave a speech probability of {value}; accepted: 0 to 1",
            code="bad_graph",
            subject=str(path),
        )
    return {"example_probability": round(value, 6)}


def _save_inputs(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    savez: Any = np.savez
    with path.open("xb") as stream:
        savez(stream, **arrays)


def export_vad_bundle(out: Path, source: VadSource | None = None) -> VerifiedBundle:
    """Bundle the wheel's graph into ``out`` (new or empty) with example inputs and metadata."""
    source = find_vad_model() if source is None else source
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".vad-export-", dir=out.parent) as scratch:
        work = Path(scratch)
        graph = work / "silero_vad.onnx"
        shutil.copyfile(source.path, graph)
        checked = _check_graph(graph)
        inputs = work / _INPUTS_FILE
        _save_inputs(inputs, _example_inputs())
        metadata: dict[str, Any] = {
            "checkpoint_revision": source.revision,
            "precision": "float32",
            "layout": (
                f"input float32[1,{CONTEXT_SAMPLES + CHUNK_SAMPLES}] (the previous chunk's last "
                f"{CONTEXT_SAMPLES} samples, then a {CHUNK_SAMPLES}-sample chunk at "
                f"{SAMPLE_RATE} Hz), state float32[2,1,128] (the previous call's stateN, zeros "
                "first), sr int64[] (16000) -> output float32[1,1] (speech probability), stateN "
                "float32[2,1,128]"
            ),
            "exporter": f"omni-edge-studio {runtime.__version__} vad_bundle",
            "calibration": "not applicable",
            "validation": {
                "source": f"sha256 of {MODEL_FILE} equal to the wheel's RECORD entry",
                **checked,
            },
            "license": "MIT (silero-vad)",
            "vad_format": VAD_FORMAT,
            "sample_rate": SAMPLE_RATE,
            "chunk_samples": CHUNK_SAMPLES,
            "context_samples": CONTEXT_SAMPLES,
        }
        return create_bundle(graph, inputs, out, component="silero-vad", metadata=metadata)


def default_vad_dir() -> Path:
    """Where the bundle lives: ``<user data dir>/vad/silero``."""
    return data_dir() / "vad" / "silero"


def _current(root: Path, source: VadSource) -> VerifiedBundle | None:
    try:
        bundle = verify_bundle(root / MANIFEST_NAME)
    except (VerificationError, OSError):
        return None
    metadata = bundle.manifest.metadata
    if metadata.get("vad_format") != VAD_FORMAT:
        return None
    return bundle if metadata.get("checkpoint_revision") == source.revision else None


def ensure_vad_bundle(
    root: Path | None = None, *, progress: Callable[[str], None] | None = None
) -> VerifiedBundle:
    """The VAD bundle at ``root`` (default :func:`default_vad_dir`), made first when none of
    the installed wheel's release verifies there. Atomic: made in a sibling folder that
    replaces ``root`` only when complete; a failure leaves nothing behind."""
    target = default_vad_dir() if root is None else Path(root)
    source = find_vad_model()
    existing = _current(target, source)
    if existing is not None:
        return existing
    if progress is not None:
        progress(f"bundling the voice activity model ({source.revision}) into {target}")

    def build(staging: Path) -> Path:
        export_vad_bundle(staging / "bundle", source)
        return staging / "bundle"

    return install_staged(
        target,
        build,
        current=lambda: _current(target, source),
        load=lambda folder: verify_bundle(folder / MANIFEST_NAME),
    )
