"""The part of the bridge that records: one :class:`runtime.audio.AudioInput` at a time, read
on a thread of its own, its level values and what it recorded carried to the GUI thread by the
bridge's one hop and emitted there as Qt signals. The Devices panel's level meter listens to it
(``monitor``), and Dictate records with it (``record``); neither waits on the device: start and
stop return at once, and ``stopped`` follows when the input is closed."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Final

import numpy as np
from PySide6.QtCore import QObject, Signal

from runtime.audio.devices import AudioDeviceError, list_input_devices, rescan_output_devices
from runtime.audio.input import SPEECH_RATE, AudioInput
from runtime.errors import OmniError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["InputLevel", "InputRecorder", "Recording", "input_device_names"]

#: How often the level meter hears from the input.
LEVEL_INTERVAL_S: Final = 0.05
#: The longest dictation kept (older audio is not kept past it: it stops by itself).
MAX_RECORDING_S: Final = 120.0


@dataclass(frozen=True, slots=True)
class InputLevel:
    """The input's level over the last 50 ms and how much has been recorded so far."""

    rms_dbfs: float
    peak_dbfs: float
    recorded_s: float
    device: str


@dataclass(frozen=True, slots=True)
class Recording:
    """What one recording kept (16 kHz mono float32; empty when only monitoring), or why it
    failed."""

    samples: np.ndarray
    sample_rate: int
    device: str
    error: str | None = None

    @property
    def seconds(self) -> float:
        return self.samples.size / self.sample_rate


def input_device_names(*, rescan: bool = False) -> tuple[list[str], str | None]:
    """The input devices' names, or ([], why) when there are none. ``rescan`` restarts
    PortAudio first so a device plugged in since shows (skipped while a stream is open)."""
    try:
        if rescan:
            try:
                rescan_output_devices()
            except AudioDeviceError:
                pass  # a stream is open: list what PortAudio knows
        devices = list_input_devices()
    except OmniError as exc:
        return [], str(exc)
    names = [device.name for device in devices]
    return names, None if names else "no audio input device found"


class InputRecorder(QObject):
    """Records or monitors one input device at a time on a thread of its own; ``post`` (the
    bridge's one hop) carries what that thread reports to the GUI thread."""

    level = Signal(object)  # InputLevel
    stopped = Signal(object)  # Recording
    running_changed = Signal(bool)

    def __init__(
        self, *, post: Callable[[Callable[[], None]], None], parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self._post = post
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.keeping = False

    @property
    def running(self) -> bool:
        return self._thread is not None

    def record(self, device: str | None) -> bool:
        """Start recording ``device`` (None: the default input); False while one runs."""
        return self._start(device, keep=True)

    def monitor(self, device: str | None) -> bool:
        """Start showing ``device``'s level without keeping its audio."""
        return self._start(device, keep=False)

    def _start(self, device: str | None, *, keep: bool) -> bool:
        if self._thread is not None:
            return False
        self._stop = threading.Event()
        self.keeping = keep
        thread = threading.Thread(
            target=self._read, args=(device, keep, self._stop), name="omni-studio-input"
        )
        self._thread = thread
        thread.start()
        self.running_changed.emit(True)
        return True

    def stop(self) -> bool:
        """Stop (never waits); ``stopped`` follows once the input is closed."""
        if self._thread is None:
            return False
        self._stop.set()
        return True

    def close(self) -> None:
        """Stop and wait for the input to close (when the window closes)."""
        thread = self._thread
        self._stop.set()
        if thread is not None:
            thread.join()

    # -- the input's thread ------------------------------------------------------------

    def _read(self, device: str | None, keep: bool, stop: threading.Event) -> None:
        kept: list[np.ndarray] = []
        name = device or "default input"
        error = None
        try:
            with AudioInput(device) as source:
                found = source.device
                name = found.name if found is not None else name
                recorded = 0
                last_level = 0.0
                while not stop.is_set():
                    chunk = source.read(timeout=LEVEL_INTERVAL_S)
                    if chunk is None:
                        break  # the device stopped
                    if chunk.size:
                        recorded += chunk.size
                        if keep:
                            kept.append(chunk)
                    now = time.monotonic()
                    if now - last_level >= LEVEL_INTERVAL_S:
                        last_level = now
                        value = source.level()
                        level = InputLevel(
                            value.rms_dbfs, value.peak_dbfs, recorded / SPEECH_RATE, name
                        )
                        self._post(partial(self.level.emit, level))
                    if keep and recorded >= MAX_RECORDING_S * SPEECH_RATE:
                        break
        except (OmniError, OSError) as exc:
            error = str(exc)
        samples = np.concatenate(kept) if kept else np.zeros(0, np.float32)
        self._post(partial(self._on_finished, Recording(samples, SPEECH_RATE, name, error)))

    def _on_finished(self, recording: Recording) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        self.running_changed.emit(False)
        self.stopped.emit(recording)
