"""Verified artifact bundles: every refusal names the manifest, the file and what is accepted."""

from __future__ import annotations

import hashlib
import json
import os
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers.onnx_graphs import (
    EXTERNAL_WEIGHTS,
    example_inputs,
    make_add_graph,
    make_bundle,
    make_matmul_graph,
    matmul_weights,
    rewrite_manifest,
    write_inputs,
)
from onnx import TensorProto, external_data_helper, helper

import runtime
from runtime.artifacts import (
    BundleCreationError,
    create_bundle,
    external_data_references,
    inspect_bundle,
    load_example_inputs,
    parse_meta_pairs,
    sha256_file,
    verify_bundle,
)
from runtime.contracts.manifest import REQUIRED_METADATA
from runtime.errors import EXIT_REFUSED, EXIT_USAGE, VerificationError

if TYPE_CHECKING:
    from pathlib import Path


def refusal(manifest: Path) -> VerificationError:
    with pytest.raises(VerificationError) as caught:
        verify_bundle(manifest)
    assert str(manifest) in str(caught.value)
    assert "accepted" in str(caught.value)
    assert caught.value.exit_code == EXIT_REFUSED
    return caught.value


def add_listed_file(manifest: Path, name: str, content: bytes | None = None) -> None:
    digest = hashlib.sha256(content or b"").hexdigest()

    def change(doc: dict[str, Any]) -> None:
        doc["files"][name] = digest

    rewrite_manifest(manifest, change)


# --- good bundles ---------------------------------------------------------------------------


def test_round_trip_create_verify_and_run(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path, kind="matmul", external_weights=True)
    bundle = verify_bundle(manifest)

    assert bundle.identity == hashlib.sha256(manifest.read_bytes()).hexdigest()
    assert bundle.identity == bundle.manifest.identity
    assert bundle.root == manifest.parent.resolve()
    assert set(bundle.manifest.files) == {"matmul.onnx", EXTERNAL_WEIGHTS, "inputs.npz"}
    for name, digest in bundle.manifest.files.items():
        assert sha256_file(bundle.path(name)) == digest
        assert bundle.file_sizes[name] == bundle.path(name).stat().st_size
    assert bundle.component == "matmul"
    assert bundle.manifest.metadata == {
        "graph_file": "matmul.onnx",
        "example_inputs_file": "inputs.npz",
        "checkpoint_revision": "unspecified",
        "precision": "float32",
        "layout": "unspecified",
        "exporter": f"omni-edge-studio {runtime.__version__}",
        "calibration": "not applicable",
        "validation": "not validated",
    }

    inputs = load_example_inputs(bundle)
    np.testing.assert_array_equal(inputs["x"], example_inputs("matmul")["x"])
    session = ort.InferenceSession(str(bundle.graph_path), providers=["CPUExecutionProvider"])
    (result,) = session.run(None, inputs)
    np.testing.assert_allclose(result, inputs["x"] @ matmul_weights(), rtol=1e-6)

    as_json = bundle.to_json()
    assert json.loads(json.dumps(as_json)) == as_json
    assert as_json["files"][EXTERNAL_WEIGHTS]["size"] == matmul_weights().nbytes
    assert as_json["identity"] == bundle.identity


def test_manifest_follows_the_seed_schema(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path, kind="matmul", external_weights=True)
    doc = json.loads(manifest.read_text(encoding="utf-8"))
    assert set(doc) == {"schema_version", "component", "files", "metadata"}
    assert doc["schema_version"] == 1
    assert set(doc["metadata"]) == set(REQUIRED_METADATA)
    assert all(len(digest) == 64 for digest in doc["files"].values())


def test_seed_shaped_manifest_with_record_metadata_verifies(tmp_path: Path) -> None:
    source = tmp_path / "src"
    make_matmul_graph(source / "graph.onnx", external_weights=True)
    write_inputs(source / "inputs.npz", example_inputs("matmul"))
    root = tmp_path / "bundle"
    root.mkdir()
    files = {}
    for name in ("graph.onnx", "weights.bin", "inputs.npz"):
        (root / name).write_bytes((source / name).read_bytes())
        files[name] = sha256_file(root / name)
    doc = {
        "schema_version": 1,
        "component": "model-owned-component-name",
        "files": files,
        "metadata": {
            "graph_file": "graph.onnx",
            "example_inputs_file": "inputs.npz",
            "checkpoint_revision": "r1",
            "precision": "float32",
            "layout": "NC",
            "exporter": "torch 2.5",
            "calibration": "not applicable",
            "validation": {"max_abs_error": 1e-6, "reference": "pytorch"},
        },
    }
    raw = json.dumps(doc).encode()
    (root / "manifest.json").write_bytes(raw)
    bundle = verify_bundle(root)  # the bundle directory stands for its manifest.json
    assert bundle.identity == hashlib.sha256(raw).hexdigest()
    assert bundle.manifest.metadata["validation"] == {"max_abs_error": 1e-6, "reference": "pytorch"}


