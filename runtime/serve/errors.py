"""The server's errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Every refusal is an :class:`ApiError` carrying the HTTP status; runtime errors keep their own
message and map to a status by what the client can do about them (fix the request: 400,
retry later: 429, nothing: 500).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from runtime.errors import (
    ConfigError,
    ModelError,
    OmniError,
    RefusedError,
    RequestCancelled,
    ResourceUnavailable,
    StageRetired,
    StructuredOutputUnsupported,
    UsageError,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

#: OpenAI's error types, by status.
INVALID_REQUEST: Final = "invalid_request_error"
AUTHENTICATION: Final = "authentication_error"
NOT_FOUND: Final = "not_found_error"
RATE_LIMIT: Final = "rate_limit_error"
SERVER: Final = "server_error"
#: The stable code of a graph call whose inputs do not fit the graph (``workers/errors.py``).
BAD_INPUT: Final = ": bad_input: "
#: What a busy pipeline tells a client to wait before retrying, in seconds.
RETRY_AFTER_S: Final = 1
#: What a client is told to wait while a pipeline is recreated, in seconds.
RESTART_RETRY_AFTER_S: Final = 5


class ApiError(Exception):
    """A refusal or failure the server answers with ``status`` and an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def invalid(message: str, *, param: str | None, code: str = "invalid_value") -> ApiError:
    """A 400 about one field of the request (``param`` names it)."""
    return ApiError(400, message, param=param, code=code)


def from_runtime_error(exc: OmniError) -> ApiError:
    """The answer to an error the runtime raised for a request, with its message."""
    message = str(exc)
    if isinstance(exc, ResourceUnavailable):
        return ApiError(
            429,
            message,
            type=RATE_LIMIT,
            code="pipeline_busy",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    if isinstance(exc, StructuredOutputUnsupported):
        return ApiError(400, message, param=exc.param, code="unsupported_response_format")
    if isinstance(exc, (UsageError, ConfigError)):
        return ApiError(400, message, code="invalid_input")
    if isinstance(exc, ModelError) and BAD_INPUT in message:
        # The graph refused the request's tensors (name, dtype or shape): the client's to fix.
        return ApiError(400, message, code="bad_input")
    if isinstance(exc, StageRetired):
        # The pipeline is recreated in the background (see ServedPipeline.cancel).
        return ApiError(
            503,
            message,
            type=SERVER,
            code="pipeline_restarting",
            headers={"Retry-After": str(RESTART_RETRY_AFTER_S)},
        )
    if isinstance(exc, RequestCancelled):
        return ApiError(503, message, type=SERVER, code="cancelled")
    if isinstance(exc, RefusedError):
        return ApiError(503, message, type=SERVER, code="refused")
    return ApiError(500, message, type=SERVER, code=type(exc).__name__)
