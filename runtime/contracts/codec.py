"""The frame codec: a JSON header plus raw buffers, decoded incrementally.

Wire layout of one frame (all integers little-endian)::

    0   4 bytes   magic  b"OEF1"
    4   u32       header_len   length of the JSON header in bytes
    8   u64       payload_len  total length of the inline buffers that follow
    16  header    UTF-8 JSON object (see below)
    ..  payload   the inline buffers, concatenated in descriptor order

The header is ``{"v": 1, "kind": str, "required": [feature, ...],
"buffers": [descriptor, ...], "body": {...}}``; ``required``, ``buffers`` and ``body``
may be omitted. A descriptor with a ``location`` names a shared-memory segment instead
of inline bytes and needs the ``shm-buffers`` feature in ``required``.

Every length is validated against :class:`FrameLimits` *before* anything of that
length is allocated, and the sum of the inline descriptors must equal
``payload_len``. Each rejection raises :class:`FrameError` with a stable ``code``
(listed in :data:`ERROR_CODES`); ``conformance/v1.json`` pins the behaviour.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import binary
from .buffers import BufferDescriptor, DescriptorError
from .versions import KNOWN_FEATURES, PROTOCOL_VERSION, FeatureError, check_required

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

MAGIC = b"OEF1"
PREFIX = struct.Struct("<4sIQ")
PREFIX_SIZE = PREFIX.size  # 16
HEADER_KEYS = frozenset({"v", "kind", "required", "buffers", "body"})

ERROR_CODES = frozenset(
    {
        "bad_magic",  # the stream is not at a frame boundary or is not ours
        "truncated",  # the stream ended inside a frame
        "header_too_large",  # header_len above the limit
        "frame_too_large",  # prefix + header + payload above the limit
        "bad_header_json",  # header is not UTF-8 JSON, has duplicate keys or NaN
        "bad_header",  # header is not an object or a field has the wrong type
        "unsupported_version",  # "v" is not the protocol version
        "unknown_required_feature",  # a required feature this side does not implement
        "too_many_buffers",  # more descriptors than the limit
        "bad_descriptor",  # a descriptor field is missing or malformed
        "bad_dtype",  # dtype outside the closed set
        "negative_length",  # negative nbytes or dimension
        "length_overflow",  # a size that does not fit 63 bits
        "size_mismatch",  # nbytes != prod(shape) * itemsize
        "payload_mismatch",  # inline descriptors do not add up to payload_len
        "trailing_bytes",  # bytes after the frame when exactly one frame was expected
        "closed",  # the decoder already failed or was closed
    }
)


class FrameError(ValueError):
    """A frame was rejected. ``code`` is one of :data:`ERROR_CODES`."""

    def __init__(self, code: str, message: str) -> None:
        assert code in ERROR_CODES, code
        super().__init__(f"{code}: {message}")
        self.code = code
        #: Whole frames :meth:`FrameDecoder.feed` decoded from the same bytes before this one.
        self.frames: list[Frame] = []


@dataclass(frozen=True, slots=True)
class FrameLimits:
    """Upper bounds a receiver enforces before allocating."""

    max_header_bytes: int = 1 << 20
    max_buffers: int = 256
    max_total_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        if self.max_header_bytes < 2 or self.max_buffers < 0 or self.max_total_bytes < 18:
            raise ValueError(f"frame limits too small: {self}")


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded frame. ``payloads[i]`` is ``None`` for a shared-memory buffer."""

    kind: str
    body: Mapping[str, Any] = field(default_factory=dict)
    buffers: tuple[BufferDescriptor, ...] = ()
    payloads: tuple[bytes | None, ...] = ()
    required: tuple[str, ...] = ()

    def header(self) -> dict[str, Any]:
        header: dict[str, Any] = {"v": PROTOCOL_VERSION, "kind": self.kind}
        if self.required:
            header["required"] = list(self.required)
        if self.buffers:
            header["buffers"] = [d.to_wire() for d in self.buffers]
        if self.body:
            header["body"] = dict(self.body)
        return header


