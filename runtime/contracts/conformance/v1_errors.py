"""The v1 fixtures of malformed streams: each names the error code a decoder must raise."""

from __future__ import annotations

import json
from typing import Any

from runtime.contracts.conformance.v1_streams import (
    DEFAULT_LIMITS,
    MAGIC,
    PREFIX,
    Fixtures,
    descriptor_of,
    frame_bytes,
    header_of,
    json_bytes,
    packed,
)


def error_fixtures(f: Fixtures) -> None:
    ping = header_of("ping")
    ping_frame = frame_bytes(ping)
    one = descriptor_of("a", "float32", [2])
    tensor = header_of("tensor", buffers=[one])
    tensor_frame = frame_bytes(tensor, packed("float32", [1, 2]))

    def bad_header(raw: bytes, payload: bytes = b"") -> bytes:
        return frame_bytes(raw, payload)

    def with_desc(desc: Any, payload: bytes = b"", **header: Any) -> bytes:
        return frame_bytes({"v": 1, "kind": "t", **header, "buffers": [desc]}, payload)

    e = f.error
    e("bad_magic", "wrong_version_digit", "magic 'OEF2'", frame_bytes(ping, magic=b"OEF2"))
    e("bad_magic", "lowercase", "magic is case-sensitive", frame_bytes(ping, magic=b"oef1"))
    e("bad_magic", "http", "a stream that is not ours at all", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    e("bad_magic", "zeros", "16 zero bytes", bytes(16))
    e(
        "bad_magic",
        "second_frame",
        "a valid frame followed by one with a bad magic",
        ping_frame + frame_bytes(ping, magic=b"XEF1"),
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
        limits={**DEFAULT_LIMITS, "max_header_bytes": len(json_bytes(ping)) - 1},
    )
    e(
        "header_too_large",
        "u32_max",
        "header_len 2**32 - 1 under the default limit, rejected from the prefix alone",
        PREFIX.pack(MAGIC, 2**32 - 1, 0),
    )
    e(
        "header_too_large",
        "default_limit_plus_one",
        "header_len of 1 MiB + 1, rejected from the prefix alone",
        PREFIX.pack(MAGIC, (1 << 20) + 1, 0),
    )
    e(
        "frame_too_large",
        "u64_max_payload",
        "payload_len 2**64 - 1, rejected before any payload byte is buffered",
        frame_bytes(ping, payload_len=2**64 - 1),
    )
    e(
        "frame_too_large",
        "default_limit",
        "payload_len of exactly 256 MiB: with prefix and header the frame exceeds the limit",
        frame_bytes(tensor, payload_len=256 << 20),
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
    e(
        code,
        "unknown",
        "an unknown required feature",
        frame_bytes(header_of("x", required=["x-future"])),
    )
    e(
        code,
        "mixed",
        "one unknown among known features",
        frame_bytes(header_of("x", required=["cancel", "x-future"])),
    )
    e(
        code,
        "case",
        "feature names are case-sensitive",
        frame_bytes(header_of("x", required=["Cancel"])),
    )

    code = "too_many_buffers"
    three = [descriptor_of(f"b{i}", "uint8", [1]) for i in range(3)]
    e(
        code,
        "over_limit",
        "three descriptors with max_buffers 2",
        frame_bytes(header_of("t", buffers=three), b"\x00\x01\x02"),
        limits={**DEFAULT_LIMITS, "max_buffers": 2},
    )
    e(
        code,
        "zero_limit",
        "one descriptor with max_buffers 0",
        frame_bytes(header_of("t", buffers=three[:1]), b"\x00"),
        limits={**DEFAULT_LIMITS, "max_buffers": 0},
    )
    empties = [descriptor_of("b", "uint8", [0]) for _ in range(257)]
    e(
        code,
        "default_limit",
        "257 descriptors under the default limit of 256",
        frame_bytes(header_of("t", buffers=empties)),
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
    e(code, "no_descriptors", "payload bytes without any descriptor", frame_bytes(ping, b"abc"))
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
        tensor_frame + frame_bytes(tensor, b"\x00" * 7),
    )
