"""Streaming input: the chunks a caller feeds a running request, as its program reads them.

A request submitted with ``streaming=True`` owns one :class:`InputStream`. The caller's thread
feeds it through :meth:`InputStream.feed_threadsafe` / :meth:`InputStream.end_threadsafe`
(each hops onto the request's loop); the program iterates it on the loop
(``async for chunk in stream``) until the caller ends its input. A cancel wakes a program
waiting for the next chunk with ``RequestCancelled``.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from runtime.errors import RequestCancelled, ResourceUnavailable, UsageError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence

#: Fed bytes a program may be behind its caller: 64 MiB is 17 minutes of 16 kHz float32
#: audio, so a live source never meets it, while a caller feeding far faster than the
#: program reads is told at once instead of growing the process without bound.
MAX_PENDING_INPUT_BYTES = 64 << 20


def chunk_bytes(chunk: object) -> int:
    """The bytes a fed chunk holds (arrays, mappings of arrays, bytes; 0 for anything else)."""
    if isinstance(chunk, np.ndarray):
        return int(chunk.nbytes)
    if isinstance(chunk, bytes | bytearray | memoryview):
        return len(chunk)
    if isinstance(chunk, dict):
        return sum(chunk_bytes(value) for value in chunk.values())
    return 0


class InputStream:
    """The chunks of one streaming request, in the order they were fed.

    The caller-side state (``ended``) is guarded by a lock so that ``feed`` after
    ``end_input`` is refused in the caller's thread; the queue itself lives on the loop."""

    def __init__(
        self, request_id: str, *, max_pending_bytes: int = MAX_PENDING_INPUT_BYTES
    ) -> None:
        self.request_id = request_id
        self._lock = threading.Lock()
        self._ended = False
        #: Bytes fed and not yet read by the program (both sides, under the lock).
        self._pending_bytes = 0
        self.max_pending_bytes = max_pending_bytes
        self._loop: asyncio.AbstractEventLoop | None = None
        # Loop side: chunks not yet read, whether the end arrived, and a failure to raise.
        self._chunks: deque[Any] = deque()
        self._end = False
        self._failure: BaseException | None = None
        self._ready: asyncio.Event | None = None
        #: Chunks fed so far (caller side), for messages and tests.
        self.fed = 0

    # -- caller's thread --------------------------------------------------------------

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the request runs on (set once, before the first chunk is fed)."""
        self._loop = loop

    @property
    def ended(self) -> bool:
        """The caller ended its input (or the request ended it by failing or cancelling)."""
        with self._lock:
            return self._ended

    def feed_threadsafe(self, chunk: Any) -> None:
        """Queue one checked chunk from any thread; UsageError once the input has ended."""
        with self._lock:
            if self._ended:
                raise UsageError(
                    f"request {self.request_id}: its input has ended; feed() is accepted only "
                    "before end_input()"
                )
            size = chunk_bytes(chunk)
            if self._pending_bytes and self._pending_bytes + size > self.max_pending_bytes:
                raise ResourceUnavailable(
                    f"request {self.request_id}: {self._pending_bytes} fed bytes are not read "
                    f"yet and this chunk adds {size}; at most {self.max_pending_bytes} may "
                    "wait: read the request's outputs or feed more slowly"
                )
            self._pending_bytes += size
            self.fed += 1
            self._call(self._put, (chunk, size))

    def end_threadsafe(self) -> None:
        """No more chunks (from any thread); idempotent."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
            self._call(self._put_end)

    def _call(self, callback: Any, *args: Any) -> None:
        loop = self._loop
        if loop is None:
            raise UsageError(f"request {self.request_id} is not running")
        if not loop.is_closed():
            loop.call_soon_threadsafe(callback, *args)

    # -- loop --------------------------------------------------------------------------

    def fail(self, exc: BaseException) -> None:
        """Wake the reader with ``exc`` (a cancel, a failure); later chunks are dropped."""
        with self._lock:
            self._ended = True
        self._failure = exc
        self._wake()

    def _put(self, item: tuple[Any, int]) -> None:
        if self._failure is None and not self._end:
            self._chunks.append(item)
            self._wake()
        else:
            self._read(item[1])

    def _read(self, size: int) -> None:
        with self._lock:
            self._pending_bytes -= size

    @property
    def pending_bytes(self) -> int:
        """Bytes fed that the program has not read yet."""
        with self._lock:
            return self._pending_bytes

    def _put_end(self) -> None:
        self._end = True
        self._wake()

    def _wake(self) -> None:
        if self._ready is not None:
            self._ready.set()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        while True:
            if self._failure is not None:
                raise self._failure
            if self._chunks:
                chunk, size = self._chunks.popleft()
                self._read(size)
                return chunk
            if self._end:
                raise StopAsyncIteration
            if self._ready is None:
                self._ready = asyncio.Event()
            self._ready.clear()
            await self._ready.wait()


def cancelled_input(request_id: str) -> RequestCancelled:
    """What a program reading a cancelled request's input gets."""
    return RequestCancelled(f"request {request_id} was cancelled")


def concatenated_chunks(
    chunks: Sequence[Mapping[str, np.ndarray]], *, pipeline: str
) -> dict[str, np.ndarray]:
    """Chunks of a mapping of arrays joined along axis 0, input by input (UsageError naming
    the chunk and input when the names, dtypes or trailing shapes differ)."""
    if not chunks:
        raise UsageError(
            f"pipeline {pipeline}: the streaming request ended with no input; accepted: at "
            "least one feed() before end_input()"
        )
    names = list(chunks[0])
    for index, chunk in enumerate(chunks[1:], start=1):
        if sorted(chunk) != sorted(names):
            raise UsageError(
                f"pipeline {pipeline}: chunk {index} has inputs {sorted(chunk)}; accepted: "
                f"the inputs of the first chunk, {sorted(names)}"
            )
    joined: dict[str, np.ndarray] = {}
    for name in names:
        parts = [chunk[name] for chunk in chunks]
        first = parts[0]
        for index, part in enumerate(parts[1:], start=1):
            if part.dtype != first.dtype or part.shape[1:] != first.shape[1:]:
                raise UsageError(
                    f"pipeline {pipeline}: chunk {index}'s {name!r} is {part.dtype} "
                    f"{part.shape}; accepted: {first.dtype} with trailing shape {first.shape[1:]}"
                    " (chunks are joined along axis 0)"
                )
        joined[name] = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
    return joined
