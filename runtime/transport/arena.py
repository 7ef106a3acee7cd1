"""Persistent shared-memory arenas: one mapping per producer, slots reused call after call.

A producer (the controller for a worker's inputs, each worker for its outputs) creates its
arena once, at load, sized for what it may retain at once (the retained result plus the next
call), maps it and touches every page, so no call pays for creating, faulting in or removing
memory. A buffer is a slot of the arena: it is identified by the producer's owner name and a
generation, retained until its consumer acknowledges that generation (a stale or unknown
acknowledgement is ignored), and counted against the same per-process limits as single
segments (:class:`~runtime.transport.shm.ShmLimitExceeded`, 64 MiB / 256 buffers).

The consumer maps the arena once too (:class:`ArenaReader`) and reads a buffer in place: a
read-only NumPy view that stays valid until that buffer is acknowledged. Whoever must keep
the bytes longer copies them, once.

On POSIX the arena is a file in ``/dev/shm`` named under the worker's prefix (so the
controller's sweep removes what a dead worker left); its name is unlinked when the producer
closes, and mappings still open keep the memory until they close. On Windows it is a named
mapping with the same length header as single segments; it lives while a handle is open.
"""

from __future__ import annotations

import bisect
import itertools
import mmap
import os
import stat
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .shm import (
    _ACCOUNTANT,
    _O_CLOEXEC,
    _O_NOFOLLOW,
    DEFAULT_MAX_BUFFERS,
    DEFAULT_MAX_BYTES,
    LENGTH_HEADER,
    SHM_DIR,
    ShmError,
    pack_length_header,
    segment_name,
    shm_supported,
    unpack_length_header,
    validate_name,
    validate_prefix,
)

if TYPE_CHECKING:
    from runtime.contracts.buffers import BufferDescriptor

#: Every slot starts on this boundary (cache lines; what ONNX Runtime's CPU kernels like).
ALIGNMENT = 64
#: The most arenas one reader keeps mapped (one per producer it talks to, in practice).
MAX_MAPPED_ARENAS = 8
PAGE = mmap.PAGESIZE


