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
import os
import select
import sys
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, BinaryIO, NoReturn, cast

import numpy as np

from runtime.contracts.buffers import BufferDescriptor, DescriptorError, DType
from runtime.contracts.codec import Frame, FrameDecoder, FrameError, FrameLimits, encode_frame_parts
from runtime.contracts.messages import AckMessage, Message, MessageError, decode_message
from runtime.errors import ExecutionError

from .shm import ShmConsumer, ShmError, ShmProducer, shm_supported, validate_prefix

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    import numpy.typing as npt

DEFAULT_SHM_THRESHOLD = 256 << 10
#: Largest single read from the pipe; the decoder never asks for more than the step needs.
READ_CHUNK = 1 << 20

_WIRE_DTYPES: dict[DType, np.dtype[Any]] = {d: np.dtype(d.value).newbyteorder("<") for d in DType}
_NATIVE_DTYPES: dict[np.dtype[Any], DType] = {np.dtype(d.value): d for d in DType}


class ChannelClosed(ExecutionError):
    """The peer closed the stream (end of file at a frame boundary) or this side closed."""

    def __init__(self, message: str, *, channel: str) -> None:
        super().__init__(message)
        self.channel = channel


class ChannelTimeout(ExecutionError):
    """No complete frame arrived before the deadline; the stream stays usable."""

    def __init__(self, message: str, *, channel: str, timeout_s: float) -> None:
        super().__init__(message)
        self.channel = channel
        self.timeout_s = timeout_s


class ProtocolError(ExecutionError):
    """The peer broke the protocol. ``code`` is a frame or message error code.

    After a framing error the stream cannot be resynchronised: the channel is unusable.
    """

    def __init__(self, message: str, *, code: str, channel: str) -> None:
        super().__init__(f"{channel}: {code}: {message}")
        self.detail = message
        self.code = code
        self.channel = channel


def descriptor_dtype(dtype: npt.DTypeLike) -> DType:
    """The wire dtype of a NumPy dtype (either byte order); refuses every other type."""
    native = np.dtype(dtype).newbyteorder("=")
    found = _NATIVE_DTYPES.get(native)
    if found is None:
        raise DescriptorError(
            "bad_dtype",
            f"dtype {np.dtype(dtype)} cannot cross a process boundary; "
            f"accepted: {', '.join(d.value for d in DType)}",
        )
    return found


def numpy_dtype(dtype: DType) -> np.dtype[Any]:
    """The NumPy dtype of a wire dtype, in wire (little-endian) byte order."""
    return _WIRE_DTYPES[dtype]


def _wire_array(name: str, value: object) -> np.ndarray[Any, Any]:
    array = np.asarray(value)
    try:
        dtype = descriptor_dtype(array.dtype)
    except DescriptorError as exc:
        raise DescriptorError(exc.code, f"array {name!r}: {exc}") from None
    wire = array.astype(numpy_dtype(dtype), copy=False)
    # ascontiguousarray would turn a 0-d array into shape (1,).
    return wire if wire.flags.c_contiguous else wire.copy(order="C")


def _bytes_of(array: np.ndarray[Any, Any]) -> memoryview:
    return array.reshape(-1).view(np.uint8).data


def frame_acks(frame: Frame) -> list[tuple[str, int]]:
    """``(owner, generation)`` of every shared-memory buffer in ``frame``, to acknowledge."""
    return [(d.owner, d.generation) for d in frame.buffers if not d.inline]


def _fileno(stream: object) -> int | None:
    try:
        return cast("BinaryIO", stream).fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


if sys.platform == "win32":
    import ctypes
    import msvcrt

    def _wait_readable(fd: int, deadline: float) -> bool:
        # select() takes only sockets on Windows; poll the pipe instead.
        handle = msvcrt.get_osfhandle(fd)
        available = ctypes.c_ulong(0)
        while True:
            ok = ctypes.windll.kernel32.PeekNamedPipe(
                handle, None, 0, None, ctypes.byref(available), None
            )
            if not ok or available.value:
                # A broken pipe is readable too: the read reports end of file.
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

