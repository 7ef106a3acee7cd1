"""Build ``v1.json``, the conformance fixtures of the frame codec (wire version 1).

Every stream is assembled here by hand from ``struct`` and ``json`` rather than by the
codec under test, so the fixtures pin the wire format independently of this
implementation. Regenerate with ``python -m runtime.contracts.conformance.build_v1``;
``--check`` exits with status 1 when the file on disk differs from what would be built.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path
from typing import Any

OUTPUT = Path(__file__).with_name("v1.json")

MAGIC = b"OEF1"
_PREFIX = struct.Struct("<4sIQ")
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

FORMAT: dict[str, Any] = {
    "description": "Conformance fixtures for the Omni Edge frame codec, wire version 1. "
    "A receiver decodes each fixture's bytes as a stream and must produce exactly the "
    "expected frames, or reject the stream with the expected error code.",
    "wire": [
        "offset 0: 4 bytes magic 'OEF1'",
        "offset 4: u32 little-endian header_len",
        "offset 8: u64 little-endian payload_len",
        "offset 16: header_len bytes of UTF-8 JSON, the header object",
        "then payload_len bytes: the inline buffers concatenated in descriptor order",
    ],
    "header": "{'v': 1, 'kind': non-empty string, 'required': [feature, ...], "
    "'buffers': [descriptor, ...], 'body': {...}}; 'required', 'buffers' and 'body' "
    "may be omitted (empty). No other key is allowed.",
    "descriptor": "{'owner': non-empty string (<= 256 chars), 'generation': int >= 0, "
    "'nbytes': int, 'dtype': name, 'shape': [int, ...] (<= 64 dims), "
    "'location': shared-memory name of 1 to 255 characters (optional), "
    "'offset': int >= 0, where the bytes start inside the arena 'location' names (optional)}; "
    "nbytes == prod(shape) * itemsize. "
    "A descriptor with 'location' carries no inline bytes and needs 'shm-buffers' in "
    "'required'; one with 'offset' also needs 'shm-arena'.",
    "dtypes": {
        "bool": 1,
        "int8": 1,
        "int16": 2,
        "int32": 4,
        "int64": 8,
        "uint8": 1,
        "uint16": 2,
        "uint32": 4,
        "uint64": 8,
        "float16": 2,
        "float32": 4,
        "float64": 8,
    },
    "known_features": [
        "binary-header",
        "cancel",
        "inline-buffers",
        "placement-report",
        "shm-arena",
        "shm-buffers",
        "text-stream",
    ],
    "fixture": {
        "name": "unique name, '/'-separated category path",
        "description": "what the fixture pins",
        "limits": "optional {max_header_bytes, max_buffers, max_total_bytes}; "
        "a missing key takes its value from default_limits",
        "chunking": "optional 'whole' (default: the bytes are fed at once) or 'bytewise' "
        "(one byte per feed); any chunking must give the same result",
        "hex": "the byte stream, hex-encoded; it may hold several frames",
        "expect": "either {'frames': [{'kind', 'body', 'required', 'buffers', "
        "'payloads_hex'}]} where buffers are descriptors in wire form and payloads_hex "
        "holds one hex string per inline buffer and null per shared-memory buffer, "
        "or {'error': code}",
    },
    "default_limits": DEFAULT_LIMITS,
    "end_of_stream": "after the last byte the receiver declares the end of the stream; "
    "ending at a frame boundary (also with no frame at all) is fine, ending inside a "
    "frame is 'truncated'",
    "errors": "an error fixture pins only the code of its rejection; frames completed "
    "before it may or may not have been delivered. Each fixture has a single fault (a "
    "negative or overflowing size cannot match its shape either, and is reported as such); "
    "the 16-byte prefix (magic, header_len, total size) is judged before the header is "
    "read, so a prefix fault wins over anything after it",
    "comparison": "bodies and descriptors compare as JSON values: 1, 1.0 and true differ",
    "error_codes": ERROR_MEANINGS,
    "regenerate": "python -m runtime.contracts.conformance.build_v1",
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
_SAMPLES: dict[str, list[Any]] = {
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


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _frame(
    header: object,
    payload: bytes = b"",
    *,
    magic: bytes = MAGIC,
    header_len: int | None = None,
    payload_len: int | None = None,
) -> bytes:
    """Prefix + header + payload; ``header`` is a JSON value or raw header bytes."""
    raw = header if isinstance(header, bytes) else _json(header)
    return (
        _PREFIX.pack(
            magic,
            len(raw) if header_len is None else header_len,
            len(payload) if payload_len is None else payload_len,
        )
        + raw
        + payload
    )


def _header(
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


def _desc(
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


def _pack(dtype: str, values: list[Any]) -> bytes:
    return struct.pack(f"<{len(values)}{_STRUCT_CODES[dtype]}", *values)


def _expected(header: dict[str, Any], payloads: list[bytes | None]) -> dict[str, Any]:
    return {
        "kind": header["kind"],
        "body": header.get("body", {}),
        "required": header.get("required", []),
        "buffers": header.get("buffers", []),
        "payloads_hex": [None if p is None else p.hex() for p in payloads],
    }


class _Fixtures:
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
                _frame(header, b"".join(p for p in payloads if p is not None))
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


def _valid(f: _Fixtures) -> None:
    ping = _header("ping")
    f.ok("ok/minimal", "the smallest frame: version and kind only", [(ping, [])])
    f.ok("ok/empty_stream", "a stream with no bytes holds no frame and is not an error", [])
    body = {
        "text": "h\u00e9llo \u2014 \u2603 \U0001f600",
        "count": 3,
        "ratio": -0.5,
        "flags": [True, False, None],
        "nested": {"a": {"b": [1, 2, {"c": "d"}]}, "empty": {}, "list": []},
    }
    f.ok(
        "ok/body_only",
        "a body of every JSON type, non-ASCII text sent as raw UTF-8",
        [(_header("event", body=body), [])],
    )
    for dtype, values in _SAMPLES.items():
        desc = _desc("stage.out", dtype, [len(values)], generation=7)
        f.ok(
            f"ok/dtype/{dtype}",
            f"one inline {dtype} buffer of shape [3], little-endian",
            [(_header("tensor", buffers=[desc]), [_pack(dtype, values)])],
        )
    scalar = _desc("scalar", "float32", [])
    f.ok(
        "ok/scalar_shape",
        "shape [] is a scalar of one element",
        [(_header("tensor", buffers=[scalar]), [_pack("float32", [0.5])])],
    )
    empty = _desc("empty", "float32", [0, 3])
    f.ok(
        "ok/zero_size_dims",
        "a zero dimension gives a buffer of 0 bytes and an empty payload",
        [(_header("tensor", buffers=[empty]), [b""])],
    )
    wide_empty = _desc("empty", "int64", [0, 2**40, 2**19])
    f.ok(
        "ok/zero_size_large_dims",
        "zero size with large other dimensions whose product still fits 63 bits",
        [(_header("tensor", buffers=[wide_empty]), [b""])],
    )
    many = [
        _desc("a", "float32", [2, 3], generation=1),
        _desc("b", "uint8", [0]),
        _desc("c", "int16", [2], generation=2),
        _desc("d", "bool", [1, 1, 1]),
    ]
    many_payloads: list[bytes | None] = [
        _pack("float32", [1, 2, 3, 4, 5, 6]),
        b"",
        _pack("int16", [-1, 1]),
        _pack("bool", [True]),
    ]
    f.ok(
        "ok/multiple_buffers",
        "several inline buffers, split from the payload in descriptor order",
        [(_header("batch", buffers=many, body={"step": 1}), many_payloads)],
    )
    shm = _desc("stage.shm", "float32", [4, 4], generation=3, location="oe-shm-1")
    inline = _desc("stage.inline", "uint8", [2])
    f.ok(
        "ok/shm_descriptor",
        "a shared-memory descriptor (no inline bytes) beside an inline one",
        [
            (
                _header("tensor", required=["shm-buffers"], buffers=[shm, inline]),
                [None, b"\x01\x02"],
            )
        ],
    )
    arena = dict(_desc("stage.arena", "float32", [4, 4], generation=7, location="oe-arena-1"))
    arena["offset"] = 4096
    f.ok(
        "ok/arena_descriptor",
        "a buffer at a byte offset of a producer's persistent shared-memory arena",
        [
            (
                _header("tensor", required=["shm-buffers", "shm-arena"], buffers=[arena]),
                [None],
            )
        ],
    )
    huge = _desc("stage.shm", "int8", [2**63 - 1], location="oe-shm-huge")
    f.ok(
        "ok/shm_max_nbytes",
        "the largest size a descriptor may name, 2**63 - 1, held in shared memory",
        [(_header("tensor", required=["shm-buffers"], buffers=[huge]), [None])],
    )
    f.ok(
        "ok/generation_max",
        "generation 2**63 - 1 is accepted",
        [(_header("tensor", buffers=[_desc("g", "uint8", [1], generation=2**63 - 1)]), [b"\xff"])],
    )
    f.ok(
        "ok/known_required_features",
        "required features the receiver implements are accepted",
        [(_header("call", required=["cancel", "text-stream"], body={"id": "r1"}), [])],
    )
    deep: Any = 0
    for _ in range(32):
        deep = [deep]
    f.ok("ok/nesting_32", "a body nested 32 levels deep", [(_header("deep", body={"x": deep}), [])])
    three: list[tuple[dict[str, Any], list[bytes | None]]] = [
        (ping, []),
        (_header("tensor", buffers=[_desc("x", "uint16", [2])]), [_pack("uint16", [1, 2])]),
        (_header("event", body={"done": True}), []),
    ]
    f.ok("ok/multiple_frames", "three frames back to back in one stream", three)
    f.ok(
        "ok/multiple_frames_bytewise",
        "the same three frames fed one byte at a time",
        three,
        chunking="bytewise",
    )
    split = [(_header("batch", buffers=many, body={"step": 2}), many_payloads)]
    f.ok(
        "ok/split_bytewise",
        "a frame with buffers fed one byte at a time",
        split,
        chunking="bytewise",
    )
    loose = b' \r\n{"body":{"k":"\\u00e9"},"kind":"x" ,"v":1}\t\n'
    f.ok(
        "ok/header_whitespace_key_order_escapes",
        "whitespace around the header, keys in any order and \\u escapes are valid JSON",
        [({"v": 1, "kind": "x", "body": {"k": "\u00e9"}}, [])],
        stream=_frame(loose),
    )
    explicit = {"v": 1, "kind": "x", "required": [], "buffers": [], "body": {}}
    f.ok(
        "ok/explicit_empty_fields",
        "'required', 'buffers' and 'body' given explicitly empty equal their omission",
        [(explicit, [])],
        stream=_frame(explicit),
    )
    limit_frame = _frame(ping)
    f.ok(
        "ok/limits/header_at_limit",
        "a header of exactly max_header_bytes is accepted",
        [(ping, [])],
        limits={**DEFAULT_LIMITS, "max_header_bytes": len(_json(ping))},
    )
    f.ok(
        "ok/limits/frame_at_limit",
        "a frame of exactly max_total_bytes is accepted",
        [(ping, [])],
        limits={**DEFAULT_LIMITS, "max_total_bytes": len(limit_frame)},
    )
    two = [_desc("a", "uint8", [1]), _desc("b", "uint8", [1])]
    f.ok(
        "ok/limits/buffers_at_limit",
        "exactly max_buffers descriptors are accepted",
        [(_header("t", buffers=two), [b"\x01", b"\x02"])],
        limits={**DEFAULT_LIMITS, "max_buffers": 2},
    )


def _errors(f: _Fixtures) -> None:
    ping = _header("ping")
    ping_frame = _frame(ping)
    one = _desc("a", "float32", [2])
    tensor = _header("tensor", buffers=[one])
    tensor_frame = _frame(tensor, _pack("float32", [1, 2]))

    def bad_header(raw: bytes, payload: bytes = b"") -> bytes:
        return _frame(raw, payload)

    def with_desc(desc: Any, payload: bytes = b"", **header: Any) -> bytes:
        return _frame({"v": 1, "kind": "t", **header, "buffers": [desc]}, payload)

    e = f.error
    e("bad_magic", "wrong_version_digit", "magic 'OEF2'", _frame(ping, magic=b"OEF2"))
    e("bad_magic", "lowercase", "magic is case-sensitive", _frame(ping, magic=b"oef1"))
    e("bad_magic", "http", "a stream that is not ours at all", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    e("bad_magic", "zeros", "16 zero bytes", bytes(16))
    e(
        "bad_magic",
        "second_frame",
        "a valid frame followed by one with a bad magic",
        ping_frame + _frame(ping, magic=b"XEF1"),
        chunking="bytewise",
    )

    e("truncated", "in_prefix", "the stream ends after 7 prefix bytes", tensor_frame[:7])
    e("truncated", "after_prefix", "the stream ends right after the prefix", tensor_frame[:16])
    e("truncated", "in_header", "the stream ends inside the header", tensor_frame[:30])
    e(
        "truncated",
        "before_payload",
        "the header is complete, the payload absent",
        tensor_frame[:-8],
    )
    e("truncated", "in_payload", "the stream ends inside the payload", tensor_frame[:-3])
    e(
        "truncated",
        "in_payload_bytewise",
        "the same, fed one byte at a time",
        tensor_frame[:-1],
        chunking="bytewise",
    )
    e(
        "truncated",
        "after_frame",
        "a complete frame, then 5 bytes of the next",
        ping_frame * 2 + ping_frame[:5],
    )

    e(
        "header_too_large",
        "over_limit",
        "a header one byte over max_header_bytes",
        ping_frame,
        limits={**DEFAULT_LIMITS, "max_header_bytes": len(_json(ping)) - 1},
    )
    e(
        "header_too_large",
        "u32_max",
        "header_len 2**32 - 1 under the default limit, rejected from the prefix alone",
        _PREFIX.pack(MAGIC, 2**32 - 1, 0),
    )
    e(
        "header_too_large",
        "default_limit_plus_one",
        "header_len of 1 MiB + 1, rejected from the prefix alone",
        _PREFIX.pack(MAGIC, (1 << 20) + 1, 0),
    )
    e(
        "frame_too_large",
        "u64_max_payload",
        "payload_len 2**64 - 1, rejected before any payload byte is buffered",
        _frame(ping, payload_len=2**64 - 1),
    )
    e(
        "frame_too_large",
        "default_limit",
        "payload_len of exactly 256 MiB: with prefix and header the frame exceeds the limit",
        _frame(tensor, payload_len=256 << 20),
    )
    e(
        "frame_too_large",
        "over_limit",
        "a frame one byte over max_total_bytes",
        ping_frame,
        limits={**DEFAULT_LIMITS, "max_total_bytes": len(ping_frame) - 1},
    )
    e(
        "frame_too_large",
        "header_within_limit",
        "header and payload each fit, their sum with the prefix does not",
        tensor_frame,
        limits={
            "max_header_bytes": 1024,
            "max_buffers": 4,
            "max_total_bytes": len(tensor_frame) - 1,
        },
    )

    code = "bad_header_json"
    e(code, "invalid_utf8", "a 0xff byte in the header", bad_header(b'{"v":1,"kind":"\xff"}'))
    e(
        code,
        "overlong_utf8",
        "an overlong UTF-8 encoding of '/'",
        bad_header(b'{"v":1,"kind":"\xc0\xaf"}'),
    )
    e(
        code,
        "utf8_surrogate",
        "a UTF-8-encoded surrogate",
        bad_header(b'{"v":1,"kind":"\xed\xa0\x80"}'),
    )
    e(
        code,
        "bom",
        "a UTF-8 byte order mark before the object",
        bad_header(b'\xef\xbb\xbf{"v":1,"kind":"x"}'),
    )
    e(code, "nan", "NaN is not JSON", bad_header(b'{"v":1,"kind":"x","body":{"x":NaN}}'))
    e(
        code,
        "infinity",
        "Infinity is not JSON",
        bad_header(b'{"v":1,"kind":"x","body":{"x":Infinity}}'),
    )
    e(
        code,
        "minus_infinity",
        "-Infinity is not JSON",
        bad_header(b'{"v":1,"kind":"x","body":{"x":-Infinity}}'),
    )
    e(
        code,
        "number_overflow",
        "1e999 is beyond a finite double",
        bad_header(b'{"v":1,"kind":"x","body":{"x":1e999}}'),
    )
    e(
        code,
        "duplicate_key",
        "a duplicate top-level key",
        bad_header(b'{"v":1,"kind":"a","kind":"b"}'),
    )
    e(
        code,
        "duplicate_body_key",
        "a duplicate key inside the body",
        bad_header(b'{"v":1,"kind":"x","body":{"a":1,"a":2}}'),
    )
    dup_desc = (
        b'{"v":1,"kind":"t","buffers":[{"owner":"a","owner":"b","generation":0,'
        b'"nbytes":1,"dtype":"uint8","shape":[1]}]}'
    )
    e(
        code,
        "duplicate_descriptor_key",
        "a duplicate key inside a descriptor",
        bad_header(dup_desc, b"\x00"),
    )
    depth = 20000
    nested = b'{"v":1,"kind":"x","body":{"x":' + b"[" * depth + b"]" * depth + b"}}"
    e(code, "deep_nesting", f"a body nested {depth} levels deep", bad_header(nested))
    e(code, "empty", "header_len 0: an empty header", bad_header(b""))
    e(code, "unquoted_keys", "not JSON: unquoted keys", bad_header(b"{v:1,kind:x}"))
    e(code, "single_quotes", "not JSON: single quotes", bad_header(b"{'v':1,'kind':'x'}"))
    e(code, "extra_data", "a second value after the object", bad_header(b'{"v":1,"kind":"x"} {}'))
    e(code, "nul_padding", "a NUL byte after the object", bad_header(b'{"v":1,"kind":"x"}\x00'))
    e(code, "unterminated", "the JSON text is cut short", bad_header(b'{"v":1,"kind":"x"'))

    code = "bad_header"
    e(code, "array", "the header is an array", bad_header(b"[1,2]"))
    e(code, "string", "the header is a string", bad_header(b'"ping"'))
    e(code, "null", "the header is null", bad_header(b"null"))
    e(code, "missing_kind", "no 'kind'", bad_header(b'{"v":1}'))
    e(code, "empty_kind", "'kind' is empty", bad_header(b'{"v":1,"kind":""}'))
    e(code, "kind_number", "'kind' is a number", bad_header(b'{"v":1,"kind":7}'))
    e(code, "kind_null", "'kind' is null", bad_header(b'{"v":1,"kind":null}'))
    e(code, "missing_version", "no 'v'", bad_header(b'{"kind":"x"}'))
    e(code, "version_string", "'v' is a string", bad_header(b'{"v":"1","kind":"x"}'))
    e(code, "version_bool", "'v' is true, not an integer", bad_header(b'{"v":true,"kind":"x"}'))
    e(code, "version_float", "'v' is 1.0, not an integer", bad_header(b'{"v":1.0,"kind":"x"}'))
    e(
        code,
        "required_string",
        "'required' is a string",
        bad_header(b'{"v":1,"kind":"x","required":"cancel"}'),
    )
    e(
        code,
        "required_number_item",
        "'required' holds a number",
        bad_header(b'{"v":1,"kind":"x","required":[1]}'),
    )
    e(code, "body_array", "'body' is an array", bad_header(b'{"v":1,"kind":"x","body":[]}'))
    e(code, "body_null", "'body' is null", bad_header(b'{"v":1,"kind":"x","body":null}'))
    e(
        code,
        "buffers_object",
        "'buffers' is an object",
        bad_header(b'{"v":1,"kind":"x","buffers":{}}'),
    )
    e(code, "buffers_null", "'buffers' is null", bad_header(b'{"v":1,"kind":"x","buffers":null}'))
    e(
        code,
        "unknown_key",
        "an unknown top-level key",
        bad_header(b'{"v":1,"kind":"x","trace":"abc"}'),
    )

    code = "unsupported_version"
    e(code, "v2", "version 2", bad_header(b'{"v":2,"kind":"x"}'))
    e(code, "v0", "version 0", bad_header(b'{"v":0,"kind":"x"}'))
    e(code, "negative", "version -1", bad_header(b'{"v":-1,"kind":"x"}'))

    code = "unknown_required_feature"
    e(code, "unknown", "an unknown required feature", _frame(_header("x", required=["x-future"])))
    e(
        code,
        "mixed",
        "one unknown among known features",
        _frame(_header("x", required=["cancel", "x-future"])),
    )
    e(code, "case", "feature names are case-sensitive", _frame(_header("x", required=["Cancel"])))

    code = "too_many_buffers"
    three = [_desc(f"b{i}", "uint8", [1]) for i in range(3)]
    e(
        code,
        "over_limit",
        "three descriptors with max_buffers 2",
        _frame(_header("t", buffers=three), b"\x00\x01\x02"),
        limits={**DEFAULT_LIMITS, "max_buffers": 2},
    )
    e(
        code,
        "zero_limit",
        "one descriptor with max_buffers 0",
        _frame(_header("t", buffers=three[:1]), b"\x00"),
        limits={**DEFAULT_LIMITS, "max_buffers": 0},
    )
    empties = [_desc("b", "uint8", [0]) for _ in range(257)]
    e(
        code,
        "default_limit",
        "257 descriptors under the default limit of 256",
        _frame(_header("t", buffers=empties)),
    )

    code = "bad_descriptor"
    good = {"owner": "a", "generation": 0, "nbytes": 1, "dtype": "uint8", "shape": [1]}

    def changed(**fields: Any) -> dict[str, Any]:
        return {**good, **fields}

    e(code, "not_object", "a descriptor that is a number", with_desc(5))
    e(
        code,
        "missing_generation",
        "no 'generation'",
        with_desc({k: v for k, v in good.items() if k != "generation"}, b"\x00"),
    )
    e(
        code,
        "missing_shape",
        "no 'shape'",
        with_desc({k: v for k, v in good.items() if k != "shape"}, b"\x00"),
    )
    e(code, "unknown_field", "an unknown field 'strides'", with_desc(changed(strides=[1]), b"\x00"))
    e(code, "empty_owner", "'owner' is empty", with_desc(changed(owner=""), b"\x00"))
    e(code, "owner_number", "'owner' is a number", with_desc(changed(owner=1), b"\x00"))
    e(
        code,
        "owner_too_long",
        "'owner' of 257 characters",
        with_desc(changed(owner="o" * 257), b"\x00"),
    )
    e(code, "negative_generation", "'generation' -1", with_desc(changed(generation=-1), b"\x00"))
    e(code, "generation_bool", "'generation' true", with_desc(changed(generation=True), b"\x00"))
    e(
        code,
        "generation_overflow",
        "'generation' 2**63",
        with_desc(changed(generation=2**63), b"\x00"),
    )
    e(code, "nbytes_string", "'nbytes' is a string", with_desc(changed(nbytes="1"), b"\x00"))
    e(code, "nbytes_float", "'nbytes' is 1.0", with_desc(changed(nbytes=1.0), b"\x00"))
    e(code, "shape_number", "'shape' is a number", with_desc(changed(shape=1), b"\x00"))
    e(code, "dim_float", "a dimension is 1.0", with_desc(changed(shape=[1.0]), b"\x00"))
    e(code, "dim_bool", "a dimension is true", with_desc(changed(shape=[True]), b"\x00"))
    e(code, "too_many_dims", "65 dimensions", with_desc(changed(shape=[1] * 65), b"\x00"))
    e(
        code,
        "empty_location",
        "'location' is empty",
        with_desc(changed(location=""), required=["shm-buffers"]),
    )
    e(
        code,
        "location_number",
        "'location' is a number",
        with_desc(changed(location=3), required=["shm-buffers"]),
    )
    e(
        code,
        "shm_without_feature",
        "shared memory without 'shm-buffers' in 'required'",
        with_desc(changed(location="oe-shm-1")),
    )
    e(
        code,
        "shm_with_other_features",
        "shared memory with other features but not 'shm-buffers'",
        with_desc(changed(location="oe-shm-1"), required=["cancel"]),
    )
    e(
        code,
        "offset_without_location",
        "an arena offset on an inline buffer",
        with_desc(changed(offset=0), b"\x00", required=["shm-arena"]),
    )
    e(
        code,
        "offset_float",
        "an arena offset of 1.0",
        with_desc(
            changed(location="oe-arena-1", offset=1.0), required=["shm-buffers", "shm-arena"]
        ),
    )
    e(
        code,
        "arena_without_feature",
        "an arena offset without 'shm-arena' in 'required'",
        with_desc(changed(location="oe-arena-1", offset=0), required=["shm-buffers"]),
    )

    code = "bad_dtype"
    for name, dtype in [
        ("complex64", "complex64"),
        ("float8", "float8"),
        ("bfloat16", "bfloat16"),
        ("uppercase", "FLOAT32"),
        ("empty", ""),
        ("number", 5),
        ("null", None),
        ("list", ["uint8"]),
    ]:
        e(code, name, f"dtype {json.dumps(dtype)}", with_desc(changed(dtype=dtype), b"\x00"))

    code = "negative_length"
    e(code, "nbytes", "nbytes -1", with_desc(changed(nbytes=-1)))
    e(code, "dim", "dimension -2", with_desc(changed(nbytes=0, shape=[-2])))
    e(
        code,
        "dim_with_zero",
        "dimension -1 beside a zero",
        with_desc(changed(nbytes=0, shape=[0, -1])),
    )
    e(
        code,
        "arena_offset",
        "arena offset -1",
        with_desc(changed(location="oe-arena-1", offset=-1), required=["shm-buffers", "shm-arena"]),
    )

    code = "length_overflow"
    e(code, "nbytes_2_63", "nbytes 2**63", with_desc(changed(nbytes=2**63, shape=[])))
    e(code, "nbytes_2_64", "nbytes 2**64", with_desc(changed(nbytes=2**64)))
    e(code, "dim_2_63", "a dimension of 2**63", with_desc(changed(nbytes=0, shape=[2**63])))
    e(
        code,
        "dims_product",
        "dimensions 2**32 x 2**32 of uint8",
        with_desc(changed(nbytes=0, shape=[2**32, 2**32])),
    )
    e(
        code,
        "itemsize_product",
        "2**61 float32 elements make 2**63 bytes",
        with_desc(changed(nbytes=0, dtype="float32", shape=[2**61])),
    )
    e(
        code,
        "zero_dim_with_overflow",
        "a zero dimension does not excuse the others overflowing (NumPy refuses the shape)",
        with_desc(changed(nbytes=0, shape=[0, 2**62, 2**62])),
    )

    code = "size_mismatch"
    e(
        code,
        "float32",
        "nbytes 7 for two float32",
        with_desc(changed(nbytes=7, dtype="float32", shape=[2]), b"\x00" * 7),
    )
    e(code, "zero_for_one", "nbytes 0 for one uint8", with_desc(changed(nbytes=0)))
    e(
        code,
        "scalar",
        "nbytes 4 for a float64 scalar",
        with_desc(changed(nbytes=4, dtype="float64", shape=[]), b"\x00" * 4),
    )
    e(
        code,
        "shm",
        "a shared-memory descriptor is checked the same way",
        with_desc(changed(nbytes=5, location="oe-shm-1"), required=["shm-buffers"]),
    )

    code = "payload_mismatch"
    e(
        code,
        "more",
        "payload_len 8 for 4 bytes of descriptors",
        with_desc(changed(nbytes=4, shape=[4]), b"\x00" * 8),
    )
    e(
        code,
        "fewer",
        "payload_len 4 for 8 bytes of descriptors",
        with_desc(changed(nbytes=8, shape=[8]), b"\x00" * 4),
    )
    e(code, "no_descriptors", "payload bytes without any descriptor", _frame(ping, b"abc"))
    e(
        code,
        "shm_counted",
        "shared-memory bytes counted into payload_len",
        with_desc(changed(location="oe-shm-1"), b"\x00", required=["shm-buffers"]),
    )
    e(
        code,
        "second_frame",
        "a valid frame, then one whose payload is one byte short",
        tensor_frame + _frame(tensor, b"\x00" * 7),
    )


BINARY_MAGIC = b"OEB1"
_DTYPE_CODE = {name: index for index, name in enumerate(_ITEMSIZE)}


def _bstr(text: str | bytes) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<H", len(raw)) + raw


def _bbuffer(
    owner: str,
    generation: int,
    dtype: str,
    shape: list[int],
    location: str | None = None,
    offset: int | None = None,
    *,
    dtype_code: int | None = None,
) -> bytes:
    where = (1 if location is not None else 0) | (2 if offset is not None else 0)
    code = _DTYPE_CODE[dtype] if dtype_code is None else dtype_code
    out = _bstr(owner) + struct.pack("<QBB", generation, code, len(shape))
    out += b"".join(struct.pack("<Q", dim) for dim in shape) + bytes((where,))
    if location is not None:
        out += _bstr(location)
    if offset is not None:
        out += struct.pack("<Q", offset)
    return out


def _bnames(names: list[str]) -> bytes:
    return struct.pack("<H", len(names)) + b"".join(_bstr(name) for name in names)


def _binary(f: _Fixtures) -> None:
    """Frames with the compact binary header (magic ``OEB1``, feature ``binary-header``)."""
    a, b = _pack("float32", [1.0, 2.0]), _pack("float32", [3.0, 4.0])
    call = (
        struct.pack("<BBH", 1, 0, 2)
        + struct.pack("<QQ", 7, 2)
        + _bstr("req-1")
        + _bnames(["a", "b"])
        + _bbuffer("stage-0", 7, "float32", [1, 2])
        + _bbuffer("stage-0", 7, "float32", [1, 2])
    )
    call_body = {"call_id": 7, "request_id": "req-1", "epoch": 2, "input_names": ["a", "b"]}
    f.ok(
        "ok/binary/call",
        "a call with two inline buffers and a binary header",
        [
            (
                _header(
                    "call",
                    body=call_body,
                    buffers=[
                        _desc("stage-0", "float32", [1, 2], generation=7),
                        _desc("stage-0", "float32", [1, 2], generation=7),
                    ],
                ),
                [a, b],
            )
        ],
        stream=_frame(call, a + b, magic=BINARY_MAGIC),
    )
    arena = dict(_desc("ort-3", "float32", [256], generation=5, location="oe-arena-1"))
    arena["offset"] = 128
    result = (
        struct.pack("<BBH", 2, 3, 1)
        + struct.pack("<QQdQ", 7, 2, 0.25, 1024)
        + _bstr("req-1")
        + _bnames(["y"])
        + _bbuffer("ort-3", 5, "float32", [256], "oe-arena-1", 128)
    )
    result_body = {
        "call_id": 7,
        "request_id": "req-1",
        "epoch": 2,
        "output_names": ["y"],
        "run_s": 0.25,
        "copied_bytes": 1024,
    }
    f.ok(
        "ok/binary/result_in_arena",
        "a result whose buffer lies at an offset of the worker's arena",
        [
            (
                _header(
                    "result",
                    required=["shm-buffers", "shm-arena"],
                    body=result_body,
                    buffers=[arena],
                ),
                [None],
            )
        ],
        stream=_frame(result, magic=BINARY_MAGIC),
    )
    ack = struct.pack("<BBH", 3, 0, 0) + _bstr("stage-0") + struct.pack("<Q", 9)
    ping = _header("ping")
    f.ok(
        "ok/binary/ack_then_json",
        "a binary acknowledgement followed by a JSON frame on the same stream",
        [(_header("ack", body={"owner": "stage-0", "generation": 9}), []), (ping, [])],
        stream=_frame(ack, magic=BINARY_MAGIC) + _frame(ping),
    )
    e = f.error
    e(
        "bad_header",
        "binary_kind",
        "binary header kind 9",
        _frame(b"\x09\x00\x00\x00", magic=BINARY_MAGIC),
    )
    e(
        "bad_header",
        "binary_trailing",
        "a byte after the binary header's end",
        _frame(ack + b"\x00", magic=BINARY_MAGIC),
    )
    e(
        "bad_header",
        "binary_truncated",
        "a binary ack cut inside its generation",
        _frame(ack[:-3], magic=BINARY_MAGIC),
    )
    e(
        "bad_header",
        "binary_utf8",
        "a request id that is not UTF-8",
        _frame(
            struct.pack("<BBH", 1, 0, 0)
            + struct.pack("<QQ", 1, 0)
            + _bstr(b"\xff\xfe")
            + _bnames([]),
            magic=BINARY_MAGIC,
        ),
    )
    e(
        "bad_dtype",
        "binary_code",
        "dtype code 12, past the last of the 12 dtypes",
        _frame(
            struct.pack("<BBH", 1, 0, 1)
            + struct.pack("<QQ", 1, 0)
            + _bstr("r")
            + _bnames(["a"])
            + _bbuffer("o", 1, "uint8", [1], dtype_code=12),
            b"\x00",
            magic=BINARY_MAGIC,
        ),
    )
    e(
        "payload_mismatch",
        "binary_inline",
        "a binary header naming 16 inline bytes before a payload of 8",
        _frame(
            call,
            a,
            magic=BINARY_MAGIC,
        ),
    )
    e(
        "bad_descriptor",
        "binary_arena_without_flag",
        "an arena offset in a binary header whose flags lack shm-arena",
        _frame(
            struct.pack("<BBH", 3, 1, 1)
            + _bstr("stage-0")
            + struct.pack("<Q", 9)
            + _bbuffer("stage-0", 1, "uint8", [4], "oe-arena-1", 0),
            magic=BINARY_MAGIC,
        ),
    )


def build() -> dict[str, Any]:
    """The whole v1 document: its format description and every fixture."""
    fixtures = _Fixtures()
    _valid(fixtures)
    _errors(fixtures)
    _binary(fixtures)
    return {"format": FORMAT, "version": 1, "fixtures": fixtures.items}


def render() -> str:
    """The exact text of ``v1.json``."""
    return json.dumps(build(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if v1.json differs instead of writing it"
    )
    parser.add_argument("--out", type=Path, default=OUTPUT, help=f"output path (default {OUTPUT})")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else None
        if current != text:
            print(f"{args.out} is out of date; run {FORMAT['regenerate']}", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {len(build()['fixtures'])} fixtures to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
