"""The artifact manifest document: every rejection has a stable code and subject."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest

from runtime.contracts import (
    MANIFEST_NAME,
    REQUIRED_METADATA,
    ArtifactManifest,
    ManifestError,
    check_relative_path,
)
from runtime.contracts.manifest import MAX_MANIFEST_BYTES

HASH = "0" * 63 + "a"


def document() -> dict[str, Any]:
    return {
        "schema_version": 1,
        "component": "tts.decoder",
        "files": {"graph.onnx": HASH, "data/inputs.npz": "f" * 64},
        "metadata": {
            "graph_file": "graph.onnx",
            "example_inputs_file": "data/inputs.npz",
            "checkpoint_revision": "abc123",
            "precision": "fp32",
            "layout": "NCHW",
            "exporter": "torch.onnx 2.4",
            "calibration": "none",
            "validation": "max_abs_err=1e-5",
        },
    }


def parse(doc: object) -> ArtifactManifest:
    return ArtifactManifest.from_bytes(json.dumps(doc).encode())


def refused(raw: bytes) -> ManifestError:
    with pytest.raises(ManifestError) as info:
        ArtifactManifest.from_bytes(raw)
    return info.value


def refused_doc(doc: object) -> ManifestError:
    return refused(json.dumps(doc).encode())


def test_a_valid_manifest() -> None:
    raw = json.dumps(document()).encode()
    manifest = ArtifactManifest.from_bytes(raw)
    assert manifest.component == "tts.decoder"
    assert manifest.graph_file == "graph.onnx"
    assert manifest.example_inputs_file == "data/inputs.npz"
    assert manifest.files["graph.onnx"] == HASH
    assert manifest.identity == hashlib.sha256(raw).hexdigest()
    assert manifest.to_document() == document()
    assert set(REQUIRED_METADATA) <= set(manifest.metadata)


def test_identity_is_of_the_exact_bytes() -> None:
    compact = json.dumps(document(), separators=(",", ":")).encode()
    spaced = json.dumps(document(), indent=2).encode()
    assert (
        ArtifactManifest.from_bytes(compact).identity
        != ArtifactManifest.from_bytes(spaced).identity
    )


def test_record_metadata_is_allowed() -> None:
    doc = document()
    doc["metadata"]["calibration"] = {"method": "minmax", "samples": 64}
    doc["metadata"]["validation"] = {"max_abs_err": 1e-5, "passed": True}
    manifest = parse(doc)
    assert manifest.metadata["validation"] == {"max_abs_err": 1e-5, "passed": True}


def test_extra_metadata_is_kept() -> None:
    doc = document()
    doc["metadata"]["notes"] = "exported on a clean checkout"
    assert parse(doc).metadata["notes"] == "exported on a clean checkout"


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b'{"schema_version": 1',
        b"\xff\xfe{}",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"n": ' + b"1" * 5000 + b"}",
        b'{"schema_version": 1, "schema_version": 1}',
    ],
    ids=["syntax", "unterminated", "not_utf8", "deep_nesting", "huge_integer", "duplicate_key"],
)
def test_bad_json(raw: bytes) -> None:
    error = refused(raw)
    assert error.code == "bad_json"
    assert "not valid UTF-8 JSON" in str(error)


def test_duplicate_file_entries_are_refused() -> None:
    text = json.dumps(document()).replace(
        '"graph.onnx": "' + HASH + '"',
        '"graph.onnx": "' + HASH + '", "graph.onnx": "' + "b" * 64 + '"',
    )
    error = refused(text.encode())
    assert error.code == "bad_json"
    assert "duplicate key 'graph.onnx'" in str(error)


def test_too_large() -> None:
    assert refused(b" " * (MAX_MANIFEST_BYTES + 1)).code == "too_large"


def test_not_an_object() -> None:
    assert refused_doc([document()]).code == "bad_schema"


def test_unknown_key() -> None:
    doc = document()
    doc["signature"] = "x"
    error = refused_doc(doc)
    assert (error.code, error.subject) == ("bad_schema", "signature")
    assert "unknown manifest key(s) ['signature']" in str(error)


def test_missing_key() -> None:
    doc = document()
    del doc["component"]
    error = refused_doc(doc)
    assert (error.code, error.subject) == ("bad_schema", "component")


@pytest.mark.parametrize("version", [2, 0, "1", 1.0, True, None])
def test_schema_version(version: object) -> None:
    doc = document()
    doc["schema_version"] = version
    error = refused_doc(doc)
    assert (error.code, error.subject) == ("bad_schema", "schema_version")
    assert "accepted: 1" in str(error)


@pytest.mark.parametrize("component", ["", "   ", 3])
def test_bad_component(component: object) -> None:
    doc = document()
    doc["component"] = component
    assert refused_doc(doc).subject == "component"


@pytest.mark.parametrize("files", [{}, [], "graph.onnx"])
def test_files_must_be_a_non_empty_object(files: object) -> None:
    doc = document()
    doc["files"] = files
    error = refused_doc(doc)
    assert (error.code, error.subject) == ("bad_schema", "files")


@pytest.mark.parametrize("key", REQUIRED_METADATA)
def test_missing_metadata(key: str) -> None:
    doc = document()
    del doc["metadata"][key]
    error = refused_doc(doc)
    assert (error.code, error.subject) == ("missing_metadata", f"metadata.{key}")
    assert key in str(error)


def test_metadata_must_be_an_object() -> None:
    doc = document()
    doc["metadata"] = ["graph.onnx"]
    assert refused_doc(doc).subject == "metadata"


@pytest.mark.parametrize("key", ["precision", "graph_file"])
def test_plain_metadata_must_be_a_string(key: str) -> None:
    doc = document()
    doc["metadata"][key] = {"value": "fp32"}
    error = refused_doc(doc)
    assert (error.code, error.subject) == ("bad_schema", f"metadata.{key}")
    assert "must be a string" in str(error)


def test_record_metadata_must_be_a_string_or_object() -> None:
    doc = document()
    doc["metadata"]["validation"] = ["ok"]
    assert "a string or an object" in str(refused_doc(doc))


@pytest.mark.parametrize("digest", ["A" * 64, "0" * 63, "0" * 65, "g" * 64, 12, None])
def test_bad_hash(digest: object) -> None:
    doc = document()
    doc["files"]["graph.onnx"] = digest
    error = refused_doc(doc)
    assert (error.code, error.subject) == ("bad_hash", "graph.onnx")
    assert "64 lowercase hex digits" in str(error)


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/etc/passwd", "absolute_path"),
        ("C:/model.onnx", "absolute_path"),
        ("c:model.onnx", "absolute_path"),
        ("../outside.onnx", "path_traversal"),
        ("data/../../outside.onnx", "path_traversal"),
        ("data\\model.onnx", "bad_path"),
        ("", "bad_path"),
        ("./model.onnx", "bad_path"),
        ("data//model.onnx", "bad_path"),
        ("data/", "bad_path"),
        ("model\n.onnx", "bad_path"),
        (MANIFEST_NAME, "bad_path"),
    ],
)
def test_bad_paths(path: str, code: str) -> None:
    doc = document()
    doc["files"][path] = HASH
    error = refused_doc(doc)
    assert (error.code, error.subject) == (code, path)


def test_check_relative_path_accepts_plain_paths() -> None:
    for path in ("graph.onnx", "data/inputs.npz", "a/b/c.bin", "weights.onnx.data"):
        check_relative_path(path)


def test_case_duplicate() -> None:
    doc = document()
    doc["files"]["Graph.ONNX"] = HASH
    error = refused_doc(doc)
    assert (error.code, error.subject) == ("case_duplicate", "Graph.ONNX")
    assert "'graph.onnx'" in str(error)


@pytest.mark.parametrize("key", ["graph_file", "example_inputs_file"])
def test_named_files_must_be_listed(key: str) -> None:
    doc = copy.deepcopy(document())
    doc["metadata"][key] = "missing.bin"
    error = refused_doc(doc)
    assert (error.code, error.subject) == ("not_in_files", f"metadata.{key}")
    assert "'missing.bin'" in str(error)
