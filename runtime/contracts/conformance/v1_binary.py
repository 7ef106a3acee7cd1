"""Conformance fixtures of the compact binary header (magic ``OEB1``, ``binary-header``)."""

from __future__ import annotations

import struct

from runtime.contracts.conformance.v1_streams import (
    _ITEMSIZE,
    Fixtures,
    descriptor_of,
    frame_bytes,
    header_of,
    packed,
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


def binary_fixtures(f: Fixtures) -> None:
    """Frames with the compact binary header (magic ``OEB1``, feature ``binary-header``)."""
    a, b = packed("float32", [1.0, 2.0]), packed("float32", [3.0, 4.0])
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
                header_of(
                    "call",
                    body=call_body,
                    buffers=[
                        descriptor_of("stage-0", "float32", [1, 2], generation=7),
                        descriptor_of("stage-0", "float32", [1, 2], generation=7),
                    ],
                ),
                [a, b],
            )
        ],
        stream=frame_bytes(call, a + b, magic=BINARY_MAGIC),
    )
    arena = dict(descriptor_of("ort-3", "float32", [256], generation=5, location="oe-arena-1"))
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
                header_of(
                    "result",
                    required=["shm-buffers", "shm-arena"],
                    body=result_body,
                    buffers=[arena],
                ),
                [None],
            )
        ],
        stream=frame_bytes(result, magic=BINARY_MAGIC),
    )
    ack = struct.pack("<BBH", 3, 0, 0) + _bstr("stage-0") + struct.pack("<Q", 9)
    ping = header_of("ping")
    f.ok(
        "ok/binary/ack_then_json",
        "a binary acknowledgement followed by a JSON frame on the same stream",
        [(header_of("ack", body={"owner": "stage-0", "generation": 9}), []), (ping, [])],
        stream=frame_bytes(ack, magic=BINARY_MAGIC) + frame_bytes(ping),
    )
    e = f.error
    e(
        "bad_header",
        "binary_kind",
        "binary header kind 9",
        frame_bytes(b"\x09\x00\x00\x00", magic=BINARY_MAGIC),
    )
    e(
        "bad_header",
        "binary_trailing",
        "a byte after the binary header's end",
        frame_bytes(ack + b"\x00", magic=BINARY_MAGIC),
    )
    e(
        "bad_header",
        "binary_truncated",
        "a binary ack cut inside its generation",
        frame_bytes(ack[:-3], magic=BINARY_MAGIC),
    )
    e(
        "bad_header",
        "binary_utf8",
        "a request id that is not UTF-8",
        frame_bytes(
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
        frame_bytes(
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
        frame_bytes(
            call,
            a,
            magic=BINARY_MAGIC,
        ),
    )
    e(
        "bad_descriptor",
        "binary_arena_without_flag",
        "an arena offset in a binary header whose flags lack shm-arena",
        frame_bytes(
            struct.pack("<BBH", 3, 1, 1)
            + _bstr("stage-0")
            + struct.pack("<Q", 9)
            + _bbuffer("stage-0", 1, "uint8", [4], "oe-arena-1", 0),
            magic=BINARY_MAGIC,
        ),
    )
