"""Shared-memory buffers: retention until acknowledgement, limits, sweeping, naming."""

from __future__ import annotations

import os
import signal
import stat
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from runtime.contracts.buffers import BufferDescriptor, DType
from runtime.contracts.messages import CallMessage, ResultMessage
from runtime.errors import ExecutionError
from runtime.transport.channel import ChannelClosed
from runtime.transport.handshake import expect_hello
from runtime.transport.shm import (
    DEFAULT_MAX_BUFFERS,
    DEFAULT_MAX_BYTES,
    LENGTH_HEADER,
    SHM_DIR,
    ShmConsumer,
    ShmError,
    ShmLimitExceeded,
    ShmProducer,
    new_prefix,
    pack_length_header,
    process_retained,
    segment_name,
    sweep_segments,
    unpack_length_header,
    validate_name,
)

MiB = 1 << 20


def shm_names(prefix: str) -> set[str]:
    return {name for name in os.listdir(SHM_DIR) if name.startswith(prefix)}


def descriptor(owner: str, segment_generation: int, name: str, nbytes: int) -> BufferDescriptor:
    return BufferDescriptor.for_array(owner, segment_generation, DType.UINT8, (nbytes,), name)


def test_put_copy_ack_unlinks(shm_prefix: str) -> None:
    data = os.urandom(300_000)
    with ShmProducer("controller", shm_prefix) as producer:
        segment = producer.put(data)
        path = SHM_DIR / segment.name
        assert segment.name.startswith(shm_prefix)
        assert len(segment.name) == len(shm_prefix) + 16
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.stat().st_size == len(data)
        assert (producer.retained_count, producer.retained_bytes) == (1, len(data))
        assert process_retained() == (len(data), 1)

        copied = ShmConsumer(shm_prefix).copy_out(
            descriptor("controller", segment.generation, segment.name, len(data))
        )
        assert bytes(copied) == data
        # Copying does not release: the producer owns the segment until the ack.
        assert path.exists()

        assert producer.acknowledge(segment.generation) is True
        assert not path.exists()
        assert (producer.retained_count, producer.retained_bytes) == (0, 0)
        assert process_retained() == (0, 0)


def test_duplicate_stale_and_unknown_acks_are_ignored(shm_prefix: str) -> None:
    with ShmProducer("w", shm_prefix) as producer:
        first = producer.put(b"a" * 10)
        second = producer.put(b"b" * 20)
        assert second.generation > first.generation
        assert producer.acknowledge(first.generation) is True
        assert producer.acknowledge(first.generation) is False
        assert producer.acknowledge(999_999) is False
        assert producer.acknowledge(-1) is False
        # The other buffer is untouched by the ignored acks.
        assert producer.retained_names == (second.name,)
        assert (SHM_DIR / second.name).exists()


def test_cancel_and_close_unlink_everything(shm_prefix: str) -> None:
    producer = ShmProducer("w", shm_prefix)
    segments = [producer.put(bytes([i]) * (i + 1)) for i in range(5)]
    assert shm_names(shm_prefix) == {s.name for s in segments}
    assert producer.cancel(segments[0].generation) is True
    assert producer.cancel(segments[0].generation) is False
    assert shm_names(shm_prefix) == {s.name for s in segments[1:]}
    producer.close()
    assert shm_names(shm_prefix) == set()
    assert producer.closed
    producer.close()
    with pytest.raises(ShmError) as info:
        producer.put(b"x")
    assert info.value.code == "closed"
    assert producer.acknowledge(segments[1].generation) is False
    assert process_retained() == (0, 0)


def test_abandoned_producer_is_finalized(shm_prefix: str) -> None:
    producer = ShmProducer("w", shm_prefix)
    producer.put(b"x" * 100)
    del producer
    assert shm_names(shm_prefix) == set()


def test_zero_byte_buffer(shm_prefix: str) -> None:
    with ShmProducer("w", shm_prefix) as producer:
        segment = producer.put(b"")
        assert (SHM_DIR / segment.name).stat().st_size == 0
        copied = ShmConsumer().copy_out(descriptor("w", segment.generation, segment.name, 0))
        assert copied == bytearray()
        assert producer.retained_count == 1
    assert shm_names(shm_prefix) == set()


