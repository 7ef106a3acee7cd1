"""The sample ring never loses, duplicates or reorders samples, across any wraparound."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.audio import SampleRing


def _counting(start: int, count: int) -> np.ndarray:
    return np.arange(start, start + count, dtype=np.float32)


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(min_value=1, max_value=64),
    operations=st.lists(
        st.tuples(st.booleans(), st.integers(min_value=0, max_value=100)), max_size=60
    ),
)
def test_ring_is_a_fifo_across_wraparound(
    capacity: int, operations: list[tuple[bool, int]]
) -> None:
    ring = SampleRing(capacity)
    produced = 0
    consumed: list[np.ndarray] = []
    for is_write, size in operations:
        if is_write:
            accepted = ring.write(_counting(produced, size))
            assert accepted == min(size, capacity - (produced - ring.total_read))
            produced += accepted
        else:
            out = np.full((size, 1), -1.0, dtype=np.float32)
            readable = ring.readable()
            count = ring.read_into(out, size)
            assert count == min(size, readable)
            assert np.all(out[count:] == -1.0), "rows past the count must stay untouched"
            consumed.append(out[:count, 0].copy())
        assert 0 <= ring.readable() <= capacity
        assert ring.readable() + ring.writable() == capacity
    out = np.empty((capacity, 1), dtype=np.float32)
    consumed.append(out[: ring.read_into(out, capacity), 0].copy())
    joined = np.concatenate(consumed) if consumed else np.zeros(0, np.float32)
    np.testing.assert_array_equal(joined, _counting(0, produced))
    assert ring.total_written == ring.total_read == produced


def test_read_broadcasts_mono_into_every_channel() -> None:
    ring = SampleRing(8)
    ring.write(_counting(1, 6))
    out = np.zeros((4, 2), dtype=np.float32)
    assert ring.read_into(out, 4) == 4
    ring.write(_counting(7, 5))
    out2 = np.zeros((8, 2), dtype=np.float32)
    assert ring.read_into(out2, 8) == 7
    np.testing.assert_array_equal(out[:, 0], out[:, 1])
    np.testing.assert_array_equal(np.concatenate([out[:, 1], out2[:7, 0]]), _counting(1, 11))


def test_full_ring_accepts_nothing_and_empty_ring_yields_nothing() -> None:
    ring = SampleRing(4)
    assert ring.read_into(np.zeros((4, 1), np.float32), 4) == 0
    assert ring.write(_counting(0, 10)) == 4
    assert ring.write(_counting(4, 1)) == 0
    assert ring.writable() == 0


@pytest.mark.parametrize("capacity", [0, -3, 2.5, True, "8"])
def test_bad_capacity_is_refused(capacity: object) -> None:
    with pytest.raises(ValueError, match="ring capacity must be a positive int"):
        SampleRing(capacity)  # type: ignore[arg-type]


def test_concurrent_producer_and_consumer_keep_order() -> None:
    ring = SampleRing(1021)
    total = 200_000
    rng = np.random.default_rng(7)
    write_sizes = rng.integers(1, 3000, size=2000)
    read_sizes = rng.integers(1, 700, size=5000)
    received = np.empty(total, dtype=np.float32)

    def produce() -> None:
        produced = 0
        index = 0
        while produced < total:
            size = int(min(write_sizes[index % len(write_sizes)], total - produced))
            index += 1
            chunk = np.arange(produced, produced + size, dtype=np.float64) % 65536
            sent = 0
            while sent < size:
                accepted = ring.write(chunk[sent:].astype(np.float32))
                sent += accepted
                if not accepted:
                    time.sleep(0)
            produced += size

    producer = threading.Thread(target=produce)
    producer.start()
    got = 0
    index = 0
    out = np.empty((700, 1), dtype=np.float32)
    while got < total:
        count = ring.read_into(out, int(read_sizes[index % len(read_sizes)]))
        index += 1
        received[got : got + count] = out[:count, 0]
        got += count
        if not count:
            time.sleep(0)
    producer.join()
    expected = (np.arange(total, dtype=np.float64) % 65536).astype(np.float32)
    np.testing.assert_array_equal(received, expected)
