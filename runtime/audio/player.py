"""Streaming playback of mono float32 PCM as it arrives, through a PortAudio stream.

Three parties touch a player:

- the owner (any thread) calls ``start``, ``pause``, ``resume``, ``stop``, ``wait`` and
  ``metrics``;
- one producer thread at a time calls ``feed`` and ``end_of_stream``; it resamples to the
  device's rate and writes into a bounded ring, waiting (with an optional timeout) while
  the ring is full;
- PortAudio's audio thread calls :meth:`_Playback.callback`, which takes no lock, never
  waits, and allocates no sample memory (see ``ring.py`` for the few small objects that
  remain; ``sounddevice`` itself wraps each block in a new NumPy view and a flags object).

A jitter buffer sits in front of the device: output starts once ``cushion_s`` of audio is
queued (or the stream has ended), and after an underrun the cushion grows by half, up to
``max_cushion_s``, before output resumes. Underruns are counted by the player (the ring
ran dry after playback started and before the end of the stream), separately from the
output-underflow flag that PortAudio reports when the device itself starved.
"""

from __future__ import annotations

import enum
import math
import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from runtime.audio.devices import (
    AudioDeviceError,
    OutputDevice,
    _first_rate,
    _start_stream,
    _stream_closed,
    resolve_output_device,
    sounddevice_module,
)
from runtime.audio.resample import StreamResampler
from runtime.audio.ring import SampleRing
from runtime.errors import ExecutionError, RequestCancelled, UsageError

if TYPE_CHECKING:
    from types import TracebackType

__all__ = [
    "AudioPlayer",
    "PlaybackBufferFull",
    "PlaybackMetrics",
    "PlayerState",
]

CUSHION_GROWTH = 1.5
STOP_GRACE_S = 0.5


class PlaybackBufferFull(ExecutionError):
    """``feed`` waited longer than its timeout for room in the playback buffer."""


class PlayerState(enum.Enum):
    CREATED = "created"
    BUFFERING = "buffering"
    PLAYING = "playing"
    PAUSED = "paused"
    FINISHED = "finished"
    STOPPED = "stopped"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class PlaybackMetrics:
    """What one player measured. Durations are seconds; frames are at ``device_rate``.

    ``time_to_first_playback_s`` runs from the request start (``mark_request_start``) to the
    first block of audio handed to the device; ``underruns`` counts the times the buffer ran
    dry after playback started and before the end of the stream, ``underrun_seconds`` the
    silence they caused; ``device_underflows`` counts PortAudio's output-underflow flags;
    ``cancel_latency_s`` runs from ``stop()`` to the first silent block (or the stream's
    end); ``playback_elapsed_s`` from the first block to the end of playback.
    """

    device_name: str
    device_index: int
    host_api: str
    device_rate: int
    input_rate: int
    channels: int
    block_frames: int
    output_latency_s: float
    time_to_first_playback_s: float | None
    underruns: int
    underrun_seconds: float
    device_underflows: int
    blocks_played: int
    frames_played: int
    frames_queued: int
    cushion_s: float
    cancel_latency_s: float | None
    playback_elapsed_s: float | None


class _Playback:
    """State shared with the audio callback; the callback is the only writer of its counters.

    Kept apart from ``AudioPlayer`` so the stream (which holds the callback) never keeps the
    player alive, and the player's finalizer can close the stream.
    """

    __slots__ = (
        "abort_signal",
        "blocks_played",
        "cancel",
        "clock",
        "cushion",
        "device_underflows",
        "eos",
        "finished",
        "frames_played",
        "max_cushion",
        "paused",
        "playing",
        "ring",
        "started",
        "stop_signal",
        "t_cancel",
        "t_closed",
        "t_finished",
        "t_first",
        "t_silenced",
        "underrun_frames",
        "underruns",
    )

    def __init__(self, ring: SampleRing, cushion: int, max_cushion: int, sd: Any) -> None:
        self.ring = ring
        self.cushion = cushion
        self.max_cushion = max_cushion
        self.eos = False
        self.paused = False
        self.cancel = False
        self.playing = False
        self.started = False
        self.t_first: float | None = None
        self.t_silenced: float | None = None
        self.t_cancel: float | None = None
        self.t_closed: float | None = None
        self.t_finished: float | None = None
        self.underruns = 0
        self.underrun_frames = 0
        self.device_underflows = 0
        self.blocks_played = 0
        self.frames_played = 0
        self.finished = threading.Event()
        self.clock = time.monotonic
        # Raised at most once each; made here so the callback does not build them.
        self.stop_signal: BaseException = sd.CallbackStop()
        self.abort_signal: BaseException = sd.CallbackAbort()

    def callback(self, outdata: np.ndarray, frames: int, _time: Any, status: Any) -> None:
        """PortAudio's audio thread: fill ``outdata`` (frames x channels). Never waits."""
        if status and status.output_underflow:
            self.device_underflows += 1
        if self.cancel:
            outdata.fill(0.0)
            if self.t_silenced is None:
                self.t_silenced = self.clock()
            raise self.abort_signal
        if self.paused:
            outdata.fill(0.0)
            return
        # Read the end flag before the ring: the producer sets it only after its last write.
        eos = self.eos
        ring = self.ring
        if not self.playing:
            if ring.readable() < self.cushion and not eos:
                outdata.fill(0.0)
                if self.started:
                    self.underrun_frames += frames
                return
            self.playing = True
            self.started = True
        count = ring.read_into(outdata, frames)
        if count:
            if self.t_first is None:
                self.t_first = self.clock()
            self.blocks_played += 1
            self.frames_played += count
        if count < frames:
            outdata[count:].fill(0.0)
            if eos:
                raise self.stop_signal
            self.underruns += 1
            self.underrun_frames += frames - count
            self.playing = False
            grown = int(self.cushion * CUSHION_GROWTH)
            self.cushion = grown if grown < self.max_cushion else self.max_cushion

    def on_finished(self) -> None:
        """PortAudio calls this once the stream went inactive (drained, aborted or failed)."""
        self.t_finished = self.clock()
        self.finished.set()


