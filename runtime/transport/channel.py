"""A framed channel over a worker's stdin/stdout, with shared memory for large arrays.

Frames use the contracts' codec. Arrays at or below ``shm_threshold`` bytes travel
inline in the frame; larger ones travel through named shared memory when both ends
share an OS domain and the controller gave a segment prefix. A receiver copies every
array out (:meth:`FramedChannel.arrays_from_frame`) and then acknowledges each shared
buffer, which lets its producer release it. Worker logs never share this stream: a
worker calls :func:`claim_worker_stdio` first, so stray output lands on stderr.

Buffers travel in little-endian byte order.
"""

from __future__ import annotations

import io
import itertools
import os
import sys
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, BinaryIO, NoReturn, TypeVar, cast

import numpy as np

from runtime.contracts.buffers import BufferDescriptor
from runtime.contracts.codec import (
    Frame,
    FrameDecoder,
    FrameError,
    FrameLimits,
    encode_ack_frame,
    encode_frame_parts,
)
from runtime.contracts.messages import AckMessage, Message, MessageError, decode_message
from runtime.wire import descriptor_dtype

from .arena import ArenaReader, ArenaSlot, ShmArena
from .frame_io import (
    PreparedFrame,
    bytes_of,
    check_outgoing,
    frame_arrays,
    wire_array,
)
from .frame_io import frame_acks as frame_acks
from .pipe_io import ChannelClosed as ChannelClosed
from .pipe_io import ChannelTimeout as ChannelTimeout
from .pipe_io import ProtocolError as ProtocolError
from .pipe_io import fileno, wait_readable, wait_writable
from .shm import ShmConsumer, ShmProducer, shm_supported, validate_prefix

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

    import numpy.typing as npt


_P = TypeVar("_P")
_T = TypeVar("_T")

DEFAULT_SHM_THRESHOLD = 256 << 10
#: Arrays above this size go to the sender's arena when it has one: writing into a mapped,
#: already-touched slot costs less than pushing the bytes through the pipe.
ARENA_THRESHOLD = 16 << 10
#: Largest single read from the pipe; the decoder never asks for more than the step needs.
READ_CHUNK = 1 << 20


