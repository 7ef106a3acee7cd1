"""Named shared memory for large buffers between two processes of one OS domain.

A producer writes a buffer into a fresh segment with a random name and *retains* it
until its single consumer has copied the bytes and acknowledged the buffer's
generation, or until the producer cancels it or closes. Retained segments count
against per-process limits (64 MiB and 256 buffers by default); a write that would
exceed either fails with :class:`ShmLimitExceeded` and creates nothing.

On POSIX a segment is a file in ``/dev/shm`` whose lifetime is its name: releasing it
unlinks it. Every name starts with a prefix the controller chooses per worker, so
:func:`sweep_segments` can remove everything a dead worker left behind. On Windows a
segment is a named mapping that lives while a handle is open; its size is rounded up
to whole pages, so a length header in front of the payload carries the exact size.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import re
import stat
import struct
import sys
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.errors import ExecutionError

if TYPE_CHECKING:
    from runtime.contracts.buffers import BufferDescriptor

    _Bytes = bytes | bytearray | memoryview

DEFAULT_MAX_BYTES = 64 << 20
DEFAULT_MAX_BUFFERS = 256
SHM_DIR = Path("/dev/shm")

#: Random part of a segment name: 8 random bytes as hex.
NAME_RANDOM_HEX = 16
_PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{2,190}-")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")

#: Windows segment header: magic, 4 pad bytes (keeps the payload 16-byte aligned), length.
LENGTH_HEADER = struct.Struct("<4s4xQ")
LENGTH_MAGIC = b"OESH"

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class ShmError(ExecutionError):
    """A shared-memory buffer could not be written or read.

    ``code`` is one of ``bad_name``, ``missing``, ``size_mismatch``, ``closed``,
    ``unsupported``, ``os_error`` or ``limit_exceeded``; ``name`` is the segment.
    """

    def __init__(self, message: str, *, code: str, name: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.name = name


class ShmLimitExceeded(ShmError):
    """A write would retain more shared memory than the per-process limit allows.

    ``limit`` is ``"bytes"`` or ``"buffers"``; ``maximum`` its value; ``retained_bytes``
    and ``retained_count`` what this process holds now; ``requested`` the write's size.
    """

    def __init__(
        self,
        *,
        limit: str,
        maximum: int,
        retained_bytes: int,
        retained_count: int,
        requested: int,
    ) -> None:
        held = f"{retained_count} buffer(s) of {retained_bytes} bytes are retained"
        if limit == "bytes":
            what = f"writing {requested} more bytes would exceed the {maximum}-byte limit"
        else:
            what = f"one more buffer would exceed the {maximum}-buffer limit"
        super().__init__(
            f"shared-memory {limit} limit exceeded: {held} in this process and {what}; "
            "the consumer must acknowledge (or the producer cancel) retained buffers first",
            code="limit_exceeded",
        )
        self.limit = limit
        self.maximum = maximum
        self.retained_bytes = retained_bytes
        self.retained_count = retained_count
        self.requested = requested


def shm_supported() -> bool:
    """Whether this platform offers named shared memory to this module."""
    return sys.platform == "win32" or SHM_DIR.is_dir()


def validate_prefix(prefix: str) -> str:
    """Check a segment-name prefix: 4-192 characters of ``[A-Za-z0-9._-]`` ending in ``-``."""
    if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):
        raise ShmError(
            f"shared-memory prefix {prefix!r:.80} is invalid; expected 4-192 characters of "
            "letters, digits, '.', '_' or '-', starting with a letter or digit and ending in '-'",
            code="bad_name",
        )
    return prefix


def validate_name(name: str) -> str:
    """Check a segment name: 1-255 characters of ``[A-Za-z0-9._-]`` (never a path)."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ShmError(
            f"shared-memory name {name!r:.80} is invalid; expected 1-255 characters of "
            "letters, digits, '.', '_' or '-', starting with a letter or digit",
            code="bad_name",
        )
    return name


def new_prefix(controller_pid: int, generation: int) -> str:
    """A fresh per-worker prefix: ``oe-<controller pid>-<generation>-<random>-``."""
    return validate_prefix(f"oe-{controller_pid}-{generation}-{os.urandom(4).hex()}-")