def test_buffer_limit_256(shm_prefix: str) -> None:
    with ShmProducer("w", shm_prefix) as producer:
        for _ in range(DEFAULT_MAX_BUFFERS):
            producer.put(b"z")
        with pytest.raises(ShmLimitExceeded) as info:
            producer.put(b"z")
        error = info.value
        assert isinstance(error, ExecutionError)
        assert (error.limit, error.maximum) == ("buffers", 256)
        assert (error.retained_count, error.retained_bytes, error.requested) == (256, 256, 1)
        assert "256-buffer limit" in str(error)
        assert "256 buffer(s)" in str(error)
        # The refused write created nothing.
        assert len(shm_names(shm_prefix)) == 256
        assert process_retained() == (256, 256)
    assert shm_names(shm_prefix) == set()
    assert process_retained() == (0, 0)


def test_byte_limit_64_mib(shm_prefix: str) -> None:
    with ShmProducer("w", shm_prefix) as producer:
        big = producer.put(bytes(48 * MiB))
        producer.put(bytes(16 * MiB))
        assert process_retained() == (DEFAULT_MAX_BYTES, 2)
        with pytest.raises(ShmLimitExceeded) as info:
            producer.put(b"1")
        error = info.value
        assert (error.limit, error.maximum) == ("bytes", 64 * MiB)
        assert (error.retained_bytes, error.retained_count, error.requested) == (64 * MiB, 2, 1)
        assert f"{64 * MiB}-byte limit" in str(error)
        assert len(shm_names(shm_prefix)) == 2
        # Acknowledging frees room for the next write.
        assert producer.acknowledge(big.generation)
        producer.put(bytes(48 * MiB))
    assert shm_names(shm_prefix) == set()


def test_limits_are_per_process_across_producers(shm_prefix: str) -> None:
    with (
        ShmProducer("a", shm_prefix) as first,
        ShmProducer("b", shm_prefix, max_bytes=64 * MiB, max_buffers=256) as second,
    ):
        for _ in range(200):
            first.put(b"a")
        for _ in range(56):
            second.put(b"b")
        with pytest.raises(ShmLimitExceeded) as info:
            second.put(b"b")
        assert info.value.retained_count == 256
        assert (first.retained_count, second.retained_count) == (200, 56)
        first.close()
        second.put(b"b")
    assert process_retained() == (0, 0)


def test_concurrent_puts_and_acks_keep_exact_accounts(shm_prefix: str) -> None:
    errors: list[BaseException] = []
    with ShmProducer("w", shm_prefix) as producer:

        def work() -> None:
            try:
                for _ in range(40):
                    segment = producer.put(b"q" * 1000)
                    assert producer.acknowledge(segment.generation)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert producer.retained_count == 0
    assert process_retained() == (0, 0)


def test_consumer_refusals(shm_prefix: str) -> None:
    consumer = ShmConsumer(shm_prefix)
    with ShmProducer("w", shm_prefix) as producer:
        segment = producer.put(b"12345678")
        with pytest.raises(ShmError) as info:
            consumer.copy_out(descriptor("w", 1, segment.name, 4))
        assert info.value.code == "size_mismatch"
        assert "holds 8 bytes" in str(info.value)
        producer.acknowledge(segment.generation)
        with pytest.raises(ShmError) as info:
            consumer.copy_out(descriptor("w", 1, segment.name, 8))
        assert info.value.code == "missing"
    for bad in ("../etc/passwd", "a/b", ".hidden", "-x", "a\x00b"):
        with pytest.raises(ShmError) as info:
            consumer.copy_out(descriptor("w", 1, bad, 1))
        assert info.value.code == "bad_name"
    with pytest.raises(ShmError, match="outside the accepted prefix"):
        consumer.copy_out(descriptor("w", 1, "oe-other-0123", 1))
    with pytest.raises(ValueError, match="inline"):
        consumer.copy_out(BufferDescriptor.for_array("w", 1, DType.UINT8, (1,)))
    with pytest.raises(ValueError, match="writable buffer of 1 bytes"):
        consumer.copy_into(descriptor("w", 1, shm_prefix + "00", 1), memoryview(bytearray(2)))