def test_identity_is_the_exact_manifest_bytes(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path)
    before = verify_bundle(manifest).identity
    manifest.write_bytes(manifest.read_bytes() + b"\n")
    after = verify_bundle(manifest).identity
    assert before != after
    assert after == hashlib.sha256(manifest.read_bytes()).hexdigest()


def test_symlink_inside_the_bundle_is_accepted(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path)
    (manifest.parent / "copy.npz").symlink_to("inputs.npz")
    add_listed_file(manifest, "copy.npz", (manifest.parent / "inputs.npz").read_bytes())
    assert "copy.npz" in verify_bundle(manifest).manifest.files


def test_files_in_subdirectories(tmp_path: Path) -> None:
    source = tmp_path / "src"
    make_matmul_graph(source / "m.onnx", external_weights=True)
    write_inputs(source / "in.npz", example_inputs("matmul"))
    root = tmp_path / "bundle"
    (root / "model").mkdir(parents=True)
    for name in ("m.onnx", EXTERNAL_WEIGHTS):
        (root / "model" / name).write_bytes((source / name).read_bytes())
    (root / "in.npz").write_bytes((source / "in.npz").read_bytes())
    names = ["model/m.onnx", f"model/{EXTERNAL_WEIGHTS}", "in.npz"]
    doc = {
        "schema_version": 1,
        "component": "m",
        "files": {name: sha256_file(root / name) for name in names},
        "metadata": dict.fromkeys(REQUIRED_METADATA, "x")
        | {"graph_file": "model/m.onnx", "example_inputs_file": "in.npz"},
    }
    (root / "manifest.json").write_text(json.dumps(doc), encoding="utf-8")
    bundle = verify_bundle(root / "manifest.json")
    assert bundle.graph_path == root.resolve() / "model" / "m.onnx"

    # External data lives next to the graph, so listing it at the bundle root is not enough.
    def move_weights(doc: dict[str, Any]) -> None:
        doc["files"][EXTERNAL_WEIGHTS] = doc["files"].pop(f"model/{EXTERNAL_WEIGHTS}")

    rewrite_manifest(root / "manifest.json", move_weights)
    (root / EXTERNAL_WEIGHTS).write_bytes((source / EXTERNAL_WEIGHTS).read_bytes())
    error = refusal(root / "manifest.json")
    assert error.code == "external_data_not_listed"
    assert error.subject == f"model/{EXTERNAL_WEIGHTS}"


def test_sha256_file_streams_in_chunks(tmp_path: Path) -> None:
    data = os.urandom(10_000)
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert sha256_file(path, chunk_size=7) == hashlib.sha256(data).hexdigest()
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()


# --- refusals: files ------------------------------------------------------------------------


def test_tampered_byte_names_the_file(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path, kind="matmul", external_weights=True)
    weights = manifest.parent / EXTERNAL_WEIGHTS
    data = bytearray(weights.read_bytes())
    data[5] ^= 0x01
    weights.write_bytes(bytes(data))
    error = refusal(manifest)
    assert error.code == "hash_mismatch"
    assert error.subject == EXTERNAL_WEIGHTS
    assert repr(EXTERNAL_WEIGHTS) in str(error)
    assert hashlib.sha256(bytes(data)).hexdigest() in str(error)


def test_missing_file(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path)
    (manifest.parent / "inputs.npz").unlink()
    error = refusal(manifest)
    assert (error.code, error.subject) == ("missing_file", "inputs.npz")
    assert "'inputs.npz'" in str(error)


def test_listed_directory_is_not_a_file(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path)
    (manifest.parent / "data").mkdir()
    add_listed_file(manifest, "data")
    error = refusal(manifest)
    assert (error.code, error.subject) == ("not_a_file", "data")


