"""Run one call at a time on its own thread, cancellable between nodes.

This module imports only the standard library, NumPy, ONNX Runtime and ``workers`` (errors,
devices), so that it runs in a minimal worker environment.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from workers.errors import WorkerError
from workers.ort_devices import ORT_EXTENSION_ERRORS

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = ["CallOutcome", "CancellableRunner", "RunningCall"]


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """How one call ended: outputs, or the error (code ``cancelled`` when terminated)."""

    outputs: Mapping[str, np.ndarray] | None
    error: WorkerError | None
    elapsed_s: float


class RunningCall:
    """A call submitted to a :class:`CancellableRunner`."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._outcome: CallOutcome | None = None

    def done(self) -> bool:
        return self._done.is_set()

    def outcome(self, timeout: float | None = None) -> CallOutcome:
        """Wait for the call to end; TimeoutError when it has not ended in ``timeout`` s."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the call did not end within {timeout} s")
        assert self._outcome is not None
        return self._outcome

    def wait(self, timeout: float | None = None) -> Mapping[str, np.ndarray]:
        """The outputs; raises the call's WorkerError (``cancelled``, ``model_error``)."""
        outcome = self.outcome(timeout)
        if outcome.error is not None:
            raise outcome.error
        assert outcome.outputs is not None
        return outcome.outputs

    def _finish(self, outcome: CallOutcome) -> None:
        self._outcome = outcome
        self._done.set()


class CancellableRunner:
    """Runs one call at a time on its own thread; :meth:`cancel` terminates it between nodes.

    ONNX Runtime checks ``RunOptions.terminate`` between node executions, so a cancelled call
    ends after the node it is running finishes.
    """

    def __init__(self, session: ort.InferenceSession, *, name: str = "ort-call") -> None:
        self._session = session
        self._name = name
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._active: RunningCall | None = None
        self._options: ort.RunOptions | None = None
        self._cancelled = False
        self._closed = False

    @property
    def busy(self) -> bool:
        with self._lock:
            return self._active is not None

    def submit(
        self,
        inputs: Mapping[str, np.ndarray],
        on_done: Callable[[CallOutcome], None] | None = None,
    ) -> RunningCall:
        """Start a call; ``on_done`` runs on the call's thread once it has ended."""
        call = RunningCall()
        with self._lock:
            if self._closed:
                raise WorkerError("busy", "the runner is closed; accepted: calls before close")
            if self._active is not None:
                raise WorkerError("busy", "a call is already running; accepted: one call at a time")
            options = ort.RunOptions()
            # A failed or cancelled call is reported as a value; ORT need not log it too.
            options.log_severity_level = 4
            self._active = call
            self._options = options
            self._cancelled = False
            thread = threading.Thread(
                target=self._run,
                args=(call, dict(inputs), options, on_done),
                name=self._name,
                daemon=True,
            )
            self._thread = thread
            thread.start()
        return call

    def run(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """Submit a call and wait for it; another thread may :meth:`cancel` it meanwhile."""
        return self.submit(inputs).wait()

    def cancel(self) -> bool:
        """Terminate the running call; False when no call was running."""
        with self._lock:
            if self._active is None or self._options is None:
                return False
            self._cancelled = True
            self._options.terminate = True
            return True

    def close(self, timeout: float = 10.0) -> None:
        """Cancel any running call and join its thread (idempotent)."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self.cancel()
        if thread is not None:
            thread.join(timeout)

    def _run(
        self,
        call: RunningCall,
        inputs: dict[str, np.ndarray],
        options: ort.RunOptions,
        on_done: Callable[[CallOutcome], None] | None,
    ) -> None:
        started = time.monotonic()
        outputs: dict[str, np.ndarray] | None = None
        error: WorkerError | None = None
        try:
            results = self._session.run(None, inputs, options)
            names = [value.name for value in self._session.get_outputs()]
            outputs = {
                name: np.asarray(result) for name, result in zip(names, results, strict=True)
            }
        except ORT_EXTENSION_ERRORS as exc:
            with self._lock:
                cancelled = self._cancelled
            if cancelled:
                error = WorkerError("cancelled", "the call was cancelled while it ran")
            else:
                error = WorkerError("model_error", f"ONNX Runtime failed the call: {exc}")
        outcome = CallOutcome(
            outputs=None if outputs is None else MappingProxyType(outputs),
            error=error,
            elapsed_s=time.monotonic() - started,
        )
        with self._lock:
            self._active = None
            self._options = None
        call._finish(outcome)
        if on_done is not None:
            on_done(outcome)
