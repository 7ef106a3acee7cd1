"""The public, Qt-free API: the one way into the engine.

:class:`PipelineSession` loads a pipeline and admits requests, each with a
:class:`RequestHandle`; :class:`Omni` and :class:`AsyncOmni` are the short forms for scripts.
The values callers need travel with them: outputs (:class:`OmniRequestOutput`,
:class:`AudioChunk`), the execution plan, and the errors the session raises.
"""

from runtime.admission import Resolution
from runtime.api.omni import AsyncOmni, Omni
from runtime.api.session import PipelineSession, ProgramOptions, RequestHandle, SessionHealth
from runtime.engine.orchestrator import LoadCancelled, loading_stages
from runtime.engine.outputs import AUDIO_KEYS, AudioChunk, OmniRequestOutput
from runtime.records import ExecutionPlan, StageRecord

__all__ = [
    "AUDIO_KEYS",
    "AsyncOmni",
    "AudioChunk",
    "ExecutionPlan",
    "LoadCancelled",
    "Omni",
    "OmniRequestOutput",
    "PipelineSession",
    "ProgramOptions",
    "RequestHandle",
    "Resolution",
    "SessionHealth",
    "StageRecord",
    "loading_stages",
]