def test_extra_traversal_path(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path)
    (tmp_path / "outside.bin").write_bytes(b"secret")
    add_listed_file(manifest, "../outside.bin", b"secret")
    error = refusal(manifest)
    assert (error.code, error.subject) == ("path_traversal", "../outside.bin")
    assert "'../outside.bin'" in str(error)


def test_absolute_path(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"secret")
    add_listed_file(manifest, str(outside), b"secret")
    error = refusal(manifest)
    assert (error.code, error.subject) == ("absolute_path", str(outside))
    assert "relative" in str(error)


def test_symlink_escape(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path)
    outside = tmp_path / "outside.npz"
    outside.write_bytes((manifest.parent / "inputs.npz").read_bytes())
    (manifest.parent / "inputs.npz").unlink()
    (manifest.parent / "inputs.npz").symlink_to(outside)
    error = refusal(manifest)  # the hash still matches: only the escape is wrong
    assert (error.code, error.subject) == ("symlink_escape", "inputs.npz")


def test_symlinked_directory_escape(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "extra.bin").write_bytes(b"x")
    (manifest.parent / "sub").symlink_to(outside, target_is_directory=True)
    add_listed_file(manifest, "sub/extra.bin", b"x")
    error = refusal(manifest)
    assert (error.code, error.subject) == ("symlink_escape", "sub/extra.bin")


def test_case_duplicate(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path)
    (manifest.parent / "INPUTS.npz").write_bytes((manifest.parent / "inputs.npz").read_bytes())
    add_listed_file(manifest, "INPUTS.npz", (manifest.parent / "inputs.npz").read_bytes())
    error = refusal(manifest)
    assert error.code == "case_duplicate"
    assert "INPUTS.npz" in str(error)
    assert "inputs.npz" in str(error)


def test_case_mismatch_with_the_name_on_disk(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path)

    def rename(doc: dict[str, Any]) -> None:
        doc["files"]["Inputs.npz"] = doc["files"].pop("inputs.npz")
        doc["metadata"]["example_inputs_file"] = "Inputs.npz"

    rewrite_manifest(manifest, rename)
    error = refusal(manifest)
    assert (error.code, error.subject) == ("case_mismatch", "Inputs.npz")


# --- refusals: external data ----------------------------------------------------------------


def test_external_data_outside_the_manifest(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path, kind="matmul", external_weights=True)

    def drop_weights(doc: dict[str, Any]) -> None:
        del doc["files"][EXTERNAL_WEIGHTS]

    rewrite_manifest(manifest, drop_weights)
    assert (manifest.parent / EXTERNAL_WEIGHTS).is_file()  # present, but not verified
    error = refusal(manifest)
    assert (error.code, error.subject) == ("external_data_not_listed", EXTERNAL_WEIGHTS)
    assert "'matmul.onnx'" in str(error)


def _bundle_with_external_location(tmp_path: Path, location: str) -> Path:
    """A matmul bundle whose graph points its weights at ``location`` (re-hashed manifest)."""
    manifest = make_bundle(tmp_path, kind="matmul", external_weights=True)
    graph = manifest.parent / "matmul.onnx"
    model = onnx.load(str(graph), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = location
    onnx.save_model(model, str(graph))
    digest = sha256_file(graph)

    def rehash(doc: dict[str, Any]) -> None:
        doc["files"]["matmul.onnx"] = digest

    rewrite_manifest(manifest, rehash)
    return manifest


def test_external_data_traversal(tmp_path: Path) -> None:
    manifest = _bundle_with_external_location(tmp_path, "../weights.bin")
    error = refusal(manifest)
    assert (error.code, error.subject) == ("path_traversal", "../weights.bin")


def test_external_data_absolute(tmp_path: Path) -> None:
    location = str(tmp_path / "weights.bin")
    manifest = _bundle_with_external_location(tmp_path, location)
    error = refusal(manifest)
    assert (error.code, error.subject) == ("absolute_path", location)


def test_external_data_references_include_subgraph_tensors(tmp_path: Path) -> None:
    def external_tensor(name: str, location: str) -> TensorProto:
        tensor = helper.make_tensor(name, TensorProto.FLOAT, [1], b"\0\0\0\0", raw=True)
        external_data_helper.set_external_data(tensor, location=location)
        tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.EXTERNAL
        return tensor

    branch = helper.make_graph(
        [helper.make_node("Constant", [], ["k"], value=external_tensor("k", "const.bin"))],
        "then",
        [],
        [helper.make_tensor_value_info("k", TensorProto.FLOAT, [1])],
        initializer=[external_tensor("sub_w", "sub.bin")],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["top_w"], ["k2"])],
        "else",
        [],
        [helper.make_tensor_value_info("k2", TensorProto.FLOAT, [1])],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["out"], then_branch=branch, else_branch=other)],
        "if",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1])],
        initializer=[external_tensor("top_w", "top.bin"), external_tensor("again", "top.bin")],
    )
    path = tmp_path / "if.onnx"
    onnx.save_model(helper.make_model(graph), str(path))
    assert sorted(external_data_references(path)) == ["const.bin", "sub.bin", "top.bin"]


