"""``omni-edge serve``: a local OpenAI-compatible server for every pipeline.

:class:`OmniServer` loads the pipelines (:class:`PipelineRegistry`) and serves
:class:`ServeApp` (Starlette) with uvicorn, in the caller's thread or a background one.
"""

from runtime.serve.app import ServeApp, ServedRequest, ServeStats
from runtime.serve.errors import ApiError
from runtime.serve.limits import ServeLimits
from runtime.serve.registry import PipelineRegistry, ServedPipeline, pipeline_kind
from runtime.serve.server import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    OmniServer,
    ServeOptions,
    is_loopback,
    resolve_api_key,
)

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "ApiError",
    "OmniServer",
    "PipelineRegistry",
    "ServeApp",
    "ServeLimits",
    "ServeOptions",
    "ServeStats",
    "ServedPipeline",
    "ServedRequest",
    "is_loopback",
    "pipeline_kind",
    "resolve_api_key",
]
