"""The server's queue per pipeline: a request to a busy pipeline waits its turn.

The runtime admits what a pipeline can run at once (one graph request, or up to a language
model's ``max_num_seqs``) and refuses the rest with ``ResourceUnavailable``. An
:class:`AdmissionQueue` lets such a request wait on the server's event loop instead, in
strict arrival order, up to ``max_queue`` waiting; beyond that the client gets 429 with
``Retry-After`` naming the queue and its size.

The head of the queue tries again whenever the pipeline winds a request up
(``RequestFinished`` on the pipeline's event bus, handed to the loop) and its ``has_room``
says a slot is free (a refused try is not free: it prepares the request, e.g. phonemizes
it, beside the request running); as a safety net it tries anyway every :data:`RETRY_S`. A waiter whose client disconnects (its handler task is cancelled)
leaves the queue at once; an admission that completes after its client went is closed, so
no slot is held for a gone client. :meth:`AdmissionQueue.close` (the server stopping) fails
every waiter with a 503 and refuses new ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from typing import TYPE_CHECKING, Final, Protocol, TypeVar

from runtime.errors import ResourceUnavailable
from runtime.events import RequestFinished
from runtime.serve.errors import RATE_LIMIT, RETRY_AFTER_S, SERVER, ApiError

if TYPE_CHECKING:
    from collections.abc import Callable

    from runtime.events import Event, EventBus

#: Requests that may wait for each pipeline unless ``--max-queue`` says otherwise: eight
#: clients with a request each, twice over.
DEFAULT_MAX_QUEUE: Final = 16
#: How often the head of a queue tries again without being woken, in seconds.
RETRY_S: Final = 5.0


class Closable(Protocol):
    def close(self) -> None: ...


A = TypeVar("A", bound=Closable)


class _Waiter:
    __slots__ = ("failure", "wake")

    def __init__(self) -> None:
        self.wake = asyncio.Event()
        self.failure: ApiError | None = None


def _close_if_admitted(future: asyncio.Future[A]) -> None:
    """An admission whose waiter went away meanwhile: give its slot back at once."""
    if future.cancelled() or future.exception() is not None:
        return
    future.result().close()


class AdmissionQueue:
    """The bounded FIFO queue of one pipeline, used from the server's event loop only
    (``depth`` and :meth:`close` may be read or called from any thread).

    ``max_queue`` 0 keeps no queue: a busy pipeline's refusal goes to the client at once.
    ``has_room`` says whether the pipeline would admit a request now (by its own count);
    ``on_change`` hears the depth after every change (on the loop)."""

    def __init__(
        self,
        name: str,
        max_queue: int,
        events: EventBus,
        *,
        has_room: Callable[[], bool] | None = None,
        on_change: Callable[[str, int], None] | None = None,
    ) -> None:
        if max_queue < 0:
            raise ValueError(f"max_queue is {max_queue}; accepted: 0 or more")
        self.name = name
        self.max_queue = max_queue
        self.on_change = on_change
        self._has_room = has_room or (lambda: True)
        self._waiters: deque[_Waiter] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        #: Requests wound up so far: the head tries again when this moved.
        self._frees = 0
        self._closed: str | None = None
        self._unsubscribe = events.subscribe(self._on_event)

    @property
    def depth(self) -> int:
        """Requests waiting now."""
        return len(self._waiters)

    # -- what wakes the head (any thread, then the loop) -----------------------------------

    def _on_event(self, event: Event) -> None:
        if isinstance(event, RequestFinished):
            self._call_on_loop(self._freed)

    def _call_on_loop(self, callback: Callable[[], None]) -> None:
        with self._lock:
            loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop has stopped: nobody waits
            loop.call_soon_threadsafe(callback)

    def _freed(self) -> None:
        self._frees += 1
        self._wake_head()

    def _wake_head(self) -> None:
        if self._waiters:
            self._waiters[0].wake.set()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self.name, len(self._waiters))

    # -- admission (the loop) --------------------------------------------------------------

    async def admit(self, attempt: Callable[[], A]) -> A:
        """``attempt()``'s result (run off the loop) once the pipeline admits it, trying in
        arrival order; ApiError 429 when the queue is full, 503 when the server stops."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._loop = loop
        if self._closed is not None:
            raise self._stopping()
        if self.max_queue == 0:
            return await self._try(loop, attempt)
        if self._waiters and len(self._waiters) >= self.max_queue:
            raise self._full()
        waiter = _Waiter()
        self._waiters.append(waiter)
        self._changed()
        try:
            # ``due``: something changed since the last try; ``forced``: try even if the
            # pipeline's count says it is full (arriving at the head of an empty queue, and on
            # the safety net's timeout).
            due, forced = True, len(self._waiters) == 1
            while True:
                if self._waiters[0] is waiter and due and (forced or self._has_room()):
                    seen = self._frees
                    try:
                        return await self._try(loop, attempt)
                    except ResourceUnavailable:
                        # Counted with the others only now that it waits.
                        if len(self._waiters) > self.max_queue:
                            raise self._full() from None
                    due, forced = self._frees != seen, False
                    if due:
                        continue  # a slot freed while it was trying
                if waiter.failure is not None:
                    raise waiter.failure
                waiter.wake.clear()
                try:
                    await asyncio.wait_for(waiter.wake.wait(), RETRY_S)
                except TimeoutError:
                    forced = True
                if waiter.failure is not None:
                    raise waiter.failure
                due = True
        finally:
            was_head = bool(self._waiters) and self._waiters[0] is waiter
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
            self._changed()
            if was_head:
                # The next in line tries at once (a language model may have more slots).
                self._wake_head()

    @staticmethod
    async def _try(loop: asyncio.AbstractEventLoop, attempt: Callable[[], A]) -> A:
        # Preparing a request (phonemizing, converting arrays) runs off the server's loop.
        future = loop.run_in_executor(None, attempt)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(_close_if_admitted)
            raise

    def _full(self) -> ApiError:
        return ApiError(
            429,
            f"pipeline {self.name} is busy and its queue is full ({self.max_queue} requests "
            f"wait, the server's --max-queue {self.max_queue}); retry after {RETRY_AFTER_S} s, "
            "or start the server with a larger --max-queue",
            type=RATE_LIMIT,
            code="queue_full",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    def _stopping(self) -> ApiError:
        return ApiError(
            503,
            f"the server is stopping; the request waiting for pipeline {self.name} was not run "
            f"({self._closed})",
            type=SERVER,
            code="server_stopping",
        )

    # -- the end (any thread) --------------------------------------------------------------

    def close(self, reason: str = "the server stopped") -> None:
        """Fail every waiter with a 503 and refuse new ones; stop listening. Idempotent."""
        if self._closed is not None:
            return
        self._closed = reason
        self._unsubscribe()
        self._call_on_loop(self._fail_all)

    def _fail_all(self) -> None:
        for waiter in self._waiters:
            waiter.failure = self._stopping()
            waiter.wake.set()
