"""Listing external-data files from ONNX bytes, checked against the onnx package itself."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

from runtime import onnx_wire
from runtime.artifacts import external_data_references
from runtime.onnx_wire import MAX_NESTING, WireError, external_data_locations
from tests.helpers.onnx_graphs import IR_VERSION, OPSET, rewrite_manifest
from tests.workers.support import identity_of
from workers.ort_session import WorkerError, load_verified_graph

if TYPE_CHECKING:
    from pathlib import Path


def _external(name: str, location: str, shape: tuple[int, ...] = (2,)) -> TensorProto:
    tensor = numpy_helper.from_array(np.zeros(shape, np.float32), name)
    set_external_data(tensor, location=location, offset=0, length=4 * int(np.prod(shape)))
    tensor.data_location = TensorProto.EXTERNAL
    tensor.ClearField("raw_data")
    return tensor


def _model(graph: onnx.GraphProto, **kwargs: object) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("local", 1)],
        **kwargs,
    )
    model.ir_version = IR_VERSION
    return model


def _every_kind_of_tensor() -> onnx.ModelProto:
    """External tensors in an initializer, a Constant attribute, a Loop body, a sparse
    initializer and a local function; one plain initializer that is not external."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["s_in", "k"], ["s_out"]),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [2]),
        ],
        [
            helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [2]),
        ],
        initializer=[_external("k", "loop/body.bin")],
    )
    sparse = helper.make_sparse_tensor(
        _external("sv", "sparse.bin", (1,)),
        numpy_helper.from_array(np.array([0], np.int64), "si"),
        [2],
    )
    function = helper.make_function(
        "local",
        "Scale",
        ["v"],
        ["w"],
        [
            helper.make_node("Constant", [], ["f"], value=_external("f", "function.bin")),
            helper.make_node("Mul", ["v", "f"], ["w"]),
        ],
        [helper.make_opsetid("", OPSET)],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["c"], value=_external("c", "constant.bin")),
            helper.make_node("Loop", ["n", "cond", "x"], ["looped"], body=body),
            helper.make_node("Scale", ["looped"], ["y"], domain="local"),
        ],
        "main",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("n", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        initializer=[
            _external("w", "weights.bin"),
            numpy_helper.from_array(np.ones(2, np.float32), "plain"),
        ],
        sparse_initializer=[sparse],
    )
    return _model(graph, functions=[function])


EXPECTED = {
    "weights.bin",
    "constant.bin",
    "loop/body.bin",
    "sparse.bin",
    "function.bin",
}


def test_field_numbers_match_the_onnx_schema() -> None:
    pairs = [
        (onnx.ModelProto, "graph", onnx_wire._MODEL_GRAPH),
        (onnx.ModelProto, "functions", onnx_wire._MODEL_FUNCTIONS),
        (onnx.GraphProto, "node", onnx_wire._GRAPH_NODE),
        (onnx.GraphProto, "initializer", onnx_wire._GRAPH_INITIALIZER),
        (onnx.GraphProto, "sparse_initializer", onnx_wire._GRAPH_SPARSE_INITIALIZER),
        (onnx.NodeProto, "attribute", onnx_wire._NODE_ATTRIBUTE),
        (onnx.FunctionProto, "node", onnx_wire._FUNCTION_NODE),
        (onnx.AttributeProto, "t", onnx_wire._ATTR_TENSOR),
        (onnx.AttributeProto, "g", onnx_wire._ATTR_GRAPH),
        (onnx.AttributeProto, "tensors", onnx_wire._ATTR_TENSORS),
        (onnx.AttributeProto, "graphs", onnx_wire._ATTR_GRAPHS),
        (onnx.AttributeProto, "sparse_tensor", onnx_wire._ATTR_SPARSE_TENSOR),
        (onnx.AttributeProto, "sparse_tensors", onnx_wire._ATTR_SPARSE_TENSORS),
        (onnx.SparseTensorProto, "values", onnx_wire._SPARSE_VALUES),
        (onnx.SparseTensorProto, "indices", onnx_wire._SPARSE_INDICES),
        (onnx.TensorProto, "name", onnx_wire._TENSOR_NAME),
        (onnx.TensorProto, "external_data", onnx_wire._TENSOR_EXTERNAL_DATA),
        (onnx.TensorProto, "data_location", onnx_wire._TENSOR_DATA_LOCATION),
        (onnx.StringStringEntryProto, "key", onnx_wire._ENTRY_KEY),
        (onnx.StringStringEntryProto, "value", onnx_wire._ENTRY_VALUE),
    ]
    for message, field, number in pairs:
        assert message.DESCRIPTOR.fields_by_name[field].number == number, (message, field)
    assert onnx_wire._DATA_LOCATION_EXTERNAL == TensorProto.EXTERNAL


