"""The compact binary header: ``call``, ``result`` and ``ack`` frames without JSON.

A frame whose prefix carries the magic ``OEB1`` instead of ``OEF1`` has a binary header of
exactly ``header_len`` bytes; everything else (prefix, payload, inline buffers in descriptor
order) is as in the JSON frame, and it decodes to the same :class:`~.codec.Frame`. A sender
uses it only after the peer offered ``binary-header`` in its hello (and, for a worker, after
the controller said so in ``load``); a receiver that knows the feature accepts both forms.

Layout, little-endian; ``str`` is a u16 byte length and UTF-8 bytes, ``names`` a u16 count
and that many ``str``::

    u8 kind (1 call, 2 result, 3 ack) | u8 flags (1: shm-buffers, 2: shm-arena) | u16 buffers
    call:   u64 call_id | u64 epoch | str request_id | names input_names
    result: u64 call_id | u64 epoch | f64 run_s | u64 copied_bytes | str request_id
            | names output_names
    ack:    str owner | u64 generation
    each buffer: str owner | u64 generation | u8 dtype | u8 ndim | ndim x u64 dim
            | u8 where (1: location, 2: offset) | [str location] | [u64 offset]

A buffer's byte size is its shape times its item size; dtype codes are the index in
:data:`DTYPE_CODES`.
"""

from __future__ import annotations

import math
import struct
from typing import TYPE_CHECKING, Any, Final

from .buffers import MAX_DIMS, BufferDescriptor, DescriptorError, DType

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

MAGIC: Final = b"OEB1"
FEATURE: Final = "binary-header"
KIND_CODES: Final = {"call": 1, "result": 2, "ack": 3}
KINDS: Final = {code: kind for kind, code in KIND_CODES.items()}
DTYPE_CODES: Final = tuple(DType)
_DTYPE_INDEX: Final = {dtype: index for index, dtype in enumerate(DTYPE_CODES)}
_FLAG_SHM: Final = 1
_FLAG_ARENA: Final = 2
_HAS_LOCATION: Final = 1
_HAS_OFFSET: Final = 2
#: The largest value a u64 field may carry here (the contracts' 63-bit lengths and counters).
_MAX_U63: Final = 2**63 - 1

_HEAD = struct.Struct("<BBH")
_U16 = struct.Struct("<H")
_U64 = struct.Struct("<Q")
_CALL = struct.Struct("<QQ")
_RESULT = struct.Struct("<QQdQ")
_BUFFER = struct.Struct("<QBB")

_BODY_KEYS: Final = {
    "call": frozenset({"call_id", "request_id", "epoch", "input_names"}),
    "result": frozenset(
        {"call_id", "request_id", "epoch", "output_names", "run_s", "copied_bytes"}
    ),
    "ack": frozenset({"owner", "generation"}),
}


