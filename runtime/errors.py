"""The runtime's error types. Each carries a message a user can act on.

Errors are grouped by what the user should do about them, which is also how the CLI
maps them to exit codes: fix the input (2), change the plan or the machine (3), or
look at what failed while running (4).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_FAILED = 4
EXIT_INTERRUPTED = 130


class OmniWarning(UserWarning):
    """A warning raised by the runtime (tests turn these into errors)."""


class OmniError(Exception):
    """Base of every error the runtime raises on purpose."""

    exit_code = EXIT_FAILED


class UsageError(OmniError):
    """The command line or API call was malformed."""

    exit_code = EXIT_USAGE


class StructuredOutputUnsupported(UsageError):
    """The language model cannot constrain its reply as asked: its grammar compiler refused
    the request's JSON schema (the message says what it does not support)."""

    #: The field of a chat request the refusal is about.
    param = "response_format"


class ConfigError(OmniError):
    """A pipeline or topology file is invalid. Names the file, line and key."""

    exit_code = EXIT_USAGE

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        key: str | None = None,
    ) -> None:
        where = ""
        if file is not None:
            where = file if line is None else f"{file}:{line}"
        prefix = ", ".join(part for part in (where, f"key '{key}'" if key else "") if part)
        super().__init__(f"{prefix}: {message}" if prefix else message)
        self.detail = message
        self.file = file
        self.line = line
        self.key = key


class RefusedError(OmniError):
    """Nothing ran because a check before loading said no."""

    exit_code = EXIT_REFUSED


class VerificationError(RefusedError):
    """An artifact bundle failed verification. ``subject`` names the file or field."""

    def __init__(self, message: str, *, code: str, subject: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.subject = subject


class AdmissionRefused(RefusedError):
    """The ledger cannot hold a plan's demands. ``holders``: (owner, bytes) of what other
    plans hold of ``constraint``, largest first."""

    def __init__(
        self,
        message: str,
        *,
        constraint: str,
        needed: int,
        free: int,
        stages: tuple[str, ...] = (),
        holders: tuple[tuple[str, int], ...] = (),
    ) -> None:
        super().__init__(message)
        self.constraint = constraint
        self.needed = needed
        self.free = free
        self.stages = stages
        self.holders = holders


class PlacementRefused(RefusedError):
    """A stage would run somewhere other than its route declares."""


class DeviceExcluded(RefusedError):
    """A route targets a device the user excluded or that is absent."""


class ResourceUnavailable(OmniError):
    """The pipeline is busy: consume or cancel the request in flight, then retry."""


class ExecutionError(OmniError):
    """Something failed while running."""


class WorkerDied(ExecutionError):
    """A worker process exited or was killed; distinct from a model error."""


class StageRetired(ExecutionError):
    """The stage failed, was retired or closed: it takes no more work until it is recreated."""


class ModelError(ExecutionError):
    """The model itself raised an error for a request."""


class RequestCancelled(OmniError):
    """The request was cancelled before it finished."""
