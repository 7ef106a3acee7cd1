"""A graph stage's slot: one call and one retained result at a time, whichever client serves it.

Both graph clients (:class:`~runtime.backends.graph.GraphStageClient`, a worker process, and
:class:`~runtime.backends.inprocess.InProcessGraphClient`) keep the same flow rules through
one :class:`GraphSlot`: a call takes the slot (a second one is refused while it is held),
delivering the result does not free it, acknowledging does; cancelling fences the request at
once, frees a retained result and keeps the stage, while cancelling an *active* call fences it
and retires the stage. What freeing, fencing and retiring mean for a worker process or for a
session in this process, the client says (:class:`SlotStage`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from runtime.errors import ResourceUnavailable

if TYPE_CHECKING:
    import asyncio

    from runtime.contracts import RequestKey

__all__ = ["GraphSlot", "SlotStage"]


class SlotStage(Protocol):
    """What a graph client does for its slot."""

    @property
    def name(self) -> str: ...

    def _free_result(self) -> None:
        """The retained result's arrays are no longer the caller's: give back their buffers."""

    def _drop_kept(self, request_id: str) -> None:
        """The request ended or was cancelled: the inputs it kept between calls go."""

    def _fence(self, key: RequestKey, call: asyncio.Future[Any] | None) -> None:
        """Fail the waiters of ``key``'s active call with RequestCancelled and ask it to stop."""

    async def _retire_cancelled(self) -> None:
        """Mark the stage retired (an active call was cancelled) and wait for its retirement."""


class GraphSlot:
    """Who holds a graph stage's slot (in flight or retained) and whether its call runs."""

    def __init__(self, stage: SlotStage) -> None:
        self._stage = stage
        self._holder: RequestKey | None = None
        self._running = False
        #: The call's outcome where the stage owns its outputs: once it is in, a cancel finds
        #: nothing left to stop (a worker's result stays active until its caller takes it).
        self._call: asyncio.Future[Any] | None = None

    @property
    def holder(self) -> RequestKey | None:
        """The request holding the slot, if any."""
        return self._holder

    @property
    def running(self) -> bool:
        """Whether the holder's call has not returned to its caller yet."""
        return self._running

    @property
    def call(self) -> asyncio.Future[Any] | None:
        """The running call's outcome, as given to :meth:`take`."""
        return self._call

    def check_free(self) -> None:
        """Refuse a call while the slot is held."""
        if self._holder is not None:
            raise ResourceUnavailable(
                f"{self._stage.name} is busy with {self._holder.request_id}: one call and one "
                "retained result at a time; acknowledge or cancel it first"
            )

    def take(self, key: RequestKey, *, call: asyncio.Future[Any] | None = None) -> None:
        """``key``'s call starts: it holds the slot until acknowledged or cancelled."""
        self.check_free()
        self._holder, self._running, self._call = key, True, call

    def ended(self) -> None:
        """The call returned to its caller (or failed); a result it gave stays retained."""
        self._running, self._call = False, None

    def free(self) -> None:
        """Nobody holds the slot; a retained result's buffers go back."""
        self._holder = None
        self.ended()
        self._stage._free_result()

    def acknowledge(self, key: RequestKey) -> bool:
        """Free the slot of ``key``'s retained result (False: not ``key``'s, or still running)."""
        if self._holder is None or self._holder != key or self._running:
            return False
        self.free()
        return True

    async def cancel(self, key: RequestKey) -> None:
        """Fence ``key``'s request: a retained result is freed and the stage kept; an active
        call is fenced and the stage retired."""
        stage = self._stage
        stage._drop_kept(key.request_id)
        holder = self._holder
        if holder is None or holder.request_id != key.request_id:
            return
        call = self._call
        if not self._running or (call is not None and call.done()):
            self.free()
            return
        self._holder = None
        self.ended()
        stage._fence(key, call)
        await stage._retire_cancelled()

    def close(self) -> asyncio.Future[Any] | None:
        """The stage is closing: nobody holds the slot; the call still running, if any."""
        call = self._call
        self.free()
        return call
