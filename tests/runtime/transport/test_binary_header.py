"""The compact binary header on a channel: sent only when enabled, always understood."""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING

import numpy as np
import pytest

from runtime.contracts import binary
from runtime.contracts.buffers import BufferDescriptor, DType
from runtime.contracts.codec import FrameDecoder, FrameError, encode_frame
from runtime.contracts.messages import AckMessage, CallMessage, ReadyMessage, ResultMessage
from runtime.contracts.versions import KNOWN_FEATURES
from runtime.transport.channel import FramedChannel

if TYPE_CHECKING:
    from collections.abc import Callable


def _sent(channel: FramedChannel, read_fd: int, send: Callable[[], object]) -> list[bytes]:
    """The magic of every frame ``send`` wrote, read raw off the pipe."""
    send()
    data = os.read(read_fd, 1 << 16)
    frames = FrameDecoder().feed(data)
    magics, position = [], 0
    for frame in frames:
        magics.append(data[position : position + 4])
        header_len = int.from_bytes(data[position + 4 : position + 8], "little")
        payload_len = int.from_bytes(data[position + 8 : position + 16], "little")
        position += 16 + header_len + payload_len
        assert frame.kind in ("call", "result", "ack")
    return magics


def test_call_result_and_ack_use_the_binary_header_once_enabled() -> None:
    read_fd, write_fd = os.pipe()
    channel = FramedChannel(io.BytesIO(), os.fdopen(write_fd, "wb"), name="sender")
    try:
        x = np.arange(8, dtype=np.float32)
        call = CallMessage(3, "req-1", 1, ("x",))
        assert _sent(channel, read_fd, lambda: channel.send_message(call, {"x": x})) == [b"OEF1"]
        channel.binary_headers = True
        result = ResultMessage(3, "req-1", 1, ("x",), 0.5, 32)
        magics = _sent(
            channel,
            read_fd,
            lambda: channel.send_message(result, {"x": x}, acks=[("stage-0", 4)]),
        )
        assert magics == [binary.MAGIC, binary.MAGIC], "the ack, then the result"
        assert _sent(channel, read_fd, lambda: channel.send_message(call, {"x": x})) == [
            binary.MAGIC
        ]
    finally:
        channel.close()
        os.close(read_fd)


def test_the_binary_form_decodes_to_the_same_frame() -> None:
    x = np.arange(4, dtype=np.int64)
    descriptor = BufferDescriptor.for_array("stage-0", 9, DType.INT64, (4,))
    body = CallMessage(9, "req-2", 0, ("x",)).to_body()
    as_json = encode_frame("call", body, [(descriptor, x.tobytes())])
    as_binary = encode_frame("call", body, [(descriptor, x.tobytes())], binary_header=True)
    assert as_json[:4] == b"OEF1"
    assert as_binary[:4] == binary.MAGIC
    assert len(as_binary) < len(as_json)
    (from_json,) = FrameDecoder().feed(as_json)
    (from_binary,) = FrameDecoder().feed(as_binary)
    assert from_binary == from_json


def test_frames_without_a_binary_form_stay_json() -> None:
    ready = ReadyMessage({"CPUExecutionProvider": 1}, 1, "assignment_info", (), (), 0.1, 0.1, 1)
    encoded = encode_frame(ready.KIND, ready.to_body(), binary_header=True)
    assert encoded[:4] == b"OEF1"
    # An acknowledgement whose owner does not fit the binary form falls back too.
    long_owner = AckMessage("o" * 70_000, 1)
    assert encode_frame("ack", long_owner.to_body(), binary_header=True)[:4] == b"OEF1"


def test_a_decoder_without_the_feature_refuses_the_binary_magic() -> None:
    frame = encode_frame("ack", AckMessage("stage-0", 1).to_body(), binary_header=True)
    older = FrameDecoder(known_features=KNOWN_FEATURES - {binary.FEATURE})
    with pytest.raises(FrameError) as info:
        older.feed(frame)
    assert info.value.code == "bad_magic"


def _header(kind: str, body: dict[str, object], descriptors: list[BufferDescriptor]) -> bytes:
    required = ["shm-buffers", "shm-arena"] if any(d.in_arena for d in descriptors) else []
    packed = binary.encode_header(kind, body, descriptors, required)
    assert packed is not None
    return packed


def _call_body(call_id: int, request_id: str = "req-0001") -> dict[str, object]:
    return {"call_id": call_id, "request_id": request_id, "epoch": 2, "input_names": ["a", "b"]}


def _descriptors(generation: int, offset: int) -> list[BufferDescriptor]:
    return [
        BufferDescriptor.for_array("ctl", generation, DType.FLOAT32, (1, 1024)),
        BufferDescriptor.for_array(
            "ctl", generation + 1, DType.INT64, (4, 256), "oe-1-arena-ctl", offset
        ),
    ]


def test_a_header_with_a_layout_seen_before_decodes_to_what_the_full_decoder_gives() -> None:
    first = _header("call", _call_body(1), _descriptors(5, 0))
    binary._TEMPLATES.clear()
    assert binary.decode_header(first, 256)[1]["call_id"] == 1
    assert len(binary._TEMPLATES) == 1, "the layout is kept"
    again = _header("call", _call_body(7, "req-0002"), _descriptors(9, 8192))
    fast = binary.decode_header(again, 256)
    binary._TEMPLATES.clear()
    slow = binary.decode_header(again, 256)
    assert fast == slow
    assert fast[1] == _call_body(7, "req-0002")
    assert [(d.generation, d.offset) for d in fast[2]] == [(9, None), (10, 8192)]
    assert fast[2] == tuple(_descriptors(9, 8192))


