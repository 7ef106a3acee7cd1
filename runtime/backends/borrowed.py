"""A caller's thread reading a stage's result pipe itself, while the event loop lets it.

A direct call (:meth:`GraphStageClient.call_direct`) blocks a thread other than the loop's
until its result arrives. Letting the loop read that result and hand it over costs two
wake-ups (the loop's, then the caller's) and a hop between threads; instead the loop *lends*
the pipe: it stops watching it, and the caller's thread waits on the pipe (and on a wake-up
pipe of its own) and decodes the frames itself. Its own call's result, and the
acknowledgements of its inputs the worker writes with it, it takes at once; every other frame
(an error report, a stale result) goes to the loop as if the loop had read it. The loop
takes the pipe back

* once no direct call came for :data:`IDLE_S` (a timer on the loop: a worker that dies
  between calls is noticed within that time),
* before anything of its own needs the pipe (an asynchronous call, closing the stage), and
* at once when the borrowing thread meets the end of the stream or a malformed frame: the
  loop then reads, and reports, that end as it always does.

Whoever reads holds no state the other needs: the channel's decoder is shared, and only one
of them reads at a time. A cancel, the worker's death or closing the stage fail the call's
future from the loop; the future wakes the borrowing thread through the wake-up pipe.
POSIX only (the loop watches pipes there); elsewhere direct calls take the loop's way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import threading
import time
from typing import TYPE_CHECKING, Any, Final

from runtime.transport.awake import AwakeWait

if TYPE_CHECKING:
    import concurrent.futures as cf
    from collections.abc import Callable

    from runtime.contracts.codec import Frame
    from runtime.transport.channel import FramedChannel

__all__ = ["IDLE_S", "BorrowedReader"]

#: How long the loop leaves the pipe lent after the last direct call, in seconds.
IDLE_S: Final = 0.02
#: How long a borrowing thread waits for the loop to lend the pipe before it gives up.
LEND_TIMEOUT_S: Final = 5.0


class BorrowedReader:
    """The lending of one channel's pipe between its loop and direct callers.

    ``take(frame)`` runs on the borrowing thread and returns True when it took the frame
    (its own call's result); any other frame goes to ``on_frame`` on the loop. A read of
    whole frames is offered to ``take_whole(bytes)`` first (True: it took them all, by their
    layout), and ``learn(bytes, frames)`` sees each read of whole frames decoded the usual
    way. ``usable()`` says whether the stage may still be read directly (not failed, not
    closing).
    """

    def __init__(
        self,
        channel: FramedChannel,
        loop: asyncio.AbstractEventLoop,
        *,
        take: Callable[[Frame], bool],
        on_frame: Callable[[Frame], None],
        usable: Callable[[], bool],
        spin_wait_s: float = 0.0,
        take_whole: Callable[[memoryview], bool] | None = None,
        learn: Callable[[memoryview, list[Frame]], None] | None = None,
    ) -> None:
        self._channel = channel
        #: Polling for the result awake before sleeping (:mod:`runtime.transport.awake`).
        self.awake = AwakeWait(channel.read_fd, spin_wait_s)
        self._loop = loop
        self._take = take
        self._on_frame = on_frame
        self._usable = usable
        self._take_whole = take_whole
        self._learn = learn
        #: Held by a direct call for as long as it runs.
        self.lock = threading.Lock()
        self._lent = False
        #: Direct calls that ran with the pipe lent (their thread read the result itself).
        self.lent_calls = 0
        self._last_call = 0.0
        self._wake: tuple[int, int] | None = None
        self._poll: Any = None
        self._closed = False

    @property
    def lent(self) -> bool:
        return self._lent

    # -- the borrowing thread (holding ``lock``) -------------------------------------------

    def borrow(self) -> bool:
        """Have the pipe lent to this thread (a no-op while it is); False when the loop
        keeps it (the caller then waits for the loop to hand its result over)."""
        if self._lent:
            self.lent_calls += 1
            return True
        if self._closed or self._loop.is_closed() or self._channel.read_fd is None:
            return False
        if self._wake is None:
            reader, writer = os.pipe()
            os.set_blocking(reader, False)
            os.set_blocking(writer, False)
            self._wake = (reader, writer)
            poll = select.poll()
            poll.register(self._channel.read_fd, select.POLLIN)
            poll.register(reader, select.POLLIN)
            self._poll = poll
        lent = threading.Event()
        outcome: list[bool] = []

        def lend() -> None:
            granted = not self._closed and self._usable() and self._channel.pause_loop_reader()
            if granted:
                self._lent = True
                self._loop.call_later(IDLE_S, self._take_back_when_idle)
            outcome.append(granted)
            lent.set()

        try:
            self._loop.call_soon_threadsafe(lend)
        except RuntimeError:
            return False
        if not lent.wait(LEND_TIMEOUT_S):
            return False
        if outcome[0]:
            self.lent_calls += 1
        return outcome[0]

    def wait(self, future: cf.Future[Any]) -> None:
        """Read the pipe until ``future`` is done (or hand the pipe back to the loop at the
        end of the stream or a malformed frame: the loop then fails the future)."""
        assert self._wake is not None
        wake_reader, wake_writer = self._wake
        reader = threading.get_ident()

        def wake(_: cf.Future[Any]) -> None:
            if threading.get_ident() != reader:
                with contextlib.suppress(OSError):
                    os.write(wake_writer, b"\0")

        future.add_done_callback(wake)
        fd = self._channel.read_fd
        poll = self._poll
        if self.awake.wait() and not self._read_once():
            return
        while not future.done():
            events = poll.poll()
            readable = False
            for ready, _ in events:
                if ready == wake_reader:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(wake_reader, 64):
                            pass
                elif ready == fd:
                    readable = True
            if readable and not self._read_once():
                return

    def _read_once(self) -> bool:
        """Take what the pipe holds now; False once the pipe was handed back to the loop."""
        read = self._channel.read_borrowed(self._take_whole)
        if read is None:
            self._hand_back()
            return False
        frames, whole = read
        if whole is not None and self._learn is not None:
            self._learn(whole, frames)
        for frame in frames:
            if not self._take(frame):
                self._loop.call_soon_threadsafe(self._on_frame, frame)
        return True

    def called(self) -> None:
        """A direct call ended (the idle timer counts from here)."""
        self._last_call = time.monotonic()

    def _hand_back(self) -> None:
        # Not lent from now on for any thread; the loop watches the pipe again.
        self._lent = False
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._channel.resume_loop_reader)

    # -- the loop -------------------------------------------------------------------------

    def _take_back_when_idle(self) -> None:
        if not self._lent:
            return
        if not self.lock.acquire(blocking=False):
            self._loop.call_later(IDLE_S, self._take_back_when_idle)
            return
        try:
            idle = time.monotonic() - self._last_call
            if idle < IDLE_S and self._usable() and not self._closed:
                self._loop.call_later(IDLE_S - idle + 0.001, self._take_back_when_idle)
                return
            self._lent = False
            self._channel.resume_loop_reader()
        finally:
            self.lock.release()

    async def take_back(self, timeout_s: float) -> None:
        """Watch the pipe on the loop again now, once a direct call in progress has ended
        (within ``timeout_s``; after that the loop takes it anyway)."""
        if not self._lent:
            return
        deadline = time.monotonic() + timeout_s
        acquired = self.lock.acquire(blocking=False)
        while not acquired and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
            acquired = self.lock.acquire(blocking=False)
        try:
            if self._lent:
                self._lent = False
                self._channel.resume_loop_reader()
        finally:
            if acquired:
                self.lock.release()

    def close(self) -> None:
        """No more lending; the wake-up pipe is closed (on the loop, after the stage ended)."""
        self._closed = True
        wake, self._wake = self._wake, None
        self._poll = None
        if wake is not None:
            for fd in wake:
                with contextlib.suppress(OSError):
                    os.close(fd)
