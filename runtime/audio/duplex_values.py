"""The values a :class:`~runtime.audio.duplex.DuplexAudio` hands out and the echo canceller
it takes: :class:`ReplyPlayback`, :class:`CapturedBlock` and :class:`DuplexMetrics` are frozen
snapshots; :class:`FrameEchoCanceller` is what a canceller must provide and
:class:`PassThroughEchoCanceller` one that changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from runtime.errors import UsageError

__all__ = [
    "CapturedBlock",
    "DuplexMetrics",
    "FrameEchoCanceller",
    "PassThroughEchoCanceller",
    "ReplyPlayback",
]


class FrameEchoCanceller(Protocol):
    """What :class:`DuplexAudio` needs of an echo canceller: it cleans ``near`` (microphone)
    given ``far`` (what was played), both float32 mono frames of ``frame_samples`` at 16 kHz,
    and returns the cleaned frame (same shape)."""

    @property
    def frame_samples(self) -> int: ...

    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray: ...


class PassThroughEchoCanceller:
    """A canceller that returns ``near`` unchanged (headphones; tests of the frame plumbing)."""

    __slots__ = ("_frame_samples", "frames_processed")

    def __init__(self, frame_samples: int = 160) -> None:
        if isinstance(frame_samples, bool) or not isinstance(frame_samples, int):
            raise UsageError(f"frame_samples must be a positive int; got {frame_samples!r}")
        if frame_samples < 1:
            raise UsageError(f"frame_samples must be a positive int; got {frame_samples!r}")
        self._frame_samples = frame_samples
        self.frames_processed = 0

    @property
    def frame_samples(self) -> int:
        return self._frame_samples

    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        if near.shape != (self._frame_samples,) or far.shape != near.shape:
            raise UsageError(
                f"process takes two frames of {self._frame_samples} samples; got "
                f"{near.shape} and {far.shape}"
            )
        self.frames_processed += 1
        return near.astype(np.float32, copy=True)


@dataclass(frozen=True, slots=True)
class ReplyPlayback:
    """How far one reply got. Sample counts are at the reply's own ``sample_rate``.

    ``fed`` counts the samples ``feed`` accepted, ``discarded`` those fed after an interrupt;
    ``played`` the samples handed to the device (converted from device frames; equal to
    ``fed`` once a reply finished uninterrupted). ``first_sample_at`` is ``time.monotonic()``
    in the callback of the block that carried the reply's first sample; the sound leaves the
    device about ``output_latency_s`` later. ``finished``: everything was played, or dropped
    after ``interrupted``.
    """

    reply_id: str
    sample_rate: int
    fed: int
    discarded: int
    played: int
    first_sample_at: float | None
    output_latency_s: float
    ended: bool
    finished: bool
    interrupted: bool


@dataclass(frozen=True, slots=True, eq=False)
class CapturedBlock:
    """Microphone audio (``near``) with the reference played alongside it (``far``).

    Both are float32 mono at ``sample_rate`` (16 kHz) and of equal length; ``near`` is
    cleaned when the stream has an echo canceller (``echo_cancelled``). ``position`` is the
    index of their first sample in the 16 kHz stream since ``start``; ``started_at`` the
    ``time.monotonic()`` of the callback that handled that sample (estimated from the latest
    block's ``captured_at`` and ``device_frame``, the device frame that block started at).
    The microphone heard it about ``input_latency_s`` earlier. ``rms_dbfs``/``peak_dbfs`` are
    the microphone's level over the device blocks this read took; ``dropped_blocks`` counts
    blocks dropped (read as silence, to keep the timing) since the previous block.
    """

    near: np.ndarray
    far: np.ndarray
    sample_rate: int
    position: int
    started_at: float
    captured_at: float
    device_frame: int
    input_latency_s: float
    output_latency_s: float
    rms_dbfs: float
    peak_dbfs: float
    dropped_blocks: int
    echo_cancelled: bool


@dataclass(frozen=True, slots=True)
class DuplexMetrics:
    """What one duplex stream measured. Frames are device frames at ``device_rate``.

    ``silence_requested_at`` is when the latest ``duck``/``interrupt`` was called,
    ``silent_at`` the callback time of the block whose end reached zero gain after it (None
    while not yet, or after a ``resume``).
    """

    input_device: str
    output_device: str
    host_api: str
    device_rate: int
    sample_rate: int
    input_channels: int
    output_channels: int
    block_frames: int
    input_latency_s: float
    output_latency_s: float
    blocks: int
    frames: int
    capture_blocks_dropped: int
    capture_blocks_queued: int
    underruns: int
    underrun_seconds: float
    device_underflows: int
    device_overflows: int
    frames_played: int
    replies: int
    gain: float
    held: bool
    silence_requested_at: float | None
    silent_at: float | None
