"""Inputs a graph stage keeps between calls of one request (a call's ``retain``).

A request that passes the very same array object again under a retained name (compared by
identity, not by value) is not copied again: a worker's stage sends the arena slot it kept
(:class:`ArenaKept`), a stage in this process reuses its own read-only copy
(:class:`KeptCopies`). What a request kept goes when it ends or is cancelled, when a call
passes another array under that name, or when another request calls the stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping

    from runtime.contracts import RequestKey
    from runtime.transport.arena import ArenaSlot
    from runtime.transport.channel import FramedChannel

__all__ = ["ArenaKept", "KeptCopies"]

HeldT = TypeVar("HeldT")


@dataclass(frozen=True, slots=True)
class _Kept(Generic[HeldT]):
    """One kept input: the request, the array the caller passed (compared by identity on the
    next call) and what holds its bytes (a pinned arena slot, or this process's copy)."""

    request_id: str
    source: object
    held: HeldT


def _drop_stale(
    kept: Mapping[str, _Kept[Any]],
    key: RequestKey,
    inputs: Mapping[str, object],
    retain: Collection[str],
) -> list[str]:
    """The kept names another request holds or this call replaces (not removed here)."""
    return [
        name
        for name, entry in kept.items()
        if entry.request_id != key.request_id
        or (name in inputs and (name not in retain or inputs[name] is not entry.source))
    ]


class ArenaKept:
    """The inputs a worker's stage keeps pinned in its inputs arena, by input name."""

    def __init__(self, owner: str, channel: Callable[[], FramedChannel | None]) -> None:
        self._owner = owner
        self._channel = channel
        self._kept: dict[str, _Kept[ArenaSlot]] = {}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._kept)

    def slots(
        self, key: RequestKey, inputs: Mapping[str, np.ndarray], retain: Collection[str]
    ) -> tuple[dict[str, ArenaSlot], list[str]]:
        """The kept slots this call sends again, and the inputs it asks to keep anew; drops
        what another request kept and what this call replaces."""
        for name in _drop_stale(self._kept, key, inputs, retain):
            self._unpin(name)
        channel = self._channel()
        arena = None if channel is None else channel.arena(self._owner)
        placed: dict[str, ArenaSlot] = {}
        pin: list[str] = []
        if arena is None:
            return placed, pin
        for name in retain:
            if name not in inputs:
                continue
            kept = self._kept.get(name)
            if kept is not None and arena.pinned(kept.held.generation):
                placed[name] = kept.held
            else:
                self._kept.pop(name, None)
                pin.append(name)
        return placed, pin

    def keep(
        self,
        key: RequestKey,
        inputs: Mapping[str, np.ndarray],
        pin: Collection[str],
        slots: Mapping[str, ArenaSlot],
    ) -> None:
        """Remember the slots the channel pinned for ``pin`` as the call went out."""
        for name in pin:
            slot = slots.get(name)
            if slot is not None:
                self._kept[name] = _Kept(key.request_id, inputs[name], slot)

    def release(self, request_id: str | None = None) -> int:
        """Free the inputs kept for ``request_id`` (every request's when None); how many."""
        names = [
            name
            for name, entry in self._kept.items()
            if request_id is None or entry.request_id == request_id
        ]
        for name in names:
            self._unpin(name)
        return len(names)

    def forget(self) -> None:
        """The arena went with the channel: nothing kept in it is sent again."""
        self._kept.clear()

    def _unpin(self, name: str) -> None:
        entry = self._kept.pop(name, None)
        channel = self._channel()
        if entry is not None and channel is not None:
            channel.unpin(self._owner, entry.held.generation)


class KeptCopies:
    """A stage in this process: each call's own copies of its inputs, a kept one reused."""

    def __init__(self) -> None:
        self._kept: dict[str, _Kept[np.ndarray]] = {}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._kept)

    def copy(
        self, key: RequestKey, inputs: Mapping[str, np.ndarray], retain: Collection[str]
    ) -> tuple[dict[str, np.ndarray], int]:
        """This call's own copies of ``inputs`` (a kept one reused) and the bytes copied."""
        for name in _drop_stale(self._kept, key, inputs, retain):
            del self._kept[name]
        arrays: dict[str, np.ndarray] = {}
        copied = 0
        for name, value in inputs.items():
            kept = self._kept.get(name)
            if kept is not None:
                arrays[str(name)] = kept.held
                continue
            array = np.array(value, copy=True)
            copied += int(array.nbytes)
            if name in retain:
                array.flags.writeable = False
                self._kept[name] = _Kept(key.request_id, value, array)
            arrays[str(name)] = array
        return arrays, copied

    def release(self, request_id: str | None = None) -> None:
        """Drop the copies kept for ``request_id`` (every request's when None)."""
        for name, entry in list(self._kept.items()):
            if request_id is None or entry.request_id == request_id:
                del self._kept[name]
