"""List the external-data files an ONNX model names, from its serialized bytes alone.

The graph worker verifies the exact bytes it hands to ONNX Runtime, so it reads the
protobuf wire format of those bytes directly (standard library only, no ``onnx``
package in the worker environment). Only the fields that can hold tensors are visited:
initializers, sparse initializers, tensor attributes, subgraphs and local functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterator

# Field numbers from onnx.proto (checked against the onnx package in the tests).
_MODEL_GRAPH: Final = 7
_MODEL_FUNCTIONS: Final = 25
_GRAPH_NODE: Final = 1
_GRAPH_INITIALIZER: Final = 5
_GRAPH_SPARSE_INITIALIZER: Final = 15
_NODE_ATTRIBUTE: Final = 5
_FUNCTION_NODE: Final = 7
_ATTR_TENSOR: Final = 5
_ATTR_GRAPH: Final = 6
_ATTR_TENSORS: Final = 10
_ATTR_GRAPHS: Final = 11
_ATTR_SPARSE_TENSOR: Final = 22
_ATTR_SPARSE_TENSORS: Final = 23
_SPARSE_VALUES: Final = 1
_SPARSE_INDICES: Final = 2
_TENSOR_NAME: Final = 8
_TENSOR_EXTERNAL_DATA: Final = 13
_TENSOR_DATA_LOCATION: Final = 14
_ENTRY_KEY: Final = 1
_ENTRY_VALUE: Final = 2
_DATA_LOCATION_EXTERNAL: Final = 1

_VARINT: Final = 0
_FIXED64: Final = 1
_LENGTH_DELIMITED: Final = 2
_FIXED32: Final = 5
#: Subgraphs nest (If/Loop bodies); real models stay far below this depth.
MAX_NESTING: Final = 64


class WireError(ValueError):
    """The bytes are not a well-formed ONNX model at the wire level."""


def external_data_locations(model: bytes | memoryview) -> tuple[str, ...]:
    """The distinct ``location`` values of every external tensor, in first-use order."""
    found: dict[str, None] = {}
    view = memoryview(model)
    has_graph = False
    for field, wire_type, value, _ in _fields(view):
        if field == _MODEL_GRAPH and wire_type == _LENGTH_DELIMITED:
            has_graph = True
            _graph(value, found, 1)
        elif field == _MODEL_FUNCTIONS and wire_type == _LENGTH_DELIMITED:
            _nodes_of(value, _FUNCTION_NODE, found, 1)
    if not has_graph:
        raise WireError("the model holds no graph")
    return tuple(found)


def _graph(view: memoryview, found: dict[str, None], depth: int) -> None:
    _check_depth(depth)
    for field, wire_type, value, _ in _fields(view):
        if wire_type != _LENGTH_DELIMITED:
            continue
        if field == _GRAPH_NODE:
            _node(value, found, depth)
        elif field == _GRAPH_INITIALIZER:
            _tensor(value, found)
        elif field == _GRAPH_SPARSE_INITIALIZER:
            _sparse(value, found)


def _nodes_of(view: memoryview, node_field: int, found: dict[str, None], depth: int) -> None:
    for field, wire_type, value, _ in _fields(view):
        if field == node_field and wire_type == _LENGTH_DELIMITED:
            _node(value, found, depth)


def _node(view: memoryview, found: dict[str, None], depth: int) -> None:
    for field, wire_type, value, _ in _fields(view):
        if field == _NODE_ATTRIBUTE and wire_type == _LENGTH_DELIMITED:
            _attribute(value, found, depth)


def _attribute(view: memoryview, found: dict[str, None], depth: int) -> None:
    for field, wire_type, value, _ in _fields(view):
        if wire_type != _LENGTH_DELIMITED:
            continue
        if field in (_ATTR_TENSOR, _ATTR_TENSORS):
            _tensor(value, found)
        elif field in (_ATTR_GRAPH, _ATTR_GRAPHS):
            _graph(value, found, depth + 1)
        elif field in (_ATTR_SPARSE_TENSOR, _ATTR_SPARSE_TENSORS):
            _sparse(value, found)


def _sparse(view: memoryview, found: dict[str, None]) -> None:
    for field, wire_type, value, _ in _fields(view):
        if field in (_SPARSE_VALUES, _SPARSE_INDICES) and wire_type == _LENGTH_DELIMITED:
            _tensor(value, found)


def _tensor(view: memoryview, found: dict[str, None]) -> None:
    external = False
    location: str | None = None
    name = ""
    for field, wire_type, value, number in _fields(view):
        if field == _TENSOR_DATA_LOCATION and wire_type == _VARINT:
            external = number == _DATA_LOCATION_EXTERNAL
        elif field == _TENSOR_NAME and wire_type == _LENGTH_DELIMITED:
            name = _text(value)
        elif field == _TENSOR_EXTERNAL_DATA and wire_type == _LENGTH_DELIMITED:
            key, entry_value = _entry(value)
            if key == "location":
                location = entry_value
            elif key in ("offset", "length") and not entry_value.isdigit():
                raise WireError(
                    f"tensor {name or '?'!r}: external data {key} {entry_value!r} is not a "
                    "non-negative integer"
                )
    if not external:
        return
    if not location:
        raise WireError(f"tensor {name!r} is stored externally but names no location")
    found.setdefault(location, None)


def _entry(view: memoryview) -> tuple[str, str]:
    key = value = ""
    for field, wire_type, data, _ in _fields(view):
        if wire_type != _LENGTH_DELIMITED:
            continue
        if field == _ENTRY_KEY:
            key = _text(data)
        elif field == _ENTRY_VALUE:
            value = _text(data)
    return key, value


def _text(view: memoryview) -> str:
    try:
        return bytes(view).decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("a string field is not valid UTF-8") from None


def _check_depth(depth: int) -> None:
    if depth > MAX_NESTING:
        raise WireError(f"subgraphs nest deeper than {MAX_NESTING} levels")


def _fields(view: memoryview) -> Iterator[tuple[int, int, memoryview, int]]:
    """Split one message into (field, wire type, bytes, number).

    ``bytes`` is the value of a length-delimited field (a view, not a copy); ``number`` is the
    value of a varint field. Fixed-width fields are skipped.
    """
    empty = view[0:0]
    pos = 0
    end = len(view)
    while pos < end:
        key, pos = _varint(view, pos)
        field, wire_type = key >> 3, key & 7
        if field == 0:
            raise WireError(f"field number 0 at byte {pos}")
        if wire_type == _VARINT:
            number, pos = _varint(view, pos)
            yield field, wire_type, empty, number
        elif wire_type == _FIXED64:
            pos = _advance(view, pos, 8)
        elif wire_type == _FIXED32:
            pos = _advance(view, pos, 4)
        elif wire_type == _LENGTH_DELIMITED:
            length, pos = _varint(view, pos)
            start = pos
            pos = _advance(view, pos, length)
            yield field, wire_type, view[start:pos], length
        else:
            raise WireError(f"unsupported wire type {wire_type} for field {field}")


def _advance(view: memoryview, pos: int, count: int) -> int:
    if pos + count > len(view):
        raise WireError(f"a field of {count} bytes at byte {pos} runs past the end")
    return pos + count


def _varint(view: memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(view):
            raise WireError("a varint runs past the end")
        byte = view[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError(f"a varint at byte {pos} is longer than 10 bytes")
