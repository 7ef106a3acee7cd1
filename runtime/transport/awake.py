"""Waiting for the peer's next frame awake, when frames have been coming back to back.

A process blocked in ``read`` on a pipe is woken by the writer's system call and then waits
for the scheduler; on the two virtual cores this was measured on, that took about 60 us of
each round trip between two Python processes (66 us p50 blocking, 25 us with the reader
polling). :class:`AwakeWait` polls a pipe for a bounded time before the caller blocks on
it, and only while the gaps it measured between its own frame going out and the peer's
answer arriving stay within that time: a stage called now and then, or a call that runs
long, never spins; and each poll yields the core first (``sched_yield``), so on a busy
machine the peer this side waits for is not kept off the core by the waiting itself
(measured without the yield, with another process busy on one of two cores: a tiny call took
1.3 ms instead of 0.45). The plan decides the budget (``ThreadPlan.spin_wait_us``: zero where
the core it would burn is needed by another stage). POSIX only: elsewhere the budget is
ignored and the caller blocks at once.
"""

from __future__ import annotations

import os
import select
import sys
import time
from typing import Final

__all__ = ["AwakeWait"]

#: Gaps remembered to decide whether the next frame is likely within the budget.
_REMEMBERED: Final = 2


class AwakeWait:
    """Bounded polling of one readable descriptor before a blocking read.

    Call :meth:`sent` when this side's frame went out, :meth:`wait` before blocking for the
    answer and :meth:`arrived` once it is read. Used from one thread at a time.
    """

    def __init__(self, fd: int | None, budget_s: float) -> None:
        self.budget_s = budget_s if fd is not None and sys.platform != "win32" else 0.0
        self._poll: select.poll | None = None
        if self.budget_s > 0 and fd is not None:
            self._poll = select.poll()
            self._poll.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        self._sent_at: float | None = None
        self._gaps: list[float] = []
        #: Waits that found the frame while polling, and those that gave up and slept.
        self.caught = 0
        self.missed = 0

    @property
    def enabled(self) -> bool:
        return self._poll is not None

    def sent(self) -> None:
        """This side's frame went out: the gap to the answer counts from now."""
        if self._poll is not None:
            self._sent_at = time.perf_counter()

    def arrived(self) -> None:
        """The answer was read: remember how long it took."""
        sent_at, self._sent_at = self._sent_at, None
        if sent_at is None:
            return
        gaps = self._gaps
        gaps.append(time.perf_counter() - sent_at)
        if len(gaps) > _REMEMBERED:
            del gaps[0]

    def likely(self) -> bool:
        """Whether the last gaps were all within the budget (so polling should pay)."""
        gaps = self._gaps
        return bool(gaps) and max(gaps) <= self.budget_s

    def wait(self) -> bool:
        """Poll until the descriptor is readable or the budget is spent, when the answer is
        likely within it; True when it became readable while polling."""
        poll = self._poll
        if poll is None or self._sent_at is None or not self.likely():
            return False
        deadline = self._sent_at + self.budget_s
        clock = time.perf_counter
        while clock() < deadline:
            if poll.poll(0):
                self.caught += 1
                return True
            # The peer may be waiting for this very core (a busy machine): let it run first.
            os.sched_yield()
        self.missed += 1
        return False
