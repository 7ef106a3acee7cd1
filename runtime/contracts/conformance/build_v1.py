"""Build ``v1.json``, the conformance fixtures of the frame codec (wire version 1).

Every stream is assembled here by hand from ``struct`` and ``json`` rather than by the
codec under test, so the fixtures pin the wire format independently of this
implementation: the valid streams here, the malformed ones in ``v1_errors``, both from the
pieces of ``v1_streams``. Regenerate with ``python -m runtime.contracts.conformance.build_v1``;
``--check`` exits with status 1 when the file on disk differs from what would be built.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from runtime.contracts.conformance.v1_binary import binary_fixtures
from runtime.contracts.conformance.v1_errors import error_fixtures
from runtime.contracts.conformance.v1_streams import (
    DEFAULT_LIMITS,
    ERROR_MEANINGS,
    SAMPLES,
    Fixtures,
    descriptor_of,
    frame_bytes,
    header_of,
    json_bytes,
    packed,
)

OUTPUT = Path(__file__).with_name("v1.json")

#: A ``load`` body with the device fields, written out by hand.
LOAD_ON_A_DEVICE: dict[str, Any] = {
    "manifest_path": "\\\\wsl.localhost\\Ubuntu\\home\\ada\\add\\manifest.json",
    "expected_identity": "sha256:" + "ab" * 32,
    "providers": ["DmlExecutionProvider"],
    "allowed_providers": ["DmlExecutionProvider"],
    "target_provider": "DmlExecutionProvider",
    "max_io_bytes": 65536,
    "min_fraction_on_target": 1.0,
    "shm_prefix": None,
    "intra_op_threads": 0,
    "allow_spinning": True,
    "binary_headers": False,
    "device": {
        "physical_id": "LUID-00000000-0000F2A1",
        "type": "gpu",
        "vendor_id": 4098,
        "device_id": 5390,
    },
    "provider_options": {"device_id": "0"},
    "ep_library": None,
}
#: A ``ready`` body reporting the device applied, written out by hand.
READY_WITH_THE_APPLIED_DEVICE: dict[str, Any] = {
    "placement": {"DmlExecutionProvider": 1},
    "total_nodes": 1,
    "placement_method": "assignment_info",
    "inputs": [{"name": "a", "dtype": "float32", "shape": [1024]}],
    "outputs": [{"name": "c", "dtype": "float32", "shape": [1024]}],
    "load_s": 0.25,
    "warmup_s": 0.5,
    "rss_bytes": 67108864,
    "intra_op_threads": 0,
    "allow_spinning": True,
    "arena_bytes": 0,
    "max_input_bytes": 8192,
    "arena_name": None,
    "device": {
        "method": "ep_device",
        "ep_name": "DmlExecutionProvider",
        "type": "gpu",
        "vendor": "AMD",
        "vendor_id": 4098,
        "device_id": 5390,
        "provider_options": {"device_id": "0"},
        "ep_library": None,
    },
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


def _valid(f: Fixtures) -> None:
    ping = header_of("ping")
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
        [(header_of("event", body=body), [])],
    )
    for dtype, values in SAMPLES.items():
        desc = descriptor_of("stage.out", dtype, [len(values)], generation=7)
        f.ok(
            f"ok/dtype/{dtype}",
            f"one inline {dtype} buffer of shape [3], little-endian",
            [(header_of("tensor", buffers=[desc]), [packed(dtype, values)])],
        )
    scalar = descriptor_of("scalar", "float32", [])
    f.ok(
        "ok/scalar_shape",
        "shape [] is a scalar of one element",
        [(header_of("tensor", buffers=[scalar]), [packed("float32", [0.5])])],
    )
    empty = descriptor_of("empty", "float32", [0, 3])
    f.ok(
        "ok/zero_size_dims",
        "a zero dimension gives a buffer of 0 bytes and an empty payload",
        [(header_of("tensor", buffers=[empty]), [b""])],
    )
    wide_empty = descriptor_of("empty", "int64", [0, 2**40, 2**19])
    f.ok(
        "ok/zero_size_large_dims",
        "zero size with large other dimensions whose product still fits 63 bits",
        [(header_of("tensor", buffers=[wide_empty]), [b""])],
    )
    many = [
        descriptor_of("a", "float32", [2, 3], generation=1),
        descriptor_of("b", "uint8", [0]),
        descriptor_of("c", "int16", [2], generation=2),
        descriptor_of("d", "bool", [1, 1, 1]),
    ]
    many_payloads: list[bytes | None] = [
        packed("float32", [1, 2, 3, 4, 5, 6]),
        b"",
        packed("int16", [-1, 1]),
        packed("bool", [True]),
    ]
    f.ok(
        "ok/multiple_buffers",
        "several inline buffers, split from the payload in descriptor order",
        [(header_of("batch", buffers=many, body={"step": 1}), many_payloads)],
    )
    shm = descriptor_of("stage.shm", "float32", [4, 4], generation=3, location="oe-shm-1")
    inline = descriptor_of("stage.inline", "uint8", [2])
    f.ok(
        "ok/shm_descriptor",
        "a shared-memory descriptor (no inline bytes) beside an inline one",
        [
            (
                header_of("tensor", required=["shm-buffers"], buffers=[shm, inline]),
                [None, b"\x01\x02"],
            )
        ],
    )
    arena = dict(
        descriptor_of("stage.arena", "float32", [4, 4], generation=7, location="oe-arena-1")
    )
    arena["offset"] = 4096
    f.ok(
        "ok/arena_descriptor",
        "a buffer at a byte offset of a producer's persistent shared-memory arena",
        [
            (
                header_of("tensor", required=["shm-buffers", "shm-arena"], buffers=[arena]),
                [None],
            )
        ],
    )
    huge = descriptor_of("stage.shm", "int8", [2**63 - 1], location="oe-shm-huge")
    f.ok(
        "ok/shm_max_nbytes",
        "the largest size a descriptor may name, 2**63 - 1, held in shared memory",
        [(header_of("tensor", required=["shm-buffers"], buffers=[huge]), [None])],
    )
    f.ok(
        "ok/generation_max",
        "generation 2**63 - 1 is accepted",
        [
            (
                header_of(
                    "tensor", buffers=[descriptor_of("g", "uint8", [1], generation=2**63 - 1)]
                ),
                [b"\xff"],
            )
        ],
    )
    f.ok(
        "ok/known_required_features",
        "required features the receiver implements are accepted",
        [(header_of("call", required=["cancel", "text-stream"], body={"id": "r1"}), [])],
    )
    f.ok(
        "ok/messages/load_on_a_device",
        "a graph worker's load naming the device to run on, the target provider's options "
        "and a plugin library (fields a receiver without them may omit)",
        [(header_of("load", body=LOAD_ON_A_DEVICE), [])],
    )
    f.ok(
        "ok/messages/ready_with_the_applied_device",
        "a graph worker's ready reporting the execution-provider device and options applied",
        [(header_of("ready", body=READY_WITH_THE_APPLIED_DEVICE), [])],
    )
    deep: Any = 0
    for _ in range(32):
        deep = [deep]
    f.ok(
        "ok/nesting_32", "a body nested 32 levels deep", [(header_of("deep", body={"x": deep}), [])]
    )
    three: list[tuple[dict[str, Any], list[bytes | None]]] = [
        (ping, []),
        (
            header_of("tensor", buffers=[descriptor_of("x", "uint16", [2])]),
            [packed("uint16", [1, 2])],
        ),
        (header_of("event", body={"done": True}), []),
    ]
    f.ok("ok/multiple_frames", "three frames back to back in one stream", three)
    f.ok(
        "ok/multiple_frames_bytewise",
        "the same three frames fed one byte at a time",
        three,
        chunking="bytewise",
    )
    split = [(header_of("batch", buffers=many, body={"step": 2}), many_payloads)]
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
        stream=frame_bytes(loose),
    )
    explicit = {"v": 1, "kind": "x", "required": [], "buffers": [], "body": {}}
    f.ok(
        "ok/explicit_empty_fields",
        "'required', 'buffers' and 'body' given explicitly empty equal their omission",
        [(explicit, [])],
        stream=frame_bytes(explicit),
    )
    limit_frame = frame_bytes(ping)
    f.ok(
        "ok/limits/header_at_limit",
        "a header of exactly max_header_bytes is accepted",
        [(ping, [])],
        limits={**DEFAULT_LIMITS, "max_header_bytes": len(json_bytes(ping))},
    )
    f.ok(
        "ok/limits/frame_at_limit",
        "a frame of exactly max_total_bytes is accepted",
        [(ping, [])],
        limits={**DEFAULT_LIMITS, "max_total_bytes": len(limit_frame)},
    )
    two = [descriptor_of("a", "uint8", [1]), descriptor_of("b", "uint8", [1])]
    f.ok(
        "ok/limits/buffers_at_limit",
        "exactly max_buffers descriptors are accepted",
        [(header_of("t", buffers=two), [b"\x01", b"\x02"])],
        limits={**DEFAULT_LIMITS, "max_buffers": 2},
    )


def build() -> dict[str, Any]:
    """The whole v1 document: its format description and every fixture."""
    fixtures = Fixtures()
    _valid(fixtures)
    error_fixtures(fixtures)
    binary_fixtures(fixtures)
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
