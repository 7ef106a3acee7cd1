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
import operator
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


#: The bytes of what stays the same from frame to frame (names, a buffer's owner, dtype,
#: shape and location), encoded once (bounded; cleared when full).
_NAMES_BYTES: dict[tuple[object, ...], bytes | None] = {}
_DESCRIPTOR_BYTES: dict[tuple[object, ...], tuple[bytes, bytes]] = {}
_BYTES_LIMIT: Final = 1024


def _names_bytes(names: tuple[object, ...]) -> bytes | None:
    found = _NAMES_BYTES.get(names, b"")
    if found != b"":
        return found
    encoded = [_str(name) for name in names]
    packed = (
        None
        if None in encoded or len(encoded) > 0xFFFF
        else _U16.pack(len(encoded)) + b"".join(encoded)  # type: ignore[arg-type]
    )
    if len(_NAMES_BYTES) >= _BYTES_LIMIT:
        _NAMES_BYTES.clear()
    _NAMES_BYTES[names] = packed
    return packed


def _descriptor_bytes(descriptor: BufferDescriptor) -> tuple[bytes, bytes] | None:
    """A buffer's bytes before its generation (owner) and after it (dtype, shape, location
    and the offset flag), or None when they have no binary form."""
    owner = _str(descriptor.owner)
    if owner is None:
        return None
    tail = [
        bytes((_DTYPE_INDEX[descriptor.dtype], len(descriptor.shape))),
        *(_U64.pack(dim) for dim in descriptor.shape),
        bytes(
            (
                (_HAS_LOCATION if descriptor.location is not None else 0)
                | (_HAS_OFFSET if descriptor.offset is not None else 0),
            )
        ),
    ]
    if descriptor.location is not None:
        location = _str(descriptor.location)
        if location is None:
            return None
        tail.append(location)
    return owner, b"".join(tail)


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
        names = _names_bytes(tuple(body["input_names" if kind == "call" else "output_names"]))
        if (
            request_id is None
            or names is None
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
        parts += [request_id, names]
    for descriptor in descriptors:
        offset = descriptor.offset
        key = (
            descriptor.owner,
            descriptor.dtype._value_,
            descriptor.shape,
            descriptor.location,
            offset is None,
        )
        pieces = _DESCRIPTOR_BYTES.get(key)
        if pieces is None:
            pieces = _descriptor_bytes(descriptor)
            if pieces is None:
                return None
            if len(_DESCRIPTOR_BYTES) >= _BYTES_LIMIT:
                _DESCRIPTOR_BYTES.clear()
            _DESCRIPTOR_BYTES[key] = pieces
        parts += [pieces[0], _U64.pack(descriptor.generation), pieces[1]]
        if offset is not None:
            parts.append(_U64.pack(offset))
    return b"".join(parts)


#: Where a result header holds its run time (after kind, flags, count, call id and epoch).
_RUN_S_AT: Final = _HEAD.size + 16
_F64: Final = struct.Struct("<d")


def with_run_s(header: bytes | memoryview, run_s: float) -> bytes | None:
    """A binary result header with its run time replaced by ``run_s``; None when ``header``
    is not a binary result header or ``run_s`` not a finite number >= 0."""
    if (
        len(header) < _RUN_S_AT + 8
        or header[0] != KIND_CODES["result"]
        or not isinstance(run_s, float)
        or not math.isfinite(run_s)
        or run_s < 0
    ):
        return None
    raw = bytes(header)
    return raw[:_RUN_S_AT] + _F64.pack(run_s) + raw[_RUN_S_AT + 8 :]


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


Decoded = tuple[str, dict[str, Any], tuple[BufferDescriptor, ...], tuple[str, ...]]

#: Where a header's per-frame values lie: ``(position, field)``, field one of ``call_id``,
#: ``epoch``, ``run_s``, ``copied_bytes``, ``request_id`` or a buffer's ``("generation", i)``
#: and ``("offset", i)``.
_Span = tuple[int, "str | tuple[str, int]"]


class _Template:
    """The layout of a header seen before: every byte that is not a per-frame value (kind,
    flags, names, owners, dtypes, shapes, locations) kept as it was, the per-frame values
    (ids, generations, offsets, timings, the request id's bytes) unpacked by one
    ``struct`` call. A header matching it decodes without walking its fields again; the
    values are checked as the full decoder checks them, and anything else takes the full
    decoder (which reports it)."""

    __slots__ = (
        "_descriptors",
        "_fields",
        "_kind",
        "_literals",
        "_names",
        "_names_key",
        "_pick_literals",
        "_pick_values",
        "_required",
        "_struct",
    )

    def __init__(self, raw: bytes, decoded: Decoded, spans: list[_Span]) -> None:
        kind, body, descriptors, required = decoded
        formats: list[str] = []
        literal_index: list[int] = []
        value_index: list[int] = []
        literals: list[bytes] = []
        fields: list[str | tuple[str, int]] = []
        position = 0
        for start, field in spans:
            if start > position:
                literal_index.append(len(formats))
                literals.append(raw[position:start])
                formats.append(f"{start - position}s")
            value_index.append(len(formats))
            fields.append(field)
            if field == "request_id":
                size = len(body["request_id"].encode("utf-8"))
                formats.append(f"{size}s")
            else:
                size = 8
                formats.append("d" if field == "run_s" else "Q")
            position = start + size
        if position < len(raw):
            literal_index.append(len(formats))
            literals.append(raw[position:])
            formats.append(f"{len(raw) - position}s")
        self._struct = struct.Struct("<" + "".join(formats))
        self._pick_literals = picker(literal_index)
        self._pick_values = picker(value_index)
        self._literals = tuple(literals)
        self._fields = tuple(fields)
        self._kind = kind
        self._names_key = "input_names" if kind == "call" else "output_names"
        self._names: list[str] = list(body[self._names_key])
        self._descriptors = descriptors
        self._required = required

    def match(self, raw: bytes) -> Decoded | None:
        """The decoded header when ``raw`` has this layout and valid values; else None."""
        found = self._struct.unpack_from(raw)
        if self._pick_literals(found) != self._literals:
            return None
        values = self._pick_values(found)
        body: dict[str, Any] = {}
        generations: dict[int, int] = {}
        offsets: dict[int, int] = {}
        for field, value in zip(self._fields, values, strict=True):
            if field == "request_id":
                try:
                    body["request_id"] = value.decode("utf-8")
                except UnicodeDecodeError:
                    return None
            elif field == "run_s":
                if not math.isfinite(value):
                    return None
                body["run_s"] = value
            elif type(field) is tuple:
                if value > _MAX_U63:
                    return None
                (generations if field[0] == "generation" else offsets)[field[1]] = value
            else:
                if value > _MAX_U63:
                    return None
                body[field] = value  # type: ignore[index]
        if self._kind != "ack":
            body[self._names_key] = list(self._names)
        descriptors = tuple(
            descriptor.with_generation(generations[index], offsets.get(index))
            for index, descriptor in enumerate(self._descriptors)
        )
        return self._kind, body, descriptors, self._required


class LiteralMatch:
    """Bytes known but for some values, matched at once: ``formats`` are the ``struct`` codes
    of the pieces in order (little-endian, no padding), ``template`` each piece's literal bytes,
    or None where a value lies. :meth:`values` compares every literal byte as one masked integer
    and unpacks the values with a struct that skips the literals."""

    __slots__ = ("_bits", "_mask", "_values", "size")

    def __init__(self, formats: Sequence[str], template: Sequence[object]) -> None:
        masked = bytearray()
        mask = bytearray()
        skipping: list[str] = []
        for form, literal in zip(formats, template, strict=True):
            size = struct.calcsize("<" + form)
            if isinstance(literal, bytes):
                masked += literal
                mask += b"\xff" * size
                skipping.append(f"{size}x")
            else:
                masked += bytes(size)
                mask += bytes(size)
                skipping.append(form)
        self._bits = int.from_bytes(masked, "little")
        self._mask = int.from_bytes(mask, "little")
        self._values = struct.Struct("<" + "".join(skipping))
        self.size = len(masked)

    def values(self, data: bytes | bytearray | memoryview) -> tuple[Any, ...] | None:
        """The values of ``data`` in order, when it is exactly as long and holds every literal;
        None otherwise."""
        if len(data) != self.size:
            return None
        if (int.from_bytes(data, "little") & self._mask) != self._bits:
            return None
        return self._values.unpack_from(data)


def picker(indexes: list[int]) -> Any:
    """A function taking ``indexes`` of a tuple, always as a tuple."""
    if not indexes:
        return lambda values: ()
    if len(indexes) == 1:
        only = indexes[0]
        return lambda values: (values[only],)
    return operator.itemgetter(*indexes)


#: Layouts seen, by the header's length and first four bytes (kind, flags, buffer count):
#: the latest few of each (two stages' results may share both).
_TEMPLATES: dict[tuple[int, bytes], list[_Template]] = {}
_TEMPLATE_LIMIT: Final = 256
_TEMPLATES_PER_KEY: Final = 4


def decode_header(raw: bytes, max_buffers: int) -> Decoded:
    """``(kind, body, descriptors, required)`` of a binary header; raises BinaryHeaderError
    (or DescriptorError for a malformed buffer) before anything is allocated. A header with
    the layout of one decoded before (the same stage's next call or result) is decoded from
    that layout (:class:`_Template`)."""
    key = (len(raw), bytes(raw[:4]))
    known = _TEMPLATES.get(key)
    if known and _HEAD.unpack_from(raw)[2] <= max_buffers:
        for template in known:
            try:
                found = template.match(raw)
            except (DescriptorError, struct.error):
                found = None
            if found is not None:
                return found
    spans: list[_Span] = []
    try:
        decoded = _decode(raw, max_buffers, spans)
    except (struct.error, IndexError):
        raise _truncated(len(raw)) from None
    if decoded[0] != "ack":
        if len(_TEMPLATES) >= _TEMPLATE_LIMIT:
            _TEMPLATES.clear()
        # A new list each time: another thread may be walking the old one.
        _TEMPLATES[key] = [_Template(bytes(raw), decoded, spans), *(known or ())][
            :_TEMPLATES_PER_KEY
        ]
    return decoded


def header_spans(raw: bytes, max_buffers: int) -> tuple[Decoded, list[_Span]]:
    """A binary header decoded in full, with where its per-frame values lie (``(position,
    field)``: ``call_id``, ``epoch``, ``run_s``, ``copied_bytes``, ``request_id`` (its UTF-8
    bytes), a buffer's ``("generation", i)`` and ``("offset", i)``, an ack's
    ``generation``); raises as :func:`decode_header` does."""
    spans: list[_Span] = []
    try:
        decoded = _decode(raw, max_buffers, spans)
    except (struct.error, IndexError):
        raise _truncated(len(raw)) from None
    if decoded[0] == "ack":
        spans.append((len(raw) - _U64.size, "generation"))
    return decoded, spans


def _decode(raw: bytes, max_buffers: int, spans: list[_Span]) -> Decoded:
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
        spans += [(position, "call_id"), (position + 8, "epoch"), (position + 18, "request_id")]
        request_id, position = _text(raw, position + _CALL.size, "the request id")
        names, position = _names(raw, position, "an input name")
        body = {"call_id": call_id, "request_id": request_id, "epoch": epoch, "input_names": names}
    else:
        call_id, epoch, run_s, copied = _RESULT.unpack_from(raw, position)
        spans += [
            (position, "call_id"),
            (position + 8, "epoch"),
            (position + 16, "run_s"),
            (position + 24, "copied_bytes"),
            (position + 34, "request_id"),
        ]
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
        spans.append((position, ("generation", index)))
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
            spans.append((position, ("offset", index)))
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
