"""Buffer descriptors and dtypes, cross-checked against NumPy."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.contracts import MAX_BUFFER_BYTES, BufferDescriptor, DescriptorError, DType
from runtime.contracts.buffers import MAX_DIMS

GOOD: dict[str, Any] = {
    "owner": "stage.out",
    "generation": 4,
    "nbytes": 24,
    "dtype": "float32",
    "shape": [2, 3],
}


def test_dtypes_are_the_numpy_plain_data_types() -> None:
    assert [d.value for d in DType] == [
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    ]
    for dtype in DType:
        assert dtype.itemsize == np.dtype(dtype.value).itemsize


def test_dtype_parse() -> None:
    assert DType.parse("uint16") is DType.UINT16
    for bad in ("complex64", "Float32", "", 4, None, ["int8"]):
        with pytest.raises(DescriptorError) as info:
            DType.parse(bad)
        assert info.value.code == "bad_dtype"
        assert "accepted: bool, int8" in str(info.value)


def test_for_array_derives_the_size() -> None:
    descriptor = BufferDescriptor.for_array("o", 2, DType.INT16, (3, 4))
    assert descriptor.nbytes == 24
    assert descriptor.inline
    assert BufferDescriptor.for_array("o", 0, DType.FLOAT64, ()).nbytes == 8
    assert BufferDescriptor.for_array("o", 0, DType.FLOAT64, (5, 0)).nbytes == 0
    shm = BufferDescriptor.for_array("o", 0, DType.UINT8, (1,), location="oe-shm-1")
    assert not shm.inline


def test_wire_round_trip() -> None:
    descriptor = BufferDescriptor.from_wire(GOOD)
    assert descriptor == BufferDescriptor("stage.out", 4, 24, DType.FLOAT32, (2, 3))
    assert descriptor.to_wire() == GOOD
    assert "location" not in descriptor.to_wire()
    shm = BufferDescriptor.from_wire({**GOOD, "location": "oe-shm-7"})
    assert shm.location == "oe-shm-7"
    assert shm.to_wire() == {**GOOD, "location": "oe-shm-7"}


def test_descriptors_are_frozen_values() -> None:
    descriptor = BufferDescriptor.from_wire(GOOD)
    with pytest.raises(dataclasses.FrozenInstanceError):
        descriptor.nbytes = 0  # type: ignore[misc]
    assert descriptor == BufferDescriptor.from_wire(dict(GOOD))
    assert hash(descriptor) == hash(BufferDescriptor.from_wire(dict(GOOD)))


def without(key: str) -> dict[str, Any]:
    return {k: v for k, v in GOOD.items() if k != key}


@pytest.mark.parametrize(
    ("wire", "code", "message"),
    [
        ([], "bad_descriptor", "must be a JSON object"),
        (without("owner"), "bad_descriptor", "missing ['owner']"),
        (without("shape"), "bad_descriptor", "missing ['shape']"),
        ({**GOOD, "strides": [12, 4]}, "bad_descriptor", "unknown descriptor field(s) ['strides']"),
        ({**GOOD, "owner": ""}, "bad_descriptor", "owner '' must be a non-empty string"),
        ({**GOOD, "owner": "o" * 257}, "bad_descriptor", "at most 256 characters"),
        ({**GOOD, "owner": 3}, "bad_descriptor", "owner 3"),
        ({**GOOD, "generation": -1}, "bad_descriptor", "generation -1"),
        ({**GOOD, "generation": True}, "bad_descriptor", "generation True"),
        ({**GOOD, "generation": 2**63}, "bad_descriptor", "generation"),
        ({**GOOD, "nbytes": 24.0}, "bad_descriptor", "nbytes 24.0 is not an integer"),
        ({**GOOD, "shape": "2x3"}, "bad_descriptor", "shape must be a list"),
        ({**GOOD, "shape": [2, 3.0]}, "bad_descriptor", "dimension 3.0 is not an integer"),
        ({**GOOD, "shape": [1] * 65, "nbytes": 4}, "bad_descriptor", "65 dimensions; at most 64"),
        ({**GOOD, "location": ""}, "bad_descriptor", "location must be"),
        ({**GOOD, "location": "x" * 256}, "bad_descriptor", "location must be"),
        ({**GOOD, "dtype": "complex64"}, "bad_dtype", "'complex64' is not supported"),
        ({**GOOD, "dtype": 5}, "bad_dtype", "5 is not supported"),
        ({**GOOD, "nbytes": -1}, "negative_length", "nbytes -1 is negative"),
        ({**GOOD, "shape": [2, -3]}, "negative_length", "dimension -3 is negative"),
        ({**GOOD, "nbytes": 2**63}, "length_overflow", "overflows 63 bits"),
        ({**GOOD, "shape": [2**63]}, "length_overflow", "overflows 63 bits"),
        ({**GOOD, "shape": [2**31, 2**31]}, "length_overflow", "of float32 overflows"),
        ({**GOOD, "nbytes": 0, "shape": [0, 2**62, 2**62]}, "length_overflow", "overflows"),
        ({**GOOD, "nbytes": 23}, "size_mismatch", "nbytes 23 != 24"),
    ],
)
def test_from_wire_errors(wire: Any, code: str, message: str) -> None:
    with pytest.raises(DescriptorError) as info:
        BufferDescriptor.from_wire(wire)
    assert info.value.code == code
    assert message in str(info.value)


def test_construction_validates_too() -> None:
    with pytest.raises(DescriptorError) as info:
        BufferDescriptor("", 0, 0, DType.UINT8, (0,))
    assert info.value.code == "bad_descriptor"
    with pytest.raises(DescriptorError) as info:
        BufferDescriptor("o", 0, 4, "float32", (1,))  # type: ignore[arg-type]
    assert info.value.code == "bad_dtype"
    with pytest.raises(DescriptorError) as info:
        BufferDescriptor("o", 0, 5, DType.FLOAT32, (1,))
    assert info.value.code == "size_mismatch"


def test_the_largest_size_is_accepted() -> None:
    descriptor = BufferDescriptor("o", 0, MAX_BUFFER_BYTES, DType.INT8, (MAX_BUFFER_BYTES,))
    assert descriptor.nbytes == 2**63 - 1
    assert len(BufferDescriptor.for_array("o", 0, DType.UINT8, (1,) * MAX_DIMS).shape) == 64


@given(st.sampled_from(DType), st.lists(st.integers(0, 6), max_size=5))
def test_sizes_agree_with_numpy(dtype: DType, shape: list[int]) -> None:
    descriptor = BufferDescriptor.for_array("o", 0, dtype, tuple(shape))
    array = np.zeros(shape, dtype=dtype.value)
    assert descriptor.nbytes == array.nbytes
    wire = BufferDescriptor.from_wire({**descriptor.to_wire(), "nbytes": array.nbytes})
    assert wire == descriptor


@given(
    st.sampled_from(DType),
    st.lists(st.integers(0, 2**63 - 1), max_size=4),
    st.integers(0, 4),
)
def test_zero_size_shapes_are_accepted_exactly_when_numpy_accepts_them(
    dtype: DType, dims: list[int], zero_at: int
) -> None:
    shape = list(dims)
    shape.insert(zero_at % (len(shape) + 1), 0)
    try:
        np.frombuffer(b"", dtype=dtype.value).reshape(shape)
        numpy_ok = True
    except ValueError:
        numpy_ok = False
    wire = {"owner": "o", "generation": 0, "nbytes": 0, "dtype": dtype.value, "shape": shape}
    if numpy_ok:
        assert BufferDescriptor.from_wire(wire).shape == tuple(shape)
    else:
        with pytest.raises(DescriptorError) as info:
            BufferDescriptor.from_wire(wire)
        assert info.value.code == "length_overflow", shape


def test_a_descriptor_for_another_generation_keeps_every_other_field() -> None:
    arena = BufferDescriptor.for_array("ctl", 1, DType.FLOAT32, (2, 3), "oe-1-arena", 64)
    moved = arena.with_generation(9, 128)
    assert (moved.generation, moved.offset) == (9, 128)
    assert moved == BufferDescriptor.for_array("ctl", 9, DType.FLOAT32, (2, 3), "oe-1-arena", 128)
    inline = BufferDescriptor.for_array("ctl", 1, DType.INT8, (4,))
    assert inline.with_generation(2) == BufferDescriptor("ctl", 2, 4, DType.INT8, (4,))


@pytest.mark.parametrize(
    ("generation", "offset", "code"),
    [
        (-1, 0, "bad_descriptor"),
        (2**63, 0, "bad_descriptor"),
        (True, 0, "bad_descriptor"),
        (1, -8, "negative_length"),
        (1, 2**63, "length_overflow"),
        (1, None, "bad_descriptor"),
    ],
)
def test_another_generation_is_checked(generation: object, offset: object, code: str) -> None:
    arena = BufferDescriptor.for_array("ctl", 1, DType.FLOAT32, (2, 3), "oe-1-arena", 64)
    with pytest.raises(DescriptorError) as caught:
        arena.with_generation(generation, offset)  # type: ignore[arg-type]
    assert caught.value.code == code
    with pytest.raises(DescriptorError):
        BufferDescriptor.for_array("ctl", 1, DType.INT8, (4,)).with_generation(1, 0)


def test_a_tensor_described_before_is_still_checked_for_its_generation_and_offset() -> None:
    first = BufferDescriptor.for_array("ctl", 1, DType.FLOAT32, (5, 7), "oe-1-arena", 0)
    again = BufferDescriptor.for_array("ctl", 2, DType.FLOAT32, (5, 7), "oe-1-arena", 4096)
    assert again.nbytes == first.nbytes == 140
    with pytest.raises(DescriptorError) as caught:
        BufferDescriptor.for_array("ctl", -1, DType.FLOAT32, (5, 7), "oe-1-arena", 0)
    assert caught.value.code == "bad_descriptor"
    with pytest.raises(DescriptorError) as caught:
        BufferDescriptor.for_array("ctl", 3, DType.FLOAT32, (5, -7), "oe-1-arena", 0)
    assert caught.value.code == "negative_length"
