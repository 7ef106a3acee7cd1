"""The part of the bridge that transcribes dictation while another pipeline (a chat) is open:
the transcription pipeline loaded beside it (``RuntimeBridge.start_beside``: on the studio's
ledger, so the two share the machine's memory as pipelines loaded together do), on a control
thread of its own. It loads
on the first dictation and stays loaded until the window closes; ``transcribed`` carries the
text (or why there is none) to the GUI thread."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

from app.control import ControlThread
from runtime.errors import OmniError

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import numpy as np

    from runtime.api import PipelineSession
    from runtime.devices import DeviceSelection, Topology

__all__ = ["Transcriber", "Transcription"]


@dataclass(frozen=True, slots=True)
class Transcription:
    """A dictation's text, or the error that stopped it."""

    text: str
    seconds: float
    error: str | None = None


class Transcriber(QObject):
    """Transcribes recorded audio with ``pipeline`` (transcribe.yaml), one at a time.

    ``start`` loads a pipeline beside the open one, ``machine`` gives the topology and device
    selection to load it on (GUI thread), and ``post`` (the bridge's one hop) carries each
    transcription to the GUI thread."""

    transcribed = Signal(object)  # Transcription
    busy_changed = Signal(bool)
    closed = Signal()

    def __init__(
        self,
        pipeline: Path,
        *,
        start: Callable[[Path, Topology | None, DeviceSelection], PipelineSession],
        machine: Callable[[], tuple[Topology | None, DeviceSelection]],
        post: Callable[[Callable[[], None]], None],
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.pipeline = pipeline
        self._start = start
        self._machine = machine
        self._post = post
        self._session: PipelineSession | None = None  # control thread only
        self._pending = 0
        self._closing = False
        self._thread = ControlThread(self, lambda exc: None)
        self._thread.setObjectName("omni-studio-transcriber")
        self._thread.finished.connect(self.closed)
        self._started = False

    @property
    def busy(self) -> bool:
        return self._pending > 0

    @property
    def closing(self) -> bool:
        return self._closing

    def transcribe(self, samples: np.ndarray, sample_rate: int) -> bool:
        """Transcribe ``samples`` (GUI thread); ``transcribed`` follows."""
        if self._closing:
            return False
        if not self._started:
            self._started = True
            self._thread.start()
        self._pending += 1
        if self._pending == 1:
            self.busy_changed.emit(True)
        topology, selection = self._machine()
        self._thread.submit(partial(self._job, samples, sample_rate, topology, selection))
        return True

    def close(self) -> bool:
        """Unload and stop (GUI thread, never waits); True when ``closed`` will follow."""
        if self._closing:
            return self._started
        self._closing = True
        if not self._started:
            return False
        self._thread.submit(self._close_job)
        self._thread.stop()
        return True

    # -- the control thread --------------------------------------------------------------

    def _job(
        self,
        samples: np.ndarray,
        sample_rate: int,
        topology: Topology | None,
        selection: DeviceSelection,
    ) -> None:
        seconds = samples.size / sample_rate
        try:
            if self._closing:
                raise OmniError("the studio is closing")
            if self._session is None:
                self._session = self._start(self.pipeline, topology, selection)
            text = ""
            for output in self._session.submit({"audio": samples, "sample_rate": sample_rate}):
                if output.finished:
                    text = (output.text or "").strip()
            result = Transcription(text, seconds)
        except (OmniError, OSError) as exc:
            result = Transcription("", seconds, str(exc))
        self._post(partial(self._done, result))

    def _close_job(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()

    def _done(self, result: Transcription) -> None:
        self._pending -= 1
        if self._pending == 0:
            self.busy_changed.emit(False)
        self.transcribed.emit(result)
