"""Buffer descriptors: what a raw tensor buffer is, before its bytes are touched.

Every tensor that crosses a process boundary is described by a descriptor that
carries its owner, generation, exact byte size, dtype and shape. The size must equal
the product of the shape times the item size, so a receiver can check a descriptor
completely before allocating anything.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

#: Largest byte count a descriptor may name (fits a signed 64-bit length everywhere).
MAX_BUFFER_BYTES = 2**63 - 1
#: NumPy's own limit on array dimensions.
MAX_DIMS = 64


class DType(enum.Enum):
    """The closed set of element types: every tensor type NumPy can hold as plain data."""

    BOOL = "bool"
    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    UINT8 = "uint8"
    UINT16 = "uint16"
    UINT32 = "uint32"
    UINT64 = "uint64"
    FLOAT16 = "float16"
    FLOAT32 = "float32"
    FLOAT64 = "float64"

    @property
    def itemsize(self) -> int:
        # Keyed by the value: an enum member's own hash is computed in Python on every lookup.
        return _ITEMSIZE_BY_VALUE[self._value_]

    @classmethod
    def parse(cls, value: object) -> DType:
        if isinstance(value, str):
            try:
                return cls(value)
            except ValueError:
                pass
        raise DescriptorError(
            "bad_dtype",
            f"dtype {value!r} is not supported; accepted: {', '.join(d.value for d in cls)}",
        )


_ITEMSIZE: dict[DType, int] = {
    DType.BOOL: 1,
    DType.INT8: 1,
    DType.INT16: 2,
    DType.INT32: 4,
    DType.INT64: 8,
    DType.UINT8: 1,
    DType.UINT16: 2,
    DType.UINT32: 4,
    DType.UINT64: 8,
    DType.FLOAT16: 2,
    DType.FLOAT32: 4,
    DType.FLOAT64: 8,
}


_ITEMSIZE_BY_VALUE: dict[str, int] = {dtype.value: size for dtype, size in _ITEMSIZE.items()}

#: Descriptors already validated, by everything but their generation and offset: the
#: tensors a stage sends call after call (bounded; cleared when full).
_KNOWN: dict[tuple[object, ...], BufferDescriptor] = {}
_KNOWN_LIMIT = 1024


class DescriptorError(ValueError):
    """A buffer descriptor is malformed. ``code`` is a stable machine-readable name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class BufferDescriptor:
    """One raw buffer: who owns it, which generation, and exactly what it holds.

    ``location`` is ``None`` when the bytes travel inline in the frame payload, or the
    name of a shared-memory segment that holds them (same OS domain only). ``offset`` is
    where the bytes start inside that segment: ``None`` for a segment that holds one buffer,
    a byte offset into a producer's persistent arena otherwise (feature ``shm-arena``).
    """

    owner: str
    generation: int
    nbytes: int
    dtype: DType
    shape: tuple[int, ...]
    location: str | None = None
    offset: int | None = None

    def __post_init__(self) -> None:
        _validate(self.owner, self.generation, self.nbytes, self.shape, self.dtype, self.location)
        _validate_offset(self.offset, self.location)

    @classmethod
    def for_array(
        cls,
        owner: str,
        generation: int,
        dtype: DType,
        shape: tuple[int, ...],
        location: str | None = None,
        offset: int | None = None,
    ) -> BufferDescriptor:
        """Build a descriptor whose size is derived from dtype and shape.

        A tensor described before (same owner, dtype, shape and location) is not checked
        again: only its generation and offset are (:meth:`with_generation`)."""
        key = (owner, dtype._value_, shape, location, offset is None)
        known = _KNOWN.get(key) if cls is BufferDescriptor else None
        if known is not None:
            return known.with_generation(generation, offset)
        nbytes = math.prod(shape) * dtype.itemsize
        made = cls(owner, generation, nbytes, dtype, shape, location, offset)
        if type(shape) is tuple and all(type(dim) is int for dim in shape):
            if len(_KNOWN) >= _KNOWN_LIMIT:
                _KNOWN.clear()
            _KNOWN[key] = made
        return made

    def with_generation(self, generation: int, offset: int | None = None) -> BufferDescriptor:
        """This descriptor for another ``generation`` (and arena ``offset``), every other field
        as this one already holds it, validated: how the same tensor is described call after
        call without checking its shape again. ``offset`` must be given exactly when this
        descriptor has one."""
        if type(generation) is not int or not 0 <= generation <= MAX_BUFFER_BYTES:
            raise DescriptorError(
                "bad_descriptor", f"descriptor generation {generation!r} must be an integer >= 0"
            )
        if (offset is None) != (self.offset is None):
            raise DescriptorError(
                "bad_descriptor",
                f"descriptor offset {offset!r}: this buffer "
                + ("lies at an arena offset" if self.offset is not None else "has no offset"),
            )
        _validate_offset(offset, self.location)
        made = object.__new__(BufferDescriptor)
        put = object.__setattr__
        put(made, "owner", self.owner)
        put(made, "generation", generation)
        put(made, "nbytes", self.nbytes)
        put(made, "dtype", self.dtype)
        put(made, "shape", self.shape)
        put(made, "location", self.location)
        put(made, "offset", offset)
        return made

    @property
    def inline(self) -> bool:
        return self.location is None

    @property
    def in_arena(self) -> bool:
        """Whether the bytes lie at ``offset`` inside a producer's persistent arena."""
        return self.offset is not None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "owner": self.owner,
            "generation": self.generation,
            "nbytes": self.nbytes,
            "dtype": self.dtype.value,
            "shape": list(self.shape),
        }
        if self.location is not None:
            wire["location"] = self.location
        if self.offset is not None:
            wire["offset"] = self.offset
        return wire

    @classmethod
    def from_wire(cls, wire: object) -> BufferDescriptor:
        """Parse and fully validate a descriptor from its JSON form."""
        if not isinstance(wire, Mapping):
            raise DescriptorError("bad_descriptor", "a buffer descriptor must be a JSON object")
        allowed = {"owner", "generation", "nbytes", "dtype", "shape", "location", "offset"}
        extra = sorted(set(wire) - allowed)
        if extra:
            raise DescriptorError(
                "bad_descriptor",
                f"unknown descriptor field(s) {extra}; accepted: {sorted(allowed)}",
            )
        missing = sorted({"owner", "generation", "nbytes", "dtype", "shape"} - set(wire))
        if missing:
            raise DescriptorError("bad_descriptor", f"descriptor is missing {missing}")
        shape = wire["shape"]
        if not isinstance(shape, list):
            raise DescriptorError("bad_descriptor", "descriptor shape must be a list of integers")
        dtype = DType.parse(wire["dtype"])
        # Construction validates every field (__post_init__), before anything is allocated.
        return cls(
            wire["owner"],
            wire["generation"],
            wire["nbytes"],
            dtype,
            tuple(shape),
            wire.get("location"),
            wire.get("offset"),
        )