def test_external_data_references_of_a_plain_graph(tmp_path: Path) -> None:
    assert external_data_references(make_add_graph(tmp_path / "a.onnx", 4)) == ()
    path = make_matmul_graph(tmp_path / "m.onnx", external_weights=True)
    assert external_data_references(path) == (EXTERNAL_WEIGHTS,)


def test_graph_that_is_not_onnx(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path)
    graph = manifest.parent / "add.onnx"
    graph.write_bytes(b"\xff\xff\xff not a protobuf")
    digest = sha256_file(graph)

    def rehash(doc: dict[str, Any]) -> None:
        doc["files"]["add.onnx"] = digest

    rewrite_manifest(manifest, rehash)
    error = refusal(manifest)
    assert (error.code, error.subject) == ("bad_graph", "add.onnx")


# --- refusals: the manifest document --------------------------------------------------------


def test_missing_metadata_key(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path)

    def drop(doc: dict[str, Any]) -> None:
        del doc["metadata"]["precision"]

    rewrite_manifest(manifest, drop)
    error = refusal(manifest)
    assert (error.code, error.subject) == ("missing_metadata", "metadata.precision")
    assert "precision" in str(error)


def test_graph_file_not_among_files(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path)

    def retarget(doc: dict[str, Any]) -> None:
        doc["metadata"]["graph_file"] = "other.onnx"

    rewrite_manifest(manifest, retarget)
    error = refusal(manifest)
    assert (error.code, error.subject) == ("not_in_files", "metadata.graph_file")


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"{not json", "bad_json"),
        (b'{"schema_version": 2, "component": "c", "files": {}, "metadata": {}}', "bad_schema"),
        (b"[]", "bad_schema"),
    ],
)
def test_malformed_manifest(tmp_path: Path, raw: bytes, code: str) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_bytes(raw)
    assert refusal(manifest).code == code


def test_missing_manifest(tmp_path: Path) -> None:
    error = refusal(tmp_path)
    assert error.code == "missing_manifest"
    assert str(tmp_path / "manifest.json") in str(error)


def test_bad_hash_syntax(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path)

    def upper(doc: dict[str, Any]) -> None:
        doc["files"]["add.onnx"] = doc["files"]["add.onnx"].upper()

    rewrite_manifest(manifest, upper)
    error = refusal(manifest)
    assert (error.code, error.subject) == ("bad_hash", "add.onnx")


# --- inspect_bundle -------------------------------------------------------------------------


def test_inspect_reports_every_file(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path, kind="matmul", external_weights=True)
    (manifest.parent / "inputs.npz").unlink()
    (manifest.parent / EXTERNAL_WEIGHTS).write_bytes(b"changed")
    report = inspect_bundle(manifest)
    assert not report.ok
    statuses = {check.name: check.status for check in report.files}
    assert statuses == {
        "matmul.onnx": "ok",
        EXTERNAL_WEIGHTS: "hash_mismatch",
        "inputs.npz": "missing",
    }
    # Errors follow the manifest's file order.
    assert [(error.code, error.subject) for error in report.errors] == [
        ("missing_file", "inputs.npz"),
        ("hash_mismatch", EXTERNAL_WEIGHTS),
    ]
    mismatch = next(check for check in report.files if check.name == EXTERNAL_WEIGHTS)
    assert mismatch.actual_sha256 == hashlib.sha256(b"changed").hexdigest()
    assert mismatch.size == len(b"changed")
    as_json = report.to_json()
    assert json.loads(json.dumps(as_json)) == as_json
    assert as_json["ok"] is False
    assert as_json["errors"][1]["subject"] == EXTERNAL_WEIGHTS

    with pytest.raises(VerificationError) as caught:
        verify_bundle(manifest)
    assert caught.value.code == report.errors[0].code