class _StreamHolder:
    """Owns the PortAudio stream, so a finalizer or the exit hook can close it without the player.

    Closing asks the callback to end the stream itself and waits for that: aborting an
    active stream cancels PortAudio's audio thread (``pthread_cancel`` on ALSA), which is
    only safe while that thread is not running Python code.
    """

    __slots__ = ("__weakref__", "playback", "stream")

    def __init__(self) -> None:
        self.stream: Any | None = None
        self.playback: _Playback | None = None

    def close(self, grace_s: float) -> None:
        stream, self.stream = self.stream, None
        if stream is None:
            return
        try:
            playback = self.playback
            if playback is not None and not playback.finished.is_set():
                playback.t_cancel = time.monotonic()
                playback.cancel = True
                playback.finished.wait(grace_s)
            # Past the grace period the callback is not being called (a stalled device).
            stream.abort()
            stream.close()
            if playback is not None:
                playback.t_closed = time.monotonic()
        finally:
            _stream_closed(self)


def _check_positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise UsageError(f"{name} must be a positive number of seconds; got {value!r}")
    if not math.isfinite(value):
        raise UsageError(f"{name} must be finite; got {value!r}")
    return float(value)


def _check_rate(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"{name} must be a positive int in Hz; got {value!r}")
    return value


