"""Protocol version and feature negotiation.

A peer lists the features it *requires* and the ones it merely *offers*. A required
feature the other side does not know is refused by name; unknown optional features
are ignored. This lets both ends add features without breaking older peers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

PROTOCOL_VERSION = 1

#: Features this implementation understands. Names are stable wire strings.
KNOWN_FEATURES: frozenset[str] = frozenset(
    {
        "inline-buffers",  # raw buffers carried in the frame payload
        "shm-buffers",  # buffers carried by named shared memory + generation acks
        "shm-arena",  # buffers at an offset of a producer's persistent shared-memory arena
        "binary-header",  # call, result and ack frames with the compact binary header
        "cancel",  # cooperative cancellation of an in-flight call
        "placement-report",  # worker reports provider node assignments after warm-up
        "text-stream",  # streamed text deltas (language-model stages)
    }
)


class FeatureError(ValueError):
    """A peer required a feature this side does not implement, or a version mismatch."""

    def __init__(self, message: str, *, unknown: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.unknown = unknown


@dataclass(frozen=True, slots=True)
class Negotiated:
    """The outcome of a handshake: the version and the features both ends use."""

    version: int
    features: frozenset[str]


def check_required(required: Iterable[str], known: frozenset[str] = KNOWN_FEATURES) -> None:
    """Raise :class:`FeatureError` naming every required feature that is not known."""
    unknown = tuple(sorted({name for name in required if name not in known}))
    if unknown:
        raise FeatureError(
            f"peer requires unknown feature(s): {', '.join(unknown)}; "
            f"this side implements: {', '.join(sorted(known))}",
            unknown=unknown,
        )


def negotiate(
    version: int,
    required: Iterable[str],
    offered: Iterable[str],
    known: frozenset[str] = KNOWN_FEATURES,
) -> Negotiated:
    """Agree on a version and feature set with a peer's announcement."""
    # type() rather than ==: a JSON true must not pass for version 1.
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise FeatureError(
            f"peer speaks protocol version {version!r}; this side speaks {PROTOCOL_VERSION}"
        )
    required = tuple(required)
    check_required(required, known)
    agreed = frozenset(required) | (frozenset(offered) & known)
    return Negotiated(version=version, features=agreed)
