"""The typed error of a graph stage's load-time or fatal error report, by the code it names.

Both graph clients (a worker process, or a session in this process) report the same codes
(:mod:`workers.errors`); this is where each becomes the error the engine raises.
"""

from __future__ import annotations

from runtime.errors import (
    ConfigError,
    ModelError,
    OmniError,
    PlacementRefused,
    VerificationError,
)

__all__ = ["worker_error"]

#: Worker error codes that mean the bundle failed verification in the worker.
_VERIFICATION_CODES = frozenset(
    {
        "missing_file",
        "bad_manifest",
        "hash_mismatch",
        "symlink_escape",
        "bad_graph",
        "external_data_not_listed",
        "bad_example_inputs",
    }
)
_PLACEMENT_CODES = frozenset({"provider_absent", "device_absent", "placement_unavailable"})


def worker_error(stage: str, code: str, message: str, *, cpu_allowed: bool) -> OmniError:
    """The typed error of a load-time or fatal error report (``code`` as the worker names it)."""
    text = f"{stage}: {code}: {message}"
    if code in _VERIFICATION_CODES:
        return VerificationError(text, code=code)
    # Without CPU fallback, a session ORT cannot create is a graph the target cannot place.
    if code in _PLACEMENT_CODES or (code == "session_failed" and not cpu_allowed):
        return PlacementRefused(text)
    if code in ("bad_route", "too_large"):
        return ConfigError(text)
    return ModelError(text)