def test_inspect_good_and_unreadable_manifest(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path)
    report = inspect_bundle(manifest)
    assert report.ok
    assert report.errors == ()
    assert all(check.status == "ok" for check in report.files)
    assert report.manifest is not None
    assert report.to_json()["identity"] == report.manifest.identity

    manifest.write_bytes(b"{")
    broken = inspect_bundle(manifest)
    assert not broken.ok
    assert broken.manifest is None
    assert broken.files == ()
    assert [error.code for error in broken.errors] == ["bad_json"]


def test_inspect_reports_escape_status(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path)
    outside = tmp_path / "outside.npz"
    (manifest.parent / "inputs.npz").rename(outside)
    (manifest.parent / "inputs.npz").symlink_to(outside)
    statuses = {check.name: check.status for check in inspect_bundle(manifest).files}
    assert statuses["inputs.npz"] == "escapes_bundle"


# --- example inputs -------------------------------------------------------------------------


def _replace_inputs(manifest: Path, data: bytes) -> None:
    (manifest.parent / "inputs.npz").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()

    def rehash(doc: dict[str, Any]) -> None:
        doc["files"]["inputs.npz"] = digest

    rewrite_manifest(manifest, rehash)


def test_example_inputs_with_pickled_objects_are_refused(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path)
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, a=np.array([{"x": 1}], dtype=object))
    _replace_inputs(manifest, pickled.read_bytes())
    with pytest.raises(VerificationError) as caught:
        load_example_inputs(verify_bundle(manifest))
    assert (caught.value.code, caught.value.subject) == ("bad_example_inputs", "inputs.npz")
    assert "'a'" in str(caught.value)
    assert "accepted" in str(caught.value)


@pytest.mark.parametrize("kind", ["npy", "garbage"])
def test_example_inputs_that_are_not_an_npz(tmp_path: Path, kind: str) -> None:
    manifest = make_bundle(tmp_path)
    if kind == "npy":
        single = tmp_path / "single.npy"
        np.save(single, np.zeros(3, dtype=np.float32))
        data = single.read_bytes()
    else:
        data = b"neither zip nor npy"
    _replace_inputs(manifest, data)
    with pytest.raises(VerificationError) as caught:
        load_example_inputs(verify_bundle(manifest))
    assert caught.value.code == "bad_example_inputs"
    assert str(manifest) in str(caught.value)


# --- create_bundle --------------------------------------------------------------------------


def _sources(tmp_path: Path, kind: str = "add") -> tuple[Path, Path]:
    source = tmp_path / "src"
    if kind == "add":
        graph = make_add_graph(source / "add.onnx", 8)
    else:
        graph = make_matmul_graph(source / "matmul.onnx", external_weights=True)
    inputs = write_inputs(source / "inputs.npz", example_inputs(kind, 8))
    return graph, inputs


def test_create_with_component_and_meta(tmp_path: Path) -> None:
    graph, inputs = _sources(tmp_path)
    meta = parse_meta_pairs(["precision=fp32", "checkpoint_revision=abc=1", "owner=me"])
    bundle = create_bundle(graph, inputs, tmp_path / "a" / "b", component="adder", metadata=meta)
    assert bundle.component == "adder"
    assert bundle.manifest.metadata["precision"] == "fp32"
    assert bundle.manifest.metadata["checkpoint_revision"] == "abc=1"
    assert bundle.manifest.metadata["owner"] == "me"
    assert sorted(path.name for path in (tmp_path / "a" / "b").iterdir()) == [
        "add.onnx",
        "inputs.npz",
        "manifest.json",
    ]


