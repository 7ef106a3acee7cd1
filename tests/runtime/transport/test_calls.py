"""A call frame packed by its layout: the bytes the encoder gives, or the usual way."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest

from runtime.contracts.buffers import BufferDescriptor, DType
from runtime.contracts.codec import FrameDecoder, encode_frame, encode_frame_parts
from runtime.contracts.messages import CONTROLLER_TO_WORKER, CallMessage, decode_message
from runtime.transport.calls import CallLayout, CallPacker, send_call
from runtime.transport.channel import ChannelClosed

if TYPE_CHECKING:
    from collections.abc import Callable

    from runtime.transport.channel import FramedChannel

ARENA = "oe-1-2-arena-stage-0"
#: Inputs large enough to go through the arena (above the inline limit).
BIG = (16, 512)


def call_frame(
    call_id: int,
    *,
    epoch: int = 0,
    request_id: str = "req-00000001",
    generations: tuple[int, ...] = (7, 8),
    offsets: tuple[int, ...] = (0, 4096),
    shape: tuple[int, ...] = (4, 256),
    names: tuple[str, ...] = ("x", "w"),
    owner: str = "stage-0",
    binary_header: bool = True,
    location: str | None = ARENA,
) -> bytes:
    """One call frame as the encoder writes it, every input in ``owner``'s arena."""
    body = {"call_id": call_id, "request_id": request_id, "epoch": epoch, "input_names": names}
    buffers: list[tuple[BufferDescriptor, bytes | None]] = []
    for generation, offset in zip(generations, offsets, strict=True):
        if location is None:
            descriptor = BufferDescriptor.for_array(owner, generation, DType.FLOAT32, shape)
            buffers.append((descriptor, bytes(descriptor.nbytes)))
        else:
            descriptor = BufferDescriptor.for_array(
                owner, generation, DType.FLOAT32, shape, location, offset
            )
            buffers.append((descriptor, None))
    parts = encode_frame_parts("call", body, buffers, binary_header=binary_header)
    return b"".join(bytes(part) for part in parts)


def _layout() -> CallLayout:
    layout = CallLayout.learn(call_frame(1))
    assert layout is not None
    return layout


def test_a_call_packed_by_its_layout_is_the_bytes_its_frame_encodes_to() -> None:
    layout = _layout()
    assert layout.owner == "stage-0"
    assert layout.input_names == ("x", "w")
    assert layout.input_specs == (
        (np.dtype(np.float32), (4, 256)),
        (np.dtype(np.float32), (4, 256)),
    )
    packed = layout.pack(2**40 + 3, 5, b"req-00000abc", (2**62, 31), (8192, 2**62))
    assert packed == call_frame(
        2**40 + 3,
        epoch=5,
        request_id="req-00000abc",
        generations=(2**62, 31),
        offsets=(8192, 2**62),
    )


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("JSON headers", call_frame(1, binary_header=False)),
        ("inputs in the frame", call_frame(1, location=None)),
        ("a result", encode_frame("ack", {"owner": "stage-0", "generation": 3})),
        ("a truncated frame", call_frame(1)[:-1]),
        ("two frames", call_frame(1) + call_frame(2)),
        ("no bytes", b""),
    ],
)
def test_only_a_whole_call_with_binary_headers_and_arena_inputs_has_a_layout(
    name: str, data: bytes
) -> None:
    assert CallLayout.learn(data) is None, name


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("a longer request id", (1, 0, b"req-000000001", (1, 2), (0, 4096))),
        ("a call id past 63 bits", (2**63, 0, b"req-00000001", (1, 2), (0, 4096))),
        ("a negative epoch", (1, -1, b"req-00000001", (1, 2), (0, 4096))),
        ("an offset past 63 bits", (1, 0, b"req-00000001", (1, 2), (0, 2**63))),
        ("one generation too few", (1, 0, b"req-00000001", (1,), (0, 4096))),
    ],
)
def test_values_a_call_of_the_layout_cannot_carry_are_refused(
    name: str, values: tuple[int, int, bytes, tuple[int, ...], tuple[int, ...]]
) -> None:
    with pytest.raises(ValueError, match=r"layout|63"):
        _layout().pack(*values)


