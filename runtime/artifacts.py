"""Verified artifact bundles: check a bundle's files on disk against its manifest, and make bundles.

A bundle is a directory holding ``manifest.json`` and the files it lists (see
:mod:`runtime.contracts.manifest` for the document). :func:`verify_bundle` turns a manifest path
into a :class:`VerifiedBundle` only when every listed file is a regular file inside the bundle
whose sha256 matches, and every ONNX external-data file the graph references is itself listed
(and so verified). :func:`inspect_bundle` runs the same checks but reports every file's status
instead of stopping at the first problem. :func:`create_bundle` copies a graph, its external
data and its example inputs into a new bundle and writes the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import shutil
import stat
import threading
import time
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

import numpy as np

import runtime
from runtime.contracts.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    REQUIRED_METADATA,
    ArtifactManifest,
    ManifestError,
    check_relative_path,
)
from runtime.errors import UsageError, VerificationError
from runtime.graph_inputs import infer_precision, input_mismatches, required_inputs
from runtime.onnx_graph import external_locations, load_graph, model_tensors
from runtime.onnx_wire import WireError, external_data_locations

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

    import onnx

__all__ = [
    "BundleCreationError",
    "BundleReport",
    "FileCheck",
    "VerifiedBundle",
    "create_bundle",
    "external_data_references",
    "forget_bundle_reports",
    "inspect_bundle",
    "load_example_inputs",
    "load_graph",
    "parse_meta_pairs",
    "sha256_file",
    "verify_bundle",
]

FILE_OK: Final = "ok"
FILE_MISSING: Final = "missing"
FILE_HASH_MISMATCH: Final = "hash_mismatch"
FILE_ESCAPES_BUNDLE: Final = "escapes_bundle"
FILE_NOT_A_FILE: Final = "not_a_file"
#: The name on disk differs from the listed name only by case (case-insensitive filesystems).
FILE_CASE_MISMATCH: Final = "case_mismatch"
#: The file could not be read: no permission, a symlink loop, an I/O error.
FILE_UNREADABLE: Final = "unreadable"

_RELATIVE_PATHS = "relative POSIX paths with '/' separators and no empty, '.' or '..' segments"
_ACCEPTED: Final[Mapping[str, str]] = {
    "too_large": f"a manifest of at most {MAX_MANIFEST_BYTES} bytes",
    "bad_json": "a UTF-8 JSON object",
    "bad_schema": "an object with exactly schema_version (1), component, files and metadata",
    "bad_path": _RELATIVE_PATHS,
    "absolute_path": _RELATIVE_PATHS,
    "path_traversal": _RELATIVE_PATHS,
    "case_duplicate": "file names that stay distinct when case is ignored",
    "bad_hash": "64 lowercase hex digits (sha256)",
    "missing_metadata": f"metadata holding all of {', '.join(REQUIRED_METADATA)}",
    "not_in_files": "graph_file and example_inputs_file naming entries of files",
}
_META_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
#: Metadata keys create_bundle derives from its arguments; --meta cannot change them.
_FIXED_METADATA = ("graph_file", "example_inputs_file")


class BundleCreationError(UsageError):
    """A bundle could not be created from the given graph, inputs or options.

    ``code`` is stable; ``subject`` names the file, input or metadata key at fault.
    """

    def __init__(self, message: str, *, code: str, subject: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.subject = subject


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    """The sha256 hex digest of a file, read in chunks so large weights never sit in memory."""
    return _hash_and_size(path, chunk_size)[0]


#: What a file's stat says of its identity and last change: device, inode, size, mtime, ctime.
FileStamp = tuple[int, int, int, int, int]
#: The coarsest file-system clock tick a change time may fall in (FAT's two seconds).
STAMP_GRANULARITY_S: Final = 2.0


def _stamp_of(info: os.stat_result) -> FileStamp:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _stamp(path: Path) -> FileStamp | None:
    """``path``'s stamp (following symlinks), None when it cannot be read."""
    try:
        return _stamp_of(path.resolve().stat())
    except (OSError, RuntimeError):
        return None


