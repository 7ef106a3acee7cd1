"""The pieces the v1 fixtures are built from: frame bytes packed by hand with ``struct`` and
``json`` (not by the codec under test), the error codes, and ``Fixtures``, which collects
every fixture."""

from __future__ import annotations

import json
import struct
from typing import Any

MAGIC = b"OEF1"
PREFIX = struct.Struct("<4sIQ")
DEFAULT_LIMITS = {"max_header_bytes": 1 << 20, "max_buffers": 256, "max_total_bytes": 256 << 20}

ERROR_MEANINGS = {
    "bad_magic": "the 4 magic bytes are not b'OEF1'",
    "truncated": "the stream ended inside a frame (prefix, header or payload)",
    "header_too_large": "header_len is above max_header_bytes",
    "frame_too_large": "16 + header_len + payload_len is above max_total_bytes",
    "bad_header_json": "the header is not strict UTF-8 JSON: bad UTF-8, a BOM, NaN or "
    "Infinity, a number beyond a finite double, a duplicate key, or nesting too deep",
    "bad_header": "the header is not an object, lacks 'v' or 'kind', has an unknown key, "
    "or a field has the wrong type",
    "unsupported_version": "'v' is an integer other than 1",
    "unknown_required_feature": "'required' names a feature the receiver does not implement",
    "too_many_buffers": "more descriptors than max_buffers",
    "bad_descriptor": "a descriptor is not an object, misses or adds a field, has a field of "
    "the wrong type, or names shared memory without 'shm-buffers' in 'required'",
    "bad_dtype": "dtype is not one of the 12 names",
    "negative_length": "nbytes or a dimension is negative",
    "length_overflow": "nbytes, a dimension, or the product of the non-zero dimensions "
    "times the item size is above 2**63 - 1",
    "size_mismatch": "nbytes differs from prod(shape) * itemsize",
    "payload_mismatch": "the inline descriptors' nbytes do not add up to payload_len",
    "trailing_bytes": "bytes follow the frame where exactly one was expected "
    "(one-frame decoding only; not used by these stream fixtures)",
    "closed": "the decoder already failed or was closed (not used by these fixtures)",
}

_STRUCT_CODES = {
    "bool": "?",
    "int8": "b",
    "int16": "h",
    "int32": "i",
    "int64": "q",
    "uint8": "B",
    "uint16": "H",
    "uint32": "I",
    "uint64": "Q",
    "float16": "e",
    "float32": "f",
    "float64": "d",
}
SAMPLES: dict[str, list[Any]] = {
    "bool": [True, False, True],
    "int8": [-128, 0, 127],
    "int16": [-32768, 1, 32767],
    "int32": [-(2**31), 1, 2**31 - 1],
    "int64": [-(2**63), 1, 2**63 - 1],
    "uint8": [0, 1, 255],
    "uint16": [0, 1, 65535],
    "uint32": [0, 1, 2**32 - 1],
    "uint64": [0, 1, 2**64 - 1],
    "float16": [1.0, -2.5, 65504.0],
    "float32": [1.0, -2.5, 3.25],
    "float64": [1.0, -2.5, 1e300],
}

_ITEMSIZE = {name: struct.calcsize("<" + code) for name, code in _STRUCT_CODES.items()}


def json_bytes(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def frame_bytes(
    header: object,
    payload: bytes = b"",
    *,
    magic: bytes = MAGIC,
    header_len: int | None = None,
    payload_len: int | None = None,
) -> bytes:
    """Prefix + header + payload; ``header`` is a JSON value or raw header bytes."""
    raw = header if isinstance(header, bytes) else json_bytes(header)
    return (
        PREFIX.pack(
            magic,
            len(raw) if header_len is None else header_len,
            len(payload) if payload_len is None else payload_len,
        )
        + raw
        + payload
    )


def header_of(
    kind: str,
    *,
    required: list[str] | None = None,
    buffers: list[Any] | None = None,
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A header in the encoder's canonical key order, empty fields omitted."""
    header: dict[str, Any] = {"v": 1, "kind": kind}
    if required:
        header["required"] = required
    if buffers:
        header["buffers"] = buffers
    if body:
        header["body"] = body
    return header


def descriptor_of(
    owner: str,
    dtype: str,
    shape: list[int],
    *,
    generation: int = 0,
    nbytes: int | None = None,
    location: str | None = None,
) -> dict[str, Any]:
    size = _ITEMSIZE[dtype]
    for dim in shape:
        size *= dim
    wire: dict[str, Any] = {
        "owner": owner,
        "generation": generation,
        "nbytes": size if nbytes is None else nbytes,
        "dtype": dtype,
        "shape": shape,
    }
    if location is not None:
        wire["location"] = location
    return wire


def packed(dtype: str, values: list[Any]) -> bytes:
    return struct.pack(f"<{len(values)}{_STRUCT_CODES[dtype]}", *values)


def _expected(header: dict[str, Any], payloads: list[bytes | None]) -> dict[str, Any]:
    return {
        "kind": header["kind"],
        "body": header.get("body", {}),
        "required": header.get("required", []),
        "buffers": header.get("buffers", []),
        "payloads_hex": [None if p is None else p.hex() for p in payloads],
    }


class Fixtures:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def _add(
        self,
        name: str,
        description: str,
        stream: bytes,
        expect: dict[str, Any],
        limits: dict[str, int] | None,
        chunking: str | None,
    ) -> None:
        if any(item["name"] == name for item in self.items):
            raise ValueError(f"duplicate fixture name {name!r}")
        fixture: dict[str, Any] = {"name": name, "description": description}
        if limits is not None:
            fixture["limits"] = limits
        if chunking is not None:
            fixture["chunking"] = chunking
        fixture["hex"] = stream.hex()
        fixture["expect"] = expect
        self.items.append(fixture)

    def ok(
        self,
        name: str,
        description: str,
        frames: list[tuple[dict[str, Any], list[bytes | None]]],
        *,
        stream: bytes | None = None,
        limits: dict[str, int] | None = None,
        chunking: str | None = None,
    ) -> None:
        """A valid stream; by default the canonical encoding of ``frames``."""
        if stream is None:
            stream = b"".join(
                frame_bytes(header, b"".join(p for p in payloads if p is not None))
                for header, payloads in frames
            )
        expect = {"frames": [_expected(header, payloads) for header, payloads in frames]}
        self._add(name, description, stream, expect, limits, chunking)

    def error(
        self,
        code: str,
        name: str,
        description: str,
        stream: bytes,
        *,
        limits: dict[str, int] | None = None,
        chunking: str | None = None,
    ) -> None:
        if code not in ERROR_MEANINGS:
            raise ValueError(f"unknown error code {code!r}")
        self._add(f"error/{code}/{name}", description, stream, {"error": code}, limits, chunking)
