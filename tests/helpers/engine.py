"""The engine under a session, for the tests that look at its stage clients and its loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.api import AsyncOmni, Omni, PipelineSession

if TYPE_CHECKING:
    from runtime.engine.orchestrator import Orchestrator


def engine_of(front: Omni | AsyncOmni | PipelineSession) -> Orchestrator:
    """The orchestrator a session drives (callers outside the tests go through the session)."""
    session = front if isinstance(front, PipelineSession) else front.session
    return session._orchestrator