def encode_frame_parts(
    kind: str,
    body: Mapping[str, Any] | None = None,
    buffers: Sequence[tuple[BufferDescriptor, bytes | bytearray | memoryview | None]] = (),
    required: Iterable[str] = (),
    *,
    binary_header: bool = False,
) -> list[bytes | memoryview]:
    """Encode one frame as a list of byte chunks, ready for a gathered write.

    ``buffers`` pairs each descriptor with its bytes (``None`` for shared memory). With
    ``binary_header`` (the peer offered ``binary-header``), a ``call``, ``result`` or ``ack``
    gets the compact binary header (:mod:`.binary`); any other frame a JSON one.
    """
    required = tuple(required)
    descriptors = [d for d, _ in buffers]
    if any(not d.inline for d in descriptors) and "shm-buffers" not in required:
        required = (*required, "shm-buffers")
    if any(d.in_arena for d in descriptors) and "shm-arena" not in required:
        required = (*required, "shm-arena")
    packed = (
        binary.encode_header(kind, body or {}, descriptors, required) if binary_header else None
    )
    if packed is not None:
        return _with_payload(binary.MAGIC, packed, buffers)
    header: dict[str, Any] = {"v": PROTOCOL_VERSION, "kind": kind}
    if required:
        header["required"] = list(required)
    if descriptors:
        header["buffers"] = [d.to_wire() for d in descriptors]
    if body:
        header["body"] = dict(body)
    return _with_payload(MAGIC, _HEADER_ENCODER.encode(header).encode("utf-8"), buffers)


def _with_payload(
    magic: bytes,
    header_bytes: bytes,
    buffers: Sequence[tuple[BufferDescriptor, bytes | bytearray | memoryview | None]],
) -> list[bytes | memoryview]:
    chunks: list[bytes | memoryview] = []
    payload_len = 0
    for descriptor, data in buffers:
        if descriptor.inline:
            if data is None:
                raise ValueError(f"inline buffer of {descriptor.owner} has no bytes")
            view = memoryview(data).cast("B")
            if view.nbytes != descriptor.nbytes:
                raise ValueError(
                    f"buffer has {view.nbytes} bytes but its descriptor says {descriptor.nbytes}"
                )
            chunks.append(view)
            payload_len += view.nbytes
        elif data is not None:
            raise ValueError("a shared-memory buffer carries no inline bytes")
    return [PREFIX.pack(magic, len(header_bytes), payload_len), header_bytes, *chunks]


#: An acknowledgement frame's bytes before its generation, by owner (binary headers).
_ACK_HEADS: dict[str, bytes] = {}
_ACK_HEADS_LIMIT = 1024
_U64 = struct.Struct("<Q")


def encode_ack_frame(owner: str, generation: int, *, binary_header: bool) -> bytes:
    """The bytes of one ``ack`` frame, as :func:`encode_frame` gives them: with a binary
    header, the bytes before the generation are made once per owner."""
    head = _ACK_HEADS.get(owner) if binary_header else None
    if head is not None and type(generation) is int and 0 <= generation < 1 << 63:
        return head + _U64.pack(generation)
    body = {"owner": owner, "generation": generation}
    frame = b"".join(encode_frame_parts("ack", body, binary_header=binary_header))
    if binary_header and frame[:4] == binary.MAGIC and isinstance(owner, str):
        if len(_ACK_HEADS) >= _ACK_HEADS_LIMIT:
            _ACK_HEADS.clear()
        _ACK_HEADS[owner] = frame[: -_U64.size]
    return frame


def encode_frame(
    kind: str,
    body: Mapping[str, Any] | None = None,
    buffers: Sequence[tuple[BufferDescriptor, bytes | bytearray | memoryview | None]] = (),
    required: Iterable[str] = (),
    *,
    binary_header: bool = False,
) -> bytes:
    """Encode one frame into a single bytes object."""
    return b"".join(encode_frame_parts(kind, body, buffers, required, binary_header=binary_header))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _finite_float(text: str) -> float:
    value = float(text)
    # A literal such as 1e999 parses to infinity, which the encoder could never send.
    if not math.isfinite(value):
        raise ValueError(f"number {text} does not fit a finite double")
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


#: Made once: ``json.dumps``/``json.loads`` with options build a new coder on every call.
_HEADER_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_HEADER_DECODER = json.JSONDecoder(
    object_pairs_hook=_no_duplicates, parse_constant=_reject_constant, parse_float=_finite_float
)


@dataclass(frozen=True, slots=True)
class _Pending:
    """A header that has been validated; waiting for its payload."""

    kind: str
    body: Mapping[str, Any]
    buffers: tuple[BufferDescriptor, ...]
    required: tuple[str, ...]
    payload_len: int


