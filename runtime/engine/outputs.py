"""The thread-safe stream that carries a request's outputs (:class:`OmniRequestOutput`, a
value of :mod:`runtime.outputs`, named here too for the engine's modules)."""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections import deque

from runtime.outputs import AUDIO_KEYS, AudioChunk, OmniRequestOutput

__all__ = ["AUDIO_KEYS", "END", "AudioChunk", "OmniRequestOutput", "OutputStream", "StreamItem"]


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
        self._discarding = False

    def put(self, item: StreamItem) -> None:
        with self._lock:
            if self._closed:
                return
            if self._discarding and isinstance(item, OmniRequestOutput):
                # Nobody reads any more: the output is acknowledged as it comes.
                item.release_stage_buffers()
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

    def discard(self) -> None:
        """From now on nobody reads: every output queued or put later is acknowledged at
        once (its stage's slot freed), so a program waiting for acknowledgements goes on."""
        with self._lock:
            self._discarding = True
            queued = [item for item in self._items if isinstance(item, OmniRequestOutput)]
            self._items = deque(
                item for item in self._items if not isinstance(item, OmniRequestOutput)
            )
        for item in queued:
            item.release_stage_buffers()

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed and not self._items
