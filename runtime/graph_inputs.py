"""What an ONNX graph declares: its inputs, how example arrays differ from them, its precision.
``create_bundle`` checks a bundle's example inputs and writes its metadata with these."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    import onnx

__all__ = [
    "describe_input",
    "infer_precision",
    "input_mismatches",
    "np_dtype_of",
    "required_inputs",
]

#: onnx.TensorProto.DataType values (fixed by the ONNX standard) of floating-point types.
_FLOAT_TYPES: Final[dict[int, str]] = {
    1: "float32",
    10: "float16",
    11: "float64",
    16: "bfloat16",
    17: "float8e4m3fn",
    18: "float8e4m3fnuz",
    19: "float8e5m2",
    20: "float8e5m2fnuz",
}


def np_dtype_of(elem_type: int) -> np.dtype[Any]:
    """The numpy dtype of an ONNX tensor element type."""
    from onnx import helper

    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def describe_input(value: onnx.ValueInfoProto) -> str:
    """An input's dtype and shape as ``float32[1, N]`` (``?`` for an unnamed free dimension)."""
    if not value.type.HasField("tensor_type"):
        return "non-tensor"
    tensor_type = value.type.tensor_type
    dtype = np.dtype(np_dtype_of(tensor_type.elem_type)).name
    if not tensor_type.HasField("shape"):
        return dtype
    dims = [
        str(dim.dim_value) if dim.HasField("dim_value") else (dim.dim_param or "?")
        for dim in tensor_type.shape.dim
    ]
    return f"{dtype}[{', '.join(dims)}]"


def required_inputs(model: onnx.ModelProto) -> dict[str, str]:
    """Each input a call must give (not an initializer), described by :func:`describe_input`."""
    initializers = {tensor.name for tensor in model.graph.initializer}
    return {
        value.name: describe_input(value)
        for value in model.graph.input
        if value.name not in initializers
    }


def input_mismatches(model: onnx.ModelProto, arrays: Mapping[str, np.ndarray]) -> list[str]:
    """How ``arrays`` differ from the graph's inputs (names, dtypes, ranks, fixed sizes)."""
    initializers = {tensor.name for tensor in model.graph.initializer}
    declared = {value.name: value for value in model.graph.input}
    required = [name for name in declared if name not in initializers]
    problems: list[str] = []
    missing = [name for name in required if name not in arrays]
    if missing:
        problems.append(f"missing {missing}")
    unknown = sorted(name for name in arrays if name not in declared)
    if unknown:
        problems.append(f"not graph inputs {unknown}")
    for key, array in arrays.items():
        value = declared.get(key)
        if value is None:
            continue
        if not value.type.HasField("tensor_type"):
            problems.append(f"{key!r} is not a tensor input of the graph")
            continue
        tensor_type = value.type.tensor_type
        expected = np_dtype_of(tensor_type.elem_type)
        if array.dtype != expected:
            problems.append(f"{key!r} is {array.dtype}, the graph wants {expected}")
        if tensor_type.HasField("shape"):
            dims = tensor_type.shape.dim
            if len(dims) != array.ndim:
                problems.append(
                    f"{key!r} has {array.ndim} dimension(s), the graph wants {len(dims)}"
                )
                continue
            for axis, (dim, size) in enumerate(zip(dims, array.shape, strict=True)):
                if dim.HasField("dim_value") and dim.dim_value != size:
                    problems.append(
                        f"{key!r} axis {axis} is {size}, the graph wants {dim.dim_value}"
                    )
    return problems


def infer_precision(model: onnx.ModelProto, tensors: Iterable[onnx.TensorProto]) -> str:
    """The floating-point type of the graph's inputs and ``tensors`` (its weights): one name,
    ``mixed``, or ``unspecified`` when none is floating-point."""
    found: set[str] = set()
    for value in model.graph.input:
        if value.type.HasField("tensor_type"):
            name = _FLOAT_TYPES.get(value.type.tensor_type.elem_type)
            if name is not None:
                found.add(name)
    for tensor in tensors:
        name = _FLOAT_TYPES.get(tensor.data_type)
        if name is not None:
            found.add(name)
    if not found:
        return "unspecified"
    return found.pop() if len(found) == 1 else "mixed"