else:

    def _wait_readable(fd: int, deadline: float) -> bool:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            readable, _, _ = select.select([fd], [], [], 0)
        else:
            readable, _, _ = select.select([fd], [], [], remaining)
        return bool(readable)


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
        self._read_fd = _fileno(reader)
        self._decoder = FrameDecoder(self.limits)
        self._ready: deque[Frame] = deque()
        self._read_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._producers: dict[str, ShmProducer] = {}
        self._shm_prefix: str | None = None
        self._consumer: ShmConsumer | None = None
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

    def _producer(self, owner: str) -> ShmProducer:
        with self._state_lock:
            if self._closed:
                raise ChannelClosed(f"channel {self.name} is closed", channel=self.name)
            producer = self._producers.get(owner)
            if producer is None:
                assert self._shm_prefix is not None
                producer = ShmProducer(owner, self._shm_prefix, **self._shm_limits)
                self._producers[owner] = producer
            return producer

    def acknowledge(self, owner: str, generation: int) -> bool:
        """The peer copied our buffer ``(owner, generation)``: release it.

        Returns False for a stale, duplicate or unknown acknowledgement.
        """
        with self._state_lock:
            producer = self._producers.get(owner)
        return producer is not None and producer.acknowledge(generation)

    @property
    def retained_count(self) -> int:
        """Shared-memory buffers this channel's producers still retain."""
        with self._state_lock:
            producers = list(self._producers.values())
        return sum(producer.retained_count for producer in producers)

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
    ) -> None:
        """Send one frame; ``arrays`` become its buffers, in mapping order.

        Inline descriptors carry ``owner`` (default: the channel name) and
        ``generation``; shared-memory descriptors carry ``owner`` and the generation
        their producer assigned, which the peer acknowledges. The frame is checked
        against ``limits`` before anything is written; on any failure the segments
        written for it are withdrawn.
        """
        owner = owner or self.name
        parts: list[tuple[BufferDescriptor, memoryview | None]] = []
        written: list[tuple[ShmProducer, int]] = []
        try:
            for array_name, value in (arrays or {}).items():
                array = _wire_array(array_name, value)
                dtype = descriptor_dtype(array.dtype)
                shape = tuple(int(dim) for dim in array.shape)
                if self.shm_enabled and array.nbytes > self.shm_threshold:
                    producer = self._producer(owner)
                    segment = producer.put(_bytes_of(array))
                    written.append((producer, segment.generation))
                    descriptor = BufferDescriptor.for_array(
                        owner, segment.generation, dtype, shape, segment.name
                    )
                    parts.append((descriptor, None))
                else:
                    descriptor = BufferDescriptor.for_array(owner, generation, dtype, shape)
                    parts.append((descriptor, _bytes_of(array)))
            chunks = encode_frame_parts(kind, body, parts, required)
            self._check_outgoing(kind, len(parts), chunks)
            self._write(chunks)
        except BaseException:
            for producer, segment_generation in written:
                producer.cancel(segment_generation)
            raise

    def send_message(
        self,
        message: Message,
        arrays: Mapping[str, npt.ArrayLike] | None = None,
        *,
        owner: str | None = None,
        generation: int = 0,
    ) -> None:
        """Send a protocol message; ``arrays`` must be keyed by its tensor names, in order."""
        names = tuple(arrays or {})
        if names != message.buffer_names:
            raise ValueError(
                f"{message.KIND} names tensors {list(message.buffer_names)} "
                f"but arrays {list(names)} were given"
            )
        self.send(message.KIND, message.to_body(), arrays, owner=owner, generation=generation)

    def send_acks(self, acks: Iterable[tuple[str, int]]) -> None:
        """Acknowledge each copied shared-memory buffer to its producer."""
        for owner, generation in acks:
            self.send_message(AckMessage(owner, generation))

    def _check_outgoing(
        self, kind: str, buffers: int, chunks: Sequence[bytes | memoryview]
    ) -> None:
        header_len = len(chunks[1])
        total = sum(memoryview(chunk).nbytes for chunk in chunks)
        problem: tuple[str, str] | None = None
        if buffers > self.limits.max_buffers:
            problem = ("too_many_buffers", f"{buffers} buffers; limit {self.limits.max_buffers}")
        elif header_len > self.limits.max_header_bytes:
            problem = (
                "header_too_large",
                f"header of {header_len} bytes; limit {self.limits.max_header_bytes}",
            )
        elif total > self.limits.max_total_bytes:
            problem = (
                "frame_too_large",
                f"frame of {total} bytes; limit {self.limits.max_total_bytes}",
            )
        if problem is not None:
            code, detail = problem
            raise ProtocolError(f"refusing to send {kind}: {detail}", code=code, channel=self.name)

    def _write(self, chunks: Sequence[bytes | memoryview]) -> None:
        with self._write_lock:
            if self._closed or self._write_broken:
                raise ChannelClosed(f"channel {self.name} is closed for writing", channel=self.name)
            try:
                self._writer.writelines(chunks)
                self._writer.flush()
            except (OSError, ValueError) as exc:
                # A partial frame may have gone out: nothing more can follow it.
                self._write_broken = True
                raise ChannelClosed(
                    f"channel {self.name}: the peer stopped reading ({exc})", channel=self.name
                ) from exc

    # Receiving.

    def read_frame(self, timeout_s: float | None = None) -> Frame:
        """Block until one whole frame arrives and return it.

        Raises :class:`ChannelClosed` at end of stream, :class:`ProtocolError` for a
        malformed or truncated frame, and :class:`ChannelTimeout` when ``timeout_s``
        passes first (the partial frame is kept for the next call).
        """
        with self._read_lock:
            try:
                return self._read_frame_locked(timeout_s)
            finally:
                if self._closed:
                    self._close_reader()

    def _read_frame_locked(self, timeout_s: float | None) -> Frame:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._ready:
            if self._read_failed is not None:
                raise self._read_failed
            if self._closed:
                raise ChannelClosed(f"channel {self.name} is closed", channel=self.name)
            need = min(self._decoder.bytes_needed(), READ_CHUNK)
            chunk = self._read_some(need, deadline, timeout_s) if need else b""
            if need and not chunk:
                self._end_of_stream()
            try:
                self._ready.extend(self._decoder.feed(chunk))
            except FrameError as exc:
                self._read_failed = self._protocol_error(exc, exc.code)
                raise self._read_failed from exc
        return self._ready.popleft()

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

    def _read_some(self, size: int, deadline: float | None, timeout_s: float | None) -> bytes:
        try:
            if self._read_fd is None:
                # An in-memory stream never blocks, so it needs no deadline.
                return self._reader.read(size)
            if deadline is not None and not _wait_readable(self._read_fd, deadline):
                raise ChannelTimeout(
                    f"channel {self.name}: no frame within {timeout_s} s",
                    channel=self.name,
                    timeout_s=timeout_s or 0.0,
                )
            return os.read(self._read_fd, size)
        except (OSError, ValueError) as exc:
            if self._closed:
                raise ChannelClosed(f"channel {self.name} is closed", channel=self.name) from exc
            raise ChannelClosed(
                f"channel {self.name}: reading failed ({exc})", channel=self.name
            ) from exc

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
        self, frame: Frame, names: Sequence[str]
    ) -> tuple[dict[str, np.ndarray[Any, Any]], list[tuple[str, int]]]:
        """Copy every buffer of ``frame`` into a new array, keyed by ``names``.

        Returns the arrays and the ``(owner, generation)`` of each shared buffer, which
        the caller acknowledges (:meth:`send_acks`) now that it holds its own copy. If a
        copy fails, the caller should still acknowledge :func:`frame_acks` of the frame.
        """
        if len(names) != len(frame.buffers) or len(set(names)) != len(names):
            raise ProtocolError(
                f"{frame.kind} carries {len(frame.buffers)} buffer(s); "
                f"expected one per distinct name in {list(names)}",
                code="buffer_count",
                channel=self.name,
            )
        arrays: dict[str, np.ndarray[Any, Any]] = {}
        for name, descriptor, payload in zip(names, frame.buffers, frame.payloads, strict=True):
            dtype = numpy_dtype(descriptor.dtype)
            if payload is not None:
                arrays[name] = np.frombuffer(payload, dtype=dtype).reshape(descriptor.shape).copy()
                continue
            consumer = self._consumer
            if not self.same_domain or consumer is None:
                raise ProtocolError(
                    f"buffer {name!r} arrived in shared memory {descriptor.location}, "
                    "which this channel has not enabled",
                    code="shm_not_enabled",
                    channel=self.name,
                )
            array = np.empty(descriptor.shape, dtype=dtype)
            try:
                consumer.copy_into(descriptor, _bytes_of(array))
            except ShmError as exc:
                raise ProtocolError(
                    f"buffer {name!r}: {exc}", code=f"shm_{exc.code}", channel=self.name
                ) from exc
            arrays[name] = array
        return arrays, frame_acks(frame)

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
        for producer in producers:
            producer.close()
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