def _hash_and_size(path: Path, chunk_size: int = 1 << 20) -> tuple[str, int]:
    digest = hashlib.sha256()
    buffer = bytearray(chunk_size)
    view = memoryview(buffer)
    size = 0
    with path.open("rb", buffering=0) as stream:
        while count := stream.readinto(buffer):
            digest.update(view[:count])
            size += count
    return digest.hexdigest(), size


@dataclass(frozen=True, slots=True)
class VerifiedBundle:
    """A bundle whose files all matched its manifest when it was verified."""

    root: Path
    manifest_path: Path
    manifest: ArtifactManifest
    identity: str
    file_sizes: Mapping[str, int]

    def path(self, name: str) -> Path:
        """The absolute path of a file the manifest lists."""
        if name not in self.manifest.files:
            raise KeyError(f"{name!r} is not listed in {self.manifest_path}")
        return self.root.joinpath(*PurePosixPath(name).parts)

    @property
    def component(self) -> str:
        return self.manifest.component

    @property
    def graph_path(self) -> Path:
        return self.path(self.manifest.graph_file)

    @property
    def example_inputs_path(self) -> Path:
        return self.path(self.manifest.example_inputs_file)

    def to_json(self) -> dict[str, Any]:
        return {
            "component": self.manifest.component,
            "identity": self.identity,
            "root": str(self.root),
            "manifest_path": str(self.manifest_path),
            "files": {
                name: {"sha256": digest, "size": self.file_sizes[name]}
                for name, digest in self.manifest.files.items()
            },
            "metadata": dict(self.manifest.metadata),
        }