def test_create_into_existing_empty_directory(tmp_path: Path) -> None:
    graph, inputs = _sources(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    assert verify_bundle(create_bundle(graph, inputs, out).manifest_path).component == "add"


def test_create_refuses_non_empty_out_and_leaves_it_alone(tmp_path: Path) -> None:
    graph, inputs = _sources(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(BundleCreationError) as caught:
        create_bundle(graph, inputs, out)
    assert caught.value.code == "out_not_empty"
    assert caught.value.exit_code == EXIT_USAGE
    assert str(out) in str(caught.value)
    assert "empty" in str(caught.value)
    assert [path.name for path in out.iterdir()] == ["keep.txt"]


def test_create_refuses_out_that_is_a_file(tmp_path: Path) -> None:
    graph, inputs = _sources(tmp_path)
    out = tmp_path / "out"
    out.write_text("file")
    with pytest.raises(BundleCreationError) as caught:
        create_bundle(graph, inputs, out)
    assert caught.value.code == "out_not_empty"
    assert out.read_text() == "file"


@pytest.mark.parametrize("precreate", [False, True])
def test_create_with_mismatched_inputs_leaves_nothing(tmp_path: Path, precreate: bool) -> None:
    graph, _ = _sources(tmp_path)
    inputs = write_inputs(
        tmp_path / "bad.npz",
        {"a": np.zeros(8, dtype=np.float64), "z": np.zeros(8, dtype=np.float32)},
    )
    out = tmp_path / "new" / "out"
    if precreate:
        out.mkdir(parents=True)
    with pytest.raises(BundleCreationError) as caught:
        create_bundle(graph, inputs, out)
    message = str(caught.value)
    assert caught.value.code == "inputs_mismatch"
    assert "missing ['b']" in message
    assert "'z'" in message
    assert "float64" in message
    assert "float32[8]" in message  # what is accepted
    if precreate:
        assert list(out.iterdir()) == []
    else:
        assert not (tmp_path / "new").exists()


def test_create_with_wrong_shape(tmp_path: Path) -> None:
    graph, _ = _sources(tmp_path)
    inputs = write_inputs(
        tmp_path / "bad.npz",
        {"a": np.zeros(8, dtype=np.float32), "b": np.zeros((2, 4), dtype=np.float32)},
    )
    with pytest.raises(BundleCreationError) as caught:
        create_bundle(graph, inputs, tmp_path / "out")
    assert "'b' has 2 dimension(s)" in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_create_refuses_pickled_inputs(tmp_path: Path) -> None:
    graph, _ = _sources(tmp_path)
    inputs = tmp_path / "pickled.npz"
    np.savez(inputs, a=np.array([None], dtype=object))
    with pytest.raises(BundleCreationError) as caught:
        create_bundle(graph, inputs, tmp_path / "out")
    assert caught.value.code == "bad_example_inputs"
    assert str(inputs) in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_create_refuses_fixed_metadata_override(tmp_path: Path) -> None:
    graph, inputs = _sources(tmp_path)
    with pytest.raises(BundleCreationError) as caught:
        create_bundle(graph, inputs, tmp_path / "out", metadata={"graph_file": "x.onnx"})
    assert (caught.value.code, caught.value.subject) == ("fixed_metadata", "graph_file")
    assert not (tmp_path / "out").exists()


def test_create_refuses_name_clash(tmp_path: Path) -> None:
    graph, _ = _sources(tmp_path, "matmul")
    written = write_inputs(tmp_path / "other" / "inputs.npz", example_inputs("matmul"))
    clash = written.rename(written.with_name("WEIGHTS.bin"))
    with pytest.raises(BundleCreationError) as caught:
        create_bundle(graph, clash, tmp_path / "out")
    assert caught.value.code == "name_clash"
    assert "'weights.bin'" in str(caught.value)
    assert caught.value.subject == "WEIGHTS.bin"
    assert not (tmp_path / "out").exists()


def test_create_refuses_graph_with_missing_external_data(tmp_path: Path) -> None:
    graph, inputs = _sources(tmp_path, "matmul")
    (graph.parent / EXTERNAL_WEIGHTS).unlink()
    with pytest.raises(BundleCreationError) as caught:
        create_bundle(graph, inputs, tmp_path / "out")
    assert (caught.value.code, caught.value.subject) == ("missing_file", EXTERNAL_WEIGHTS)
    assert not (tmp_path / "out").exists()


def test_create_refuses_missing_sources_and_bad_graph(tmp_path: Path) -> None:
    graph, inputs = _sources(tmp_path)
    with pytest.raises(BundleCreationError) as caught:
        create_bundle(tmp_path / "nope.onnx", inputs, tmp_path / "out")
    assert str(tmp_path / "nope.onnx") in str(caught.value)
    graph.write_bytes(b"\xff\xff not onnx")
    with pytest.raises(BundleCreationError) as caught:
        create_bundle(graph, inputs, tmp_path / "out")
    assert caught.value.code == "bad_graph"
    assert not (tmp_path / "out").exists()


def test_create_refuses_empty_component(tmp_path: Path) -> None:
    graph, inputs = _sources(tmp_path)
    with pytest.raises(BundleCreationError) as caught:
        create_bundle(graph, inputs, tmp_path / "out", component=" ")
    assert caught.value.code == "bad_component"
    assert not (tmp_path / "out").exists()


def _mixed_graph(path: Path) -> Path:
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["h"], ["h32"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["h32", "f"], ["o"]),
        ],
        "mixed",
        [
            helper.make_tensor_value_info("h", TensorProto.FLOAT16, [2]),
            helper.make_tensor_value_info("f", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, [2])],
    )
    onnx.save_model(helper.make_model(graph), str(path))
    return path