class FramedChannel:
    """One end of a framed byte stream.

    ``reader`` and ``writer`` are binary streams (a worker's stdout and stdin on the
    controller side). ``limits`` bounds what this side accepts and sends. Shared memory
    is used only when ``same_domain`` is true and a ``shm_prefix`` is known; the same
    prefix names this side's segments and is the only one accepted from the peer.
    ``send`` is thread-safe; one thread reads.
    """

    def __init__(
        self,
        reader: BinaryIO,
        writer: BinaryIO,
        *,
        name: str,
        limits: FrameLimits | None = None,
        shm_threshold: int = DEFAULT_SHM_THRESHOLD,
        shm_prefix: str | None = None,
        same_domain: bool = False,
        shm_max_bytes: int | None = None,
        shm_max_buffers: int | None = None,
    ) -> None:
        if shm_threshold < 0:
            raise ValueError(f"shm_threshold {shm_threshold} must be >= 0")
        self.name = name
        self.limits = limits or FrameLimits()
        self.shm_threshold = shm_threshold
        self.same_domain = same_domain
        self._shm_limits: dict[str, int] = {}
        if shm_max_bytes is not None:
            self._shm_limits["max_bytes"] = shm_max_bytes
        if shm_max_buffers is not None:
            self._shm_limits["max_buffers"] = shm_max_buffers
        self._reader = reader
        # Gathered writes need a buffered writer: a raw pipe write may be partial.
        self._writer: BinaryIO = (
            cast("BinaryIO", io.BufferedWriter(writer))
            if isinstance(writer, io.RawIOBase)
            else writer
        )
        self._read_fd = fileno(reader)
        self._write_fd = fileno(writer)
        self._decoder = FrameDecoder(self.limits)
        self._ready: deque[Frame] = deque()
        self._read_lock = threading.Lock()
        self._read_buffer: bytearray | None = None
        self._write_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._producers: dict[str, ShmProducer] = {}
        self._generations: dict[str, itertools.count[int]] = {}
        self._arenas: dict[str, ShmArena] = {}
        self._shm_prefix: str | None = None
        self._consumer: ShmConsumer | None = None
        self._arena_reader: ArenaReader | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # The loop reader's callbacks, kept to lend the pipe and take it back.
        self._loop_readable: Callable[[], None] | None = None
        self._loop_on_frame: Callable[[Frame], None] | None = None
        self._loop_finish: Callable[[BaseException | None], None] | None = None
        self._loop_paused = False
        self._borrowed_failure: FrameError | None = None
        #: Send call, result and ack frames with the compact binary header (set once the
        #: peer offered ``binary-header``); every frame received is accepted either way.
        self.binary_headers = False
        self._closed = False
        self._write_broken = False
        self._read_failed: ProtocolError | ChannelClosed | None = None
        if shm_prefix is not None:
            self.enable_shm(shm_prefix)

    # Shared memory.

    @property
    def shm_prefix(self) -> str | None:
        return self._shm_prefix

    @property
    def shm_enabled(self) -> bool:
        return self.same_domain and self._shm_prefix is not None

    def enable_shm(self, prefix: str) -> None:
        """Start using shared memory under ``prefix`` (a worker learns it from ``load``)."""
        validate_prefix(prefix)
        with self._state_lock:
            if self._shm_prefix is not None and self._shm_prefix != prefix:
                raise ValueError(
                    f"channel {self.name} already uses shared-memory prefix {self._shm_prefix}"
                )
            if not shm_supported():
                return
            self._shm_prefix = prefix
            self._consumer = ShmConsumer(prefix)
            self._arena_reader = ArenaReader(prefix)

    def _owner_generations(self, owner: str) -> itertools.count[int]:
        # One counter per owner, shared by its arena and its single segments.
        found = self._generations.get(owner)
        if found is None:
            found = self._generations[owner] = itertools.count(1)
        return found

    def _producer(self, owner: str) -> ShmProducer:
        with self._state_lock:
            if self._closed:
                raise ChannelClosed(f"channel {self.name} is closed", channel=self.name)
            producer = self._producers.get(owner)
            if producer is None:
                assert self._shm_prefix is not None
                producer = ShmProducer(
                    owner,
                    self._shm_prefix,
                    generations=self._owner_generations(owner),
                    **self._shm_limits,
                )
                self._producers[owner] = producer
            return producer

    def open_arena(self, owner: str, size: int) -> ShmArena | None:
        """Create (once) and keep the persistent arena this side writes ``owner``'s buffers to.

        None when shared memory is not in use on this channel. A second call for the same
        owner returns the arena already open.
        """
        with self._state_lock:
            if self._closed:
                raise ChannelClosed(f"channel {self.name} is closed", channel=self.name)
            if not self.shm_enabled:
                return None
            arena = self._arenas.get(owner)
            if arena is None:
                assert self._shm_prefix is not None
                arena = ShmArena(
                    owner,
                    self._shm_prefix,
                    size,
                    generations=self._owner_generations(owner),
                    **self._shm_limits,
                )
                self._arenas[owner] = arena
            return arena

    def arena(self, owner: str) -> ShmArena | None:
        with self._state_lock:
            return self._arenas.get(owner)

    def acknowledge(self, owner: str, generation: int) -> bool:
        """The peer is done with our buffer ``(owner, generation)``: release it.

        Returns False for a stale, duplicate or unknown acknowledgement.
        """
        with self._state_lock:
            arena = self._arenas.get(owner)
            producer = self._producers.get(owner)
        if arena is not None and arena.acknowledge(generation):
            return True
        return producer is not None and producer.acknowledge(generation)

    @property
    def retained_count(self) -> int:
        """Shared-memory buffers this channel's producers and arenas still retain."""
        with self._state_lock:
            producers = list(self._producers.values())
            arenas = list(self._arenas.values())
        return sum(producer.retained_count for producer in producers) + sum(
            arena.retained_count for arena in arenas
        )

    # Sending.

    def send(
        self,
        kind: str,
        body: Mapping[str, Any] | None = None,
        arrays: Mapping[str, npt.ArrayLike] | None = None,
        *,
        owner: str | None = None,
        generation: int = 0,
        required: Iterable[str] = (),
        placed: Mapping[str, ArenaSlot] | None = None,
        before: Sequence[Message] = (),
        from_loop: bool = False,
        pin: Collection[str] = (),
        slots: dict[str, ArenaSlot] | None = None,
    ) -> int:
        """Send one frame; ``arrays`` become its buffers, in mapping order.

        Inline descriptors carry ``owner`` (default: the channel name) and
        ``generation``; shared-memory descriptors carry ``owner`` and the generation
        their producer assigned, which the peer acknowledges. An array above
        :data:`ARENA_THRESHOLD` is copied into ``owner``'s arena when it has one (one copy,
        into memory already mapped); an array named in ``placed`` already lies in that
        arena's slot (its producer wrote it there) and is sent as is. Other arrays above
        ``shm_threshold`` go to a single segment. An array named in ``pin`` that goes to the
        arena gets a pinned slot (kept across acknowledgements, sent again through ``placed``,
        freed by :meth:`unpin`); ``slots`` receives the arena slot of each array written there.
        ``before`` are messages (acknowledgements)
        written in the same write, ahead of this frame. The frame is checked against
        ``limits`` before anything is written; on any failure the buffers written for it are
        withdrawn. Returns the bytes copied into shared memory for this frame.
        """
        prepared = self.prepare(
            kind, body, arrays, owner, generation, required, placed, before, pin, slots
        )
        try:
            self._write(prepared.chunks, from_loop=from_loop)
        except BaseException:
            prepared.withdraw()
            raise
        return prepared.copied

    def prepare(
        self,
        kind: str,
        body: Mapping[str, Any] | None,
        arrays: Mapping[str, npt.ArrayLike] | None,
        owner: str | None,
        generation: int,
        required: Iterable[str],
        placed: Mapping[str, ArenaSlot] | None,
        before: Sequence[Message],
        pin: Collection[str],
        slots: dict[str, ArenaSlot] | None,
    ) -> PreparedFrame:
        """What :meth:`send` writes, with its buffers in place, not written yet
        (:meth:`write_prepared`, or ``PreparedFrame.withdraw``); withdrawn on any failure."""
        owner = owner or self.name
        parts: list[tuple[BufferDescriptor, memoryview | None]] = []
        written: list[tuple[ShmProducer | ShmArena, int]] = []
        pinned: list[int] = []
        copied = 0
        placed = placed or {}
        arena = self._arenas.get(owner) if self._arenas else None
        try:
            for array_name, value in (arrays or {}).items():
                slot = placed.get(array_name)
                if slot is not None and arena is not None:
                    array = np.asarray(value)
                    dtype = descriptor_dtype(array.dtype)
                    shape = tuple(int(dim) for dim in array.shape)
                    # A pinned slot sent again: its consumer acknowledges this send too.
                    arena.reuse(slot.generation)
                    written.append((arena, slot.generation))
                    parts.append(
                        (
                            BufferDescriptor.for_array(
                                owner, slot.generation, dtype, shape, arena.name, slot.offset
                            ),
                            None,
                        )
                    )
                    continue
                array, dtype = wire_array(array_name, value)
                shape = array.shape
                if arena is not None and array.nbytes > ARENA_THRESHOLD:
                    keep = array_name in pin
                    put = arena.put(array, pin=keep)
                    if put is not None:
                        if keep:
                            pinned.append(put.generation)
                        if slots is not None:
                            slots[array_name] = put
                        written.append((arena, put.generation))
                        copied += array.nbytes
                        parts.append(
                            (
                                BufferDescriptor.for_array(
                                    owner, put.generation, dtype, shape, arena.name, put.offset
                                ),
                                None,
                            )
                        )
                        continue
                if self.shm_enabled and array.nbytes > self.shm_threshold:
                    producer: ShmProducer | ShmArena = self._producer(owner)
                    assert isinstance(producer, ShmProducer)
                    segment = producer.put(bytes_of(array))
                    written.append((producer, segment.generation))
                    copied += array.nbytes
                    descriptor = BufferDescriptor.for_array(
                        owner, segment.generation, dtype, shape, segment.name
                    )
                    parts.append((descriptor, None))
                else:
                    descriptor = BufferDescriptor.for_array(owner, generation, dtype, shape)
                    parts.append((descriptor, bytes_of(array)))
            binary = self.binary_headers
            chunks = encode_frame_parts(kind, body, parts, required, binary_header=binary)
            check_outgoing(self.limits, self.name, kind, len(parts), chunks)
            leading: list[bytes | memoryview] = []
            for message in before:
                if isinstance(message, AckMessage):
                    leading.append(
                        encode_ack_frame(message.owner, message.generation, binary_header=binary)
                    )
                else:
                    leading.extend(
                        encode_frame_parts(message.KIND, message.to_body(), binary_header=binary)
                    )
        except BaseException:
            PreparedFrame([], 0, copied, written, pinned, arena).withdraw()
            raise
        return PreparedFrame([*leading, *chunks], len(leading) + 1, copied, written, pinned, arena)

    def write_prepared(self, prepared: PreparedFrame) -> None:
        """Write a frame made by :meth:`prepare`; its buffers are withdrawn if that fails."""
        try:
            self._write(prepared.chunks)
        except BaseException:
            prepared.withdraw()
            raise

    def write_frames(self, data: bytes | bytearray) -> None:
        """Write bytes that are whole frames as this channel encodes them, made another way
        (a worker's answer packed by its layout, :mod:`runtime.transport.answers`)."""
        self._write([memoryview(data)])

    def unpin(self, owner: str, generation: int) -> bool:
        """Stop keeping ``owner``'s pinned arena slot ``generation`` (see :meth:`send`)."""
        arena = self.arena(owner)
        return arena is not None and arena.unpin(generation)

    def send_message(
        self,
        message: Message,
        arrays: Mapping[str, npt.ArrayLike] | None = None,
        *,
        owner: str | None = None,
        generation: int = 0,
        placed: Mapping[str, ArenaSlot] | None = None,
        acks: Iterable[tuple[str, int]] = (),
        from_loop: bool = False,
        pin: Collection[str] = (),
        slots: dict[str, ArenaSlot] | None = None,
    ) -> int:
        """Send a protocol message; ``arrays`` must be keyed by its tensor names, in order.

        ``acks`` are acknowledgements written ahead of it in the same write. Returns the
        bytes copied into shared memory (see :meth:`send`).
        """
        names = tuple(arrays or {})
        if names != message.buffer_names:
            raise ValueError(
                f"{message.KIND} names tensors {list(message.buffer_names)} "
                f"but arrays {list(names)} were given"
            )
        return self.send(
            message.KIND,
            message.to_body(),
            arrays,
            owner=owner,
            generation=generation,
            placed=placed,
            before=[AckMessage(owner, gen) for owner, gen in acks],
            from_loop=from_loop,
            pin=pin,
            slots=slots,
        )

    def send_acks(self, acks: Iterable[tuple[str, int]], *, from_loop: bool = False) -> None:
        """Acknowledge shared-memory buffers to their producer, all in one write."""
        binary_header = self.binary_headers
        frames: list[bytes | memoryview] = []
        for owner, generation in acks:
            # Checked as the message checks them; the frame is the one its encoding gives.
            AckMessage(owner, generation)
            frames.append(encode_ack_frame(owner, generation, binary_header=binary_header))
        if frames:
            self._write(frames, from_loop=from_loop)

    def _write(self, chunks: Sequence[bytes | memoryview], *, from_loop: bool = False) -> None:
        """Write whole frames. From the event loop this never waits for the peer: what the
        pipe cannot take at once is finished by a writer thread, which holds the write lock
        until the frame is out, so frames stay whole and in order."""
        fd = self._write_fd
        if fd is None:
            with self._write_lock:
                self._check_writable()
                try:
                    self._writer.writelines(chunks)
                    self._writer.flush()
                except (OSError, ValueError) as exc:
                    raise self._broken(exc) from exc
            return
        views = [memoryview(chunk).cast("B") for chunk in chunks]
        self._write_lock.acquire()
        handed_off = False
        try:
            self._check_writable()
            remaining = self._write_some(fd, views, wait=not from_loop)
            if remaining:
                # The pipe is full: a thread finishes this frame; the lock goes with it.
                handed_off = True
                threading.Thread(
                    target=self._finish_write,
                    args=(fd, remaining),
                    name=f"{self.name}-writer",
                    daemon=True,
                ).start()
        finally:
            if not handed_off:
                self._write_lock.release()

    def _finish_write(self, fd: int, remaining: list[memoryview]) -> None:
        try:
            self._write_some(fd, remaining, wait=True)
        except ChannelClosed:
            pass
        finally:
            self._write_lock.release()

    def _write_some(self, fd: int, views: list[memoryview], *, wait: bool) -> list[memoryview]:
        """Write ``views`` in order; without ``wait``, stop at a full pipe and return the rest."""
        while views:
            try:
                written = os.writev(fd, views[:64])
            except BlockingIOError:
                if not wait:
                    return views
                wait_writable(fd)
                continue
            except (OSError, ValueError) as exc:
                raise self._broken(exc) from exc
            while views and written >= views[0].nbytes:
                written -= views[0].nbytes
                views.pop(0)
            if written:
                views[0] = views[0][written:]
        return views

    def _check_writable(self) -> None:
        if self._closed or self._write_broken:
            raise ChannelClosed(f"channel {self.name} is closed for writing", channel=self.name)

    def _broken(self, exc: BaseException) -> ChannelClosed:
        # A partial frame may have gone out: nothing more can follow it.
        self._write_broken = True
        return ChannelClosed(
            f"channel {self.name}: the peer stopped reading ({exc})", channel=self.name
        )

    # Receiving.

    def read_frame(
        self,
        timeout_s: float | None = None,
        *,
        pending: deque[_P] | None = None,
        whole: Callable[[memoryview], _T | None] | None = None,
    ) -> Frame | _P | _T:
        """Block until one whole frame arrives and return it.

        Raises :class:`ChannelClosed` at end of stream, :class:`ProtocolError` for a
        malformed or truncated frame, and :class:`ChannelTimeout` when ``timeout_s``
        passes first (the partial frame is kept for the next call). With ``pending``, an
        item another reader left there (under the read lock) is returned first. A read that
        starts at a frame boundary with no frame waiting is offered to ``whole(bytes)``
        first: what it returns (not None) is returned instead, the decoder never seeing
        those bytes (a call read by its layout, :mod:`runtime.transport.calls`).
        """
        with self._read_lock:
            if pending:
                return pending.popleft()
            try:
                return self._read_frame_locked(timeout_s, whole)
            finally:
                if self._closed:
                    self._close_reader()

    def _read_frame_locked(
        self, timeout_s: float | None, whole: Callable[[memoryview], _T | None] | None = None
    ) -> Frame | _T:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._ready:
            if self._read_failed is not None:
                raise self._read_failed
            if self._closed:
                raise ChannelClosed(f"channel {self.name} is closed", channel=self.name)
            # A pipe read returns what is there: reading more than this step needs takes a
            # whole small frame (prefix, header and payload) in one system call.
            need = READ_CHUNK if self._decoder.bytes_needed() else 0
            at_boundary = self._decoder.at_boundary
            chunk = self._read_some(need, deadline, timeout_s) if need else b""
            if need and not chunk:
                self._end_of_stream()
            if whole is not None and at_boundary and isinstance(chunk, memoryview):
                taken = whole(chunk)
                if taken is not None:
                    return taken
            try:
                self._feed(chunk)
            except FrameError as exc:
                self._read_failed = self._protocol_error(exc, exc.code)
                if not self._ready:
                    raise self._read_failed from exc
        return self._ready.popleft()

    def _feed(self, data: bytes | memoryview) -> None:
        """Decode ``data``; the frames before a bad one are kept."""
        try:
            self._ready.extend(self._decoder.feed(data))
        except FrameError as exc:
            self._ready.extend(exc.frames)
            raise

    def _protocol_error(self, exc: ValueError, code: str) -> ProtocolError:
        return ProtocolError(str(exc).removeprefix(f"{code}: "), code=code, channel=self.name)

    def read_message(
        self, accepted: frozenset[str] | None = None, timeout_s: float | None = None
    ) -> tuple[Message, Frame]:
        """Read one frame and parse it as a protocol message of an ``accepted`` kind."""
        frame = self.read_frame(timeout_s)
        try:
            return decode_message(frame, accepted), frame
        except MessageError as exc:
            raise self._protocol_error(exc, exc.code) from exc

    def _read_some(
        self, size: int, deadline: float | None, timeout_s: float | None
    ) -> bytes | memoryview:
        try:
            if self._read_fd is None:
                # An in-memory stream never blocks, so it needs no deadline.
                return self._reader.read(size)
            if deadline is not None and not wait_readable(self._read_fd, deadline):
                raise ChannelTimeout(
                    f"channel {self.name}: no frame within {timeout_s} s",
                    channel=self.name,
                    timeout_s=timeout_s or 0.0,
                )
            return self._read_fd_into(self._read_fd, size)
        except (OSError, ValueError) as exc:
            if self._closed:
                raise ChannelClosed(f"channel {self.name} is closed", channel=self.name) from exc
            raise ChannelClosed(
                f"channel {self.name}: reading failed ({exc})", channel=self.name
            ) from exc

    def _read_fd_into(self, fd: int, size: int) -> memoryview:
        """Up to ``size`` bytes from ``fd`` into this channel's read buffer (allocated once:
        a fresh buffer per read would map and unmap a megabyte each time). The view is valid
        until the next read; the decoder copies whatever it keeps."""
        buffer = self._read_buffer
        if buffer is None or len(buffer) < size:
            buffer = self._read_buffer = bytearray(max(size, READ_CHUNK))
        count = os.readv(fd, [memoryview(buffer)[:size]])
        return memoryview(buffer)[:count]

    def _end_of_stream(self) -> NoReturn:
        if self._decoder.at_boundary:
            self._read_failed = ChannelClosed(
                f"channel {self.name}: the peer closed the stream", channel=self.name
            )
            raise self._read_failed
        try:
            self._decoder.close()
        except FrameError as exc:
            self._read_failed = self._protocol_error(exc, exc.code)
            raise self._read_failed from exc
        raise AssertionError("a decoder inside a frame reports it as truncated")

    def arrays_from_frame(
        self, frame: Frame, names: Sequence[str], *, copy: bool = True
    ) -> tuple[dict[str, np.ndarray[Any, Any]], list[tuple[str, int]]]:
        """The buffers of ``frame`` as arrays keyed by ``names``, and the ``(owner,
        generation)`` of each shared buffer, which the caller acknowledges (:meth:`send_acks`)
        once it no longer reads them. If reading fails, the caller should still acknowledge
        :func:`frame_acks` of the frame.

        With ``copy`` every array is a new copy. Without it, inline buffers and buffers in
        the peer's arena are read in place: read-only arrays valid until the frame is
        dropped (inline) or the buffer is acknowledged (arena). A buffer in a single segment
        is copied either way.
        """
        return frame_arrays(
            frame,
            names,
            copy=copy,
            shm=(self._consumer, self._arena_reader) if self.same_domain else None,
            channel=self.name,
        )

    # Reading on an event loop (POSIX).

    @property
    def loop_reading(self) -> bool:
        return self._loop is not None

    @property
    def read_fd(self) -> int | None:
        return self._read_fd

    def start_loop_reader(
        self,
        loop: asyncio.AbstractEventLoop,
        on_frame: Callable[[Frame], None],
        on_closed: Callable[[BaseException | None], None],
    ) -> None:
        """Read frames with the loop's own readiness on the pipe (call on the loop's thread).

        ``on_frame`` runs on the loop for each frame; ``on_closed`` once at the end (``None``
        at a clean end of stream). Writes from the loop no longer wait for the peer either.
        POSIX only: Windows pipes cannot be watched by the loop (use
        :func:`start_reader_thread` there).
        """
        fd = self._read_fd
        if fd is None or sys.platform == "win32":
            raise ValueError(f"channel {self.name} cannot be read on an event loop here")
        os.set_blocking(fd, False)
        if self._write_fd is not None:
            os.set_blocking(self._write_fd, False)
        self._loop = loop
        finished = False
        # Frames the handshake already decoded come first.
        while self._ready:
            loop.call_soon(on_frame, self._ready.popleft())

        def finish(error: BaseException | None) -> None:
            nonlocal finished
            if finished:
                return
            finished = True
            self._stop_loop_reader()
            on_closed(error)

        def readable() -> None:
            try:
                data = self._read_fd_into(fd, READ_CHUNK)
            except BlockingIOError:
                return
            except (OSError, ValueError) as exc:
                finish(None if self._closed else ChannelClosed(str(exc), channel=self.name))
                return
            if not data:
                if self._decoder.at_boundary:
                    finish(None)
                    return
                try:
                    self._decoder.close()
                except FrameError as exc:
                    finish(self._protocol_error(exc, exc.code))
                return
            failure: FrameError | None = None
            try:
                self._feed(data)
            except FrameError as exc:
                failure = exc
            while self._ready and not finished:
                on_frame(self._ready.popleft())
            if failure is not None:
                finish(self._protocol_error(failure, failure.code))

        self._loop_readable = readable
        self._loop_on_frame = on_frame
        self._loop_finish = finish
        self._loop_paused = False
        loop.add_reader(fd, readable)

    # Lending the pipe to a thread that waits for one reply (runtime/backends/borrowed.py).

    def pause_loop_reader(self) -> bool:
        """Stop the loop watching the pipe (on the loop's thread): another thread reads it
        with :meth:`read_borrowed` until :meth:`resume_loop_reader`. False when the loop
        does not read this channel."""
        loop, fd = self._loop, self._read_fd
        if loop is None or fd is None or self._loop_readable is None or self._loop_paused:
            return False
        loop.remove_reader(fd)
        self._loop_paused = True
        return True

    def resume_loop_reader(self) -> None:
        """Watch the pipe on the loop again (on the loop's thread). Frames the borrowing
        thread decoded but did not take, and a malformed frame it met, are the loop's now."""
        if not self._loop_paused:
            return
        self._loop_paused = False
        loop, fd, readable = self._loop, self._read_fd, self._loop_readable
        if loop is None or fd is None or readable is None or loop.is_closed():
            return
        on_frame, finish = self._loop_on_frame, self._loop_finish
        while self._ready and on_frame is not None:
            on_frame(self._ready.popleft())
        failure, self._borrowed_failure = self._borrowed_failure, None
        if failure is not None and finish is not None:
            finish(self._protocol_error(failure, failure.code))
            return
        loop.add_reader(fd, readable)

    def read_borrowed(
        self, take_whole: Callable[[memoryview], bool] | None = None
    ) -> tuple[list[Frame], memoryview | None] | None:
        """The whole frames the lent pipe holds now (none when it holds only part of one),
        and the bytes read when they were exactly those frames (valid until the next read);
        None at the end of the stream, when reading fails or at a malformed frame: the
        borrower then hands the pipe back, and the loop reports what ended it.

        ``take_whole`` is offered the bytes first when the read starts at a frame boundary
        with no frame waiting: True means it took them (they were whole frames it knows, see
        :mod:`runtime.transport.answers`), and the decoder never sees them."""
        fd = self._read_fd
        if fd is None or not self._loop_paused:
            return None
        try:
            data = self._read_fd_into(fd, READ_CHUNK)
        except BlockingIOError:
            return [], None
        except (OSError, ValueError):
            return None
        if not data:
            return None
        at_boundary = self._decoder.at_boundary and not self._ready
        if at_boundary and take_whole is not None and take_whole(data):
            return [], None
        try:
            self._feed(data)
        except FrameError as exc:
            self._borrowed_failure = exc
            return None
        frames = list(self._ready)
        self._ready.clear()
        whole = at_boundary and self._decoder.at_boundary
        return frames, data if whole else None

    def _stop_loop_reader(self) -> None:
        loop, self._loop = self._loop, None
        fd = self._read_fd
        if loop is None or fd is None or loop.is_closed():
            return
        # Imported here: a worker, which never reads on a loop, need not load asyncio.
        import asyncio

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            loop.remove_reader(fd)
        else:
            loop.call_soon_threadsafe(loop.remove_reader, fd)

    # Reading from another thread than the one blocked in read_frame (a worker's watcher).

    def try_read_frame(self, accept: Callable[[], bool]) -> Frame | None:
        """Read one frame if no other thread is reading and ``accept()`` holds under the
        read lock; None otherwise. Blocks until the whole frame has arrived."""
        if not self._read_lock.acquire(blocking=False):
            return None
        try:
            if not accept():
                return None
            return self._read_frame_locked(None)
        finally:
            self._read_lock.release()

    @property
    def has_frames(self) -> bool:
        """Whether whole frames already read wait in this channel (no need to wait)."""
        return bool(self._ready)

    def wait_readable(self, timeout_s: float) -> bool:
        """Whether bytes (or the end of the stream) are waiting to be read, within ``timeout_s``."""
        if self._ready:
            return True
        if self._read_fd is None:
            return True
        return wait_readable(self._read_fd, time.monotonic() + timeout_s)

    # Lifetime.

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release every retained shared buffer and close both streams. Idempotent.

        A thread blocked in :meth:`read_frame` returns when the peer closes its end (or
        exits) and then closes the reading stream.
        """
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            producers = list(self._producers.values())
            arenas = list(self._arenas.values())
            reader = self._arena_reader
        self._stop_loop_reader()
        for producer in producers:
            producer.close()
        for arena in arenas:
            arena.close()
        if reader is not None:
            reader.close()
        try:
            self._writer.close()
        except (OSError, ValueError):
            # Flushing into a pipe whose reader is gone fails; the stream closes anyway.
            pass
        # A thread blocked reading keeps the descriptor until it returns (then closes it):
        # closing it under that thread would let a reused descriptor number be read.
        if self._read_lock.acquire(blocking=False):
            try:
                self._close_reader()
            finally:
                self._read_lock.release()

    def _close_reader(self) -> None:
        try:
            self._reader.close()
        except (OSError, ValueError):
            pass

    def __enter__(self) -> FramedChannel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
