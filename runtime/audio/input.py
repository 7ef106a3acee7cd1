"""Audio input: a PortAudio input stream delivering 16 kHz mono float32 chunks as they arrive.

Three parties touch an :class:`AudioInput`:

- the owner (any thread) calls ``start``, ``close``, ``level`` and ``metrics``;
- one consumer thread reads chunks (``read`` or iteration); it mixes each device block down to
  mono and resamples it with soxr to ``sample_rate`` (16 kHz unless told), so the audio thread
  does no filtering;
- PortAudio's audio thread calls :meth:`_Capture.callback`, which never waits: it copies the
  block into a bounded queue (a full queue drops the block and counts it) and notes the
  block's RMS and peak for a level meter.

The same code path serves a microphone and the tests: on a JACK dummy server, a client that
plays a file into the input stream's ports delivers it in real time, as a sound card would.
Closing asks the callback to end the stream and waits for that, as the player does (aborting a
running input thread is only safe while it is not in Python); a reader waiting on a closed
input gets the end of the stream (None).
"""

from __future__ import annotations

import collections
import math
import queue
import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

import numpy as np

from runtime.audio.devices import (
    InputDevice,
    _first_rate,
    _start_stream,
    _stream_closed,
    resolve_input_device,
    sounddevice_module,
)
from runtime.audio.resample import StreamResampler
from runtime.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import TracebackType

__all__ = [
    "AudioInput",
    "AudioLevel",
    "AudioSource",
    "CaptureMetrics",
    "level_dbfs",
]

#: The rate speech models take (Silero VAD, Whisper).
SPEECH_RATE: Final = 16000
#: Floor of the level meter: digital silence reads as this.
SILENCE_DBFS: Final = -120.0
STOP_GRACE_S: Final = 0.5
#: How often a waiting reader looks whether the stream ended.
_POLL_S: Final = 0.02


class AudioSource(Protocol):
    """What a consumer of live audio reads: mono float32 chunks at ``sample_rate``, in order,
    as they arrive; None once the source ended. ``level`` serves a meter."""

    @property
    def sample_rate(self) -> int: ...

    def read(self, timeout: float | None = None) -> np.ndarray | None: ...

    def level(self, window_s: float = 0.05) -> AudioLevel: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class AudioLevel:
    """RMS and peak of the last ``window_s`` of captured audio, in dB relative to full scale
    (0 dBFS is a sample of 1.0; silence reads :data:`SILENCE_DBFS`)."""

    rms_dbfs: float
    peak_dbfs: float
    window_s: float


def level_dbfs(value: float) -> float:
    """An amplitude (0 to 1) in dBFS, floored at :data:`SILENCE_DBFS`."""
    if value <= 0.0:
        return SILENCE_DBFS
    return max(SILENCE_DBFS, 20.0 * math.log10(value))


@dataclass(frozen=True, slots=True)
class CaptureMetrics:
    """What one input measured. Frames are device frames at ``device_rate``."""

    device_name: str
    device_index: int
    host_api: str
    device_rate: int
    sample_rate: int
    channels: int
    block_frames: int
    input_latency_s: float
    frames_captured: int
    blocks_captured: int
    blocks_dropped: int
    device_overflows: int
    samples_delivered: int
    queued_blocks: int


class _Capture:
    """State shared with the audio callback (kept apart from ``AudioInput`` so the stream,
    which holds the callback, never keeps the input alive and a finalizer can close it)."""

    __slots__ = (
        "blocks",
        "blocks_dropped",
        "device_overflows",
        "finished",
        "frames",
        "levels",
        "queue",
        "stop",
        "stop_signal",
    )

    def __init__(self, capacity: int, level_blocks: int, sd: Any) -> None:
        self.queue: queue.Queue[np.ndarray] = queue.Queue(maxsize=capacity)
        self.levels: collections.deque[tuple[int, float, float]] = collections.deque(
            maxlen=level_blocks
        )
        self.frames = 0
        self.blocks = 0
        self.blocks_dropped = 0
        self.device_overflows = 0
        self.stop = False
        self.finished = threading.Event()
        self.stop_signal: BaseException = sd.CallbackStop()

    def callback(self, indata: np.ndarray, frames: int, _time: Any, status: Any) -> None:
        """PortAudio's audio thread: keep a copy of the block. Never waits."""
        if self.stop:
            raise self.stop_signal
        if status and status.input_overflow:
            self.device_overflows += 1
        block = indata.copy()
        # A device (or a driver's stale buffer) may hand over NaN, infinity or values past
        # full scale: the audio is kept finite and within [-1, 1] from here on.
        np.nan_to_num(block, copy=False, nan=0.0, posinf=1.0, neginf=-1.0)
        np.clip(block, -1.0, 1.0, out=block)
        self.frames += frames
        self.blocks += 1
        if frames:
            peak = float(np.abs(block).max())
            mean_square = float(np.mean(np.square(block, dtype=np.float64)))
            self.levels.append((frames, mean_square, peak))
        try:
            self.queue.put_nowait(block)
        except queue.Full:
            self.blocks_dropped += 1

    def on_finished(self) -> None:
        self.finished.set()


