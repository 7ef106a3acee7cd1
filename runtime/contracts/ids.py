"""Request and event identities.

A request keeps its id for its whole life; its *epoch* increases each time it is
fenced (cancelled or restarted). Anything stamped with an older epoch is stale and is
dropped by the receiver, which is how a cancelled call's late result is ignored.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace


def new_request_id() -> str:
    """A random, URL-safe request id."""
    return "req-" + os.urandom(8).hex()


@dataclass(frozen=True, slots=True, order=True)
class RequestKey:
    """A request id together with its current epoch."""

    request_id: str
    epoch: int = 0

    def __post_init__(self) -> None:
        if not self.request_id:
            raise ValueError("request_id must be a non-empty string")
        if self.epoch < 0:
            raise ValueError(f"epoch {self.epoch} must be >= 0")

    def fenced(self) -> RequestKey:
        """The same request in the next epoch: everything older becomes stale."""
        return replace(self, epoch=self.epoch + 1)

    def is_stale(self, current: RequestKey) -> bool:
        """True when this key names the same request as ``current`` at an older epoch."""
        return self.request_id == current.request_id and self.epoch < current.epoch

    def to_wire(self) -> dict[str, object]:
        return {"request_id": self.request_id, "epoch": self.epoch}


@dataclass(frozen=True, slots=True)
class EventId:
    """One event of one request: the request key and a per-request sequence number."""

    key: RequestKey
    sequence: int

    def __post_init__(self) -> None:
        if self.sequence < 0:
            raise ValueError(f"sequence {self.sequence} must be >= 0")
