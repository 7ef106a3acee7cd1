"""runtime.wire: NumPy arrays to and from the contracts' inline buffers, exactly."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.contracts import BufferDescriptor, DescriptorError, DType, decode_frame
from runtime.contracts.codec import Frame, encode_frame_parts
from runtime.transport import frame_io
from runtime.wire import (
    array_from_buffer,
    descriptor_dtype,
    frame_arrays,
    inline_buffer,
    numpy_dtype,
)


def _sample(dtype: DType) -> np.ndarray:
    values = np.arange(-6, 6).reshape(3, 4)
    if dtype is DType.BOOL:
        return values % 3 == 0
    return (
        values.astype(dtype.value)
        if not dtype.value.startswith("uint")
        else (values + 6).astype(dtype.value)
    )


@pytest.mark.parametrize("dtype", list(DType))
def test_every_dtype_round_trips_through_a_frame(dtype: DType) -> None:
    array = _sample(dtype)
    parts = [inline_buffer(array, owner="stage-0", generation=3)]

    frame = decode_frame(b"".join(encode_frame_parts("call", {}, parts)))
    (decoded,) = frame_arrays(frame)

    (descriptor,) = frame.buffers
    assert descriptor == BufferDescriptor("stage-0", 3, array.nbytes, dtype, (3, 4))
    assert decoded.dtype == array.dtype
    assert np.array_equal(decoded, array)


@pytest.mark.parametrize(
    "array",
    [
        np.array(2.5, dtype=np.float32),
        np.zeros((0, 5), dtype=np.int16),
        np.arange(24, dtype=np.int32).reshape(4, 6)[::2, ::3],
        np.arange(5, dtype=">f8"),
    ],
    ids=["0-d", "empty", "strided", "big-endian"],
)
def test_shapes_layouts_and_byte_orders_survive(array: np.ndarray) -> None:
    descriptor, payload = inline_buffer(array, owner="o")

    decoded = array_from_buffer(descriptor, payload)

    assert decoded.shape == array.shape
    assert decoded.dtype == array.dtype.newbyteorder("=")
    assert np.array_equal(decoded, array)


def test_the_wire_is_little_endian_c_order() -> None:
    _, payload = inline_buffer(np.array([[1, 2], [3, 4]], dtype=">u2").T, owner="o")

    assert bytes(payload) == b"\x01\x00\x03\x00\x02\x00\x04\x00"


def test_the_decoded_array_is_a_writable_copy() -> None:
    descriptor, payload = inline_buffer(np.arange(4, dtype=np.uint8), owner="o")
    raw = bytearray(payload)

    decoded = array_from_buffer(descriptor, raw)
    raw[0] = 99
    decoded[1] = 42

    assert decoded.tolist() == [0, 42, 2, 3]


@pytest.mark.parametrize("dtype", [np.complex64, np.float128, object, "U3"])
def test_other_numpy_types_are_refused(dtype: object) -> None:
    with pytest.raises(DescriptorError, match="cannot cross a process boundary") as caught:
        inline_buffer(np.zeros(2, dtype=dtype), owner="o")
    assert caught.value.code == "bad_dtype"


def test_a_payload_of_the_wrong_length_is_refused() -> None:
    descriptor = BufferDescriptor.for_array("o", 0, DType.FLOAT32, (2, 2))

    with pytest.raises(
        DescriptorError, match="payload of 12 bytes for a descriptor of 16"
    ) as caught:
        array_from_buffer(descriptor, b"\0" * 12)
    assert caught.value.code == "size_mismatch"


def test_shared_memory_buffers_are_not_read_from_the_frame() -> None:
    descriptor = BufferDescriptor.for_array("o", 1, DType.INT8, (4,), location="oe-seg")
    frame = Frame("result", {}, (descriptor,), (None,), ("shm-buffers",))

    with pytest.raises(ValueError, match="only inline buffers carry their bytes"):
        array_from_buffer(descriptor, b"\0" * 4)
    with pytest.raises(
        ValueError, match=r"frame 'result': buffer 0 lives in shared memory 'oe-seg'"
    ):
        frame_arrays(frame)


def test_the_dtype_mapping_is_the_channels() -> None:
    # The channel's arrays go to and from frames through frame_io.
    for dtype in DType:
        assert numpy_dtype(dtype) == frame_io.numpy_dtype(dtype)
        assert (
            descriptor_dtype(numpy_dtype(dtype)) is dtype is frame_io.descriptor_dtype(dtype.value)
        )