def test_a_result_header_decodes_the_same_from_its_layout() -> None:
    body: dict[str, object] = {
        "call_id": 3,
        "request_id": "req-0001",
        "epoch": 1,
        "output_names": ["sum"],
        "run_s": 0.25,
        "copied_bytes": 0,
    }
    descriptors = [BufferDescriptor.for_array("ort-1", 4, DType.FLOAT32, (1, 1024))]
    binary._TEMPLATES.clear()
    binary.decode_header(_header("result", body, descriptors), 256)
    body.update(call_id=4, run_s=0.5, copied_bytes=4096)
    descriptors = [descriptors[0].with_generation(5)]
    fast = binary.decode_header(_header("result", body, descriptors), 256)
    binary._TEMPLATES.clear()
    assert fast == binary.decode_header(_header("result", body, descriptors), 256)
    assert fast[1]["run_s"] == 0.5
    assert fast[2][0].generation == 5


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("generation", 2**63, "bad_descriptor"),
        ("offset", 2**63, "length_overflow"),
        ("call_id", 2**63, None),
        ("request_id", b"\xff" * 8, "bad_header"),
        ("name", b"z", None),
    ],
)
def test_a_header_whose_values_break_the_rules_is_refused_as_without_a_layout(
    field: str, value: object, code: str | None
) -> None:
    """A known layout never lets through what the full decoder refuses: the same header
    gives the same answer (error code, or the value read) with and without it."""
    good = bytearray(_header("call", _call_body(1), _descriptors(5, 0)))
    if field == "generation":
        position = good.index(b"ctl") + 3
        good[position : position + 8] = int(value).to_bytes(8, "little")  # type: ignore[call-overload]
    elif field == "offset":
        good[-8:] = int(value).to_bytes(8, "little")  # type: ignore[call-overload]
    elif field == "call_id":
        good[4:12] = int(value).to_bytes(8, "little")  # type: ignore[call-overload]
    elif field == "request_id":
        position = good.index(b"req-0001")
        good[position : position + 8] = value  # type: ignore[assignment]
    else:
        position = good.index(b"\x01\x00b")
        good[position + 2 : position + 3] = value  # type: ignore[assignment]
    raw = bytes(good)

    def outcome() -> object:
        try:
            return binary.decode_header(raw, 256)
        except (binary.BinaryHeaderError, ValueError) as exc:
            return getattr(exc, "code", type(exc).__name__)

    binary._TEMPLATES.clear()
    binary.decode_header(_header("call", _call_body(1), _descriptors(5, 0)), 256)
    warm = outcome()
    binary._TEMPLATES.clear()
    cold = outcome()
    assert warm == cold
    if code is not None:
        assert warm == code
    elif field == "call_id":
        # The contracts' u63 rule is the message's to enforce: the header reads the value.
        assert isinstance(warm, tuple)
        assert warm[1]["call_id"] == 2**63
    else:
        assert isinstance(warm, tuple)
        assert warm[1]["input_names"] == ["a", "z"]


def test_a_layout_is_used_only_within_the_buffer_limit() -> None:
    raw = _header("call", _call_body(1), _descriptors(5, 0))
    binary._TEMPLATES.clear()
    binary.decode_header(raw, 256)
    with pytest.raises(binary.BinaryHeaderError) as caught:
        binary.decode_header(raw, 1)
    assert caught.value.code == "too_many_buffers"


def test_the_encoder_writes_the_same_bytes_from_what_it_kept() -> None:
    descriptors = _descriptors(5, 64)
    binary._DESCRIPTOR_BYTES.clear()
    binary._NAMES_BYTES.clear()
    cold = _header("call", _call_body(1), descriptors)
    warm = _header("call", _call_body(1), descriptors)
    assert cold == warm
    assert binary.decode_header(warm, 256)[2] == tuple(descriptors)
    too_long = "x" * 0x10000
    assert (
        binary.encode_header("call", {**_call_body(1), "input_names": [too_long]}, [], []) is None
    )


def test_two_layouts_of_the_same_length_are_both_kept() -> None:
    """Two stages' results may share a header's length and first bytes: neither evicts the
    other, and each decodes as the full decoder decodes it."""
    body: dict[str, object] = {
        "call_id": 1,
        "request_id": "req-0001",
        "epoch": 1,
        "run_s": 0.25,
        "copied_bytes": 0,
    }
    first = {**body, "output_names": ["y1"]}
    second = {**body, "output_names": ["y2"]}
    descriptors = [BufferDescriptor.for_array("ort-1", 4, DType.FLOAT32, (1, 1024))]
    binary._TEMPLATES.clear()
    raw_first = _header("result", first, descriptors)
    raw_second = _header("result", second, descriptors)
    assert len(raw_first) == len(raw_second)
    binary.decode_header(raw_first, 256)
    binary.decode_header(raw_second, 256)
    assert len(next(iter(binary._TEMPLATES.values()))) == 2
    assert binary.decode_header(raw_first, 256)[1]["output_names"] == ["y1"]
    assert binary.decode_header(raw_second, 256)[1]["output_names"] == ["y2"]
    assert len(next(iter(binary._TEMPLATES.values()))) == 2, "both matched: nothing re-added"