def test_a_call_of_a_learned_layout_reads_as_the_decoder_reads_it() -> None:
    data = call_frame(
        9, epoch=4, request_id="req-00000009", generations=(41, 42), offsets=(8192, 12288)
    )
    call = _layout().match(data)
    assert call is not None
    (frame,) = FrameDecoder().feed(data)
    message = decode_message(frame, CONTROLLER_TO_WORKER)
    assert isinstance(message, CallMessage)
    assert (call.call_id, call.epoch, call.request_id) == (9, 4, "req-00000009")
    assert call.buffers == frame.buffers
    assert call.acks == [("stage-0", 41), ("stage-0", 42)]
    assert call.layout.input_names == message.input_names


def _with_request_id(data: bytes, old: bytes, new: bytes) -> bytes:
    assert len(old) == len(new)
    assert data.count(old) == 1
    return data.replace(old, new)


@pytest.mark.parametrize(
    ("name", "other"),
    [
        ("another shape", lambda: call_frame(2, shape=(2, 512))),
        ("another owner", lambda: call_frame(2, owner="stage-1")),
        ("other names", lambda: call_frame(2, names=("x", "v"))),
        ("a longer request id", lambda: call_frame(2, request_id="req-000000002")),
        ("a call id past 63 bits", lambda: _past_63()),
        (
            "a request id that is not UTF-8",
            lambda: _with_request_id(call_frame(2), b"req-00000001", b"req-0000000\xff"),
        ),
        ("a truncated frame", lambda: call_frame(2)[:-1]),
        ("two calls in one read", lambda: call_frame(2) + call_frame(3)),
    ],
)
def test_anything_but_a_call_of_the_layout_is_left_to_the_decoder(
    name: str, other: Callable[[], bytes]
) -> None:
    assert _layout().match(other()) is None, name


def _past_63() -> bytes:
    """A call frame with 2**63 as its call id (a value no encoder writes)."""
    raw = bytearray(call_frame(2))
    at = 16 + 4  # the frame's prefix, then kind, flags and count
    assert raw[at : at + 8] == (2).to_bytes(8, "little")
    raw[at : at + 8] = (2**63).to_bytes(8, "little")
    return bytes(raw)


def test_inputs_fit_a_layout_only_as_the_encoder_would_send_them_unchanged() -> None:
    layout = _layout()
    x = np.zeros((4, 256), np.float32)
    assert layout.fits({"x": x, "w": x})
    assert not layout.fits({"w": x, "x": x})
    assert not layout.fits({"x": x})
    assert not layout.fits({"x": x, "w": np.zeros((4, 255), np.float32)})
    assert not layout.fits({"x": x, "w": np.zeros((4, 256), np.float64)})
    assert not layout.fits({"x": x, "w": np.zeros((256, 4), np.float32).T})
    assert not layout.fits({"x": x, "w": x.tolist()})


def test_a_packer_learns_from_a_call_repeated_the_usual_way() -> None:
    packer = CallPacker()
    x = {"x": np.zeros((4, 256), np.float32), "w": np.zeros((4, 256), np.float32)}
    assert not packer.fits(x)
    assert not packer.repeated(x)
    assert packer.repeated(x)
    assert not packer.repeated({"x": np.zeros((2, 256), np.float32), "w": x["w"]})
    packer.learn([call_frame(1, location=None)])
    assert packer.layout is None
    packer.learn([call_frame(1)])
    assert packer.fits(x)