class BinaryHeaderError(ValueError):
    """A binary header is malformed; ``code`` is one of the codec's frame error codes."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _str(value: object) -> bytes | None:
    if not isinstance(value, str):
        return None
    data = value.encode("utf-8")
    return _U16.pack(len(data)) + data if len(data) <= 0xFFFF else None


def _u63(value: object) -> bool:
    return type(value) is int and 0 <= value <= _MAX_U63


def encode_header(
    kind: str,
    body: Mapping[str, Any],
    descriptors: Sequence[BufferDescriptor],
    required: Iterable[str],
) -> bytes | None:
    """The binary header of this frame, or None when it has no binary form (other kinds,
    other features, values out of range): the sender then writes a JSON header."""
    code = KIND_CODES.get(kind)
    if code is None or set(body) != _BODY_KEYS[kind] or len(descriptors) > 0xFFFF:
        return None
    flags = 0
    for feature in required:
        if feature == "shm-buffers":
            flags |= _FLAG_SHM
        elif feature == "shm-arena":
            flags |= _FLAG_ARENA
        else:
            return None
    parts = [_HEAD.pack(code, flags, len(descriptors))]
    if kind == "ack":
        owner = _str(body["owner"])
        if owner is None or not _u63(body["generation"]):
            return None
        parts += [owner, _U64.pack(body["generation"])]
    else:
        request_id = _str(body["request_id"])
        names_key = "input_names" if kind == "call" else "output_names"
        names = [_str(name) for name in body[names_key]]
        if (
            request_id is None
            or None in names
            or len(names) > 0xFFFF
            or not _u63(body["call_id"])
            or not _u63(body["epoch"])
        ):
            return None
        if kind == "call":
            parts.append(_CALL.pack(body["call_id"], body["epoch"]))
        else:
            run_s, copied = body["run_s"], body["copied_bytes"]
            if not isinstance(run_s, float) or not math.isfinite(run_s) or not _u63(copied):
                return None
            parts.append(_RESULT.pack(body["call_id"], body["epoch"], run_s, copied))
        parts += [request_id, _U16.pack(len(names)), *names]  # type: ignore[list-item]
    for descriptor in descriptors:
        owner = _str(descriptor.owner)
        if owner is None:
            return None
        parts += [
            owner,
            _BUFFER.pack(
                descriptor.generation, _DTYPE_INDEX[descriptor.dtype], len(descriptor.shape)
            ),
            *(_U64.pack(dim) for dim in descriptor.shape),
        ]
        where = (_HAS_LOCATION if descriptor.location is not None else 0) | (
            _HAS_OFFSET if descriptor.offset is not None else 0
        )
        parts.append(bytes((where,)))
        if descriptor.location is not None:
            location = _str(descriptor.location)
            if location is None:
                return None
            parts.append(location)
        if descriptor.offset is not None:
            parts.append(_U64.pack(descriptor.offset))
    return b"".join(parts)


def _truncated(size: int) -> BinaryHeaderError:
    return BinaryHeaderError("bad_header", f"binary header of {size} bytes ends inside a field")


def _text(raw: bytes, position: int, what: str) -> tuple[str, int]:
    (size,) = _U16.unpack_from(raw, position)
    end = position + 2 + size
    if end > len(raw):
        raise _truncated(len(raw))
    try:
        return raw[position + 2 : end].decode("utf-8"), end
    except UnicodeDecodeError:
        raise BinaryHeaderError("bad_header", f"binary header: {what} is not UTF-8") from None


def _names(raw: bytes, position: int, what: str) -> tuple[list[str], int]:
    (count,) = _U16.unpack_from(raw, position)
    position += 2
    names = []
    for _ in range(count):
        name, position = _text(raw, position, what)
        names.append(name)
    return names, position


def decode_header(
    raw: bytes, max_buffers: int
) -> tuple[str, dict[str, Any], tuple[BufferDescriptor, ...], tuple[str, ...]]:
    """``(kind, body, descriptors, required)`` of a binary header; raises BinaryHeaderError
    (or DescriptorError for a malformed buffer) before anything is allocated."""
    try:
        return _decode(raw, max_buffers)
    except (struct.error, IndexError):
        raise _truncated(len(raw)) from None


def _decode(
    raw: bytes, max_buffers: int
) -> tuple[str, dict[str, Any], tuple[BufferDescriptor, ...], tuple[str, ...]]:
    code, flags, count = _HEAD.unpack_from(raw, 0)
    position = _HEAD.size
    kind = KINDS.get(code)
    if kind is None:
        raise BinaryHeaderError("bad_header", f"binary header kind {code}; accepted: 1, 2 or 3")
    if flags & ~(_FLAG_SHM | _FLAG_ARENA):
        raise BinaryHeaderError("bad_header", f"binary header flags {flags:#04x}; accepted: 1, 2")
    if count > max_buffers:
        raise BinaryHeaderError("too_many_buffers", f"{count} buffers; limit {max_buffers}")
    body: dict[str, Any]
    if kind == "ack":
        owner, position = _text(raw, position, "the owner")
        (generation,) = _U64.unpack_from(raw, position)
        position += 8
        body = {"owner": owner, "generation": generation}
    elif kind == "call":
        call_id, epoch = _CALL.unpack_from(raw, position)
        request_id, position = _text(raw, position + _CALL.size, "the request id")
        names, position = _names(raw, position, "an input name")
        body = {"call_id": call_id, "request_id": request_id, "epoch": epoch, "input_names": names}
    else:
        call_id, epoch, run_s, copied = _RESULT.unpack_from(raw, position)
        request_id, position = _text(raw, position + _RESULT.size, "the request id")
        names, position = _names(raw, position, "an output name")
        body = {
            "call_id": call_id,
            "request_id": request_id,
            "epoch": epoch,
            "output_names": names,
            "run_s": run_s,
            "copied_bytes": copied,
        }
    descriptors = []
    for index in range(count):
        owner, position = _text(raw, position, f"buffer {index}'s owner")
        generation, dtype_code, ndim = _BUFFER.unpack_from(raw, position)
        position += _BUFFER.size
        if dtype_code >= len(DTYPE_CODES):
            raise BinaryHeaderError(
                "bad_dtype", f"buffer {index}: dtype code {dtype_code}; accepted: 0-11"
            )
        if ndim > MAX_DIMS:
            raise BinaryHeaderError(
                "bad_descriptor", f"buffer {index} has {ndim} dimensions; at most {MAX_DIMS}"
            )
        shape = struct.unpack_from(f"<{ndim}Q", raw, position)
        position += 8 * ndim
        where = raw[position]
        position += 1
        if where & ~(_HAS_LOCATION | _HAS_OFFSET):
            raise BinaryHeaderError("bad_header", f"buffer {index}: location flags {where:#04x}")
        location = None
        if where & _HAS_LOCATION:
            location, position = _text(raw, position, f"buffer {index}'s location")
        offset = None
        if where & _HAS_OFFSET:
            (offset,) = _U64.unpack_from(raw, position)
            position += 8
        dtype = DTYPE_CODES[dtype_code]
        try:
            if math.prod(dim for dim in shape if dim) * dtype.itemsize > _MAX_U63:
                raise DescriptorError(
                    "length_overflow", f"shape {list(shape)} of {dtype.value} overflows 63 bits"
                )
            descriptors.append(
                BufferDescriptor.for_array(owner, generation, dtype, shape, location, offset)
            )
        except DescriptorError as exc:
            raise BinaryHeaderError(exc.code, f"buffer {index}: {exc}") from None
    if position != len(raw):
        raise BinaryHeaderError(
            "bad_header", f"binary header has {len(raw) - position} bytes after its end"
        )
    required = (("shm-buffers",) if flags & _FLAG_SHM else ()) + (
        ("shm-arena",) if flags & _FLAG_ARENA else ()
    )
    return kind, body, tuple(descriptors), required
