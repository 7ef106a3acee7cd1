"""The framed channel over real pipes and a real child process, inline and via shared memory."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from runtime.contracts.buffers import BufferDescriptor, DescriptorError, DType
from runtime.contracts.codec import Frame, FrameLimits, encode_frame
from runtime.contracts.messages import (
    AckMessage,
    ByeMessage,
    CallMessage,
    CancelMessage,
    ErrorMessage,
    ResultMessage,
    ShutdownMessage,
)
from runtime.errors import ExecutionError
from runtime.transport import descriptor_dtype, numpy_dtype
from runtime.transport.channel import (
    ChannelClosed,
    ChannelTimeout,
    FramedChannel,
    ProtocolError,
    frame_acks,
)
from runtime.transport.handshake import expect_hello
from runtime.transport.shm import SHM_DIR, ShmLimitExceeded
from runtime.transport.stdio import start_reader_thread

Pair = Callable[..., tuple[FramedChannel, FramedChannel]]
SHAPES: list[tuple[int, ...]] = [(), (0,), (0, 3), (7,), (3, 4, 5)]


def shm_names(prefix: str) -> set[str]:
    return {name for name in os.listdir(SHM_DIR) if name.startswith(prefix)}


def sample(dtype: DType, shape: tuple[int, ...], seed: int = 0) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    np_dtype = np.dtype(dtype.value)
    if dtype is DType.BOOL:
        return rng.integers(0, 2, size=shape).astype(bool)
    if np_dtype.kind in "iu":
        info = np.iinfo(np_dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=np_dtype, endpoint=True)
    values = rng.standard_normal(size=shape).astype(np_dtype)
    if values.size >= 3:
        values.flat[:3] = [np.nan, np.inf, -0.0]
    return values


def every_dtype(shapes: list[tuple[int, ...]] = SHAPES) -> dict[str, np.ndarray[Any, Any]]:
    return {
        f"{dtype.value}{list(shape)}": sample(dtype, shape, seed)
        for seed, (dtype, shape) in enumerate((d, s) for d in DType for s in shapes)
    }


def assert_identical(got: dict[str, np.ndarray[Any, Any]], sent: dict[str, Any]) -> None:
    assert list(got) == list(sent)
    for name, expected in sent.items():
        expected = np.asarray(expected)
        array = got[name]
        assert array.shape == expected.shape, name
        assert array.dtype.newbyteorder("=") == expected.dtype.newbyteorder("="), name
        assert (
            array.astype(array.dtype.newbyteorder("=")).tobytes()
            == expected.astype(expected.dtype.newbyteorder("=")).tobytes()
        ), name
        assert array.flags.writeable, name
        assert array.flags.owndata or array.base is not None


def exchange(
    sender: FramedChannel,
    receiver: FramedChannel,
    arrays: dict[str, Any] | None,
    kind: str = "echo",
    **options: Any,
) -> Frame:
    """Send on one thread while reading on this one, as two processes would."""
    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(sender.send, kind, {"n": 1}, arrays, **options)
        frame = receiver.read_frame(timeout_s=30)
        sent.result(timeout=30)
    return frame


def test_dtype_mapping_is_exact() -> None:
    for dtype in DType:
        assert descriptor_dtype(np.dtype(dtype.value)) is dtype
        assert descriptor_dtype(numpy_dtype(dtype)) is dtype
        assert numpy_dtype(dtype).byteorder in "<|="
    assert descriptor_dtype(np.dtype(">f8")) is DType.FLOAT64
    for bad in (np.complex64, object, np.str_, "datetime64[s]", np.longdouble, "V4"):
        if np.dtype(bad) == np.float64:
            continue
        with pytest.raises(DescriptorError) as info:
            descriptor_dtype(bad)
        assert info.value.code == "bad_dtype"
        assert "accepted: bool, int8" in str(info.value)


def test_round_trip_every_dtype_inline(channel_pair: Pair) -> None:
    left, right = channel_pair()
    arrays = every_dtype()
    frame = exchange(left, right, arrays, owner="stage-0", generation=9)
    assert frame.body == {"n": 1}
    assert all(d.inline for d in frame.buffers)
    assert {(d.owner, d.generation) for d in frame.buffers} == {("stage-0", 9)}
    got, acks = right.arrays_from_frame(frame, list(arrays))
    assert acks == []
    assert_identical(got, arrays)


def test_round_trip_every_dtype_through_shm(channel_pair: Pair, shm_prefix: str) -> None:
    left, right = channel_pair(shm_prefix=shm_prefix, same_domain=True, shm_threshold=0)
    arrays = every_dtype()
    frame = exchange(left, right, arrays)
    assert "shm-buffers" in frame.required
    shared = [d for d in frame.buffers if not d.inline]
    # Everything but the zero-size arrays goes through shared memory.
    assert len(shared) == sum(1 for a in arrays.values() if a.nbytes)
    assert shm_names(shm_prefix) == {d.location for d in shared}
    assert left.retained_count == len(shared)

    got, acks = right.arrays_from_frame(frame, list(arrays))
    assert_identical(got, arrays)
    assert acks == [(d.owner, d.generation) for d in shared] == frame_acks(frame)
    # Copies are independent of the segments, which are still retained.
    assert shm_names(shm_prefix) == {d.location for d in shared}

    right.send_acks(acks)
    for _ in acks:
        message, _frame = left.read_message(timeout_s=10)
        assert isinstance(message, AckMessage)
        assert left.acknowledge(message.owner, message.generation) is True
    assert shm_names(shm_prefix) == set()
    assert left.retained_count == 0
    # A duplicate or stale ack is ignored.
    assert left.acknowledge(*acks[0]) is False
    assert left.acknowledge("nobody", 1) is False


def test_threshold_and_domain_choose_the_route(channel_pair: Pair, shm_prefix: str) -> None:
    left, right = channel_pair(shm_prefix=shm_prefix, same_domain=True, shm_threshold=64)
    arrays = {"at": np.zeros(16, np.float32), "above": np.zeros(17, np.float32)}
    frame = exchange(left, right, arrays)
    assert [d.inline for d in frame.buffers] == [True, False]
    got, acks = right.arrays_from_frame(frame, ["at", "above"])
    assert_identical(got, arrays)
    for owner, generation in acks:
        assert left.acknowledge(owner, generation)

    other_left, other_right = channel_pair(
        shm_prefix=shm_prefix, same_domain=False, shm_threshold=0
    )
    frame = exchange(other_left, other_right, {"big": np.ones(1 << 16)})
    assert frame.buffers[0].inline
    assert not other_left.shm_enabled


def test_byte_order_and_layout_are_normalised(channel_pair: Pair, shm_prefix: str) -> None:
    left, right = channel_pair(shm_prefix=shm_prefix, same_domain=True, shm_threshold=100)
    base = np.arange(60, dtype=np.float64).reshape(6, 10)
    arrays = {
        "big_endian": np.arange(12, dtype=">i4").reshape(3, 4),
        "strided": base[::2, ::3],
        "fortran": np.asfortranarray(base),
        "transposed": base.T,
        "scalar": np.float16(1.5),
        "list": [[1, 2], [3, 4]],
    }
    frame = exchange(left, right, arrays)
    got, acks = right.arrays_from_frame(frame, list(arrays))
    assert_identical(got, arrays)
    assert got["big_endian"].dtype.str == "<i4"
    assert got["scalar"].shape == ()
    for ack in acks:
        assert left.acknowledge(*ack)


def test_unsupported_dtype_sends_nothing(channel_pair: Pair, shm_prefix: str) -> None:
    left, right = channel_pair(shm_prefix=shm_prefix, same_domain=True, shm_threshold=0)
    arrays = {"fine": np.ones(100), "complex": np.ones(3, dtype=np.complex64)}
    with pytest.raises(DescriptorError) as info:
        left.send("echo", {}, arrays)
    assert info.value.code == "bad_dtype"
    assert "'complex'" in str(info.value)
    assert "float16" in str(info.value)
    # The segment already written for "fine" was withdrawn, and nothing was sent.
    assert shm_names(shm_prefix) == set()
    with pytest.raises(ChannelTimeout):
        right.read_frame(timeout_s=0.05)


def test_outgoing_limits_are_checked_before_writing(channel_pair: Pair, shm_prefix: str) -> None:
    limits = FrameLimits(max_header_bytes=4096, max_buffers=2, max_total_bytes=10_000)
    left, right = channel_pair(
        shm_prefix=shm_prefix, same_domain=True, shm_threshold=50_000, limits=limits
    )
    with pytest.raises(ProtocolError) as info:
        left.send("echo", {}, {"x": np.zeros(20_000, np.uint8)})
    assert info.value.code == "frame_too_large"
    with pytest.raises(ProtocolError) as info:
        left.send("echo", {}, {f"x{i}": np.zeros(1, np.uint8) for i in range(3)})
    assert info.value.code == "too_many_buffers"
    with pytest.raises(ProtocolError) as info:
        left.send("echo", {"text": "y" * 5000})
    assert info.value.code == "header_too_large"
    # Shared buffers written for a refused frame are withdrawn.
    with pytest.raises(ProtocolError):
        left.send("echo", {}, {f"big{i}": np.zeros(60_000, np.uint8) for i in range(3)})
    assert shm_names(shm_prefix) == set()
    with pytest.raises(ChannelTimeout):
        right.read_frame(timeout_s=0.05)
    # The channel still works after refusing.
    frame = exchange(left, right, {"ok": np.zeros(10, np.uint8)})
    assert frame.kind == "echo"


def test_shm_limit_during_send_withdraws_the_frame(channel_pair: Pair, shm_prefix: str) -> None:
    left, right = channel_pair(
        shm_prefix=shm_prefix, same_domain=True, shm_threshold=0, shm_max_buffers=1
    )
    with pytest.raises(ShmLimitExceeded) as info:
        left.send("echo", {}, {"a": np.ones(4), "b": np.ones(4)})
    assert info.value.limit == "buffers"
    assert shm_names(shm_prefix) == set()
    assert left.retained_count == 0
    with pytest.raises(ChannelTimeout):
        right.read_frame(timeout_s=0.05)


def test_shm_frame_refused_when_receiver_has_no_shm(channel_pair: Pair, shm_prefix: str) -> None:
    left, right = channel_pair(
        left={"shm_prefix": shm_prefix, "same_domain": True, "shm_threshold": 0}
    )
    frame = exchange(left, right, {"a": np.ones(8)})
    with pytest.raises(ProtocolError) as info:
        right.arrays_from_frame(frame, ["a"])
    assert info.value.code == "shm_not_enabled"
    # The receiver still releases the producer's buffer.
    right.send_acks(frame_acks(frame))
    message, _ = left.read_message(timeout_s=10)
    assert isinstance(message, AckMessage)
    assert left.acknowledge(message.owner, message.generation)
    assert shm_names(shm_prefix) == set()


def test_released_segment_is_a_protocol_error(channel_pair: Pair, shm_prefix: str) -> None:
    left, right = channel_pair(shm_prefix=shm_prefix, same_domain=True, shm_threshold=0)
    frame = exchange(left, right, {"a": np.ones(8)})
    left.close()
    with pytest.raises(ProtocolError) as info:
        right.arrays_from_frame(frame, ["a"])
    assert info.value.code == "shm_missing"
    with pytest.raises(ProtocolError) as info:
        right.arrays_from_frame(frame, ["a", "b"])
    assert info.value.code == "buffer_count"


def raw_channel(data: bytes, **options: Any) -> FramedChannel:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, data)
    os.close(write_fd)
    return FramedChannel(
        os.fdopen(read_fd, "rb"),
        open(os.devnull, "wb"),
        name="raw",
        **options,
    )


def test_garbage_is_bad_magic_and_poisons_the_channel() -> None:
    with raw_channel(b"GARBAGE! this is not a frame at all") as channel:
        with pytest.raises(ProtocolError) as info:
            channel.read_frame()
        assert info.value.code == "bad_magic"
        assert isinstance(info.value, ExecutionError)
        assert "bad_magic" in str(info.value)
        with pytest.raises(ProtocolError) as again:
            channel.read_frame()
        assert again.value.code == "bad_magic"


def test_frame_errors_surface_with_their_codes() -> None:
    huge_header = b"OEF1" + (1 << 30).to_bytes(4, "little") + bytes(8)
    with raw_channel(huge_header) as channel, pytest.raises(ProtocolError) as info:
        channel.read_frame()
    assert info.value.code == "header_too_large"
    unknown_feature = encode_frame("call", {}, required=["teleport"])
    with raw_channel(unknown_feature) as channel, pytest.raises(ProtocolError) as info:
        channel.read_frame()
    assert info.value.code == "unknown_required_feature"


def test_end_of_stream() -> None:
    frame = encode_frame(
        "echo", {"k": 1}, [(BufferDescriptor.for_array("o", 0, DType.INT8, (3,)), b"abc")]
    )
    with raw_channel(frame) as channel:
        assert channel.read_frame().body == {"k": 1}
        with pytest.raises(ChannelClosed):
            channel.read_frame()
        with pytest.raises(ChannelClosed):
            channel.read_frame()
    for cut in (3, 16, len(frame) - 1):
        with raw_channel(frame[:cut]) as channel, pytest.raises(ProtocolError) as info:
            channel.read_frame()
        assert info.value.code == "truncated"


def test_timeout_keeps_the_partial_frame() -> None:
    read_fd, write_fd = os.pipe()
    channel = FramedChannel(os.fdopen(read_fd, "rb"), open(os.devnull, "wb"), name="slow")
    try:
        frame = encode_frame("echo", {"k": "v"})
        os.write(write_fd, frame[:20])
        started = time.monotonic()
        with pytest.raises(ChannelTimeout) as info:
            channel.read_frame(timeout_s=0.1)
        assert 0.09 <= time.monotonic() - started < 5
        assert info.value.timeout_s == 0.1
        os.write(write_fd, frame[20:])
        assert channel.read_frame(timeout_s=5).body == {"k": "v"}
    finally:
        os.close(write_fd)
        channel.close()


def test_send_after_peer_closed(channel_pair: Pair, shm_prefix: str) -> None:
    left, right = channel_pair(shm_prefix=shm_prefix, same_domain=True, shm_threshold=0)
    right.close()
    with pytest.raises(ChannelClosed):
        left.send("echo", {}, {"a": np.ones(1000)})
    assert shm_names(shm_prefix) == set()
    with pytest.raises(ChannelClosed):
        left.send("echo", {})


def test_closed_channel_refuses_everything(channel_pair: Pair) -> None:
    left, _right = channel_pair()
    left.close()
    left.close()
    assert left.closed
    with pytest.raises(ChannelClosed):
        left.send("echo")
    with pytest.raises(ChannelClosed):
        left.read_frame()


def test_concurrent_senders_never_interleave(channel_pair: Pair) -> None:
    left, right = channel_pair()
    received: list[Frame] = []
    ended: list[BaseException | None] = []
    done = threading.Event()

    def on_closed(error: BaseException | None) -> None:
        ended.append(error)
        done.set()

    reader = start_reader_thread(right, received.append, on_closed)

    def send_many(sender: int) -> None:
        for sequence in range(25):
            payload = np.full(12_000, sender * 1000 + sequence, dtype=np.int32)
            left.send("echo", {"sender": sender, "sequence": sequence}, {"p": payload})

    with ThreadPoolExecutor(4) as pool:
        for future in [pool.submit(send_many, sender) for sender in range(4)]:
            future.result(timeout=60)
    left.close()
    assert done.wait(30)
    reader.join(10)
    assert ended == [None]
    assert len(received) == 100
    for frame in received:
        arrays, _ = right.arrays_from_frame(frame, ["p"])
        expected = frame.body["sender"] * 1000 + frame.body["sequence"]
        assert np.all(arrays["p"] == expected)
    for sender in range(4):
        sequences = [f.body["sequence"] for f in received if f.body["sender"] == sender]
        assert sequences == list(range(25))


def test_reader_thread_reports_errors_once() -> None:
    calls: list[BaseException | None] = []
    frames: list[Frame] = []
    with raw_channel(encode_frame("one") + b"junk" * 8) as channel:
        thread = start_reader_thread(channel, frames.append, calls.append)
        thread.join(10)
    assert [f.kind for f in frames] == ["one"]
    assert len(calls) == 1
    assert isinstance(calls[0], ProtocolError)
    assert calls[0].code == "bad_magic"

    def refuse(frame: Frame) -> None:
        raise RuntimeError(f"cannot handle {frame.kind}")

    calls.clear()
    with raw_channel(encode_frame("one") + encode_frame("two")) as channel:
        thread = start_reader_thread(channel, refuse, calls.append)
        thread.join(10)
    assert len(calls) == 1
    assert isinstance(calls[0], RuntimeError)
    assert "cannot handle one" in str(calls[0])


def test_send_message_checks_tensor_names(channel_pair: Pair) -> None:
    left, _right = channel_pair()
    with pytest.raises(ValueError, match=r"names tensors \['a'\] but arrays \['b'\]"):
        left.send_message(CallMessage(1, "r", 0, ("a",)), {"b": np.ones(1)})


def call_and_collect(
    channel: FramedChannel, call: CallMessage, arrays: dict[str, Any]
) -> tuple[ResultMessage, dict[str, np.ndarray[Any, Any]], list[tuple[str, int]]]:
    channel.send_message(call, arrays, owner="controller", generation=call.call_id)
    while True:
        message, frame = channel.read_message(timeout_s=30)
        if isinstance(message, AckMessage):
            assert channel.acknowledge(message.owner, message.generation)
            continue
        assert isinstance(message, ResultMessage)
        outputs, acks = channel.arrays_from_frame(frame, message.output_names)
        return message, outputs, acks


def shut_down(worker: Any) -> None:
    worker.channel.send_message(ShutdownMessage())
    message, _ = worker.channel.read_message(timeout_s=30)
    assert isinstance(message, ByeMessage)
    assert worker.process.wait(timeout=30) == 0
    worker.log_thread.join(10)


def test_child_process_echo_inline(echo_worker: Callable[..., Any]) -> None:
    worker = echo_worker(generation=4, threshold=0)
    hello = expect_hello(
        worker.channel, expected_generation=4, expected_pid=worker.process.pid, timeout_s=30
    )
    assert hello.worker == "echo"
    arrays = every_dtype()
    result, outputs, acks = call_and_collect(
        worker.channel, CallMessage(3, "req-a", 1, tuple(arrays)), arrays
    )
    assert (result.call_id, result.request_id, result.epoch) == (3, "req-a", 1)
    assert acks == []
    assert_identical(outputs, arrays)

    worker.channel.send_message(CancelMessage(3))
    message, _ = worker.channel.read_message(timeout_s=30)
    assert message == ErrorMessage(3, "cancelled", "nothing was running", fatal=False)
    shut_down(worker)
    # The worker's stray print went to stderr, never into the frame stream.
    assert "echo worker: stray stdout line" in worker.log
    assert "echo worker: ready" in worker.log


def test_child_process_echo_through_shm(echo_worker: Callable[..., Any], shm_prefix: str) -> None:
    worker = echo_worker(generation=2, prefix=shm_prefix, threshold=1024)
    expect_hello(
        worker.channel, expected_generation=2, expected_pid=worker.process.pid, timeout_s=30
    )
    arrays = every_dtype([(), (0, 5), (16,), (64, 64), (3, 100, 7)])
    call = CallMessage(1, "req-b", 0, tuple(arrays))
    for _ in range(3):
        _result, outputs, acks = call_and_collect(worker.channel, call, arrays)
        assert_identical(outputs, arrays)
        large = sum(1 for a in arrays.values() if a.nbytes > 1024)
        assert len(acks) == large > 0
        # Our inputs were all acknowledged; the worker retains its outputs until our acks.
        assert worker.channel.retained_count == 0
        assert len(shm_names(shm_prefix)) == large
        worker.channel.send_acks(acks)
    shut_down(worker)
    assert "echo worker: bye, 0 retained" in worker.log
    assert shm_names(shm_prefix) == set()


def test_close_while_a_reader_is_blocked(channel_pair: Pair) -> None:
    left, right = channel_pair()
    ended: list[BaseException | None] = []
    reader = start_reader_thread(right, lambda frame: None, ended.append)
    time.sleep(0.05)
    right.close()
    # The blocked read keeps its descriptor until the peer closes its end.
    assert reader.is_alive()
    left.close()
    reader.join(10)
    assert not reader.is_alive()
    assert ended == [None]
    assert right._reader.closed


def test_protocol_error_message_names_channel_and_code_once() -> None:
    with raw_channel(b"XXXX" + bytes(12)) as channel, pytest.raises(ProtocolError) as info:
        channel.read_frame()
    assert str(info.value).startswith("raw: bad_magic: expected b'OEF1'")
    assert str(info.value).count("bad_magic") == 1
