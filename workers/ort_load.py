"""Verify and load a graph bundle: every byte handed to ONNX Runtime (graph and external
weights) is the byte that was hashed, read once into memory, so a file changed on disk after
verification can never reach the session.

This module imports only the standard library, NumPy, ``runtime.contracts``,
``runtime.onnx_wire`` and ``workers`` (errors, buckets), so that it runs in a minimal worker
environment.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from runtime.contracts.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    ArtifactManifest,
    ManifestError,
    check_relative_path,
)
from runtime.onnx_wire import WireError, external_data_locations
from workers.errors import WorkerError
from workers.ort_buckets import dtype_of, spec_of

if TYPE_CHECKING:
    from collections.abc import Mapping

    from runtime.contracts.messages import TensorSpec

__all__ = ["LoadedGraph", "load_verified_graph"]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class LoadedGraph:
    """A bundle's graph, external weights and example inputs, read once and verified.

    ``external_data`` maps each location as the graph names it to that file's verified bytes.
    """

    manifest_path: Path
    manifest: ArtifactManifest
    graph_dir: Path
    graph_bytes: bytes
    external_data: Mapping[str, bytes]
    example_inputs: Mapping[str, np.ndarray]

    @property
    def identity(self) -> str:
        return self.manifest.identity

    @property
    def input_specs(self) -> tuple[TensorSpec, ...]:
        return tuple(spec_of(name, array) for name, array in self.example_inputs.items())


def load_verified_graph(manifest_path: str | Path, expected_identity: str) -> LoadedGraph:
    """Read a bundle's manifest, graph, external data and example inputs, checking every hash.

    The manifest's sha256 must equal ``expected_identity`` (what the controller verified);
    each file is read once and its in-memory bytes are hashed against the manifest.
    """
    path = Path(manifest_path).absolute()
    if path.is_dir():
        path = path / MANIFEST_NAME
    raw = _read_regular(path, MANIFEST_NAME, limit=MAX_MANIFEST_BYTES)
    actual = _sha256(raw)
    if actual != expected_identity:
        raise WorkerError(
            "hash_mismatch",
            f"{path}: manifest sha256 is {actual} but the controller verified "
            f"{expected_identity}; accepted: the exact manifest that was verified "
            "(the bundle changed after verification)",
            subject=MANIFEST_NAME,
        )
    try:
        manifest = ArtifactManifest.from_bytes(raw)
    except ManifestError as exc:
        raise WorkerError("bad_manifest", f"{path}: {exc}", subject=exc.subject) from None
    root = path.parent.resolve()
    graph_name = manifest.graph_file
    graph_bytes = _read_listed(path, root, manifest, graph_name)
    try:
        locations = external_data_locations(graph_bytes)
    except WireError as exc:
        raise WorkerError(
            "bad_graph",
            f"{path}: graph_file {graph_name!r} is not a readable ONNX model ({exc}); "
            "accepted: a serialized ONNX ModelProto",
            subject=graph_name,
        ) from None
    graph_dir = posixpath.dirname(graph_name)
    external: dict[str, bytes] = {}
    for location in locations:
        try:
            check_relative_path(location)
        except ManifestError as exc:
            raise WorkerError(
                "external_data_not_listed",
                f"{path}: graph_file {graph_name!r} references external data {location!r} "
                f"({exc}); accepted: a relative path inside the bundle",
                subject=location,
            ) from None
        name = posixpath.join(graph_dir, location) if graph_dir else location
        if name not in manifest.files:
            raise WorkerError(
                "external_data_not_listed",
                f"{path}: graph_file {graph_name!r} references external data {name!r}, which "
                "the manifest does not list; accepted: every external-data file listed with "
                "its sha256",
                subject=name,
            )
        external[location] = _read_listed(path, root, manifest, name)
    inputs_name = manifest.example_inputs_file
    examples = _load_examples(path, inputs_name, _read_listed(path, root, manifest, inputs_name))
    return LoadedGraph(
        manifest_path=path,
        manifest=manifest,
        graph_dir=root.joinpath(*PurePosixPath(graph_dir).parts),
        graph_bytes=graph_bytes,
        external_data=MappingProxyType(external),
        example_inputs=MappingProxyType(examples),
    )


def _read_regular(path: Path, subject: str, *, limit: int | None = None) -> bytes:
    try:
        with path.open("rb") as stream:
            info = os.fstat(stream.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise WorkerError(
                    "missing_file",
                    f"{path} is not a regular file; accepted: a regular file",
                    subject=subject,
                )
            if limit is not None and info.st_size > limit:
                raise WorkerError(
                    "bad_manifest",
                    f"{path} is {info.st_size} bytes; accepted: at most {limit}",
                    subject=subject,
                )
            return stream.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise WorkerError(
            "missing_file",
            f"{path} does not exist; accepted: a file present in the bundle",
            subject=subject,
        ) from None


def _read_listed(manifest_path: Path, root: Path, manifest: ArtifactManifest, name: str) -> bytes:
    target = root.joinpath(*PurePosixPath(name).parts).resolve()
    if not target.is_relative_to(root):
        raise WorkerError(
            "symlink_escape",
            f"{manifest_path}: file {name!r} resolves to {target}, outside the bundle; "
            "accepted: files inside the bundle directory",
            subject=name,
        )
    data = _read_regular(target, name)
    actual = _sha256(data)
    expected = manifest.files[name]
    if actual != expected:
        raise WorkerError(
            "hash_mismatch",
            f"{manifest_path}: file {name!r} as loaded has sha256 {actual} but the manifest "
            f"lists {expected}; accepted: the exact bytes the manifest was written for",
            subject=name,
        )
    return data


def _load_examples(manifest_path: Path, name: str, data: bytes) -> dict[str, np.ndarray]:
    accepted = "accepted: an .npz archive of plain numeric or boolean arrays (no pickle)"
    try:
        loaded = np.load(io.BytesIO(data), allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise WorkerError(
                "bad_example_inputs",
                f"{manifest_path}: example_inputs_file {name!r} is a single array, not an "
                f"archive of named arrays; {accepted}",
                subject=name,
            )
        with loaded:
            arrays = {key: np.asarray(loaded[key]) for key in loaded.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise WorkerError(
            "bad_example_inputs",
            f"{manifest_path}: example_inputs_file {name!r} cannot be loaded ({exc}); {accepted}",
            subject=name,
        ) from None
    if not arrays:
        raise WorkerError(
            "bad_example_inputs",
            f"{manifest_path}: example_inputs_file {name!r} holds no arrays; {accepted}",
            subject=name,
        )
    for key, array in arrays.items():
        try:
            dtype_of(array)
        except ValueError as exc:
            raise WorkerError(
                "bad_example_inputs",
                f"{manifest_path}: example input {key!r} in {name!r}: {exc}",
                subject=key,
            ) from None
    return arrays