def _sender(
    channel_pair: Callable[..., tuple[FramedChannel, FramedChannel]], shm_prefix: str
) -> tuple[FramedChannel, FramedChannel, CallLayout]:
    controller, worker = channel_pair(shm_prefix=shm_prefix, same_domain=True)
    controller.binary_headers = True
    arena = controller.open_arena("stage-0", 1 << 18)
    assert arena is not None
    x = {"x": np.ones(BIG, np.float32), "w": np.ones(BIG, np.float32)}
    packer = CallPacker()
    prepared = controller.prepare(
        "call",
        CallMessage(1, "req-00000001", 0, ("x", "w")).to_body(),
        x,
        "stage-0",
        1,
        (),
        None,
        (),
        (),
        None,
    )
    packer.learn(prepared.chunks)
    prepared.withdraw()
    assert packer.layout is not None
    assert arena.retained_count == 0
    return controller, worker, packer.layout


def test_a_packed_call_reaches_the_worker_as_the_call_it_encodes(
    channel_pair: Callable[..., tuple[FramedChannel, FramedChannel]], shm_prefix: str
) -> None:
    controller, worker, layout = _sender(channel_pair, shm_prefix)
    inputs = {
        "x": np.arange(16 * 512, dtype=np.float32).reshape(BIG),
        "w": np.full(BIG, 2.0, np.float32),
    }
    slots: dict[str, object] = {}
    copied = send_call(
        controller,
        layout,
        inputs,
        call_id=7,
        epoch=2,
        request_id="req-00000002",
        slots=slots,  # type: ignore[arg-type]
    )
    assert copied == 2 * 16 * 512 * 4
    assert list(slots) == ["x", "w"]
    message, frame = worker.read_message(CONTROLLER_TO_WORKER, timeout_s=5)
    assert message == CallMessage(7, "req-00000002", 2, ("x", "w"))
    arrays, acks = worker.arrays_from_frame(frame, message.input_names)
    np.testing.assert_array_equal(arrays["x"], inputs["x"])
    np.testing.assert_array_equal(arrays["w"], inputs["w"])
    arena = controller.arena("stage-0")
    assert arena is not None
    assert arena.retained_count == 2
    for owner, generation in acks:
        assert controller.acknowledge(owner, generation)
    assert arena.retained_count == 0


def test_a_call_the_arena_has_no_room_for_is_left_to_the_usual_way(
    channel_pair: Callable[..., tuple[FramedChannel, FramedChannel]], shm_prefix: str
) -> None:
    controller, worker, layout = _sender(channel_pair, shm_prefix)
    arena = controller.arena("stage-0")
    assert arena is not None
    filler = arena.allocate(arena.size - 32 * 1024)
    assert filler is not None
    slots: dict[str, object] = {}
    inputs = {"x": np.ones(BIG, np.float32), "w": np.ones(BIG, np.float32)}
    sent = send_call(
        controller,
        layout,
        inputs,
        call_id=7,
        epoch=0,
        request_id="req-00000002",
        slots=slots,  # type: ignore[arg-type]
    )
    assert sent is None
    assert slots == {}
    # The one input that found room was given back; nothing was written.
    assert arena.retained_count == 1
    assert not worker.wait_readable(0.05)
    other = send_call(
        controller,
        layout,
        inputs,
        call_id=8,
        epoch=0,
        request_id="req-2",
        slots=slots,  # type: ignore[arg-type]
    )
    assert other is None
    assert arena.retained_count == 1
    assert arena.acknowledge(filler[0].generation)


def test_a_packed_call_that_cannot_be_written_frees_its_slots(
    channel_pair: Callable[..., tuple[FramedChannel, FramedChannel]], shm_prefix: str
) -> None:
    controller, worker, layout = _sender(channel_pair, shm_prefix)
    worker.close()
    inputs = {"x": np.ones(BIG, np.float32), "w": np.ones(BIG, np.float32)}
    with pytest.raises(ChannelClosed):
        send_call(
            controller,
            layout,
            inputs,
            call_id=7,
            epoch=0,
            request_id="req-00000002",
            slots={},
        )
    arena = controller.arena("stage-0")
    assert arena is not None
    assert arena.retained_count == 0