class FrameDecoder:
    """Incremental decoder: feed bytes as they arrive, get complete frames back.

    After any :class:`FrameError` the decoder is poisoned (a byte stream cannot be
    resynchronised) and every later call raises ``closed``.
    """

    def __init__(
        self, limits: FrameLimits | None = None, known_features: frozenset[str] = KNOWN_FEATURES
    ) -> None:
        self.limits = limits or FrameLimits()
        self.known_features = known_features
        self._buf = bytearray()
        self._header_len: int | None = None
        self._payload_len = 0
        self._pending: _Pending | None = None
        self._failed: FrameError | None = None
        self._binary = False

    def bytes_needed(self) -> int:
        """How many more bytes complete the current step (prefix, header or payload)."""
        if self._header_len is None:
            return PREFIX_SIZE - len(self._buf)
        if self._pending is None:
            return self._header_len - len(self._buf)
        return self._pending.payload_len - len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Add bytes; return every frame they complete (possibly none). A FrameError carries
        the frames completed before the bad one (``frames``)."""
        if self._failed is not None:
            raise FrameError("closed", f"decoder already failed ({self._failed.code})")
        view = memoryview(data).cast("B")
        frames: list[Frame] = []
        try:
            while True:
                if self._header_len is None and not self._buf and view.nbytes >= PREFIX_SIZE:
                    # Whole frames first, without stepping through the state machine.
                    whole = self._whole_frame(view)
                    if whole is not None:
                        frames.append(whole[0])
                        view = view[whole[1] :]
                        continue
                need = self.bytes_needed()
                if need == 0:
                    # Also completes steps of length zero (an empty payload).
                    step = bytes(self._buf)
                    self._buf = bytearray()
                    frame = self._advance(step)
                    if frame is not None:
                        frames.append(frame)
                    continue
                if not view.nbytes:
                    break
                if not self._buf and view.nbytes >= need:
                    # A whole step is here: decode it from the input, without buffering.
                    frame = self._advance(view[:need])
                    view = view[need:]
                    if frame is not None:
                        frames.append(frame)
                    continue
                take = min(need, view.nbytes)
                self._buf += view[:take]
                view = view[take:]
        except FrameError as exc:
            self._failed = exc
            self._buf = bytearray()
            exc.frames = frames
            raise
        return frames

    def _whole_frame(self, view: memoryview) -> tuple[Frame, int] | None:
        """The frame at the start of ``view`` and its length, when all of it is there (None
        otherwise: the state machine takes the bytes step by step). The same checks, in the
        same order, as the step-by-step way."""
        _, header_len, payload_len = PREFIX.unpack_from(view)
        end = PREFIX_SIZE + header_len + payload_len
        if view.nbytes < end:
            return None
        self._read_prefix(view[:PREFIX_SIZE])
        self._pending = self._parse_header(bytes(view[PREFIX_SIZE : PREFIX_SIZE + header_len]))
        pending = self._pending
        self._header_len = None
        self._pending = None
        return _assemble(pending, bytes(view[PREFIX_SIZE + header_len : end])), end

    def close(self) -> None:
        """Declare the end of the stream; raise ``truncated`` if inside a frame."""
        if self._failed is not None:
            return
        partial = self._header_len is not None or len(self._buf) > 0
        self._failed = FrameError("closed", "decoder closed")
        if partial:
            raise FrameError("truncated", "the stream ended inside a frame")

    @property
    def at_boundary(self) -> bool:
        return self._header_len is None and not self._buf

    def _advance(self, step: bytes | memoryview) -> Frame | None:
        """Complete the current step with its bytes (exactly what it needed)."""
        if self._header_len is None:
            self._read_prefix(step)
            return None
        if self._pending is None:
            self._pending = self._parse_header(bytes(step))
            return None
        pending = self._pending
        self._header_len = None
        self._pending = None
        return _assemble(pending, bytes(step))

    def _read_prefix(self, step: bytes | memoryview) -> None:
        magic, header_len, payload_len = PREFIX.unpack(step)
        if magic != MAGIC and (magic != binary.MAGIC or binary.FEATURE not in self.known_features):
            raise FrameError("bad_magic", f"expected {MAGIC!r}, got {magic!r}")
        self._binary = magic == binary.MAGIC
        if header_len > self.limits.max_header_bytes:
            raise FrameError(
                "header_too_large",
                f"header of {header_len} bytes; limit {self.limits.max_header_bytes}",
            )
        total = PREFIX_SIZE + header_len + payload_len
        if total > self.limits.max_total_bytes:
            raise FrameError(
                "frame_too_large",
                f"frame of {total} bytes; limit {self.limits.max_total_bytes}",
            )
        self._buf = bytearray()
        self._header_len = header_len
        self._payload_len = payload_len

    def _parse_header(self, raw: bytes) -> _Pending:
        if self._binary:
            return self._parse_binary_header(raw)
        try:
            header = _HEADER_DECODER.decode(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise FrameError("bad_header_json", f"header is not valid JSON: {exc}") from None
        if not isinstance(header, dict):
            raise FrameError("bad_header", "header must be a JSON object")
        unknown = sorted(set(header) - HEADER_KEYS)
        if unknown:
            raise FrameError("bad_header", f"unknown header key(s) {unknown}")
        version = header.get("v")
        if not isinstance(version, int) or isinstance(version, bool):
            raise FrameError("bad_header", "header field 'v' must be an integer")
        if version != PROTOCOL_VERSION:
            raise FrameError(
                "unsupported_version",
                f"frame version {version}; this side speaks {PROTOCOL_VERSION}",
            )
        kind = header.get("kind")
        if not isinstance(kind, str) or not kind:
            raise FrameError("bad_header", "header field 'kind' must be a non-empty string")
        required = header.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise FrameError("bad_header", "header field 'required' must be a list of strings")
        try:
            check_required(required, self.known_features)
        except FeatureError as exc:
            raise FrameError("unknown_required_feature", str(exc)) from None
        body = header.get("body", {})
        if not isinstance(body, dict):
            raise FrameError("bad_header", "header field 'body' must be an object")
        wire_buffers = header.get("buffers", [])
        if not isinstance(wire_buffers, list):
            raise FrameError("bad_header", "header field 'buffers' must be a list")
        if len(wire_buffers) > self.limits.max_buffers:
            raise FrameError(
                "too_many_buffers",
                f"{len(wire_buffers)} buffers; limit {self.limits.max_buffers}",
            )
        descriptors: list[BufferDescriptor] = []
        for index, wire in enumerate(wire_buffers):
            try:
                descriptors.append(BufferDescriptor.from_wire(wire))
            except DescriptorError as exc:
                raise FrameError(exc.code, f"buffer {index}: {exc}") from None
        return self._checked(kind, body, descriptors, required)

    def _parse_binary_header(self, raw: bytes) -> _Pending:
        try:
            kind, body, found, required = binary.decode_header(raw, self.limits.max_buffers)
        except binary.BinaryHeaderError as exc:
            raise FrameError(exc.code, str(exc)) from None
        return self._checked(kind, body, list(found), list(required))

    def _checked(
        self,
        kind: str,
        body: dict[str, Any],
        descriptors: list[BufferDescriptor],
        required: list[str],
    ) -> _Pending:
        """The checks every header passes, JSON or binary, once its fields are parsed."""
        inline_total = sum(d.nbytes for d in descriptors if d.inline)
        if inline_total != self._payload_len:
            raise FrameError(
                "payload_mismatch",
                f"descriptors name {inline_total} inline bytes; payload_len is {self._payload_len}",
            )
        if any(not d.inline for d in descriptors) and "shm-buffers" not in required:
            raise FrameError(
                "bad_descriptor", "a shared-memory buffer needs 'shm-buffers' in 'required'"
            )
        if any(d.in_arena for d in descriptors) and "shm-arena" not in required:
            raise FrameError(
                "bad_descriptor", "a buffer at an arena offset needs 'shm-arena' in 'required'"
            )
        return _Pending(kind, body, tuple(descriptors), tuple(required), self._payload_len)


def _assemble(pending: _Pending, payload: bytes) -> Frame:
    payloads: list[bytes | None] = []
    offset = 0
    for descriptor in pending.buffers:
        if descriptor.inline:
            payloads.append(payload[offset : offset + descriptor.nbytes])
            offset += descriptor.nbytes
        else:
            payloads.append(None)
    return Frame(
        kind=pending.kind,
        body=pending.body,
        buffers=pending.buffers,
        payloads=tuple(payloads),
        required=pending.required,
    )


def decode_frame(data: bytes, limits: FrameLimits | None = None) -> Frame:
    """Decode exactly one frame from ``data``."""
    decoder = FrameDecoder(limits)
    view = memoryview(data).cast("B")
    offset = 0
    # Feed one step at a time so bytes after the frame are reported as trailing,
    # never parsed as the start of another frame.
    while offset < view.nbytes:
        step = decoder.bytes_needed()
        frames = decoder.feed(view[offset : offset + step])
        offset += step
        if frames:
            if offset < view.nbytes:
                raise FrameError("trailing_bytes", f"{view.nbytes - offset} bytes follow the frame")
            return frames[0]
    decoder.close()
    raise FrameError("truncated", "no complete frame")
