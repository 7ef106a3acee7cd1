"""NumPy arrays to and from the stage contracts' inline buffers.

The contracts themselves import only the standard library; this module is their optional
NumPy layer (``omni-stage-contracts[wire]`` ships it as ``omni_stage_contracts.wire``).
Buffers travel in little-endian byte order and C order, one of the 12 dtypes of
:class:`~runtime.contracts.buffers.DType`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runtime.contracts.buffers import BufferDescriptor, DescriptorError, DType

try:
    import numpy as np
except ModuleNotFoundError as exc:
    raise ModuleNotFoundError(
        f"{__name__} needs NumPy; install it with the 'wire' extra: "
        "pip install 'omni-stage-contracts[wire]'",
        name="numpy",
    ) from exc

if TYPE_CHECKING:
    import numpy.typing as npt

    from runtime.contracts.codec import Frame

__all__ = [
    "array_from_buffer",
    "descriptor_dtype",
    "frame_arrays",
    "inline_buffer",
    "numpy_dtype",
]

_WIRE_DTYPES: dict[DType, np.dtype[Any]] = {d: np.dtype(d.value).newbyteorder("<") for d in DType}
_NATIVE_DTYPES: dict[np.dtype[Any], DType] = {np.dtype(d.value): d for d in DType}


_WIRE_DTYPES_BY_VALUE: dict[str, np.dtype[Any]] = {d.value: t for d, t in _WIRE_DTYPES.items()}


def numpy_dtype(dtype: DType) -> np.dtype[Any]:
    """The NumPy dtype of a wire dtype, in wire (little-endian) byte order."""
    return _WIRE_DTYPES_BY_VALUE[dtype.value]


#: The same, keyed by the dtypes arrays carry (native and little-endian order): one lookup
#: for the common case.
_BY_ARRAY_DTYPE: dict[object, DType] = {
    **{np.dtype(d.value): d for d in DType},
    **{t: d for d, t in _WIRE_DTYPES.items()},
}


def descriptor_dtype(dtype: npt.DTypeLike) -> DType:
    """The wire dtype of a NumPy dtype of either byte order; raises ``DescriptorError`` else."""
    if isinstance(dtype, np.dtype):
        known = _BY_ARRAY_DTYPE.get(dtype)
        if known is not None:
            return known
    native = np.dtype(dtype).newbyteorder("=")
    found = _NATIVE_DTYPES.get(native)
    if found is None:
        raise DescriptorError(
            "bad_dtype",
            f"dtype {np.dtype(dtype)} cannot cross a process boundary; "
            f"accepted: {', '.join(d.value for d in DType)}",
        )
    return found


def inline_buffer(
    array: npt.ArrayLike, *, owner: str, generation: int = 0
) -> tuple[BufferDescriptor, memoryview]:
    """A descriptor of ``array`` and its wire bytes, one pair for ``encode_frame_parts``."""
    value = np.asarray(array)
    dtype = descriptor_dtype(value.dtype)
    wire = value.astype(numpy_dtype(dtype), copy=False)
    # ascontiguousarray would turn a 0-d array into shape (1,).
    wire = wire if wire.flags.c_contiguous else wire.copy(order="C")
    shape = tuple(int(dim) for dim in wire.shape)
    descriptor = BufferDescriptor.for_array(owner, generation, dtype, shape)
    return descriptor, wire.reshape(-1).view(np.uint8).data


def array_from_buffer(
    descriptor: BufferDescriptor, payload: bytes | bytearray | memoryview
) -> np.ndarray[Any, Any]:
    """A new writable array, in native byte order, of the bytes ``descriptor`` describes.

    Raises ``DescriptorError`` (``size_mismatch``) when the payload's length is not
    ``descriptor.nbytes``, and ``ValueError`` for a shared-memory descriptor, whose bytes
    are not in the frame.
    """
    if not descriptor.inline:
        raise ValueError(
            f"buffer of {descriptor.owner!r} lives in shared memory {descriptor.location!r}; "
            "only inline buffers carry their bytes in the frame"
        )
    view = memoryview(payload).cast("B")
    if view.nbytes != descriptor.nbytes:
        raise DescriptorError(
            "size_mismatch",
            f"payload of {view.nbytes} bytes for a descriptor of {descriptor.nbytes} bytes "
            f"({descriptor.dtype.value} {list(descriptor.shape)})",
        )
    wire = np.frombuffer(view, dtype=numpy_dtype(descriptor.dtype)).reshape(descriptor.shape)
    return wire.astype(wire.dtype.newbyteorder("="), copy=True)


def frame_arrays(frame: Frame) -> list[np.ndarray[Any, Any]]:
    """The arrays of a decoded frame's buffers, in order; every buffer must be inline."""
    arrays: list[np.ndarray[Any, Any]] = []
    for index, (descriptor, payload) in enumerate(zip(frame.buffers, frame.payloads, strict=True)):
        if payload is None:
            raise ValueError(
                f"frame {frame.kind!r}: buffer {index} lives in shared memory "
                f"{descriptor.location!r}; only inline buffers can be read from the frame"
            )
        arrays.append(array_from_buffer(descriptor, payload))
    return arrays