def test_every_kind_of_external_tensor_is_found_as_onnx_finds_it(tmp_path: Path) -> None:
    model = _every_kind_of_tensor()
    path = tmp_path / "model.onnx"
    onnx.save_model(model, str(path))
    found = external_data_locations(path.read_bytes())
    assert set(found) == EXPECTED
    assert len(found) == len(EXPECTED), "each location is listed once"
    assert set(found) == set(external_data_references(path))


def test_a_model_without_external_data_lists_nothing(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "plain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    assert external_data_locations(_model(graph).SerializeToString()) == ()


def test_an_external_tensor_without_a_location_is_refused() -> None:
    tensor = numpy_helper.from_array(np.zeros(2, np.float32), "w")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    graph = helper.make_graph([], "g", [], [], initializer=[tensor])
    with pytest.raises(WireError, match=r"'w'.*names no location"):
        external_data_locations(_model(graph).SerializeToString())


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"\x3a\x05abc", "runs past the end"),  # graph field claims 5 bytes, 3 follow
        (b"\x3a", "varint runs past the end"),
        (b"\x3b", "wire type 3"),  # a deprecated group
        (b"\x00", "field number 0"),
        (b"\xff" * 11, "longer than 10 bytes"),
    ],
)
def test_malformed_bytes_are_refused(data: bytes, needle: str) -> None:
    with pytest.raises(WireError, match=needle):
        external_data_locations(data)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def test_nesting_beyond_the_limit_is_refused() -> None:
    # Written by hand: protobuf itself refuses to build messages this deep.
    graph = b""
    for _ in range(MAX_NESTING + 1):
        attribute = _field(onnx_wire._ATTR_GRAPH, graph)
        node = _field(onnx_wire._NODE_ATTRIBUTE, attribute)
        graph = _field(onnx_wire._GRAPH_NODE, node)
    with pytest.raises(WireError, match="nest deeper"):
        external_data_locations(_field(onnx_wire._MODEL_GRAPH, graph))


def test_nesting_at_the_limit_is_read() -> None:
    graph = _field(onnx_wire._GRAPH_INITIALIZER, _external("deep", "deep.bin").SerializeToString())
    for _ in range(MAX_NESTING - 1):
        attribute = _field(onnx_wire._ATTR_GRAPH, graph)
        node = _field(onnx_wire._NODE_ATTRIBUTE, attribute)
        graph = _field(onnx_wire._GRAPH_NODE, node)
    assert external_data_locations(_field(onnx_wire._MODEL_GRAPH, graph)) == ("deep.bin",)


def test_a_graph_that_is_not_onnx_is_refused_at_load(tmp_path: Path) -> None:
    from tests.helpers.onnx_graphs import make_bundle

    manifest = make_bundle(tmp_path, kind="add", name="add")
    garbage = b"\x3b not an onnx model"
    (manifest.parent / "add.onnx").write_bytes(garbage)
    digest = hashlib.sha256(garbage).hexdigest()
    rewrite_manifest(manifest, lambda doc: doc["files"].__setitem__("add.onnx", digest))
    with pytest.raises(WorkerError) as caught:
        load_verified_graph(manifest, identity_of(manifest))
    assert caught.value.code == "bad_graph"
    assert caught.value.subject == "add.onnx"


def test_a_model_without_a_graph_is_refused() -> None:
    with pytest.raises(WireError, match="no graph"):
        external_data_locations(b"")
