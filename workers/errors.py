"""The one error type worker processes raise on purpose (standard library only).

A worker reports a :class:`WorkerError` to its controller as an ``error`` message carrying
``code``, ``message`` and ``subject``; the controller maps the code to a runtime error.
"""

from __future__ import annotations

from typing import Final

#: Stable codes a worker reports. The controller maps them to runtime error types.
WORKER_ERROR_CODES: Final = frozenset(
    {
        "missing_file",  # a manifest or listed file is absent or not a regular file
        "bad_manifest",  # the manifest document is malformed
        "hash_mismatch",  # bytes read differ from the expected identity or listed sha256
        "symlink_escape",  # a listed file resolves outside the bundle
        "bad_graph",  # the graph bytes are not a readable ONNX model
        "external_data_not_listed",  # the graph names external data the manifest omits
        "bad_example_inputs",  # the example inputs cannot be loaded or do not fit the graph
        "bad_route",  # providers, allowed providers and target contradict each other
        "provider_absent",  # an execution provider is not in this ONNX Runtime build
        "device_absent",  # ONNX Runtime lists no device of the provider matching the request
        "session_failed",  # ONNX Runtime refused to create the session
        "warmup_failed",  # the warm-up call with the example inputs failed
        "placement_unavailable",  # neither assignment info nor a profile was recorded
        "bad_input",  # a call's inputs differ from the bucket by name, dtype or shape
        "too_large",  # a call's inputs plus outputs exceed max_io_bytes
        "busy",  # a call arrived while another one was running
        "cancelled",  # the running call was terminated on request
        "model_error",  # ONNX Runtime failed while running a call
        "result_failed",  # a finished call's outputs could not be sent back
    }
)


class WorkerError(Exception):
    """A failure a worker reports by code. ``subject`` names the file, input or provider."""

    def __init__(self, code: str, message: str, *, subject: str | None = None) -> None:
        assert code in WORKER_ERROR_CODES, code
        super().__init__(message)
        self.code = code
        self.message = message
        self.subject = subject

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"
