"""A preallocated single-producer, single-consumer ring of float32 samples.

The producer thread calls :meth:`SampleRing.write`; the audio callback calls
:meth:`SampleRing.read_into`. Neither takes a lock. Each side owns one counter (the
producer ``_written``, the consumer ``_read``), only ever increases it, and publishes it
with a single attribute store after the samples are in place; under CPython's global
interpreter lock an attribute store is atomic, so the other side sees either the old or
the new count, both of which are safe.

What the read path still creates on each call, documented because the callback must not
allocate sample memory: a few Python ints for the index arithmetic and at most four NumPy
view headers (two slices of the ring, two of the output); no sample data is allocated and
nothing is resized. The ring is stored as ``(capacity, 1)`` so one mono column broadcasts
into any number of output channels without a temporary array.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SampleRing"]


class SampleRing:
    """A bounded FIFO of mono float32 samples for one producer and one consumer thread."""

    __slots__ = ("_buffer", "_capacity", "_read", "_written")

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"ring capacity must be a positive int of samples; got {capacity!r}")
        self._capacity = capacity
        self._buffer = np.zeros((capacity, 1), dtype=np.float32)
        self._written = 0
        self._read = 0

    @property
    def capacity(self) -> int:
        """How many samples the ring holds at most."""
        return self._capacity

    @property
    def total_written(self) -> int:
        """Samples the producer has written since creation."""
        return self._written

    @property
    def total_read(self) -> int:
        """Samples the consumer has read since creation."""
        return self._read

    def readable(self) -> int:
        """Samples ready for the consumer (a lower bound while the producer is writing)."""
        return self._written - self._read

    def writable(self) -> int:
        """Free space for the producer (a lower bound while the consumer is reading)."""
        return self._capacity - (self._written - self._read)

    def write(self, samples: np.ndarray) -> int:
        """Copy as many of ``samples`` (1-D float32) as fit; return how many were copied.

        Producer side only. Never blocks: the caller decides whether to wait and retry.
        """
        written = self._written
        free = self._capacity - (written - self._read)
        count = min(free, len(samples))
        if count <= 0:
            return 0
        start = written % self._capacity
        first = min(count, self._capacity - start)
        column = self._buffer[:, 0]
        column[start : start + first] = samples[:first]
        if count > first:
            column[: count - first] = samples[first:count]
        self._written = written + count
        return count

    def read_into(self, out: np.ndarray, frames: int) -> int:
        """Copy up to ``frames`` samples into ``out[:n]`` (every column); return ``n``.

        Consumer side only. Never blocks and allocates no sample memory; ``out`` is a
        ``(frames, channels)`` float32 array and rows past ``n`` are left untouched.
        """
        read = self._read
        available = self._written - read
        count = frames if available >= frames else available
        if count <= 0:
            return 0
        start = read % self._capacity
        first = self._capacity - start
        if first >= count:
            out[:count] = self._buffer[start : start + count]
        else:
            out[:first] = self._buffer[start:]
            out[first:count] = self._buffer[: count - first]
        self._read = read + count
        return count

    def discard(self, count: int) -> int:
        """Skip up to ``count`` readable samples without copying them; return how many.

        Consumer side only (the duplex stream drops an interrupted reply with it).
        """
        read = self._read
        available = self._written - read
        skipped = count if available >= count else available
        if skipped <= 0:
            return 0
        self._read = read + skipped
        return skipped