class AudioPlayer:
    """Play mono float32 PCM chunks on an output device as they arrive.

    ``device`` is a name (case-insensitive substring), an index, or None for the default.
    ``sample_rate_in`` is the rate of the fed audio; the device runs at ``device_rate``
    when given, else at ``sample_rate_in`` when the device accepts it, else at its default
    rate, and the player resamples. ``block_frames`` is the callback size in device frames:
    pause and cancel take effect within one block. ``buffer_s`` bounds the queued audio;
    ``feed`` waits while it is full.
    """

    def __init__(
        self,
        device: str | int | None = None,
        *,
        sample_rate_in: int,
        block_frames: int = 512,
        cushion_s: float = 0.15,
        max_cushion_s: float = 1.0,
        buffer_s: float = 10.0,
        latency: float | str = "low",
        device_rate: int | None = None,
        channels: int | None = None,
    ) -> None:
        self._input_rate = _check_rate("sample_rate_in", sample_rate_in)
        if (
            isinstance(block_frames, bool)
            or not isinstance(block_frames, int)
            or not (16 <= block_frames <= 16384)
        ):
            raise UsageError(f"block_frames must be an int from 16 to 16384; got {block_frames!r}")
        self._block_frames = block_frames
        self._cushion_s = _check_positive("cushion_s", cushion_s)
        self._max_cushion_s = _check_positive("max_cushion_s", max_cushion_s)
        if self._max_cushion_s < self._cushion_s:
            raise UsageError(
                f"max_cushion_s ({max_cushion_s}) must be at least cushion_s ({cushion_s})"
            )
        self._buffer_s = _check_positive("buffer_s", buffer_s)
        if self._buffer_s < 2 * self._max_cushion_s:
            raise UsageError(
                f"buffer_s ({buffer_s}) must be at least twice max_cushion_s ({max_cushion_s})"
            )
        if isinstance(latency, str):
            if latency not in ("low", "high"):
                raise UsageError(f"latency must be 'low', 'high' or seconds; got {latency!r}")
        else:
            _check_positive("latency", latency)
        self._latency = latency
        self._requested_rate = (
            None if device_rate is None else _check_rate("device_rate", device_rate)
        )
        if channels is not None and (
            isinstance(channels, bool) or not isinstance(channels, int) or channels < 1
        ):
            raise UsageError(f"channels must be a positive int; got {channels!r}")
        self._requested_channels = channels
        self._device_spec = device

        self._lock = threading.Lock()
        self._producer = threading.Lock()
        self._holder = _StreamHolder()
        self._finalizer = weakref.finalize(self, self._holder.close, STOP_GRACE_S)
        self._playback: _Playback | None = None
        self._resampler: StreamResampler | None = None
        self._device: OutputDevice | None = None
        self._device_rate = 0
        self._channels = 0
        self._output_latency_s = 0.0
        self._frames_queued = 0
        self._t_reference: float | None = None
        self._ended = False
        self._closed = False
        self._stopped = False

    # ----------------------------------------------------------------- lifecycle

    def mark_request_start(self, t: float | None = None) -> None:
        """Set the reference for ``time_to_first_playback_s`` (``time.monotonic()`` clock).

        Without it the reference is the moment ``start()`` was called.
        """
        self._t_reference = time.monotonic() if t is None else float(t)

    def start(self) -> None:
        """Open the device and start the stream (silent until the cushion is queued)."""
        with self._lock:
            if self._closed:
                raise UsageError("this player was stopped; create a new AudioPlayer")
            if self._playback is not None:
                raise UsageError("the player was already started")
            if self._t_reference is None:
                self._t_reference = time.monotonic()
            sd = sounddevice_module()
            device = resolve_output_device(self._device_spec)
            channels = self._requested_channels or min(2, device.max_output_channels)
            if channels > device.max_output_channels:
                raise UsageError(
                    f"device {device.describe()} has {device.max_output_channels} output "
                    f"channel(s); {channels} were requested"
                )
            rate = self._choose_rate(sd, device, channels)
            ring = SampleRing(max(int(self._buffer_s * rate), 4 * self._block_frames))
            playback = _Playback(
                ring,
                cushion=max(1, round(self._cushion_s * rate)),
                max_cushion=max(1, round(self._max_cushion_s * rate)),
                sd=sd,
            )
            self._holder.playback = playback
            stream = _start_stream(
                sd,
                self._holder,
                lambda: sd.OutputStream(
                    samplerate=rate,
                    blocksize=self._block_frames,
                    device=device.index,
                    channels=channels,
                    dtype="float32",
                    latency=self._latency,
                    callback=playback.callback,
                    finished_callback=playback.on_finished,
                ),
                opening=f"audio output {device.describe()} at {rate} Hz, {channels} ch",
                starting=f"audio output {device.describe()}",
            )
            self._device = device
            self._device_rate = rate
            self._channels = channels
            self._output_latency_s = float(stream.latency)
            self._resampler = StreamResampler(self._input_rate, rate)
            self._playback = playback

    def _choose_rate(self, sd: Any, device: OutputDevice, channels: int) -> int:
        if self._requested_rate is not None:
            candidates = [self._requested_rate]
        else:
            candidates = [self._input_rate, device.default_sample_rate]
        return _first_rate(
            sd,
            candidates,
            lambda rate: sd.check_output_settings(
                device=device.index, channels=channels, dtype="float32", samplerate=rate
            ),
            f"audio output {device.describe()} accepts none of the sample rates {{rates}} "
            f"with {channels} ch",
        )

    def pause(self) -> None:
        """Output silence from the next block on; queued audio is kept."""
        self._require_started().paused = True

    def resume(self) -> None:
        """Continue from where ``pause`` left off."""
        self._require_started().paused = False

    def stop(self) -> None:
        """Cancel: silence within one block, close the stream, free the buffers. Idempotent.

        The callback itself outputs the silent block and ends the stream, so the audio
        thread is never interrupted inside Python; if the callback does not run within
        ``STOP_GRACE_S`` (a stalled device), the stream is aborted from here.
        """
        with self._lock:
            if self._closed:
                return
            self._stopped = True
            self._close_locked()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until everything fed was played (after ``end_of_stream``) or the player stopped.

        Returns True when playback is over (the stream is then closed), False on timeout.
        """
        playback = self._require_started()
        if not playback.finished.wait(timeout):
            return False
        with self._lock:
            self._close_locked()
        return True

    def _close_locked(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._holder.close(STOP_GRACE_S + self._output_latency_s)
        if self._playback is not None:
            # Keep the counters, drop the samples: the ring is the only large allocation.
            self._playback.ring = SampleRing(1)
        self._resampler = None

    def __enter__(self) -> AudioPlayer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ producer

    def feed(self, pcm: np.ndarray, *, timeout_s: float | None = None) -> None:
        """Queue mono float32 samples at ``sample_rate_in`` (producer thread).

        Waits while the buffer is full; raises ``PlaybackBufferFull`` after ``timeout_s``
        (None waits as long as the player lives), ``RequestCancelled`` once stopped.
        """
        if not isinstance(pcm, np.ndarray) or pcm.ndim != 1 or pcm.dtype != np.float32:
            shape = getattr(pcm, "shape", None)
            dtype = getattr(pcm, "dtype", type(pcm).__name__)
            raise UsageError(
                f"feed takes a 1-D float32 NumPy array of mono samples; got {dtype} with "
                f"shape {shape}"
            )
        if not np.isfinite(pcm).all():
            raise UsageError("feed got NaN or infinite samples; audio must be finite floats")
        with self._producer:
            self._check_feedable()
            resampler = self._resampler
            assert resampler is not None
            self._push(resampler.process(pcm), timeout_s)

    def end_of_stream(self, *, timeout_s: float | None = None) -> None:
        """No more audio: queue the resampler's tail; playback drains, then finishes."""
        with self._producer:
            self._check_feedable()
            resampler = self._resampler
            assert resampler is not None
            self._push(resampler.flush(), timeout_s)
            self._ended = True
            self._require_started().eos = True

    def _check_feedable(self) -> None:
        playback = self._require_started()
        if self._ended:
            raise UsageError("end_of_stream() was already called; no more audio can be fed")
        self._check_alive(playback)

    def _check_alive(self, playback: _Playback) -> None:
        if self._stopped or playback.cancel:
            raise RequestCancelled("playback was stopped")
        if playback.finished.is_set() or self._closed:
            device = self._device.describe() if self._device else "the audio output"
            raise AudioDeviceError(
                f"the stream to {device} ended unexpectedly (the device failed or was disconnected)"
            )

    def _push(self, samples: np.ndarray, timeout_s: float | None) -> None:
        playback = self._require_started()
        total = samples.shape[0]
        done = 0
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        # Half a block: the ring only fills when it already holds many blocks.
        poll_s = min(0.005, self._block_frames / self._device_rate / 2)
        while True:
            done += playback.ring.write(samples[done:])
            if done >= total:
                break
            self._check_alive(playback)
            if deadline is not None and time.monotonic() >= deadline:
                self._frames_queued += done
                raise PlaybackBufferFull(
                    f"the playback buffer ({self._buffer_s} s) stayed full for {timeout_s} s "
                    f"(paused, or the device is not consuming); {total - done} of {total} "
                    "frames were not queued"
                )
            time.sleep(poll_s)
        self._frames_queued += total

    # ------------------------------------------------------------------- reports

    def _require_started(self) -> _Playback:
        playback = self._playback
        if playback is None:
            raise UsageError("the player was not started; call start() first")
        return playback

    @property
    def state(self) -> PlayerState:
        playback = self._playback
        if playback is None:
            return PlayerState.STOPPED if self._closed else PlayerState.CREATED
        if playback.cancel:
            return PlayerState.STOPPED
        if playback.finished.is_set():
            return PlayerState.FINISHED if playback.eos else PlayerState.FAILED
        if playback.paused:
            return PlayerState.PAUSED
        return PlayerState.PLAYING if playback.playing else PlayerState.BUFFERING

    @property
    def device(self) -> OutputDevice | None:
        """The device in use, once started."""
        return self._device

    @property
    def block_duration_s(self) -> float:
        """Seconds per callback block at the device rate (0 before ``start``)."""
        return self._block_frames / self._device_rate if self._device_rate else 0.0

    def metrics(self) -> PlaybackMetrics:
        """A snapshot of what the player measured so far."""
        playback = self._playback
        device = self._device
        rate = self._device_rate
        if playback is None or device is None:
            raise UsageError("the player was not started; there are no metrics yet")
        first = (
            None
            if playback.t_first is None or self._t_reference is None
            else playback.t_first - self._t_reference
        )
        cancel_latency = None
        if playback.t_cancel is not None:
            ends = [
                t
                for t in (playback.t_silenced, playback.t_finished, playback.t_closed)
                if t is not None
            ]
            if ends:
                cancel_latency = max(0.0, min(ends) - playback.t_cancel)
        elapsed = None
        if playback.t_first is not None and playback.t_finished is not None:
            elapsed = playback.t_finished - playback.t_first
        return PlaybackMetrics(
            device_name=device.name,
            device_index=device.index,
            host_api=device.host_api,
            device_rate=rate,
            input_rate=self._input_rate,
            channels=self._channels,
            block_frames=self._block_frames,
            output_latency_s=self._output_latency_s,
            time_to_first_playback_s=first,
            underruns=playback.underruns,
            underrun_seconds=playback.underrun_frames / rate,
            device_underflows=playback.device_underflows,
            blocks_played=playback.blocks_played,
            frames_played=playback.frames_played,
            frames_queued=self._frames_queued,
            cushion_s=playback.cushion / rate,
            cancel_latency_s=cancel_latency,
            playback_elapsed_s=elapsed,
        )
