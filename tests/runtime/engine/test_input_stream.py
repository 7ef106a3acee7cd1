"""A streaming request's fed input: bounded by what the program has not read yet."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from runtime.engine.inputs import InputStream, chunk_bytes
from runtime.errors import ResourceUnavailable


def test_chunk_sizes_count_arrays_mappings_and_bytes() -> None:
    frame = np.zeros(512, np.float32)
    assert chunk_bytes(frame) == 2048
    assert chunk_bytes({"a": frame, "b": np.zeros(3, np.int64)}) == 2048 + 24
    assert chunk_bytes(b"abc") == 3
    assert chunk_bytes("text") == 0


def test_a_caller_far_ahead_of_the_program_is_told_and_reading_makes_room() -> None:
    loop = asyncio.new_event_loop()
    try:
        stream = InputStream("r1", max_pending_bytes=4096)
        stream.bind(loop)
        frame = np.zeros(512, np.float32)  # 2,048 bytes
        stream.feed_threadsafe(frame)
        stream.feed_threadsafe(frame)
        assert stream.pending_bytes == 4096
        with pytest.raises(
            ResourceUnavailable, match=r"request r1: 4096 fed bytes .* at most 4096"
        ):
            stream.feed_threadsafe(frame)
        assert stream.fed == 2  # the refused chunk was not taken

        async def read_one() -> object:
            return await stream.__anext__()

        # The loop delivers the queued chunks; the program reads one, which makes room.
        first = loop.run_until_complete(read_one())
        assert isinstance(first, np.ndarray)
        assert stream.pending_bytes == 2048
        stream.feed_threadsafe(frame)
        stream.end_threadsafe()

        async def read_rest() -> int:
            return len([chunk async for chunk in stream])

        assert loop.run_until_complete(read_rest()) == 2
        assert stream.pending_bytes == 0
    finally:
        loop.close()


def test_one_chunk_larger_than_the_window_is_taken_when_nothing_waits() -> None:
    """The bound refuses only a chunk that would join others waiting: a single large chunk
    (a whole file fed at once) still goes through."""
    loop = asyncio.new_event_loop()
    try:
        stream = InputStream("r2", max_pending_bytes=1024)
        stream.bind(loop)
        stream.feed_threadsafe(np.zeros(4096, np.float32))
        assert stream.pending_bytes == 16384
    finally:
        loop.close()