def start_reader_thread(
    channel: FramedChannel,
    on_frame: Callable[[Frame], None],
    on_closed: Callable[[BaseException | None], None],
) -> threading.Thread:
    """Read frames on a daemon thread; report the end once: ``None`` at end of stream."""

    def loop() -> None:
        error: BaseException | None = None
        try:
            while True:
                on_frame(channel.read_frame())
        except ChannelClosed:
            error = None
        except Exception as exc:  # noqa: BLE001 - the reader's loop reports whatever ended it
            error = exc
        on_closed(error)

    thread = threading.Thread(target=loop, name=f"{channel.name}-reader", daemon=True)
    thread.start()
    return thread


def start_log_pump(
    stream: BinaryIO, on_line: Callable[[str], None], *, name: str
) -> threading.Thread:
    """Forward each line of a worker's stderr to ``on_line`` until end of file, then close it."""

    def loop() -> None:
        try:
            for raw in iter(stream.readline, b""):
                on_line(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
        finally:
            stream.close()

    thread = threading.Thread(target=loop, name=f"{name}-stderr", daemon=True)
    thread.start()
    return thread


def claim_worker_stdio() -> tuple[BinaryIO, BinaryIO]:
    """In a worker: take stdin/stdout for frames and send everything else to stderr.

    Returns private streams on the original descriptors 0 and 1; afterwards descriptor
    0 reads nothing and descriptor 1 (``print``, native libraries) writes to stderr, so
    nothing but frames can reach the controller's stream.
    """
    sys.stdout.flush()
    frames_in = os.dup(0)
    frames_out = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(devnull, 0)
    finally:
        os.close(devnull)
    os.dup2(2, 1)
    return os.fdopen(frames_in, "rb"), os.fdopen(frames_out, "wb")
