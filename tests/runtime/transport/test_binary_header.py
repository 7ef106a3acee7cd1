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