def test_sweep_removes_only_the_prefix(shm_prefix: str) -> None:
    other = new_prefix(os.getpid(), 2).replace("oe-", "oe-test-", 1)
    mine = ShmProducer("w", shm_prefix)
    theirs = ShmProducer("w", other)
    try:
        names = {mine.put(b"1").name, mine.put(b"2").name}
        kept = theirs.put(b"3").name
        assert set(sweep_segments(shm_prefix)) == names
        assert shm_names(shm_prefix) == set()
        assert (SHM_DIR / kept).exists()
        assert sweep_segments(shm_prefix) == []
    finally:
        # Releasing after a sweep tolerates the missing names.
        mine.close()
        theirs.close()
    assert process_retained() == (0, 0)


@pytest.mark.parametrize("prefix", ["", "-", "oe", "oe-", "oe-x", "../oe-", "oe/1-", "oe 1-"])
def test_bad_prefixes_are_refused(prefix: str) -> None:
    with pytest.raises(ShmError) as info:
        sweep_segments(prefix)
    assert info.value.code == "bad_name"
    with pytest.raises(ShmError):
        ShmProducer("w", prefix)


def test_naming() -> None:
    prefix = new_prefix(1234, 7)
    assert prefix.startswith("oe-1234-7-")
    assert prefix.endswith("-")
    assert len(prefix) == len("oe-1234-7-") + 9
    assert new_prefix(1234, 7) != prefix
    name = segment_name(prefix)
    assert name.startswith(prefix)
    int(name[len(prefix) :], 16)
    assert validate_name(name) == name


def test_length_header() -> None:
    header = pack_length_header(12345)
    assert len(header) == LENGTH_HEADER.size == 16
    assert unpack_length_header(header + b"payload") == 12345
    assert unpack_length_header(pack_length_header(0)) == 0
    with pytest.raises(ShmError) as info:
        unpack_length_header(bytes(16), name="zeroed")
    assert info.value.code == "missing"
    with pytest.raises(ShmError) as info:
        unpack_length_header(header[:8])
    assert info.value.code == "missing"
    with pytest.raises(ValueError, match="negative"):
        pack_length_header(-1)


def test_killed_worker_segments_are_swept(echo_worker: Callable[..., Any], shm_prefix: str) -> None:
    worker = echo_worker(generation=1, prefix=shm_prefix, threshold=0)
    hello = expect_hello(worker.channel, expected_generation=1, expected_pid=None, timeout_s=30)
    inputs = {"a": np.arange(1000, dtype=np.float32), "b": np.ones((64, 64), dtype=np.int64)}
    worker.channel.send_message(CallMessage(1, "req-1", 0, ("a", "b")), inputs)
    message, frame = worker.channel.read_message()
    while not isinstance(message, ResultMessage):
        # The worker's acks for our inputs arrive first.
        worker.channel.acknowledge(message.owner, message.generation)  # type: ignore[attr-defined]
        message, frame = worker.channel.read_message()
    assert worker.channel.retained_count == 0
    # The worker now retains its two result segments until we acknowledge them: we never do.
    held = shm_names(shm_prefix)
    assert held == {d.location for d in frame.buffers}
    assert len(held) == 2
    os.kill(hello.pid, signal.SIGKILL)
    assert worker.process.wait(timeout=10) == -signal.SIGKILL
    assert shm_names(shm_prefix) == held
    assert sorted(sweep_segments(shm_prefix)) == sorted(held)
    assert shm_names(shm_prefix) == set()
    # Writing to the dead worker fails and withdraws the segments written for that frame.
    with pytest.raises(ChannelClosed):
        worker.channel.send_message(CallMessage(2, "req-1", 0, ("a", "b")), inputs)
    assert worker.channel.retained_count == 0
    assert shm_names(shm_prefix) == set()
