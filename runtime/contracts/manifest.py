"""The artifact manifest (schema_version 1), parsed and checked without touching files.

A bundle is a directory holding ``manifest.json`` and the files it lists::

    {"schema_version": 1, "component": "name",
     "files": {"graph.onnx": "<sha256>", "inputs.npz": "<sha256>"},
     "metadata": {"graph_file": "graph.onnx", "example_inputs_file": "inputs.npz",
                  "checkpoint_revision": "...", "precision": "...", "layout": "...",
                  "exporter": "...", "calibration": "...", "validation": "..."}}

This module checks the document itself (schema, hash syntax, path syntax); the runtime's
``artifacts`` module checks the files on disk against it.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
REQUIRED_METADATA = (
    "graph_file",
    "example_inputs_file",
    "checkpoint_revision",
    "precision",
    "layout",
    "exporter",
    "calibration",
    "validation",
)
#: Metadata values that may be structured records instead of plain strings.
RECORD_METADATA = frozenset({"calibration", "validation"})
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_DRIVE_RE = re.compile(r"^[A-Za-z]:")
MAX_MANIFEST_BYTES = 4 * 1024 * 1024


class ManifestError(ValueError):
    """The manifest is malformed. ``code`` is stable; ``subject`` names the field or file."""

    def __init__(self, code: str, message: str, subject: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.subject = subject


def check_relative_path(path: str) -> None:
    """Refuse anything but a plain relative POSIX path inside the bundle."""
    if not path:
        raise ManifestError("bad_path", "an empty file name is not allowed", path)
    if "\\" in path:
        raise ManifestError("bad_path", f"{path!r}: use '/' separators, not '\\'", path)
    if path.startswith("/") or _DRIVE_RE.match(path):
        raise ManifestError(
            "absolute_path", f"{path!r} is absolute; paths must be relative to the manifest", path
        )
    parts = path.split("/")
    if ".." in parts:
        raise ManifestError("path_traversal", f"{path!r} leaves the bundle ('..')", path)
    if any(part in ("", ".") for part in parts):
        raise ManifestError("bad_path", f"{path!r} has an empty or '.' segment", path)
    if any(ord(ch) < 32 for ch in path):
        raise ManifestError("bad_path", f"{path!r} contains control characters", path)


@dataclass(frozen=True, slots=True)
class ArtifactManifest:
    """A parsed manifest. ``identity`` is the sha256 of the exact manifest bytes."""

    component: str
    files: Mapping[str, str]
    metadata: Mapping[str, Any]
    identity: str

    @property
    def graph_file(self) -> str:
        return str(self.metadata["graph_file"])

    @property
    def example_inputs_file(self) -> str:
        return str(self.metadata["example_inputs_file"])

    @classmethod
    def from_bytes(cls, raw: bytes) -> ArtifactManifest:
        if len(raw) > MAX_MANIFEST_BYTES:
            raise ManifestError(
                "too_large", f"manifest is {len(raw)} bytes; at most {MAX_MANIFEST_BYTES}"
            )
        try:
            doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
        except (ValueError, RecursionError) as exc:
            # ValueError covers bad UTF-8, bad JSON, duplicate keys and over-long integers.
            raise ManifestError("bad_json", f"manifest is not valid UTF-8 JSON: {exc}") from None
        return cls.from_document(doc, identity=hashlib.sha256(raw).hexdigest())

    @classmethod
    def from_document(cls, doc: object, *, identity: str) -> ArtifactManifest:
        if not isinstance(doc, dict):
            raise ManifestError("bad_schema", "manifest must be a JSON object")
        expected = {"schema_version", "component", "files", "metadata"}
        unknown = sorted(set(doc) - expected)
        if unknown:
            raise ManifestError(
                "bad_schema",
                f"unknown manifest key(s) {unknown}; accepted: {sorted(expected)}",
                unknown[0],
            )
        missing = sorted(expected - set(doc))
        if missing:
            raise ManifestError("bad_schema", f"manifest is missing {missing}", missing[0])
        version = doc["schema_version"]
        if type(version) is not int or version != SCHEMA_VERSION:
            raise ManifestError(
                "bad_schema",
                f"schema_version {version!r} is not supported; accepted: {SCHEMA_VERSION}",
                "schema_version",
            )
        component = doc["component"]
        if not isinstance(component, str) or not component.strip():
            raise ManifestError("bad_schema", "component must be a non-empty string", "component")
        files = _parse_files(doc["files"])
        metadata = _parse_metadata(doc["metadata"], files)
        return cls(component=component, files=files, metadata=metadata, identity=identity)

    def to_document(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "component": self.component,
            "files": dict(self.files),
            "metadata": dict(self.metadata),
        }


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        # Parsers disagree on which duplicate wins; a manifest must mean one thing.
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _parse_files(files: object) -> dict[str, str]:
    if not isinstance(files, dict) or not files:
        raise ManifestError("bad_schema", "files must be a non-empty object", "files")
    seen_folded: dict[str, str] = {}
    out: dict[str, str] = {}
    for path, digest in files.items():
        check_relative_path(path)
        if path == MANIFEST_NAME:
            raise ManifestError("bad_path", f"{MANIFEST_NAME} cannot list itself", path)
        folded = path.casefold()
        if folded in seen_folded:
            raise ManifestError(
                "case_duplicate",
                f"{path!r} and {seen_folded[folded]!r} differ only by case",
                path,
            )
        seen_folded[folded] = path
        if not isinstance(digest, str) or not _SHA256_RE.match(digest):
            raise ManifestError(
                "bad_hash", f"files[{path!r}] must be 64 lowercase hex digits (sha256)", path
            )
        out[path] = digest
    return out


def _parse_metadata(metadata: object, files: Mapping[str, str]) -> dict[str, Any]:
    if not isinstance(metadata, dict):
        raise ManifestError("bad_schema", "metadata must be an object", "metadata")
    missing = [key for key in REQUIRED_METADATA if key not in metadata]
    if missing:
        raise ManifestError(
            "missing_metadata", f"metadata is missing {missing}", f"metadata.{missing[0]}"
        )
    for key in REQUIRED_METADATA:
        value = metadata[key]
        ok = isinstance(value, str) or (key in RECORD_METADATA and isinstance(value, dict))
        if not ok:
            kind = "a string or an object" if key in RECORD_METADATA else "a string"
            raise ManifestError("bad_schema", f"metadata.{key} must be {kind}", f"metadata.{key}")
    for key in ("graph_file", "example_inputs_file"):
        if metadata[key] not in files:
            raise ManifestError(
                "not_in_files",
                f"metadata.{key} {metadata[key]!r} is not among the manifest's files",
                f"metadata.{key}",
            )
    return dict(metadata)