def _aligned(nbytes: int) -> int:
    return max(ALIGNMENT, (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT)


def arena_size_for(buffer_sizes: list[int], copies: int = 2) -> int:
    """An arena that holds ``copies`` sets of these buffers at once, in whole pages."""
    total = copies * sum(_aligned(size) for size in buffer_sizes)
    return max(PAGE, (total + PAGE - 1) // PAGE * PAGE)


@dataclass(frozen=True, slots=True)
class ArenaSlot:
    """One buffer of an arena: where it lies, and the generation its consumer acknowledges."""

    generation: int
    offset: int
    nbytes: int


if sys.platform == "win32":

    def _create_mapping(name: str, size: int) -> tuple[mmap.mmap, int]:
        total = LENGTH_HEADER.size + size
        mapping = mmap.mmap(-1, total, tagname=name)
        if mapping[: LENGTH_HEADER.size] != bytes(LENGTH_HEADER.size):
            mapping.close()
            raise ShmError(
                f"shared-memory name {name} is already in use", code="os_error", name=name
            )
        mapping[: LENGTH_HEADER.size] = pack_length_header(size)
        return mapping, LENGTH_HEADER.size

    def _unlink(name: str) -> None:
        # A named mapping vanishes with its last handle.
        return

    def _open_mapping(name: str) -> tuple[mmap.mmap, int, int]:
        probe = mmap.mmap(-1, LENGTH_HEADER.size, tagname=name)
        try:
            size = unpack_length_header(probe[: LENGTH_HEADER.size], name=name)
        finally:
            probe.close()
        mapping = mmap.mmap(-1, LENGTH_HEADER.size + size, tagname=name, access=mmap.ACCESS_READ)
        return mapping, LENGTH_HEADER.size, size

else:
    from .shm import _allocate

    def _create_mapping(name: str, size: int) -> tuple[mmap.mmap, int]:
        path = SHM_DIR / name
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | _O_NOFOLLOW | _O_CLOEXEC, 0o600)
        try:
            _allocate(fd, size)
            mapping = mmap.mmap(fd, size)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        return mapping, 0

    def _unlink(name: str) -> None:
        (SHM_DIR / name).unlink(missing_ok=True)

    def _open_mapping(name: str) -> tuple[mmap.mmap, int, int]:
        try:
            fd = os.open(SHM_DIR / name, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
        except FileNotFoundError:
            raise ShmError(
                f"shared-memory arena {name} does not exist; its producer closed it",
                code="missing",
                name=name,
            ) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size <= 0:
                raise ShmError(
                    f"shared-memory arena {name} is not a mappable segment",
                    code="size_mismatch",
                    name=name,
                )
            return mmap.mmap(fd, info.st_size, access=mmap.ACCESS_READ), 0, info.st_size
        finally:
            os.close(fd)


class _Slots:
    """The arena's bookkeeping, shared with its finalizer: free ranges and retained slots."""

    __slots__ = ("closed", "lock", "mapping", "name", "offsets", "pinned", "retained", "sizes")

    def __init__(self, name: str, mapping: mmap.mmap) -> None:
        self.lock = threading.Lock()
        self.name = name
        self.mapping: mmap.mmap | None = mapping
        # Retained slots by generation, and their starts sorted (first-fit allocation).
        self.retained: dict[int, ArenaSlot] = {}
        self.offsets: list[int] = []
        self.sizes: dict[int, int] = {}
        # Pinned slots (kept across acknowledgements) and how many sends the peer has not
        # acknowledged yet; unpinning frees one once that count is zero.
        self.pinned: dict[int, int] = {}
        self.closed = False

    def release_all(self) -> None:
        with self.lock:
            self.closed = True
            slots = list(self.retained.values())
            self.retained.clear()
            self.pinned.clear()
            self.offsets.clear()
            self.sizes.clear()
            mapping, self.mapping = self.mapping, None
        for slot in slots:
            _ACCOUNTANT.release(slot.nbytes)
        _unlink(self.name)
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:
                # Views handed out still point into it; the mapping goes with the last of them.
                pass


class ShmArena:
    """A producer's persistent arena of ``size`` bytes under ``prefix``. Thread-safe.

    :meth:`allocate` reserves a slot and returns it with a writable view (a worker has ONNX
    Runtime write its outputs there); :meth:`put` copies bytes into a new slot. Both return
    ``None`` when no free range is large enough, and the caller falls back to a single
    segment. :meth:`acknowledge` releases a slot by generation.
    """

    def __init__(
        self,
        owner: str,
        prefix: str,
        size: int,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_buffers: int = DEFAULT_MAX_BUFFERS,
        generations: itertools.count[int] | None = None,
    ) -> None:
        if not isinstance(owner, str) or not owner:
            raise ValueError(f"arena owner {owner!r} must be a non-empty string")
        if size <= 0:
            raise ValueError(f"arena size {size} must be > 0")
        if not shm_supported():
            raise ShmError(
                f"no shared memory on this system ({SHM_DIR} is absent)", code="unsupported"
            )
        self.owner = owner
        self.prefix = validate_prefix(prefix)
        self.size = (size + PAGE - 1) // PAGE * PAGE
        self.max_bytes = max_bytes
        self.max_buffers = max_buffers
        self.name = segment_name(self.prefix)
        self._generations = generations if generations is not None else itertools.count(1)
        try:
            mapping, self._base = _create_mapping(self.name, self.size)
        except OSError as exc:
            raise ShmError(
                f"cannot create a shared-memory arena {self.name} of {self.size} bytes: {exc}",
                code="os_error",
                name=self.name,
            ) from exc
        self._slots = _Slots(self.name, mapping)
        # Registered before any slot exists, so even an abandoned arena is removed.
        self._finalizer = weakref.finalize(self, self._slots.release_all)
        self._memory = np.frombuffer(mapping, dtype=np.uint8, count=self.size, offset=self._base)
        # Touch every page once, now: no call faults the arena in later.
        self._memory[::PAGE] = 0

    # Slots.

    def allocate(self, nbytes: int) -> tuple[ArenaSlot, np.ndarray[Any, Any]] | None:
        """Reserve a slot of ``nbytes`` and return it with a writable ``uint8`` view of it."""
        slots = self._slots
        need = _aligned(nbytes)
        with slots.lock:
            if slots.closed:
                raise ShmError(f"shared-memory arena {self.name} is closed", code="closed")
            offset = self._first_fit(need)
            if offset is None:
                return None
            _ACCOUNTANT.reserve(nbytes, self.max_bytes, self.max_buffers)
            slot = ArenaSlot(next(self._generations), offset, nbytes)
            bisect.insort(slots.offsets, offset)
            slots.sizes[offset] = need
            slots.retained[slot.generation] = slot
        return slot, self._memory[offset : offset + nbytes]

    def _first_fit(self, need: int) -> int | None:
        start = 0
        for offset in self._slots.offsets:
            if offset - start >= need:
                return start
            start = offset + self._slots.sizes[offset]
        return start if self.size - start >= need else None

    def put(self, data: np.ndarray[Any, Any], *, pin: bool = False) -> ArenaSlot | None:
        """Copy a contiguous array's bytes into a new slot (None: no room; nothing written).

        A ``pin``-ned slot outlives its consumer's acknowledgements: it may be sent again
        (:meth:`reuse`) and is freed by :meth:`unpin`."""
        source = data.reshape(-1).view(np.uint8)
        found = self.allocate(source.nbytes)
        if found is None:
            return None
        slot, view = found
        try:
            np.copyto(view, source)
        except BaseException:
            self.acknowledge(slot.generation)
            raise
        if pin:
            with self._slots.lock:
                self._slots.pinned[slot.generation] = 1
        return slot

    def reuse(self, generation: int) -> bool:
        """A pinned slot is sent once more (its consumer acknowledges that send too); False
        for a slot that is not pinned."""
        slots = self._slots
        with slots.lock:
            if slots.pinned.get(generation, -1) < 0 or generation not in slots.retained:
                return False
            slots.pinned[generation] += 1
            return True

    def unpin(self, generation: int) -> bool:
        """Stop keeping a pinned slot: freed now, or at the acknowledgement of its last send
        still out. False for a slot that is not pinned."""
        slots = self._slots
        with slots.lock:
            uses = slots.pinned.pop(generation, None)
            if uses is None:
                return False
            if uses > 0:
                # Freed when the consumer acknowledges what it still reads.
                slots.pinned[generation] = -uses
                return True
        self._free(generation)
        return True

    def acknowledge(self, generation: int) -> bool:
        """The consumer is done with this buffer: free its slot (a pinned slot stays until
        :meth:`unpin`). Stale or unknown: False."""
        slots = self._slots
        with slots.lock:
            uses = slots.pinned.get(generation)
            if uses is not None:
                if uses > 0:
                    slots.pinned[generation] = uses - 1
                    return True
                if uses == 0:
                    # Kept, with no send out: a stale or duplicate acknowledgement.
                    return False
                if uses < -1:
                    slots.pinned[generation] = uses + 1
                    return True
                # The last send out of an unpinned slot: now it goes.
                del slots.pinned[generation]
        return self._free(generation)

    def _free(self, generation: int) -> bool:
        slots = self._slots
        with slots.lock:
            slot = slots.retained.pop(generation, None)
            if slot is None:
                return False
            slots.offsets.remove(slot.offset)
            del slots.sizes[slot.offset]
        _ACCOUNTANT.release(slot.nbytes)
        return True

    def pinned(self, generation: int) -> bool:
        """Whether ``generation`` is a pinned slot still kept for another send."""
        with self._slots.lock:
            return self._slots.pinned.get(generation, -1) >= 0

    def owns(self, generation: int) -> bool:
        with self._slots.lock:
            return generation in self._slots.retained

    # State and lifetime.

    @property
    def retained_count(self) -> int:
        with self._slots.lock:
            return len(self._slots.retained)

    @property
    def retained_bytes(self) -> int:
        with self._slots.lock:
            return sum(slot.nbytes for slot in self._slots.retained.values())

    @property
    def closed(self) -> bool:
        return self._slots.closed

    def close(self) -> None:
        """Free every slot, remove the arena's name and unmap it. Idempotent."""
        self._memory = np.empty(0, dtype=np.uint8)
        self._finalizer()


class ArenaReader:
    """Maps the arenas a peer names (under ``accepted_prefix``) and reads buffers in place."""

    def __init__(self, accepted_prefix: str | None = None) -> None:
        self.accepted_prefix = None if accepted_prefix is None else validate_prefix(accepted_prefix)
        self._lock = threading.Lock()
        self._mapped: dict[str, tuple[mmap.mmap, np.ndarray[Any, Any]]] = {}

    def view(self, descriptor: BufferDescriptor, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        """A read-only array over the bytes ``descriptor`` names (valid until acknowledged)."""
        if descriptor.location is None or descriptor.offset is None:
            raise ValueError(
                f"buffer {descriptor.owner}/{descriptor.generation} is not in an arena"
            )
        name = descriptor.location
        # An arena mapped already had its name checked when it was mapped.
        found = self._mapped.get(name)
        if found is not None:
            memory = found[1]
        else:
            validate_name(name)
            if self.accepted_prefix is not None and not name.startswith(self.accepted_prefix):
                raise ShmError(
                    f"shared-memory arena {name} is outside the accepted prefix "
                    f"{self.accepted_prefix}",
                    code="bad_name",
                    name=name,
                )
            memory = self._memory(name)
        end = descriptor.offset + descriptor.nbytes
        if end > memory.nbytes:
            raise ShmError(
                f"buffer {descriptor.owner}/{descriptor.generation} at offset {descriptor.offset} "
                f"of {descriptor.nbytes} bytes ends past arena {name} ({memory.nbytes} bytes)",
                code="size_mismatch",
                name=name,
            )
        raw = memory[descriptor.offset : end]
        return raw.view(dtype).reshape(descriptor.shape)

    def _memory(self, name: str) -> np.ndarray[Any, Any]:
        with self._lock:
            found = self._mapped.get(name)
            if found is not None:
                return found[1]
            if len(self._mapped) >= MAX_MAPPED_ARENAS:
                raise ShmError(
                    f"shared-memory arena {name} would be the {MAX_MAPPED_ARENAS + 1}th this "
                    f"reader maps; accepted: at most {MAX_MAPPED_ARENAS}",
                    code="limit_exceeded",
                    name=name,
                )
            try:
                mapping, base, size = _open_mapping(name)
            except OSError as exc:
                raise ShmError(
                    f"cannot map shared-memory arena {name}: {exc}", code="os_error", name=name
                ) from exc
            memory = np.frombuffer(mapping, dtype=np.uint8, count=size, offset=base)
            self._mapped[name] = (mapping, memory)
            return memory

    def close(self) -> None:
        """Unmap every arena (views still alive keep theirs until they go). Idempotent."""
        with self._lock:
            mapped = list(self._mapped.values())
            self._mapped.clear()
        for mapping, _ in mapped:
            try:
                mapping.close()
            except BufferError:
                pass
