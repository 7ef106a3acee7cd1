"""Persistent shared-memory arenas: slots reused by generation, limits, in-place reads."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from runtime.contracts.buffers import BufferDescriptor, DType
from runtime.contracts.codec import encode_frame_parts
from runtime.contracts.messages import AckMessage
from runtime.transport.arena import (
    ALIGNMENT,
    MAX_MAPPED_ARENAS,
    ArenaReader,
    ShmArena,
    arena_size_for,
)
from runtime.transport.channel import ARENA_THRESHOLD, ChannelTimeout, ProtocolError
from runtime.transport.shm import SHM_DIR, ShmError, ShmLimitExceeded, process_retained

if TYPE_CHECKING:
    from collections.abc import Callable

    from runtime.transport.channel import FramedChannel

    Pair = Callable[..., tuple[FramedChannel, FramedChannel]]

KIB = 1 << 10


def shm_names(prefix: str) -> set[str]:
    return {path.name for path in SHM_DIR.iterdir() if path.name.startswith(prefix)}


def _descriptor(arena: ShmArena, generation: int, offset: int, shape: tuple[int, ...]) -> Any:
    return BufferDescriptor.for_array(
        arena.owner, generation, DType.FLOAT32, shape, arena.name, offset
    )


def test_the_arena_is_one_segment_mapped_once_and_removed_on_close(shm_prefix: str) -> None:
    arena = ShmArena("stage", shm_prefix, 100 * KIB)
    assert shm_names(shm_prefix) == {arena.name}
    assert arena.size % 4096 == 0
    assert arena.size >= 100 * KIB
    first = arena.put(np.arange(1024, dtype=np.float32))
    second = arena.put(np.ones(1024, dtype=np.float32))
    assert first is not None
    assert second is not None
    assert first.generation != second.generation
    assert second.offset >= first.offset + first.nbytes
    assert second.offset % ALIGNMENT == 0
    # No new segment per buffer: both live in the one arena.
    assert shm_names(shm_prefix) == {arena.name}
    assert process_retained() == (2 * 4096, 2)
    arena.close()
    arena.close()
    assert shm_names(shm_prefix) == set()
    assert process_retained() == (0, 0)


def test_slots_are_freed_by_their_generation_and_reused(shm_prefix: str) -> None:
    with_room_for_two = arena_size_for([64 * KIB])
    arena = ShmArena("stage", shm_prefix, with_room_for_two)
    try:
        one = arena.put(np.zeros(16 * KIB, dtype=np.float32))
        two = arena.put(np.zeros(16 * KIB, dtype=np.float32))
        assert one is not None
        assert two is not None
        assert arena.put(np.zeros(16 * KIB, dtype=np.float32)) is None, "full: caller falls back"
        assert arena.acknowledge(one.generation) is True
        assert arena.acknowledge(one.generation) is False, "a duplicate ack is stale"
        assert arena.acknowledge(10**9) is False, "an unknown generation is ignored"
        three = arena.put(np.zeros(16 * KIB, dtype=np.float32))
        assert three is not None
        assert three.offset == one.offset, "the freed range is reused"
        assert three.generation > two.generation, "a generation names one buffer only"
        assert arena.retained_count == 2
    finally:
        arena.close()


def test_the_process_limits_hold_for_arena_slots(shm_prefix: str) -> None:
    arena = ShmArena("stage", shm_prefix, 1 << 20, max_bytes=64 * KIB, max_buffers=2)
    try:
        kept = arena.put(np.zeros(8 * KIB, dtype=np.float32))
        assert kept is not None
        with pytest.raises(ShmLimitExceeded) as info:
            arena.put(np.zeros(16 * KIB, dtype=np.float32))
        assert info.value.limit == "bytes"
        assert info.value.retained_bytes == 32 * KIB
        assert arena.put(np.zeros(KIB, dtype=np.float32)) is not None
        with pytest.raises(ShmLimitExceeded) as info:
            arena.put(np.zeros(KIB, dtype=np.float32))
        assert info.value.limit == "buffers"
        # A refused write holds nothing.
        assert arena.retained_count == 2
    finally:
        arena.close()
    assert process_retained() == (0, 0)


def test_a_reader_sees_the_bytes_in_place_read_only(shm_prefix: str) -> None:
    arena = ShmArena("stage", shm_prefix, 64 * KIB)
    reader = ArenaReader(shm_prefix)
    try:
        found = arena.allocate(4 * 256)
        assert found is not None
        slot, raw = found
        target = raw.view(np.float32)
        target[:] = np.arange(256, dtype=np.float32)
        view = reader.view(_descriptor(arena, slot.generation, slot.offset, (16, 16)), np.float32)
        assert not view.flags.writeable
        np.testing.assert_array_equal(view.reshape(-1), np.arange(256, dtype=np.float32))
        # The producer's next write into the same slot shows through: valid until acknowledged.
        target[0] = 99.0
        assert view[0, 0] == 99.0
    finally:
        reader.close()
        arena.close()


def test_a_reader_refuses_what_the_arena_does_not_hold(shm_prefix: str) -> None:
    arena = ShmArena("stage", shm_prefix, 4096)
    reader = ArenaReader(shm_prefix)
    try:
        past_the_end = _descriptor(arena, 1, arena.size - 8, (4,))
        with pytest.raises(ShmError) as info:
            reader.view(past_the_end, np.float32)
        assert info.value.code == "size_mismatch"
        assert arena.name in str(info.value)
        stranger = ArenaReader("oe-other-prefix-")
        with pytest.raises(ShmError) as info:
            stranger.view(_descriptor(arena, 1, 0, (4,)), np.float32)
        assert info.value.code == "bad_name"
        missing = BufferDescriptor.for_array(
            "stage", 1, DType.FLOAT32, (4,), f"{shm_prefix}gone", 0
        )
        with pytest.raises(ShmError) as info:
            reader.view(missing, np.float32)
        assert info.value.code == "missing"
    finally:
        reader.close()
        arena.close()


def test_a_reader_maps_a_bounded_number_of_arenas(shm_prefix: str) -> None:
    arenas = [ShmArena(f"p{i}", shm_prefix, 4096) for i in range(MAX_MAPPED_ARENAS + 1)]
    reader = ArenaReader(shm_prefix)
    try:
        for arena in arenas[:-1]:
            reader.view(_descriptor(arena, 1, 0, (4,)), np.float32)
        with pytest.raises(ShmError) as info:
            reader.view(_descriptor(arenas[-1], 1, 0, (4,)), np.float32)
        assert info.value.code == "limit_exceeded"
    finally:
        reader.close()
        for arena in arenas:
            arena.close()


def test_an_abandoned_arena_is_removed(shm_prefix: str) -> None:
    arena = ShmArena("stage", shm_prefix, 4096)
    assert arena.put(np.zeros(1024, dtype=np.float32)) is not None
    del arena
    gc.collect()
    assert shm_names(shm_prefix) == set()
    assert process_retained() == (0, 0)


def test_a_channel_sends_through_its_arena_and_the_ack_frees_the_slot(
    channel_pair: Pair, shm_prefix: str
) -> None:
    left, right = channel_pair(shm_prefix=shm_prefix, same_domain=True)
    arena = left.open_arena("left", arena_size_for([64 * KIB]))
    assert arena is not None
    big = np.arange(16 * KIB, dtype=np.float32)
    small = np.arange(4, dtype=np.float32)
    copied = left.send("tensor", {}, {"big": big, "small": small})
    assert copied == big.nbytes
    frame = right.read_frame(timeout_s=10)
    assert "shm-arena" in frame.required
    assert [d.in_arena for d in frame.buffers] == [True, False]
    got, acks = right.arrays_from_frame(frame, ["big", "small"], copy=False)
    assert not got["big"].flags.writeable
    np.testing.assert_array_equal(got["big"], big)
    np.testing.assert_array_equal(got["small"], small)
    assert shm_names(shm_prefix) == {arena.name}, "no segment per buffer"
    assert left.retained_count == 1
    right.send_acks(acks)
    message, _ = left.read_message(timeout_s=10)
    assert isinstance(message, AckMessage)
    assert left.acknowledge(message.owner, message.generation) is True
    assert left.acknowledge(message.owner, message.generation) is False
    assert left.retained_count == 0


def test_a_full_arena_falls_back_to_a_single_segment(channel_pair: Pair, shm_prefix: str) -> None:
    left, right = channel_pair(shm_prefix=shm_prefix, same_domain=True)
    arena = left.open_arena("left", 4096 * 4)
    assert arena is not None
    too_big = np.zeros(128 * KIB, dtype=np.float32)
    assert too_big.nbytes > ARENA_THRESHOLD
    left.send("tensor", {}, {"x": too_big})
    frame = right.read_frame(timeout_s=10)
    (descriptor,) = frame.buffers
    assert not descriptor.inline
    assert not descriptor.in_arena
    assert descriptor.location in shm_names(shm_prefix)
    got, acks = right.arrays_from_frame(frame, ["x"])
    np.testing.assert_array_equal(got["x"], too_big)
    for owner, generation in acks:
        assert left.acknowledge(owner, generation) is True
    assert left.retained_count == 0


def test_an_arena_buffer_past_its_end_is_a_protocol_error(
    channel_pair: Pair, shm_prefix: str
) -> None:
    left, right = channel_pair(shm_prefix=shm_prefix, same_domain=True)
    arena = left.open_arena("left", 4096)
    assert arena is not None
    bad = _descriptor(arena, 1, 4096 - 4, (4,))
    for chunk in encode_frame_parts("tensor", {}, [(bad, None)]):
        left._write([chunk])
    frame = right.read_frame(timeout_s=10)
    with pytest.raises(ProtocolError) as info:
        right.arrays_from_frame(frame, ["x"])
    assert info.value.code == "shm_size_mismatch"
    with pytest.raises(ChannelTimeout):
        left.read_frame(timeout_s=0.05)


def test_a_pinned_slot_outlives_acknowledgements_until_unpinned(shm_prefix: str) -> None:
    arena = ShmArena("stage", shm_prefix, 64 * KIB)
    try:
        before = process_retained()
        slot = arena.put(np.ones(1024, np.float32), pin=True)
        assert slot is not None
        # The consumer read it once and acknowledged it: the slot stays.
        assert arena.acknowledge(slot.generation)
        assert arena.pinned(slot.generation)
        assert arena.owns(slot.generation)
        # A duplicate acknowledgement with nothing out is stale, and frees nothing.
        assert not arena.acknowledge(slot.generation)
        assert arena.owns(slot.generation)
        # Sent again, then unpinned while that send is still out: freed at its acknowledgement.
        assert arena.reuse(slot.generation)
        assert arena.unpin(slot.generation)
        assert arena.owns(slot.generation)
        assert not arena.pinned(slot.generation)
        assert not arena.reuse(slot.generation)
        assert arena.acknowledge(slot.generation)
        assert not arena.owns(slot.generation)
        assert process_retained() == before
        # Unpinned with nothing out: freed at once.
        again = arena.put(np.ones(1024, np.float32), pin=True)
        assert again is not None
        assert arena.acknowledge(again.generation)
        assert arena.unpin(again.generation)
        assert not arena.owns(again.generation)
        assert not arena.unpin(again.generation)
        assert process_retained() == before
    finally:
        arena.close()


def test_closing_an_arena_frees_its_pinned_slots(shm_prefix: str) -> None:
    before = process_retained()
    arena = ShmArena("stage", shm_prefix, 64 * KIB)
    slot = arena.put(np.ones(1024, np.float32), pin=True)
    assert slot is not None
    arena.close()
    assert process_retained() == before
    assert shm_names(shm_prefix) == set()
