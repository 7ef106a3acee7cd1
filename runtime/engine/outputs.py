"""What a request yields: ``OmniRequestOutput`` and the thread-safe stream that carries it."""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


@dataclass(slots=True, eq=False)
class OmniRequestOutput:
    """One output of a request.

    ``outputs`` of a graph stage are read-only arrays over the worker's shared memory: they
    stay valid until :meth:`release_stage_buffers` is called, and the stage keeps its slot
    until then. The public generators call it when iteration advances or closes, direct
    consumers call it in ``finally``. Whatever must outlive the acknowledgement is copied by
    whoever keeps it (:meth:`kept_outputs`; ``Omni.run`` returns such copies).

    ``text`` is a language-model stage's text: on a partial output (``finished`` false) the
    text added since the previous one, so the partials concatenate to the whole; on the
    final output of a text-producing pipeline, the whole text. It is None on outputs that
    carry no text (tensors, audio chunks). Shaped like audio, it is also in ``outputs``: a
    text partial's outputs are ``{"text": <the new text>}``, as an audio partial's hold
    ``pcm``, ``sample_rate`` and its indices.
    """

    request_id: str
    stage: str
    outputs: Mapping[str, np.ndarray]
    finished: bool
    index: int = 0
    metrics: Mapping[str, Any] = field(default_factory=dict)
    text: str | None = None
    _release: Callable[[], None] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def kept_outputs(self) -> dict[str, Any]:
        """Copies of the outputs that stay valid after acknowledgement (copied once, here)."""
        kept: dict[str, Any] = {}
        for name, value in self.outputs.items():
            kept[name] = value.copy() if isinstance(value, np.ndarray) else value
        return kept

    def release_stage_buffers(self) -> None:
        """Acknowledge this output so its stage can take the next request. Idempotent."""
        with self._lock:
            release, self._release = self._release, None
        if release is not None:
            release()


class _End:
    """Marks the end of a request's stream."""


END = _End()
StreamItem = OmniRequestOutput | BaseException | _End


class OutputStream:
    """A thread-safe queue of a request's outputs, readable from threads and event loops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: deque[StreamItem] = deque()
        self._waiters: deque[cf.Future[StreamItem]] = deque()
        self._closed = False

    def put(self, item: StreamItem) -> None:
        with self._lock:
            if self._closed:
                return
            if isinstance(item, (BaseException, _End)):
                self._closed = True
            while self._waiters:
                waiter = self._waiters.popleft()
                if waiter.set_running_or_notify_cancel():
                    waiter.set_result(item)
                    return
            self._items.append(item)

    def next_future(self) -> cf.Future[StreamItem]:
        """A future that resolves with the next item (immediately if one is queued)."""
        future: cf.Future[StreamItem] = cf.Future()
        with self._lock:
            if self._items:
                future.set_result(self._items.popleft())
            else:
                self._waiters.append(future)
        return future

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed and not self._items