class _StreamHolder:
    """Owns the PortAudio stream, so a finalizer or the exit hook can close it."""

    __slots__ = ("__weakref__", "capture", "stream")

    def __init__(self) -> None:
        self.stream: Any | None = None
        self.capture: _Capture | None = None

    def close(self, grace_s: float) -> None:
        stream, self.stream = self.stream, None
        if stream is None:
            return
        try:
            capture = self.capture
            if capture is not None and not capture.finished.is_set():
                capture.stop = True
                capture.finished.wait(grace_s)
            # Past the grace period the callback is not being called (a stalled device).
            stream.abort()
            stream.close()
        finally:
            _stream_closed(self)


def _check_rate(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"{name} must be a positive int in Hz; got {value!r}")
    return value


def _check_seconds(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise UsageError(f"{name} must be a positive number of seconds; got {value!r}")
    return float(value)


class AudioInput:
    """Record from an input device as 16 kHz (``sample_rate``) mono float32 chunks.

    ``device`` is a name (case-insensitive part of one), an index, or None for the default
    input. The device runs at ``device_rate`` when given, else at its own default rate (the
    rate it records best at), and the input resamples with soxr. ``channels`` (default 1) are
    mixed down to mono. ``block_frames`` is the callback size in device frames (default: 32 ms
    worth). ``queue_s`` bounds the audio waiting for the reader; past it blocks are dropped
    and counted (``metrics().blocks_dropped``), never waited for.
    """

    def __init__(
        self,
        device: str | int | None = None,
        *,
        sample_rate: int = SPEECH_RATE,
        device_rate: int | None = None,
        channels: int = 1,
        block_frames: int | None = None,
        queue_s: float = 10.0,
        latency: float | str = "low",
    ) -> None:
        self._sample_rate = _check_rate("sample_rate", sample_rate)
        self._requested_rate = (
            None if device_rate is None else _check_rate("device_rate", device_rate)
        )
        if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
            raise UsageError(f"channels must be a positive int; got {channels!r}")
        self._channels = channels
        if block_frames is not None and (
            isinstance(block_frames, bool)
            or not isinstance(block_frames, int)
            or not 16 <= block_frames <= 16384
        ):
            raise UsageError(f"block_frames must be an int from 16 to 16384; got {block_frames!r}")
        self._block_request = block_frames
        self._queue_s = _check_seconds("queue_s", queue_s)
        if isinstance(latency, str):
            if latency not in ("low", "high"):
                raise UsageError(f"latency must be 'low', 'high' or seconds; got {latency!r}")
        else:
            _check_seconds("latency", latency)
        self._latency = latency
        self._device_spec = device
        self._lock = threading.Lock()
        self._reader = threading.Lock()
        self._holder = _StreamHolder()
        self._finalizer = weakref.finalize(self, self._holder.close, STOP_GRACE_S)
        self._capture: _Capture | None = None
        self._resampler: StreamResampler | None = None
        self._device: InputDevice | None = None
        self._device_rate = 0
        self._block_frames = 0
        self._input_latency_s = 0.0
        self._delivered = 0
        self._ended = False
        self._closed = False

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Open the device and start recording."""
        with self._lock:
            if self._closed:
                raise UsageError("this input was closed; create a new AudioInput")
            if self._capture is not None:
                raise UsageError("the input was already started")
            sd = sounddevice_module()
            device = resolve_input_device(self._device_spec)
            if self._channels > device.max_input_channels:
                raise UsageError(
                    f"audio input {device.describe()} has {device.max_input_channels} input "
                    f"channel(s); {self._channels} were requested"
                )
            rate = self._choose_rate(sd, device)
            block = self._block_request or max(16, round(rate * 0.032))
            capacity = max(4, math.ceil(self._queue_s * rate / block))
            capture = _Capture(capacity, level_blocks=max(4, math.ceil(rate / block)), sd=sd)
            self._holder.capture = capture
            stream = _start_stream(
                sd,
                self._holder,
                lambda: sd.InputStream(
                    samplerate=rate,
                    blocksize=block,
                    device=device.index,
                    channels=self._channels,
                    dtype="float32",
                    latency=self._latency,
                    callback=capture.callback,
                    finished_callback=capture.on_finished,
                ),
                opening=f"audio input {device.describe()} at {rate} Hz, {self._channels} ch",
                starting=f"audio input {device.describe()}",
            )
            self._device = device
            self._device_rate = rate
            self._block_frames = block
            self._input_latency_s = float(stream.latency)
            self._resampler = StreamResampler(rate, self._sample_rate)
            self._capture = capture

    def _choose_rate(self, sd: Any, device: InputDevice) -> int:
        if self._requested_rate is not None:
            candidates = [self._requested_rate]
        else:
            candidates = [device.default_sample_rate, self._sample_rate]
        return _first_rate(
            sd,
            candidates,
            lambda rate: sd.check_input_settings(
                device=device.index, channels=self._channels, dtype="float32", samplerate=rate
            ),
            f"audio input {device.describe()} accepts none of the sample rates {{rates}} "
            f"with {self._channels} ch",
        )

    def close(self) -> None:
        """Stop recording and close the stream; a waiting reader gets the end. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._holder.close(STOP_GRACE_S + self._input_latency_s)

    def __enter__(self) -> AudioInput:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ consumer

    def read(self, timeout: float | None = None) -> np.ndarray | None:
        """The next chunk of mono samples at ``sample_rate`` (consumer thread).

        Waits for audio; returns an empty array after ``timeout`` seconds without any, and
        None once the input was closed (or the device stopped) and everything captured before
        was read.
        """
        capture = self._require_started()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._reader:
            while True:
                if self._ended:
                    return None
                try:
                    block = capture.queue.get(timeout=_POLL_S)
                except queue.Empty:
                    if capture.finished.is_set() or self._closed:
                        return self._end()
                    if deadline is not None and time.monotonic() >= deadline:
                        return np.zeros(0, np.float32)
                    continue
                chunk = self._convert(block)
                if chunk.size:
                    return chunk

    def _convert(self, block: np.ndarray) -> np.ndarray:
        mono = block[:, 0] if block.shape[1] == 1 else block.mean(axis=1, dtype=np.float32)
        resampler = self._resampler
        assert resampler is not None
        chunk = resampler.process(np.ascontiguousarray(mono, dtype=np.float32))
        self._delivered += chunk.size
        return chunk

    def _end(self) -> np.ndarray | None:
        """The resampler's tail once, then None."""
        self._ended = True
        resampler = self._resampler
        tail = resampler.flush() if resampler is not None else np.zeros(0, np.float32)
        if tail.size:
            self._delivered += tail.size
            return tail
        return None

    def __iter__(self) -> Iterator[np.ndarray]:
        """Chunks until the input is closed (from another thread) or the device stops."""
        while (chunk := self.read()) is not None:
            if chunk.size:
                yield chunk

    # ------------------------------------------------------------------- reports

    def _require_started(self) -> _Capture:
        capture = self._capture
        if capture is None:
            raise UsageError("the input was not started; call start() first")
        return capture

    @property
    def sample_rate(self) -> int:
        """The rate of the chunks :meth:`read` returns."""
        return self._sample_rate

    @property
    def device(self) -> InputDevice | None:
        """The device in use, once started."""
        return self._device

    @property
    def closed(self) -> bool:
        return self._closed

    def level(self, window_s: float = 0.05) -> AudioLevel:
        """RMS and peak (dBFS) of about the last ``window_s`` of captured audio (the blocks
        that end it; at least one block). Safe from any thread, e.g. a meter's timer."""
        capture = self._require_started()
        rate = self._device_rate
        frames = 0
        weighted = 0.0
        peak = 0.0
        for count, mean_square, block_peak in reversed(list(capture.levels)):
            frames += count
            weighted += mean_square * count
            peak = max(peak, block_peak)
            if frames >= window_s * rate:
                break
        if not frames:
            return AudioLevel(SILENCE_DBFS, SILENCE_DBFS, 0.0)
        rms = math.sqrt(weighted / frames)
        return AudioLevel(level_dbfs(rms), level_dbfs(peak), frames / rate)

    def metrics(self) -> CaptureMetrics:
        capture = self._require_started()
        device = self._device
        assert device is not None
        return CaptureMetrics(
            device_name=device.name,
            device_index=device.index,
            host_api=device.host_api,
            device_rate=self._device_rate,
            sample_rate=self._sample_rate,
            channels=self._channels,
            block_frames=self._block_frames,
            input_latency_s=self._input_latency_s,
            frames_captured=capture.frames,
            blocks_captured=capture.blocks,
            blocks_dropped=capture.blocks_dropped,
            device_overflows=capture.device_overflows,
            samples_delivered=self._delivered,
            queued_blocks=capture.queue.qsize(),
        )
