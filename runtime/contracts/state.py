"""Opaque state handles.

A stage may keep state between calls (a KV cache, a decoder context). Other parties
only ever see an opaque handle. New handles are neither replayable nor migratable
unless the stage that made them says so explicitly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class StateHandle:
    """An opaque reference to state owned by one stage's worker."""

    owner: str
    token: str = field(default_factory=lambda: os.urandom(16).hex())
    replayable: bool = False
    migratable: bool = False

    def __post_init__(self) -> None:
        if not self.owner:
            raise ValueError("a state handle needs an owner")
        if not self.token:
            raise ValueError("a state handle needs a token")

    def to_wire(self) -> dict[str, object]:
        return {
            "owner": self.owner,
            "token": self.token,
            "replayable": self.replayable,
            "migratable": self.migratable,
        }