def segment_name(prefix: str) -> str:
    """A fresh segment name under ``prefix``."""
    return validate_prefix(prefix) + os.urandom(NAME_RANDOM_HEX // 2).hex()


def pack_length_header(nbytes: int) -> bytes:
    """The header written in front of a Windows segment's payload."""
    if nbytes < 0:
        raise ValueError(f"length {nbytes} is negative")
    return LENGTH_HEADER.pack(LENGTH_MAGIC, nbytes)


def unpack_length_header(data: _Bytes, *, name: str | None = None) -> int:
    """Read a segment's exact payload length; a mapping without our header is missing."""
    view = memoryview(data).cast("B")
    if view.nbytes < LENGTH_HEADER.size:
        raise ShmError(
            f"shared-memory segment {name} is shorter than its length header",
            code="missing",
            name=name,
        )
    magic, nbytes = LENGTH_HEADER.unpack(view[: LENGTH_HEADER.size])
    if magic != LENGTH_MAGIC:
        # A named mapping that nobody wrote reads as zeros: its producer released it.
        raise ShmError(
            f"shared-memory segment {name} has no length header; its producer released it",
            code="missing",
            name=name,
        )
    return int(nbytes)


class _Accountant:
    """What every producer of this process retains together."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.retained_bytes = 0
        self.retained_count = 0

    def reserve(self, nbytes: int, max_bytes: int, max_buffers: int) -> None:
        with self._lock:
            if self.retained_count + 1 > max_buffers:
                limit, maximum = "buffers", max_buffers
            elif self.retained_bytes + nbytes > max_bytes:
                limit, maximum = "bytes", max_bytes
            else:
                self.retained_bytes += nbytes
                self.retained_count += 1
                return
            raise ShmLimitExceeded(
                limit=limit,
                maximum=maximum,
                retained_bytes=self.retained_bytes,
                retained_count=self.retained_count,
                requested=nbytes,
            )

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.retained_bytes -= nbytes
            self.retained_count -= 1


_ACCOUNTANT = _Accountant()


def process_retained() -> tuple[int, int]:
    """``(bytes, buffers)`` retained by all producers of this process."""
    return _ACCOUNTANT.retained_bytes, _ACCOUNTANT.retained_count


if sys.platform == "win32":

    def _create_segment(name: str, data: memoryview) -> mmap.mmap | None:
        size = LENGTH_HEADER.size + data.nbytes
        mapping = mmap.mmap(-1, size, tagname=name)
        try:
            if mapping[: LENGTH_HEADER.size] != bytes(LENGTH_HEADER.size):
                raise ShmError(
                    f"shared-memory name {name} is already in use", code="os_error", name=name
                )
            mapping[: LENGTH_HEADER.size] = pack_length_header(data.nbytes)
            mapping[LENGTH_HEADER.size : size] = data
        except BaseException:
            mapping.close()
            raise
        # The mapping exists while this handle is open: the producer keeps it until released.
        return mapping

    def _release_segment(name: str, handle: mmap.mmap | None) -> None:
        if handle is not None:
            handle.close()

    def _copy_segment(name: str, destination: memoryview) -> None:
        size = LENGTH_HEADER.size + destination.nbytes
        mapping = mmap.mmap(-1, size, tagname=name)
        try:
            nbytes = unpack_length_header(mapping[: LENGTH_HEADER.size], name=name)
            if nbytes != destination.nbytes:
                raise ShmError(
                    f"shared-memory segment {name} holds {nbytes} bytes; "
                    f"its descriptor says {destination.nbytes}",
                    code="size_mismatch",
                    name=name,
                )
            with memoryview(mapping) as source:
                destination[:] = source[LENGTH_HEADER.size : size]
        finally:
            mapping.close()

    def _sweep(prefix: str) -> list[str]:
        # Named mappings vanish with their last handle: a dead producer leaves nothing.
        return []

else:

    def _allocate(fd: int, nbytes: int) -> None:
        try:
            # Allocates the pages now: a full /dev/shm fails here, not with SIGBUS later.
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as exc:
            if exc.errno != errno.EOPNOTSUPP:
                raise
            os.ftruncate(fd, nbytes)

    def _create_segment(name: str, data: memoryview) -> mmap.mmap | None:
        path = SHM_DIR / name
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | _O_NOFOLLOW | _O_CLOEXEC, 0o600)
        try:
            try:
                if data.nbytes:
                    _allocate(fd, data.nbytes)
                    with mmap.mmap(fd, data.nbytes) as mapping:
                        mapping[:] = data
            finally:
                os.close(fd)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        # POSIX keeps no handle: the name alone holds the segment until it is unlinked.
        return None

    def _release_segment(name: str, handle: mmap.mmap | None) -> None:
        # A controller may already have swept it; the name is gone either way.
        (SHM_DIR / name).unlink(missing_ok=True)

    def _copy_segment(name: str, destination: memoryview) -> None:
        try:
            fd = os.open(SHM_DIR / name, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
        except FileNotFoundError:
            raise ShmError(
                f"shared-memory segment {name} does not exist; its producer released it",
                code="missing",
                name=name,
            ) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size != destination.nbytes:
                raise ShmError(
                    f"shared-memory segment {name} holds {info.st_size} bytes; "
                    f"its descriptor says {destination.nbytes}",
                    code="size_mismatch",
                    name=name,
                )
            if destination.nbytes:
                with (
                    mmap.mmap(fd, destination.nbytes, access=mmap.ACCESS_READ) as mapping,
                    memoryview(mapping) as source,
                ):
                    destination[:] = source
        finally:
            os.close(fd)

    def _sweep(prefix: str) -> list[str]:
        try:
            entries = sorted(os.listdir(SHM_DIR))
        except FileNotFoundError:
            return []
        removed = []
        for entry in entries:
            if entry.startswith(prefix):
                try:
                    os.unlink(SHM_DIR / entry)
                except FileNotFoundError:
                    continue
                removed.append(entry)
        return removed


def sweep_segments(prefix: str) -> list[str]:
    """Remove every segment whose name starts with ``prefix``; return the names removed.

    A controller calls this after a worker exited or was killed, with the prefix it
    gave that worker.
    """
    return _sweep(validate_prefix(prefix))


@dataclass(frozen=True, slots=True)
class ShmSegment:
    """A buffer a producer wrote: its segment name, generation and exact size."""

    name: str
    generation: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class _Retained:
    name: str
    nbytes: int
    handle: mmap.mmap | None


class _Store:
    """A producer's retained segments, shared with its finalizer."""

    __slots__ = ("closed", "lock", "segments")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.segments: dict[int, _Retained] = {}
        self.closed = False

    def release_all(self) -> None:
        with self.lock:
            self.closed = True
            segments = list(self.segments.values())
            self.segments.clear()
        for segment in segments:
            _release(segment)


def _release(segment: _Retained) -> None:
    try:
        _release_segment(segment.name, segment.handle)
    finally:
        _ACCOUNTANT.release(segment.nbytes)


class ShmProducer:
    """Writes buffers into named segments and retains each until it is released.

    ``owner`` is the name descriptors carry; ``prefix`` starts every segment name.
    ``max_bytes`` and ``max_buffers`` bound what *all* producers of this process
    retain together. Thread-safe.
    """

    def __init__(
        self,
        owner: str,
        prefix: str,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_buffers: int = DEFAULT_MAX_BUFFERS,
        generations: itertools.count[int] | None = None,
    ) -> None:
        if not isinstance(owner, str) or not owner:
            raise ValueError(f"producer owner {owner!r} must be a non-empty string")
        if max_bytes < 0 or max_buffers < 0:
            raise ValueError(f"limits must be >= 0, got {max_bytes} bytes, {max_buffers} buffers")
        if not shm_supported():
            raise ShmError(
                f"no shared memory on this system ({SHM_DIR} is absent)", code="unsupported"
            )
        self.owner = owner
        self.prefix = validate_prefix(prefix)
        self.max_bytes = max_bytes
        self.max_buffers = max_buffers
        # Shared with the owner's arena, if any: a generation names one buffer of the owner.
        self._generations = generations if generations is not None else itertools.count(1)
        self._store = _Store()
        # Registered before any segment exists, so even an abandoned producer cleans up.
        self._finalizer = weakref.finalize(self, self._store.release_all)

    def put(self, data: _Bytes) -> ShmSegment:
        """Copy ``data`` into a new segment and retain it; return its name and generation."""
        view = memoryview(data).cast("B")
        nbytes = view.nbytes
        store = self._store
        with store.lock:
            if store.closed:
                raise ShmError(f"shared-memory producer {self.owner} is closed", code="closed")
            _ACCOUNTANT.reserve(nbytes, self.max_bytes, self.max_buffers)
            generation = next(self._generations)
        name = segment_name(self.prefix)
        try:
            handle = _create_segment(name, view)
        except OSError as exc:
            _ACCOUNTANT.release(nbytes)
            raise ShmError(
                f"cannot create shared-memory segment {name} of {nbytes} bytes: {exc}",
                code="os_error",
                name=name,
            ) from exc
        except BaseException:
            _ACCOUNTANT.release(nbytes)
            raise
        retained = _Retained(name, nbytes, handle)
        with store.lock:
            # A close() that ran while this segment was being written must not miss it.
            kept = not store.closed
            if kept:
                store.segments[generation] = retained
        if kept:
            return ShmSegment(name, generation, nbytes)
        _release(retained)
        raise ShmError(
            f"shared-memory producer {self.owner} was closed during a write", code="closed"
        )

    def acknowledge(self, generation: int) -> bool:
        """The consumer copied this buffer: release it. A stale or unknown ack returns False."""
        with self._store.lock:
            retained = self._store.segments.pop(generation, None)
        if retained is None:
            return False
        _release(retained)
        return True

    def cancel(self, generation: int) -> bool:
        """Withdraw a buffer the consumer will not copy (its frame was not delivered)."""
        return self.acknowledge(generation)

    def close(self) -> None:
        """Release every retained buffer. Idempotent."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._store.closed

    @property
    def retained_bytes(self) -> int:
        with self._store.lock:
            return sum(segment.nbytes for segment in self._store.segments.values())

    @property
    def retained_count(self) -> int:
        with self._store.lock:
            return len(self._store.segments)

    @property
    def retained_names(self) -> tuple[str, ...]:
        with self._store.lock:
            return tuple(segment.name for segment in self._store.segments.values())

    def __enter__(self) -> ShmProducer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class ShmConsumer:
    """Copies buffers out of segments it is handed; never releases them (the producer does).

    With ``accepted_prefix`` set, a descriptor naming any other segment is refused.
    """

    def __init__(self, accepted_prefix: str | None = None) -> None:
        self.accepted_prefix = None if accepted_prefix is None else validate_prefix(accepted_prefix)

    def _checked_name(self, descriptor: BufferDescriptor) -> str:
        if descriptor.location is None:
            raise ValueError(
                f"buffer {descriptor.owner}/{descriptor.generation} is inline, not shared"
            )
        name = validate_name(descriptor.location)
        if self.accepted_prefix is not None and not name.startswith(self.accepted_prefix):
            raise ShmError(
                f"shared-memory segment {name} is outside the accepted prefix {self.accepted_prefix}",
                code="bad_name",
                name=name,
            )
        return name

    def copy_into(self, descriptor: BufferDescriptor, destination: memoryview) -> None:
        """Copy the segment ``descriptor`` names into ``destination`` (exactly its size)."""
        name = self._checked_name(descriptor)
        target = destination.cast("B") if destination.format != "B" else destination
        if target.nbytes != descriptor.nbytes or target.readonly:
            raise ValueError(
                f"destination must be a writable buffer of {descriptor.nbytes} bytes, "
                f"got {target.nbytes} bytes (read-only: {target.readonly})"
            )
        try:
            _copy_segment(name, target)
        except OSError as exc:
            raise ShmError(
                f"cannot read shared-memory segment {name}: {exc}", code="os_error", name=name
            ) from exc

    def copy_out(self, descriptor: BufferDescriptor) -> bytearray:
        """Copy the segment ``descriptor`` names into a new bytearray."""
        out = bytearray(descriptor.nbytes)
        self.copy_into(descriptor, memoryview(out))
        return out
