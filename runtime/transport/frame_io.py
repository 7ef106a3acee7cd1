"""Arrays into frames and back: the arrays that travel, the limits a frame is checked
against before it is written, a frame prepared but not yet written, and a received frame's
buffers read back as arrays (inline, in the peer's arena, or in a single segment)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from runtime.contracts.buffers import DescriptorError, DType
from runtime.wire import descriptor_dtype, numpy_dtype

from .pipe_io import ProtocolError
from .shm import ShmError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from runtime.contracts.codec import Frame, FrameLimits

    from .arena import ArenaReader, ShmArena
    from .shm import ShmConsumer, ShmProducer


def wire_array(name: str, value: object) -> tuple[np.ndarray[Any, Any], DType]:
    """``value`` as the array that travels (little-endian, C order) and its wire dtype."""
    array = np.asarray(value)
    try:
        dtype = descriptor_dtype(array.dtype)
    except DescriptorError as exc:
        raise DescriptorError(exc.code, f"array {name!r}: {exc}") from None
    wire_dtype = numpy_dtype(dtype)
    if array.dtype == wire_dtype and array.flags.c_contiguous:
        return array, dtype
    wire = array.astype(wire_dtype, copy=False)
    # ascontiguousarray would turn a 0-d array into shape (1,).
    return (wire if wire.flags.c_contiguous else wire.copy(order="C")), dtype


def bytes_of(array: np.ndarray[Any, Any]) -> memoryview:
    return array.reshape(-1).view(np.uint8).data


def frame_acks(frame: Frame) -> list[tuple[str, int]]:
    """``(owner, generation)`` of every shared-memory buffer in ``frame``, to acknowledge."""
    return [(d.owner, d.generation) for d in frame.buffers if not d.inline]


@dataclass(slots=True)
class PreparedFrame:
    """A frame encoded (after the acknowledgements written with it) and its buffers in
    place, not yet written (:meth:`FramedChannel.prepare`)."""

    chunks: list[bytes | memoryview]
    #: Where in ``chunks`` the frame's own header lies.
    header_index: int
    #: Bytes copied into shared memory for it.
    copied: int
    written: list[tuple[ShmProducer | ShmArena, int]]
    pinned: list[int]
    arena: ShmArena | None

    def withdraw(self) -> None:
        """Release the buffers this frame, which will not be sent, holds (idempotent)."""
        written, self.written = self.written, []
        pinned, self.pinned = self.pinned, []
        for producer, generation in written:
            producer.acknowledge(generation)
        if self.arena is not None:
            for generation in pinned:
                self.arena.unpin(generation)


def check_outgoing(
    limits: FrameLimits,
    channel: str,
    kind: str,
    buffers: int,
    chunks: Sequence[bytes | memoryview],
) -> None:
    """Refuse (``ProtocolError``) a frame over ``limits`` before anything of it is written."""
    header_len = len(chunks[1])
    total = sum(memoryview(chunk).nbytes for chunk in chunks)
    problem: tuple[str, str] | None = None
    if buffers > limits.max_buffers:
        problem = ("too_many_buffers", f"{buffers} buffers; limit {limits.max_buffers}")
    elif header_len > limits.max_header_bytes:
        problem = (
            "header_too_large",
            f"header of {header_len} bytes; limit {limits.max_header_bytes}",
        )
    elif total > limits.max_total_bytes:
        problem = (
            "frame_too_large",
            f"frame of {total} bytes; limit {limits.max_total_bytes}",
        )
    if problem is not None:
        code, detail = problem
        raise ProtocolError(f"refusing to send {kind}: {detail}", code=code, channel=channel)


def frame_arrays(
    frame: Frame,
    names: Sequence[str],
    *,
    copy: bool,
    shm: tuple[ShmConsumer | None, ArenaReader | None] | None,
    channel: str,
) -> tuple[dict[str, np.ndarray[Any, Any]], list[tuple[str, int]]]:
    """The buffers of ``frame`` as arrays keyed by ``names``, and the ``(owner, generation)``
    of each shared buffer (see :meth:`FramedChannel.arrays_from_frame`); ``shm`` is what reads
    shared memory, None where the channel has not enabled it."""
    if len(names) != len(frame.buffers) or len(set(names)) != len(names):
        raise ProtocolError(
            f"{frame.kind} carries {len(frame.buffers)} buffer(s); "
            f"expected one per distinct name in {list(names)}",
            code="buffer_count",
            channel=channel,
        )
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    for name, descriptor, payload in zip(names, frame.buffers, frame.payloads, strict=True):
        dtype = numpy_dtype(descriptor.dtype)
        if payload is not None:
            array = np.frombuffer(payload, dtype=dtype).reshape(descriptor.shape)
            arrays[name] = array.copy() if copy else array
            continue
        consumer, reader = shm if shm is not None else (None, None)
        if consumer is None or reader is None:
            raise ProtocolError(
                f"buffer {name!r} arrived in shared memory {descriptor.location}, "
                "which this channel has not enabled",
                code="shm_not_enabled",
                channel=channel,
            )
        try:
            if descriptor.in_arena:
                view = reader.view(descriptor, dtype)
                arrays[name] = view.copy() if copy else view
                continue
            array = np.empty(descriptor.shape, dtype=dtype)
            consumer.copy_into(descriptor, bytes_of(array))
        except ShmError as exc:
            raise ProtocolError(
                f"buffer {name!r}: {exc}", code=f"shm_{exc.code}", channel=channel
            ) from exc
        arrays[name] = array
    return arrays, frame_acks(frame)