def _int_graph(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Add", ["i", "j"], ["o"])],
        "ints",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, [2]),
            helper.make_tensor_value_info("j", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("o", TensorProto.INT64, [2])],
    )
    onnx.save_model(helper.make_model(graph), str(path))
    return path


@pytest.mark.parametrize(
    ("build", "arrays", "precision"),
    [
        (
            _mixed_graph,
            {"h": np.zeros(2, np.float16), "f": np.zeros(2, np.float32)},
            "mixed",
        ),
        (_int_graph, {"i": np.zeros(2, np.int64), "j": np.ones(2, np.int64)}, "unspecified"),
    ],
)
def test_create_infers_precision(
    tmp_path: Path, build: Any, arrays: dict[str, np.ndarray], precision: str
) -> None:
    graph = build(tmp_path / "g.onnx")
    inputs = write_inputs(tmp_path / "in.npz", arrays)
    bundle = create_bundle(graph, inputs, tmp_path / "out")
    assert bundle.manifest.metadata["precision"] == precision
    assert bundle.component == "g"


# --- parse_meta_pairs -----------------------------------------------------------------------


def test_parse_meta_pairs() -> None:
    assert parse_meta_pairs([]) == {}
    assert parse_meta_pairs(["layout=NCHW", "x.y-z=a b"]) == {"layout": "NCHW", "x.y-z": "a b"}


@pytest.mark.parametrize("pair", ["novalue", "=v", "k=", "1k=v", "a b=c"])
def test_parse_meta_pairs_refuses(pair: str) -> None:
    with pytest.raises(BundleCreationError) as caught:
        parse_meta_pairs([pair])
    assert caught.value.subject == pair
    assert repr(pair) in str(caught.value)
    assert "KEY=VALUE" in str(caught.value)


def test_parse_meta_pairs_refuses_repeated_key() -> None:
    with pytest.raises(BundleCreationError) as caught:
        parse_meta_pairs(["layout=a", "layout=b"])
    assert "'layout'" in str(caught.value)


def test_verified_bundle_path_refuses_unlisted_names(tmp_path: Path) -> None:
    bundle = verify_bundle(make_bundle(tmp_path))
    with pytest.raises(KeyError, match="not listed"):
        bundle.path("other.bin")


# --- remaining refusals ---------------------------------------------------------------------


def test_symlink_loop_is_unreadable(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path)
    (manifest.parent / "loop-a").symlink_to("loop-b")
    (manifest.parent / "loop-b").symlink_to("loop-a")
    add_listed_file(manifest, "loop-a")
    report = inspect_bundle(manifest)
    check = next(check for check in report.files if check.name == "loop-a")
    assert check.status == "unreadable"
    assert check.detail
    error = refusal(manifest)
    assert (error.code, error.subject) == ("unreadable", "loop-a")


def test_manifest_that_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").mkdir()
    error = refusal(tmp_path)
    assert error.code == "not_a_file"