@dataclass(frozen=True, slots=True)
class FileCheck:
    """The outcome of checking one listed file. ``status`` is one of the ``FILE_*`` constants."""

    name: str
    expected_sha256: str
    status: str
    actual_sha256: str | None = None
    size: int | None = None
    #: Why an ``unreadable`` file could not be read (the OS error).
    detail: str | None = None
    #: The file's stat when it was hashed (see :meth:`BundleReport.unchanged`).
    stamp: FileStamp | None = field(default=None, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == FILE_OK

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "expected_sha256": self.expected_sha256,
            "actual_sha256": self.actual_sha256,
            "size": self.size,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class BundleReport:
    """Every check made on a bundle; ``manifest`` is None when the manifest itself was refused."""

    manifest_path: Path
    manifest: ArtifactManifest | None
    files: tuple[FileCheck, ...]
    errors: tuple[VerificationError, ...]
    #: The manifest's stat before it was read (see :meth:`unchanged`).
    manifest_stamp: FileStamp | None = field(default=None, compare=False, repr=False)
    #: The wall-clock time (ns) the checks began, before any file was read.
    checked_ns: int = field(default=0, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return self.manifest is not None and not self.errors

    def unchanged(self) -> bool:
        """Whether every file checked keeps the stat it was read with, and changed more than
        :data:`STAMP_GRANULARITY_S` before (a later write in that clock tick would leave the
        stat alike): then the report may stand for hashing the files again."""
        settled = self.checked_ns - int(STAMP_GRANULARITY_S * 1e9)
        root = self.manifest_path.parent.resolve()
        stamped = [(self.manifest_path, self.manifest_stamp)]
        stamped += [
            (root.joinpath(*PurePosixPath(check.name).parts), check.stamp) for check in self.files
        ]
        for path, stamp in stamped:
            if stamp is None or max(stamp[3], stamp[4]) > settled or _stamp(path) != stamp:
                return False
        return True

    def verified(self) -> VerifiedBundle:
        """The bundle as :func:`verify_bundle` gives it, from this report's checks (no file is
        read again); raises the first error, the one :func:`verify_bundle` raises."""
        if self.errors:
            raise self.errors[0]
        assert self.manifest is not None, "a report without errors always has its manifest"
        return VerifiedBundle(
            root=self.manifest_path.parent.resolve(),
            manifest_path=self.manifest_path,
            manifest=self.manifest,
            identity=self.manifest.identity,
            file_sizes=MappingProxyType(
                {check.name: check.size for check in self.files if check.size is not None}
            ),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "manifest_path": str(self.manifest_path),
            "ok": self.ok,
            "component": None if self.manifest is None else self.manifest.component,
            "identity": None if self.manifest is None else self.manifest.identity,
            "files": [check.to_json() for check in self.files],
            "errors": [
                {"code": error.code, "subject": error.subject, "message": str(error)}
                for error in self.errors
            ],
        }


#: The last sound report of each bundle checked in this process, by manifest path. A bundle
#: whose files all keep their stats (:meth:`BundleReport.unchanged`) is not hashed again: a
#: pipeline's voice is verified when its program loads and again when admission resolves it.
_SOUND: dict[Path, BundleReport] = {}
_SOUND_LOCK = threading.Lock()


def _remembered(path: Path) -> BundleReport | None:
    with _SOUND_LOCK:
        report = _SOUND.get(path)
    return report if report is not None and report.unchanged() else None


def _remember(report: BundleReport) -> BundleReport:
    with _SOUND_LOCK:
        if report.ok:
            _SOUND[report.manifest_path] = report
        else:
            _SOUND.pop(report.manifest_path, None)
    return report


def forget_bundle_reports() -> None:
    """Drop the sound reports this process keeps: each bundle is hashed again when next
    checked."""
    with _SOUND_LOCK:
        _SOUND.clear()


def inspect_bundle(manifest_path: str | Path) -> BundleReport:
    """Check a bundle completely and report every problem; never raises for bundle problems.

    A sound report made earlier in this process stands while every file keeps its stat."""
    path = _manifest_file(manifest_path)
    remembered = _remembered(path)
    if remembered is not None:
        return remembered
    checked_ns = time.time_ns()
    stamp = _stamp(path)  # before reading: a later change makes the report stale, never wrong
    manifest: ArtifactManifest | None = None
    files: list[FileCheck] = []
    errors: list[VerificationError] = []
    for item in _check_bundle(path):
        if isinstance(item, ArtifactManifest):
            manifest = item
        elif isinstance(item, FileCheck):
            files.append(item)
        else:
            errors.append(item)
    return _remember(
        BundleReport(
            manifest_path=path,
            manifest=manifest,
            files=tuple(files),
            errors=tuple(errors),
            manifest_stamp=stamp,
            checked_ns=checked_ns,
        )
    )


def verify_bundle(manifest_path: str | Path) -> VerifiedBundle:
    """Verify a bundle (its manifest file or its directory); raise the first problem found.

    The same checks as :func:`inspect_bundle`, whose sound report made earlier in this
    process stands for hashing the files again while every file keeps its stat."""
    return inspect_bundle(manifest_path).verified()


def _manifest_file(manifest_path: str | Path) -> Path:
    path = Path(manifest_path).absolute()
    return path / MANIFEST_NAME if path.is_dir() else path


def _check_bundle(
    manifest_path: Path,
) -> Iterator[ArtifactManifest | FileCheck | VerificationError]:
    """Yield the manifest, then each file's check, then any error, in a stable order."""
    try:
        manifest = _read_manifest(manifest_path)
    except VerificationError as exc:
        yield exc
        return
    yield manifest
    root = manifest_path.parent.resolve()
    listing_cache: dict[Path, frozenset[str]] = {}
    graph_ok = False
    for name, expected in manifest.files.items():
        check = _check_file(root, name, expected, listing_cache)
        yield check
        if check.ok:
            graph_ok = graph_ok or name == manifest.graph_file
        else:
            yield _file_error(manifest_path, check)
    if graph_ok:
        yield from _check_external_data(manifest_path, root, manifest)


def _read_manifest(manifest_path: Path) -> ArtifactManifest:
    try:
        info = manifest_path.stat()
    except FileNotFoundError:
        raise VerificationError(
            f"{manifest_path}: no manifest here; accepted: a bundle directory holding "
            f"{MANIFEST_NAME}, or the path of that file",
            code="missing_manifest",
            subject=str(manifest_path),
        ) from None
    if not stat.S_ISREG(info.st_mode):
        raise VerificationError(
            f"{manifest_path}: the manifest is not a regular file; accepted: a JSON file",
            code="not_a_file",
            subject=str(manifest_path),
        )
    if info.st_size > MAX_MANIFEST_BYTES:
        raise VerificationError(
            f"{manifest_path}: the manifest is {info.st_size} bytes; accepted: "
            f"{_ACCEPTED['too_large']}",
            code="too_large",
            subject=str(manifest_path),
        )
    try:
        raw = manifest_path.read_bytes()
    except OSError as exc:
        raise VerificationError(
            f"{manifest_path}: the manifest cannot be read ({exc}); accepted: a readable file",
            code="unreadable",
            subject=str(manifest_path),
        ) from None
    try:
        return ArtifactManifest.from_bytes(raw)
    except ManifestError as exc:
        raise _from_manifest_error(manifest_path, exc) from None


def _from_manifest_error(manifest_path: Path, exc: ManifestError) -> VerificationError:
    message = f"{manifest_path}: {exc}"
    accepted = _ACCEPTED.get(exc.code)
    if accepted is not None and "accepted" not in str(exc):
        message = f"{message}; accepted: {accepted}"
    return VerificationError(message, code=exc.code, subject=exc.subject)


def _check_file(
    root: Path, name: str, expected: str, listing_cache: dict[Path, frozenset[str]]
) -> FileCheck:
    parts = PurePosixPath(name).parts
    lexical = root.joinpath(*parts)
    try:
        # Names carry no '..' (the contract refuses it), so only a symlink can lead outside.
        resolved = lexical.resolve()
        if not resolved.is_relative_to(root):
            return FileCheck(name, expected, FILE_ESCAPES_BUNDLE)
        case_status = _listed_case_status(root, parts, listing_cache)
        if case_status != FILE_OK:
            return FileCheck(name, expected, case_status)
        info = resolved.stat()
        if not stat.S_ISREG(info.st_mode):
            return FileCheck(name, expected, FILE_NOT_A_FILE)
        actual, size = _hash_and_size(resolved)
    except FileNotFoundError:
        return FileCheck(name, expected, FILE_MISSING)
    # Python 3.11 reports a symlink loop in resolve() as RuntimeError, later versions as OSError.
    except (OSError, RuntimeError) as exc:
        return FileCheck(name, expected, FILE_UNREADABLE, detail=str(exc))
    status = FILE_OK if actual == expected else FILE_HASH_MISMATCH
    return FileCheck(name, expected, status, actual_sha256=actual, size=size, stamp=_stamp_of(info))


def _listed_case_status(
    root: Path, parts: tuple[str, ...], listing_cache: dict[Path, frozenset[str]]
) -> str:
    """Whether each segment of a listed name exists with exactly that spelling."""
    parent = root
    for part in parts:
        entries = listing_cache.get(parent)
        if entries is None:
            try:
                entries = frozenset(os.listdir(parent))
            except (FileNotFoundError, NotADirectoryError):
                entries = frozenset()
            listing_cache[parent] = entries
        if part not in entries:
            folded = part.casefold()
            if any(entry.casefold() == folded for entry in entries):
                return FILE_CASE_MISMATCH
            return FILE_MISSING
        parent = parent / part
    return FILE_OK


def _file_error(manifest_path: Path, check: FileCheck) -> VerificationError:
    name = check.name
    if check.status == FILE_HASH_MISMATCH:
        message = (
            f"{manifest_path}: file {name!r} has sha256 {check.actual_sha256} but the manifest "
            f"lists {check.expected_sha256}; accepted: the exact bytes the manifest was written "
            "for (the file was changed or corrupted)"
        )
    elif check.status == FILE_MISSING:
        message = (
            f"{manifest_path}: file {name!r} is listed but absent from the bundle; accepted: "
            "every listed file present next to the manifest"
        )
    elif check.status == FILE_ESCAPES_BUNDLE:
        message = (
            f"{manifest_path}: file {name!r} is a symlink (or lies under one) that leads outside "
            "the bundle; accepted: regular files, or symlinks that stay inside the bundle"
        )
        return VerificationError(message, code="symlink_escape", subject=name)
    elif check.status == FILE_UNREADABLE:
        message = (
            f"{manifest_path}: file {name!r} cannot be read ({check.detail}); accepted: a "
            "readable regular file"
        )
    elif check.status == FILE_CASE_MISMATCH:
        message = (
            f"{manifest_path}: file {name!r} exists only with different letter case; accepted: "
            "names spelled exactly as on disk"
        )
    else:
        message = (
            f"{manifest_path}: {name!r} is not a regular file; accepted: regular files "
            "(not directories, devices or pipes)"
        )
    return VerificationError(message, code=_FILE_CODES[check.status], subject=name)


_FILE_CODES: Final[Mapping[str, str]] = {
    FILE_HASH_MISMATCH: "hash_mismatch",
    FILE_MISSING: "missing_file",
    FILE_ESCAPES_BUNDLE: "symlink_escape",
    FILE_CASE_MISMATCH: "case_mismatch",
    FILE_NOT_A_FILE: "not_a_file",
    FILE_UNREADABLE: "unreadable",
}


def _check_external_data(
    manifest_path: Path, root: Path, manifest: ArtifactManifest
) -> Iterator[VerificationError]:
    graph_name = manifest.graph_file
    try:
        locations = external_data_references(root.joinpath(*PurePosixPath(graph_name).parts))
    except VerificationError as exc:
        yield VerificationError(
            f"{manifest_path}: graph_file {graph_name!r}: {exc}", code=exc.code, subject=graph_name
        )
        return
    graph_dir = posixpath.dirname(graph_name)
    for location in locations:
        try:
            check_relative_path(location)
        except ManifestError as exc:
            yield VerificationError(
                f"{manifest_path}: graph_file {graph_name!r} references external data "
                f"{location!r} ({exc}); accepted: {_RELATIVE_PATHS}, relative to the graph file",
                code=exc.code,
                subject=location,
            )
            continue
        name = posixpath.join(graph_dir, location) if graph_dir else location
        if name not in manifest.files:
            yield VerificationError(
                f"{manifest_path}: graph_file {graph_name!r} references external data {name!r}, "
                "which the manifest does not list; accepted: every external-data file listed "
                "with its sha256 in files",
                code="external_data_not_listed",
                subject=name,
            )


def external_data_references(graph_path: Path) -> tuple[str, ...]:
    """The distinct external-data locations an ONNX graph names (relative to its file).

    Covers initializers, sparse tensors, attribute tensors, subgraphs and local functions. The
    graph's protobuf wire format is read directly (no ``onnx`` import); weights are not read.
    """
    try:
        data = graph_path.read_bytes()
    except OSError as exc:
        raise VerificationError(
            f"{graph_path} cannot be read ({exc}); accepted: an ONNX model file",
            code="bad_graph",
            subject=str(graph_path),
        ) from None
    try:
        return external_data_locations(data)
    except WireError as exc:
        raise VerificationError(
            f"{graph_path} cannot be read as an ONNX model ({exc}); accepted: an ONNX model file",
            code="bad_graph",
            subject=str(graph_path),
        ) from None


def load_example_inputs(bundle: VerifiedBundle) -> dict[str, np.ndarray]:
    """The bundle's example inputs: an ``.npz`` of plain arrays (pickled objects are refused)."""
    try:
        return _load_npz(bundle.example_inputs_path)
    except ValueError as exc:
        raise VerificationError(
            f"{bundle.manifest_path}: example_inputs_file {bundle.manifest.example_inputs_file!r} "
            f"{exc}",
            code="bad_example_inputs",
            subject=bundle.manifest.example_inputs_file,
        ) from None


#: What reading an ``.npz`` archive may raise on a damaged or unsupported one: zipfile's
#: encrypted entries (RuntimeError) and unsupported compression, versions or flags
#: (NotImplementedError), a damaged deflate stream (zlib.error), besides a bad archive.
NPZ_ERRORS: Final = (
    OSError,
    ValueError,
    EOFError,
    zipfile.BadZipFile,
    NotImplementedError,
    RuntimeError,
    zlib.error,
)


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    """Load an npz without pickle; ValueError says what is wrong and what is accepted."""
    accepted = "accepted: an .npz archive of numeric/boolean/string arrays (numpy.savez)"
    try:
        loaded = np.load(path, allow_pickle=False)
    except NPZ_ERRORS as exc:
        raise ValueError(f"cannot be loaded without pickle ({exc}); {accepted}") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError(f"is a single .npy array, not an archive of named arrays; {accepted}")
    arrays: dict[str, np.ndarray] = {}
    with loaded:
        for key in loaded.files:
            try:
                arrays[key] = np.asarray(loaded[key])
            except NPZ_ERRORS as exc:
                raise ValueError(f"array {key!r} cannot be loaded ({exc}); {accepted}") from None
    return arrays


def parse_meta_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """Turn ``KEY=VALUE`` strings into a dict; the error names the pair at fault."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not _META_KEY_RE.match(key) or not value:
            raise BundleCreationError(
                f"--meta {pair!r} is not KEY=VALUE; accepted: a key of letters, digits, '_', "
                "'.' or '-' (not starting with a digit), '=', then a non-empty value",
                code="bad_meta_pair",
                subject=pair,
            )
        if key in out:
            raise BundleCreationError(
                f"--meta {pair!r} repeats key {key!r}; accepted: each key once",
                code="bad_meta_pair",
                subject=pair,
            )
        out[key] = value
    return out


def create_bundle(
    graph: Path,
    inputs: Path,
    out: Path,
    *,
    component: str | None = None,
    metadata: Mapping[str, str] | None = None,
) -> VerifiedBundle:
    """Copy a graph, its external data and its example inputs into ``out`` and write a manifest.

    ``out`` must not exist or must be an empty directory. On any failure nothing is left behind:
    a directory this call created is removed, and a pre-existing empty one is emptied again.
    """
    graph = Path(graph)
    inputs = Path(inputs)
    out = Path(out)
    _require_regular_file(graph, "graph")
    _require_regular_file(inputs, "inputs")
    created_top = _prepare_out_dir(out)
    try:
        return _fill_bundle(graph, inputs, out, component=component, metadata=metadata)
    except BaseException:
        _clean_out_dir(out, created_top)
        raise


def _require_regular_file(path: Path, role: str) -> None:
    if not path.is_file():
        raise BundleCreationError(
            f"{role} file {path} does not exist or is not a regular file; accepted: an existing "
            f"{'ONNX model' if role == 'graph' else '.npz'} file",
            code="missing_file",
            subject=str(path),
        )


def _prepare_out_dir(out: Path) -> Path | None:
    """Make ``out`` ready; return the topmost directory created (None when ``out`` existed)."""
    if out.exists() or out.is_symlink():
        if not out.is_dir() or out.is_symlink():
            raise BundleCreationError(
                f"--out {out} exists and is not a plain directory (a file or a symlink); accepted: "
                "a new or empty directory",
                code="out_not_empty",
                subject=str(out),
            )
        if any(out.iterdir()):
            raise BundleCreationError(
                f"--out {out} is not empty; accepted: a new or empty directory",
                code="out_not_empty",
                subject=str(out),
            )
        return None
    top = out
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    out.mkdir(parents=True)
    return top


def _clean_out_dir(out: Path, created_top: Path | None) -> None:
    if created_top is not None:
        shutil.rmtree(created_top, ignore_errors=True)
        return
    for entry in out.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _fill_bundle(
    graph: Path,
    inputs: Path,
    out: Path,
    *,
    component: str | None,
    metadata: Mapping[str, str] | None,
) -> VerifiedBundle:
    try:
        model = load_graph(graph)
        locations = external_locations(model, graph)
    except VerificationError as exc:
        raise BundleCreationError(str(exc), code=exc.code, subject=str(graph)) from None
    copies: dict[str, Path] = {}
    _add_copy(copies, graph.name, graph, "graph file")
    for location in locations:
        try:
            check_relative_path(location)
        except ManifestError as exc:
            raise BundleCreationError(
                f"{graph} references external data {location!r} ({exc}); accepted: "
                f"{_RELATIVE_PATHS}, relative to the graph file",
                code=exc.code,
                subject=location,
            ) from None
        source = graph.parent.joinpath(*PurePosixPath(location).parts)
        if not source.is_file():
            raise BundleCreationError(
                f"{graph} references external data {location!r}, but {source} is not a file; "
                "accepted: external-data files next to the graph as the graph names them",
                code="missing_file",
                subject=location,
            )
        _add_copy(copies, location, source, "external data")
    _add_copy(copies, inputs.name, inputs, "inputs file")

    try:
        arrays = _load_npz(inputs)
    except ValueError as exc:
        raise BundleCreationError(
            f"--inputs {inputs} {exc}", code="bad_example_inputs", subject=str(inputs)
        ) from None
    _check_inputs_match_graph(model, arrays, graph, inputs)

    meta = _default_metadata(model, graph.name, inputs.name)
    for key, value in (metadata or {}).items():
        if key in _FIXED_METADATA:
            raise BundleCreationError(
                f"metadata key {key!r} is set from the graph and inputs file names and cannot be "
                f"given; accepted: any other key (e.g. {', '.join(REQUIRED_METADATA[2:])})",
                code="fixed_metadata",
                subject=key,
            )
        meta[key] = value
    name = graph.stem if component is None else component
    if not name.strip():
        raise BundleCreationError(
            "component must be a non-empty name; accepted: e.g. the graph file's stem",
            code="bad_component",
            subject="component",
        )

    files: dict[str, str] = {}
    for relative, source in copies.items():
        destination = out.joinpath(*PurePosixPath(relative).parts)
        destination.parent.mkdir(parents=True, exist_ok=True)
        files[relative] = _copy_hashing(source, destination)
    document = {"schema_version": 1, "component": name, "files": files, "metadata": meta}
    raw = (json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
    manifest_path = out / MANIFEST_NAME
    manifest_path.write_bytes(raw)
    return verify_bundle(manifest_path)


def _add_copy(copies: dict[str, Path], name: str, source: Path, role: str) -> None:
    """Add a file to copy, refusing names that would collide in the bundle on any filesystem."""
    folded = {key.casefold(): key for key in copies}
    folded[MANIFEST_NAME.casefold()] = MANIFEST_NAME
    clash = folded.get(name.casefold())
    if clash is not None:
        raise BundleCreationError(
            f"{role} {name!r} ({source}) would take the bundle name {clash!r} (names are "
            "compared ignoring case); accepted: graph, external-data and inputs files whose "
            f"names differ from each other and from {MANIFEST_NAME}, ignoring case",
            code="name_clash",
            subject=name,
        )
    copies[name] = source


def _copy_hashing(source: Path, destination: Path, chunk_size: int = 1 << 20) -> str:
    """Copy a file and return the sha256 of the bytes written."""
    digest = hashlib.sha256()
    with source.open("rb") as reader, destination.open("xb") as writer:
        while chunk := reader.read(chunk_size):
            digest.update(chunk)
            writer.write(chunk)
    return digest.hexdigest()


def _check_inputs_match_graph(
    model: onnx.ModelProto, arrays: Mapping[str, np.ndarray], graph: Path, inputs: Path
) -> None:
    problems = input_mismatches(model, arrays)
    if problems:
        raise BundleCreationError(
            f"--inputs {inputs} does not match the inputs of {graph}: {'; '.join(problems)}; "
            f"accepted: one array per graph input, named and typed as {required_inputs(model)}",
            code="inputs_mismatch",
            subject=str(inputs),
        )


def _default_metadata(model: onnx.ModelProto, graph_name: str, inputs_name: str) -> dict[str, Any]:
    return {
        "graph_file": graph_name,
        "example_inputs_file": inputs_name,
        "checkpoint_revision": "unspecified",
        "precision": infer_precision(model, model_tensors(model)),
        "layout": "unspecified",
        "exporter": f"omni-edge-studio {runtime.__version__}",
        "calibration": "not applicable",
        "validation": "not validated",
    }