def _validate_offset(offset: object, location: object) -> None:
    if offset is None:
        return
    if location is None:
        raise DescriptorError(
            "bad_descriptor", "descriptor offset needs a location (the arena it points into)"
        )
    if not _is_int(offset):
        raise DescriptorError("bad_descriptor", f"descriptor offset {offset!r} is not an integer")
    assert isinstance(offset, int)
    if offset < 0:
        raise DescriptorError("negative_length", f"descriptor offset {offset} is negative")
    if offset > MAX_BUFFER_BYTES:
        raise DescriptorError("length_overflow", f"descriptor offset {offset} overflows 63 bits")


def _validate(
    owner: object,
    generation: object,
    nbytes: object,
    shape: object,
    dtype: object,
    location: object,
) -> None:
    # The common case first, in a few operations: every field well-formed.
    if (
        type(owner) is str
        and 0 < len(owner) <= 256
        and type(generation) is int
        and 0 <= generation <= MAX_BUFFER_BYTES
        and type(nbytes) is int
        and 0 <= nbytes <= MAX_BUFFER_BYTES
        and type(shape) in (tuple, list)
        and len(shape) <= MAX_DIMS  # type: ignore[arg-type]
        and all(type(dim) is int and 0 < dim <= MAX_BUFFER_BYTES for dim in shape)  # type: ignore[attr-defined]
        and type(dtype) is DType
        and (location is None or (type(location) is str and 0 < len(location) <= 255))
    ):
        size = math.prod(cast("tuple[int, ...]", shape)) * _ITEMSIZE_BY_VALUE[dtype._value_]
        if size == nbytes:
            return
    _validate_slowly(owner, generation, nbytes, shape, dtype, location)


def _validate_slowly(
    owner: object,
    generation: object,
    nbytes: object,
    shape: object,
    dtype: object,
    location: object,
) -> None:
    if not isinstance(owner, str) or not owner or len(owner) > 256:
        raise DescriptorError(
            "bad_descriptor",
            f"descriptor owner {owner!r:.40} must be a non-empty string of at most 256 characters",
        )
    if not _is_int(generation) or not 0 <= generation <= MAX_BUFFER_BYTES:  # type: ignore[operator]
        raise DescriptorError(
            "bad_descriptor", f"descriptor generation {generation!r} must be an integer >= 0"
        )
    if not _is_int(nbytes):
        raise DescriptorError("bad_descriptor", f"descriptor nbytes {nbytes!r} is not an integer")
    assert isinstance(nbytes, int)
    if nbytes < 0:
        raise DescriptorError("negative_length", f"descriptor nbytes {nbytes} is negative")
    if nbytes > MAX_BUFFER_BYTES:
        raise DescriptorError("length_overflow", f"descriptor nbytes {nbytes} overflows 63 bits")
    if not isinstance(shape, (list, tuple)):
        raise DescriptorError("bad_descriptor", "descriptor shape must be a list of integers")
    if len(shape) > MAX_DIMS:
        raise DescriptorError(
            "bad_descriptor", f"descriptor has {len(shape)} dimensions; at most {MAX_DIMS}"
        )
    for dim in shape:
        if not _is_int(dim):
            raise DescriptorError("bad_descriptor", f"shape dimension {dim!r} is not an integer")
        if dim < 0:
            raise DescriptorError("negative_length", f"shape dimension {dim} is negative")
        if dim > MAX_BUFFER_BYTES:
            raise DescriptorError("length_overflow", f"shape dimension {dim} overflows 63 bits")
    if not isinstance(dtype, DType):
        raise DescriptorError("bad_dtype", f"dtype {dtype!r} is not a DType")
    # Zero dimensions are skipped, as NumPy does: [0, 2**62, 2**62] cannot be reshaped either.
    if math.prod(dim for dim in shape if dim) * dtype.itemsize > MAX_BUFFER_BYTES:
        raise DescriptorError(
            "length_overflow", f"shape {list(shape)} of {dtype.value} overflows 63 bits"
        )
    expected = math.prod(shape) * dtype.itemsize
    if expected != nbytes:
        raise DescriptorError(
            "size_mismatch",
            f"descriptor nbytes {nbytes} != {expected} "
            f"(shape {list(shape)} x {dtype.itemsize}-byte {dtype.value})",
        )
    if location is not None and (
        not isinstance(location, str) or not location or len(location) > 255
    ):
        raise DescriptorError(
            "bad_descriptor", "descriptor location must be a shared-memory name or absent"
        )