def test_manifest_too_large(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_bytes(b" " * (4 * 1024 * 1024 + 1))
    assert refusal(manifest).code == "too_large"


@pytest.mark.parametrize("content", [b"", b"\xff\xff\xff not a protobuf"])
def test_external_data_references_of_a_non_graph(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "g.onnx"
    path.write_bytes(content)
    with pytest.raises(VerificationError) as caught:
        external_data_references(path)
    assert (caught.value.code, caught.value.subject) == ("bad_graph", str(path))
    assert "accepted" in str(caught.value)


def _external_tensor(name: str, location: str, **extra: int) -> TensorProto:
    tensor = helper.make_tensor(name, TensorProto.FLOAT, [1], b"\0\0\0\0", raw=True)
    external_data_helper.set_external_data(tensor, location=location, **extra)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    return tensor


def _add_graph_with_externals(path: Path, *tensors: TensorProto) -> Path:
    """``y = x + w0 (+ w1 ...)`` whose weights are the given external tensors."""
    nodes = []
    previous = "x"
    for index, tensor in enumerate(tensors):
        output = "y" if index == len(tensors) - 1 else f"t{index}"
        nodes.append(helper.make_node("Add", [previous, tensor.name], [output]))
        previous = output
    graph = helper.make_graph(
        nodes,
        "ext",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        initializer=list(tensors),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(helper.make_model(graph), str(path))
    return path


def test_external_data_with_negative_offset(tmp_path: Path) -> None:
    path = _add_graph_with_externals(tmp_path / "g.onnx", _external_tensor("w", "w.bin", offset=-4))
    with pytest.raises(VerificationError) as caught:
        external_data_references(path)
    assert caught.value.code == "bad_graph"
    assert "offset" in str(caught.value)


def test_create_refuses_external_data_leaving_the_graph_directory(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(b"\0\0\0\0")
    graph = _add_graph_with_externals(
        tmp_path / "src" / "g.onnx", _external_tensor("w", "../w.bin")
    )
    inputs = write_inputs(tmp_path / "src" / "in.npz", {"x": np.zeros(1, np.float32)})
    with pytest.raises(BundleCreationError) as caught:
        create_bundle(graph, inputs, tmp_path / "out")
    assert (caught.value.code, caught.value.subject) == ("path_traversal", "../w.bin")
    assert not (tmp_path / "out").exists()


def test_create_refuses_external_data_names_that_differ_by_case(tmp_path: Path) -> None:
    source = tmp_path / "src"
    graph = _add_graph_with_externals(
        source / "g.onnx", _external_tensor("w0", "W.bin"), _external_tensor("w1", "w.bin")
    )
    for name in ("W.bin", "w.bin"):
        (source / name).write_bytes(b"\0\0\0\0")
    inputs = write_inputs(source / "in.npz", {"x": np.zeros(1, np.float32)})
    out = tmp_path / "out"
    with pytest.raises(BundleCreationError) as caught:
        create_bundle(graph, inputs, out)
    assert (caught.value.code, caught.value.subject) == ("name_clash", "w.bin")
    assert "'W.bin'" in str(caught.value)
    assert not out.exists()


def test_create_copies_external_data_in_subdirectories(tmp_path: Path) -> None:
    source = tmp_path / "src"
    graph = _add_graph_with_externals(source / "g.onnx", _external_tensor("w", "data/w.bin"))
    (source / "data").mkdir()
    (source / "data" / "w.bin").write_bytes(np.float32(2.5).tobytes())
    inputs = write_inputs(source / "in.npz", {"x": np.ones(1, np.float32)})
    bundle = create_bundle(graph, inputs, tmp_path / "out")
    assert set(bundle.manifest.files) == {"g.onnx", "data/w.bin", "in.npz"}
    session = ort.InferenceSession(str(bundle.graph_path), providers=["CPUExecutionProvider"])
    (result,) = session.run(None, load_example_inputs(bundle))
    np.testing.assert_array_equal(result, np.array([3.5], np.float32))


def test_create_refuses_inputs_for_a_sequence_input(tmp_path: Path) -> None:
    graph_proto = helper.make_graph(
        [helper.make_node("SequenceLength", ["s"], ["n"])],
        "seq",
        [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("n", TensorProto.INT64, [])],
    )
    graph = tmp_path / "seq.onnx"
    onnx.save_model(helper.make_model(graph_proto), str(graph))
    inputs = write_inputs(tmp_path / "in.npz", {"s": np.zeros(2, np.float32)})
    with pytest.raises(BundleCreationError) as caught:
        create_bundle(graph, inputs, tmp_path / "out")
    assert "'s' is not a tensor input" in str(caught.value)
    assert "non-tensor" in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_create_with_wrong_length(tmp_path: Path) -> None:
    graph, _ = _sources(tmp_path)
    inputs = write_inputs(
        tmp_path / "bad.npz",
        {"a": np.zeros(8, dtype=np.float32), "b": np.zeros(4, dtype=np.float32)},
    )
    with pytest.raises(BundleCreationError) as caught:
        create_bundle(graph, inputs, tmp_path / "out")
    assert "'b' axis 0 is 4, the graph wants 8" in str(caught.value)


def test_graph_is_read_as_binary_protobuf_whatever_its_extension(tmp_path: Path) -> None:
    graph = make_matmul_graph(tmp_path / "m.onnx", external_weights=True)
    renamed = graph.rename(tmp_path / "m.json")
    assert external_data_references(renamed) == (EXTERNAL_WEIGHTS,)
