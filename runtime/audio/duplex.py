"""A full-duplex speaker and microphone stream for a spoken conversation with barge-in.

Four parties touch a :class:`DuplexAudio`:

- the owner (any thread) calls ``start``, ``close``, ``metrics``, ``level``, ``reply`` and
  the barge-in controls ``duck``, ``resume`` and ``interrupt``; the controls only write
  flags (under a lock of their own that the callback never takes) and take effect inside the
  callback within one block;
- one producer thread feeds replies: ``begin_reply``, ``feed`` (mono float32 at the reply's
  rate, resampled to the device's rate), ``end_reply``; it writes into a preallocated
  :class:`~runtime.audio.ring.SampleRing` and waits (with an optional timeout) while the
  ring is full;
- one consumer thread calls ``read``: it takes captured blocks from a preallocated ring of
  blocks, resamples the microphone (``near``) and the played reference (``far``) to 16 kHz,
  and runs the optional echo canceller on whole frames;
- PortAudio's audio thread calls :meth:`_Duplex.callback`. It takes no lock, never waits and
  allocates no sample memory: the output, the gain ramp, the mixed-down microphone and the
  capture slots are preallocated; each counter and flag is written by one side only (see
  ``ring.py`` for the small objects that remain).

The audio callback's state lives in :mod:`runtime.audio.duplex_callback`, the values handed
out and the echo canceller's protocol in :mod:`runtime.audio.duplex_values`.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from runtime.audio.devices import (
    AudioDeviceError,
    InputDevice,
    OutputDevice,
    _first_rate,
    _start_stream,
    resolve_input_device,
    resolve_output_device,
    sounddevice_module,
)
from runtime.audio.duplex_callback import _Duplex, _Reply, _StreamHolder
from runtime.audio.duplex_values import (
    CapturedBlock,
    DuplexMetrics,
    FrameEchoCanceller,
    PassThroughEchoCanceller,
    ReplyPlayback,
)
from runtime.audio.input import SILENCE_DBFS, SPEECH_RATE, AudioLevel, level_dbfs
from runtime.audio.player import PlaybackBufferFull
from runtime.audio.resample import StreamResampler
from runtime.audio.ring import SampleRing
from runtime.errors import RequestCancelled, UsageError

if TYPE_CHECKING:
    from types import TracebackType

__all__ = [
    "CapturedBlock",
    "DuplexAudio",
    "DuplexMetrics",
    "FrameEchoCanceller",
    "PassThroughEchoCanceller",
    "ReplyPlayback",
]

#: The rate of the default voice (Piper ``joe``).
DEFAULT_REPLY_RATE: Final = 22050
STOP_GRACE_S: Final = 0.5
#: Seconds of captured blocks the level meter can look back over.
_LEVEL_HISTORY_S: Final = 2.0

DeviceSpec = str | int | None


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


def _check_channels(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name} must be a positive int; got {value!r}")
    return value


def _check_device_spec(value: object) -> tuple[DeviceSpec, DeviceSpec]:
    def single(spec: object) -> DeviceSpec:
        if spec is None or (isinstance(spec, (str, int)) and not isinstance(spec, bool)):
            return spec
        raise UsageError(
            f"device must be a name, an index, None or an (input, output) pair of those; "
            f"got {value!r}"
        )

    if isinstance(value, tuple):
        if len(value) != 2:
            raise UsageError(
                f"device as a pair must be (input, output); got {len(value)} items: {value!r}"
            )
        return single(value[0]), single(value[1])
    spec = single(value)
    return spec, spec


def _check_canceller(canceller: object) -> FrameEchoCanceller | None:
    if canceller is None:
        return None
    frame = getattr(canceller, "frame_samples", None)
    if isinstance(frame, bool) or not isinstance(frame, int) or frame < 1:
        raise UsageError(
            f"echo_canceller must have frame_samples, a positive int; got {frame!r} from "
            f"{type(canceller).__name__}"
        )
    if not callable(getattr(canceller, "process", None)):
        raise UsageError(
            f"echo_canceller must have process(near, far); {type(canceller).__name__} has not"
        )
    checked: FrameEchoCanceller = canceller  # type: ignore[assignment]
    return checked


def _describe(spec: DeviceSpec) -> str:
    return "the default" if spec is None else repr(spec)


class DuplexAudio:
    """Play replies and record the microphone through one full-duplex PortAudio stream.

    ``device`` names both sides (a name, case-insensitive part of one, an index, or None for
    the defaults) or is an ``(input, output)`` pair when they are different devices. Both run
    at ``device_rate`` when given, else at the first rate both accept of the output's
    default, the input's default, 48 kHz and 16 kHz. Replies are fed at their own rate
    (``reply_rate`` unless ``begin_reply`` names one); captured audio is read at
    ``sample_rate`` (16 kHz). ``block_frames`` is the callback size: the controls take effect
    within one block. ``buffer_s`` bounds queued reply audio (``feed`` waits while full);
    ``queue_s`` bounds captured audio waiting for ``read`` (past it blocks are dropped and
    counted). ``echo_canceller`` (see :class:`FrameEchoCanceller`) cleans ``near`` in whole
    frames, which delays it by less than one frame (``frame_samples``) at 16 kHz.
    """

    def __init__(
        self,
        device: DeviceSpec | tuple[DeviceSpec, DeviceSpec] = None,
        *,
        reply_rate: int = DEFAULT_REPLY_RATE,
        sample_rate: int = SPEECH_RATE,
        device_rate: int | None = None,
        input_channels: int = 1,
        output_channels: int | None = None,
        block_frames: int = 512,
        fade_s: float = 0.02,
        cushion_s: float = 0.1,
        buffer_s: float = 10.0,
        queue_s: float = 5.0,
        latency: float | str = "low",
        echo_canceller: FrameEchoCanceller | None = None,
    ) -> None:
        self._input_spec, self._output_spec = _check_device_spec(device)
        self._reply_rate = _check_rate("reply_rate", reply_rate)
        self._sample_rate = _check_rate("sample_rate", sample_rate)
        self._requested_rate = (
            None if device_rate is None else _check_rate("device_rate", device_rate)
        )
        self._input_channels = _check_channels("input_channels", input_channels)
        self._requested_output_channels = (
            None if output_channels is None else _check_channels("output_channels", output_channels)
        )
        if (
            isinstance(block_frames, bool)
            or not isinstance(block_frames, int)
            or not 16 <= block_frames <= 16384
        ):
            raise UsageError(f"block_frames must be an int from 16 to 16384; got {block_frames!r}")
        self._block_frames = block_frames
        self._fade_s = _check_seconds("fade_s", fade_s)
        self._cushion_s = _check_seconds("cushion_s", cushion_s)
        self._buffer_s = _check_seconds("buffer_s", buffer_s)
        if self._buffer_s < 2 * self._cushion_s:
            raise UsageError(
                f"buffer_s ({buffer_s}) must be at least twice cushion_s ({cushion_s})"
            )
        self._queue_s = _check_seconds("queue_s", queue_s)
        if isinstance(latency, str):
            if latency not in ("low", "high"):
                raise UsageError(f"latency must be 'low', 'high' or seconds; got {latency!r}")
        else:
            _check_seconds("latency", latency)
        self._latency = latency
        self._canceller = _check_canceller(echo_canceller)

        self._lock = threading.Lock()
        self._producer = threading.Lock()
        self._control = threading.Lock()
        self._reader = threading.Lock()
        self._holder = _StreamHolder()
        self._finalizer = weakref.finalize(self, self._holder.close, STOP_GRACE_S)
        self._duplex: _Duplex | None = None
        self._input: InputDevice | None = None
        self._output: OutputDevice | None = None
        self._device_rate = 0
        self._output_channels = 0
        self._input_latency_s = 0.0
        self._output_latency_s = 0.0
        self._closed = False
        # Producer side.
        self._replies: dict[str, _Reply] = {}
        self._open: _Reply | None = None
        # Controls.
        self._silence_requested_at: float | None = None
        self._silence_wanted = False
        # Consumer side.
        self._near_resampler: StreamResampler | None = None
        self._far_resampler: StreamResampler | None = None
        self._pending_near = np.zeros(0, np.float32)
        self._pending_far = np.zeros(0, np.float32)
        self._next_frame = 0
        self._position = 0
        self._dropped_unreported = 0
        self._ended = False

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Open the devices and start the stream (silent until a reply is fed)."""
        with self._lock:
            if self._closed:
                raise UsageError("this duplex stream was closed; create a new DuplexAudio")
            if self._duplex is not None:
                raise UsageError("the duplex stream was already started")
            sd = sounddevice_module()
            input_device = resolve_input_device(self._input_spec)
            output_device = resolve_output_device(self._output_spec)
            if self._input_channels > input_device.max_input_channels:
                raise UsageError(
                    f"audio input {input_device.describe()} has "
                    f"{input_device.max_input_channels} input channel(s); "
                    f"input_channels={self._input_channels} was requested"
                )
            out_channels = self._requested_output_channels or min(
                2, output_device.max_output_channels
            )
            if out_channels > output_device.max_output_channels:
                raise UsageError(
                    f"audio output {output_device.describe()} has "
                    f"{output_device.max_output_channels} output channel(s); "
                    f"output_channels={out_channels} was requested"
                )
            rate = self._choose_rate(sd, input_device, output_device, out_channels)
            block = self._block_frames
            duplex = _Duplex(
                ring=SampleRing(max(int(self._buffer_s * rate), 4 * block)),
                block=block,
                in_channels=self._input_channels,
                cap_slots=max(4, math.ceil(self._queue_s * rate / block)),
                level_slots=max(4, math.ceil(_LEVEL_HISTORY_S * rate / block)),
                cushion=max(1, round(self._cushion_s * rate)),
                fade_frames=max(1, round(self._fade_s * rate)),
                sd=sd,
            )
            devices = f"input {input_device.describe()} and output {output_device.describe()}"
            self._holder.duplex = duplex
            stream = _start_stream(
                sd,
                self._holder,
                lambda: sd.Stream(
                    samplerate=rate,
                    blocksize=block,
                    device=(input_device.index, output_device.index),
                    channels=(self._input_channels, out_channels),
                    dtype="float32",
                    latency=self._latency,
                    callback=duplex.callback,
                    finished_callback=duplex.on_finished,
                ),
                opening=f"a duplex stream on {devices} at {rate} Hz "
                f"({self._input_channels} ch in, {out_channels} ch out)",
                starting=f"the duplex stream on {devices}",
            )
            self._input = input_device
            self._output = output_device
            self._device_rate = rate
            self._output_channels = out_channels
            in_latency, out_latency = stream.latency
            self._input_latency_s = float(in_latency)
            self._output_latency_s = float(out_latency)
            self._near_resampler = StreamResampler(rate, self._sample_rate)
            self._far_resampler = StreamResampler(rate, self._sample_rate)
            self._duplex = duplex

    def _choose_rate(
        self, sd: Any, input_device: InputDevice, output_device: OutputDevice, out_channels: int
    ) -> int:
        if self._requested_rate is not None:
            candidates = [self._requested_rate]
        else:
            candidates = list(
                dict.fromkeys(
                    [
                        output_device.default_sample_rate,
                        input_device.default_sample_rate,
                        48000,
                        self._sample_rate,
                    ]
                )
            )

        def check(rate: int) -> None:
            sd.check_input_settings(
                device=input_device.index,
                channels=self._input_channels,
                dtype="float32",
                samplerate=rate,
            )
            sd.check_output_settings(
                device=output_device.index, channels=out_channels, dtype="float32", samplerate=rate
            )

        return _first_rate(
            sd,
            candidates,
            check,
            f"audio input {input_device.describe()} and output {output_device.describe()} "
            f"accept none of the sample rates {{rates}} together "
            f"({self._input_channels} ch in, {out_channels} ch out)",
        )

    def close(self) -> None:
        """Stop both directions and close the stream. Idempotent.

        A waiting producer gets ``RequestCancelled``; a reader gets what was captured before,
        then None.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._holder.close(STOP_GRACE_S + self._output_latency_s)

    def __enter__(self) -> DuplexAudio:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ producer

    def begin_reply(self, reply_id: str, *, sample_rate: int | None = None) -> None:
        """Start a new reply (producer thread); its audio follows the previous reply's.

        ``sample_rate`` is the rate ``feed`` will get (``reply_rate`` unless given). The
        previous reply must have been ended, unless it was interrupted.
        """
        if not isinstance(reply_id, str) or not reply_id:
            raise UsageError(f"reply_id must be a non-empty str; got {reply_id!r}")
        rate = self._reply_rate if sample_rate is None else _check_rate("sample_rate", sample_rate)
        with self._producer:
            duplex = self._check_alive()
            if reply_id in self._replies:
                raise UsageError(f"reply id {reply_id!r} was already used; give each reply its own")
            previous = self._open
            if previous is not None:
                if not previous.interrupt_requested:
                    raise UsageError(
                        f"reply {previous.reply_id!r} is still open; call end_reply() before "
                        f"begin_reply({reply_id!r})"
                    )
                self._close_reply(previous, duplex)
            reply = _Reply(reply_id, rate, StreamResampler(rate, self._device_rate))
            self._replies[reply_id] = reply
            self._open = reply
            duplex.replies.append(reply)

    def feed(self, pcm: np.ndarray, *, timeout_s: float | None = None) -> bool:
        """Queue mono float32 samples of the open reply (producer thread).

        Returns True when queued, False when discarded because the reply was interrupted.
        Waits while the buffer is full (while ducked, the reply does not drain); raises
        ``PlaybackBufferFull`` after ``timeout_s`` (None waits), ``RequestCancelled`` once
        closed.
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
            duplex = self._check_alive()
            reply = self._require_open("feed")
            if reply.interrupt_requested:
                reply.discarded += pcm.size
                return False
            resampler = reply.resampler
            assert resampler is not None
            reply.fed += pcm.size
            return self._push(duplex, reply, resampler.process(pcm), timeout_s)

    def end_reply(self, *, timeout_s: float | None = None) -> None:
        """No more audio for the open reply: queue the resampler's tail; it plays out."""
        with self._producer:
            duplex = self._check_alive()
            reply = self._require_open("end_reply")
            resampler = reply.resampler
            if not reply.interrupt_requested and resampler is not None:
                self._push(duplex, reply, resampler.flush(), timeout_s)
            self._close_reply(reply, duplex)

    def _close_reply(self, reply: _Reply, duplex: _Duplex) -> None:
        reply.resampler = None
        reply.end = duplex.ring.total_written
        self._open = None

    def _require_open(self, call: str) -> _Reply:
        reply = self._open
        if reply is None:
            raise UsageError(f"{call}() needs an open reply; call begin_reply(reply_id) first")
        return reply

    def _check_alive(self) -> _Duplex:
        duplex = self._duplex
        if duplex is None:
            if self._closed:
                raise RequestCancelled("the duplex stream was closed")
            raise UsageError("the duplex stream was not started; call start() first")
        if self._closed or duplex.stop:
            raise RequestCancelled("the duplex stream was closed")
        if duplex.finished.is_set():
            raise AudioDeviceError(
                f"the duplex stream on {self._devices_text()} ended unexpectedly (the device "
                "failed or was disconnected)"
            )
        return duplex

    def _push(
        self, duplex: _Duplex, reply: _Reply, samples: np.ndarray, timeout_s: float | None
    ) -> bool:
        total = samples.shape[0]
        done = 0
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        poll_s = min(0.005, self._block_frames / self._device_rate / 2)
        while True:
            done += duplex.ring.write(samples[done:])
            if done >= total:
                return True
            if reply.interrupt_requested:
                return False
            self._check_alive()
            if deadline is not None and time.monotonic() >= deadline:
                raise PlaybackBufferFull(
                    f"the playback buffer ({self._buffer_s} s) stayed full for {timeout_s} s "
                    f"(ducked, or the device is not consuming); {total - done} of {total} "
                    f"frames of reply {reply.reply_id!r} were not queued"
                )
            time.sleep(poll_s)

    # ------------------------------------------------------------------ controls

    def duck(self) -> None:
        """Fade the output to silence over ``fade_s``, then hold the reply where it is."""
        with self._control:
            duplex = self._require_started()
            self._silence_requested_at = time.monotonic()
            self._silence_wanted = True
            duplex.hold_requested = True
            duplex.silence_serial += 1

    def resume(self) -> None:
        """Fade back in over ``fade_s`` and continue from the held sample."""
        with self._control:
            duplex = self._require_started()
            self._silence_wanted = False
            duplex.hold_requested = False

    def interrupt(self) -> tuple[str, ...]:
        """Fade out (unless silent already), then drop every reply not yet finished.

        Returns their ids; later feeds for them are discarded. The next reply plays at full
        gain (an interrupt also ends a duck).
        """
        with self._control:
            duplex = self._require_started()
            self._silence_requested_at = time.monotonic()
            self._silence_wanted = True
            interrupted = []
            # Every queued reply, also one played to its end but not yet retired: the
            # callback drops them in order, the finished ones with nothing to drop.
            for reply in list(duplex.replies):
                reply.interrupt_requested = True
                if not reply.finished:
                    interrupted.append(reply.reply_id)
            duplex.hold_requested = False
            duplex.silence_serial += 1
            return tuple(interrupted)

    def wait_silent(self, timeout: float | None = None) -> float | None:
        """Wait until the output is silent after the latest ``duck``/``interrupt``.

        Returns ``silent_at``: the callback time of the first block after the call whose end
        is silent (the fade reached zero gain, or nothing was playing). None after
        ``timeout``, after a ``resume``, or when the stream ended first.
        """
        duplex = self._require_started()
        if self._silence_requested_at is None:
            raise UsageError("wait_silent() needs a duck() or interrupt() first")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if not self._silence_wanted:
                return None
            if duplex.silent_serial == duplex.silence_serial:
                return duplex.silent_at
            if duplex.finished.is_set():
                return None
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(0.001)

    # ------------------------------------------------------------------- replies

    def reply(self, reply_id: str) -> ReplyPlayback:
        """A snapshot of one reply's playback."""
        reply = self._replies.get(reply_id)
        if reply is None:
            known = ", ".join(repr(name) for name in list(self._replies)[-10:]) or "none"
            raise UsageError(f"no reply {reply_id!r} was begun; the latest are: {known}")
        rate = self._device_rate
        if reply.finished and not reply.interrupted:
            played = reply.fed
        else:
            played = min(reply.fed, round(reply.played * reply.rate / rate))
        return ReplyPlayback(
            reply_id=reply.reply_id,
            sample_rate=reply.rate,
            fed=reply.fed,
            discarded=reply.discarded,
            played=played,
            first_sample_at=reply.first_at,
            output_latency_s=self._output_latency_s,
            ended=reply.end >= 0,
            finished=reply.finished,
            interrupted=reply.interrupted or (reply.interrupt_requested and not reply.finished),
        )

    def played_samples(self, reply_id: str) -> int:
        """Samples of the reply (at its own rate) handed to the device so far."""
        return self.reply(reply_id).played

    def wait_reply(self, reply_id: str, timeout: float | None = None) -> bool:
        """Wait until the reply finished playing (or was dropped); False after ``timeout``."""
        if reply_id not in self._replies:
            self.reply(reply_id)
        reply = self._replies[reply_id]
        duplex = self._require_started()
        deadline = None if timeout is None else time.monotonic() + timeout
        poll_s = min(0.005, self._block_frames / self._device_rate / 2)
        while not reply.finished:
            if duplex.finished.is_set():
                return False
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True

    # ------------------------------------------------------------------ consumer

    def read(self, timeout: float | None = None) -> CapturedBlock | None:
        """The next captured audio, ``near`` and ``far`` at 16 kHz (consumer thread).

        Waits for audio; returns None after ``timeout`` seconds without any (``ended`` is
        then False) and once the stream was closed (or the device stopped) and everything
        captured before was read (``ended`` is then True).
        """
        duplex = self._require_started()
        deadline = None if timeout is None else time.monotonic() + timeout
        poll_s = min(0.005, self._block_frames / self._device_rate / 2)
        with self._reader:
            while True:
                if self._ended:
                    return None
                if duplex.cap_written > duplex.cap_read:
                    block = self._take(duplex)
                    if block is not None:
                        return block
                    continue
                if duplex.finished.is_set() or self._closed:
                    return self._end()
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                time.sleep(poll_s)

    def _take(self, duplex: _Duplex) -> CapturedBlock | None:
        """Convert the captured blocks waiting; None when no whole output came of them yet.

        Blocks dropped in between read as silence in both ``near`` and ``far``, which keeps
        them in step with the stream's time; after a longer gap than the capture queue holds,
        the conversion starts afresh at the new position instead.
        """
        longest_fill = duplex.cap_slots * self._block_frames
        nears: list[np.ndarray] = []
        fars: list[np.ndarray] = []
        weighted = 0.0
        frames_total = 0
        peak = 0.0
        captured_at = 0.0
        device_frame = 0
        index = duplex.cap_read
        while index < duplex.cap_written:
            slot = index % duplex.cap_slots
            start = int(duplex.cap_frame[slot])
            gap = start - self._next_frame
            if gap > 0:
                self._dropped_unreported += max(1, round(gap / self._block_frames))
                if gap <= longest_fill:
                    nears.append(np.zeros(gap, np.float32))
                    fars.append(np.zeros(gap, np.float32))
                elif nears:
                    break  # convert what came before the gap first
                else:
                    self._restart_conversion(start)
            frames = int(duplex.cap_frames[slot])
            device_frame = start
            captured_at = float(duplex.cap_time[slot])
            nears.append(duplex.cap_buffer[slot, :frames, 0].copy())
            fars.append(duplex.cap_buffer[slot, :frames, 1].copy())
            weighted += float(duplex.cap_mean_square[slot]) * frames
            frames_total += frames
            peak = max(peak, float(duplex.cap_peak[slot]))
            self._next_frame = start + frames
            index += 1
            # The callback may overwrite a slot once it is given back.
            duplex.cap_read = index
        near_resampler = self._near_resampler
        far_resampler = self._far_resampler
        assert near_resampler is not None
        assert far_resampler is not None
        near = near_resampler.process(np.concatenate(nears))
        far = far_resampler.process(np.concatenate(fars))
        rms = math.sqrt(weighted / frames_total) if frames_total else 0.0
        return self._emit(near, far, captured_at, device_frame, rms, peak, final=False)

    def _restart_conversion(self, device_frame: int) -> None:
        """Start converting afresh at ``device_frame`` (the tails of before are let go)."""
        rate = self._device_rate
        self._near_resampler = StreamResampler(rate, self._sample_rate)
        self._far_resampler = StreamResampler(rate, self._sample_rate)
        self._pending_near = np.zeros(0, np.float32)
        self._pending_far = np.zeros(0, np.float32)
        self._position = round(device_frame * self._sample_rate / rate)
        self._next_frame = device_frame

    def _emit(
        self,
        near: np.ndarray,
        far: np.ndarray,
        captured_at: float,
        device_frame: int,
        rms: float,
        peak: float,
        *,
        final: bool,
    ) -> CapturedBlock | None:
        near = np.concatenate([self._pending_near, near])
        far = np.concatenate([self._pending_far, far])
        size = min(near.size, far.size)
        canceller = self._canceller
        if canceller is not None:
            frame = canceller.frame_samples
            whole = size if final else size // frame * frame
        else:
            whole = size
        self._pending_near = near[whole:]
        self._pending_far = far[whole:]
        near, far = near[:whole], far[:whole]
        if canceller is not None and whole:
            near = self._cancel(canceller, near, far)
        if not whole:
            return None
        position = self._position
        self._position += whole
        rate = self._device_rate
        started_at = captured_at + (position * rate / self._sample_rate - device_frame) / rate
        dropped, self._dropped_unreported = self._dropped_unreported, 0
        return CapturedBlock(
            near=near,
            far=np.ascontiguousarray(far),
            sample_rate=self._sample_rate,
            position=position,
            started_at=started_at,
            captured_at=captured_at,
            device_frame=device_frame,
            input_latency_s=self._input_latency_s,
            output_latency_s=self._output_latency_s,
            rms_dbfs=level_dbfs(rms),
            peak_dbfs=level_dbfs(peak),
            dropped_blocks=dropped,
            echo_cancelled=canceller is not None,
        )

    @staticmethod
    def _cancel(canceller: FrameEchoCanceller, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        frame = canceller.frame_samples
        count = math.ceil(near.size / frame)
        padded_near = np.zeros(count * frame, np.float32)
        padded_far = np.zeros(count * frame, np.float32)
        padded_near[: near.size] = near
        padded_far[: far.size] = far
        cleaned = np.empty(count * frame, np.float32)
        for index in range(count):
            piece = slice(index * frame, (index + 1) * frame)
            out = canceller.process(padded_near[piece], padded_far[piece])
            if not isinstance(out, np.ndarray) or out.shape != (frame,):
                raise UsageError(
                    f"the echo canceller {type(canceller).__name__} returned "
                    f"{getattr(out, 'shape', type(out).__name__)} for a frame of {frame} "
                    "samples; it must return a frame of the same shape"
                )
            cleaned[piece] = out
        return cleaned[: near.size]

    def _end(self) -> CapturedBlock | None:
        """The resamplers' (and the canceller's) tail once, then None."""
        self._ended = True
        near_resampler = self._near_resampler
        far_resampler = self._far_resampler
        if near_resampler is None or far_resampler is None:
            return None
        return self._emit(
            near_resampler.flush(),
            far_resampler.flush(),
            time.monotonic(),
            self._next_frame,
            0.0,
            0.0,
            final=True,
        )

    # ------------------------------------------------------------------- reports

    def _require_started(self) -> _Duplex:
        duplex = self._duplex
        if duplex is None:
            raise UsageError("the duplex stream was not started; call start() first")
        return duplex

    def _devices_text(self) -> str:
        if self._input is None or self._output is None:
            return f"input {_describe(self._input_spec)}, output {_describe(self._output_spec)}"
        return f"input {self._input.describe()} and output {self._output.describe()}"

    @property
    def sample_rate(self) -> int:
        """The rate of the audio :meth:`read` returns."""
        return self._sample_rate

    @property
    def device_rate(self) -> int:
        """The rate both sides of the stream run at (0 before ``start``)."""
        return self._device_rate

    @property
    def block_duration_s(self) -> float:
        """Seconds per callback block at the device rate (0 before ``start``)."""
        return self._block_frames / self._device_rate if self._device_rate else 0.0

    @property
    def ended(self) -> bool:
        """True once :meth:`read` delivered the end of the stream."""
        return self._ended

    @property
    def closed(self) -> bool:
        return self._closed

    def level(self, window_s: float = 0.05) -> AudioLevel:
        """RMS and peak (dBFS) of the microphone over about the last ``window_s`` (the blocks
        that end it; at least one). Safe from any thread, e.g. a meter's timer."""
        duplex = self._require_started()
        rate = self._device_rate
        slots = duplex.level_frames.shape[0]
        count = duplex.level_count
        frames = 0
        weighted = 0.0
        peak = 0.0
        for index in range(count - 1, max(-1, count - 1 - slots), -1):
            slot = index % slots
            block = int(duplex.level_frames[slot])
            frames += block
            weighted += float(duplex.level_mean_square[slot]) * block
            peak = max(peak, float(duplex.level_peak[slot]))
            if frames >= window_s * rate:
                break
        if not frames:
            return AudioLevel(SILENCE_DBFS, SILENCE_DBFS, 0.0)
        return AudioLevel(level_dbfs(math.sqrt(weighted / frames)), level_dbfs(peak), frames / rate)

    def metrics(self) -> DuplexMetrics:
        """A snapshot of what the stream measured so far."""
        duplex = self._require_started()
        input_device = self._input
        output_device = self._output
        assert input_device is not None
        assert output_device is not None
        silent_at = (
            duplex.silent_at
            if self._silence_wanted and duplex.silent_serial == duplex.silence_serial
            else None
        )
        return DuplexMetrics(
            input_device=input_device.describe(),
            output_device=output_device.describe(),
            host_api=output_device.host_api,
            device_rate=self._device_rate,
            sample_rate=self._sample_rate,
            input_channels=self._input_channels,
            output_channels=self._output_channels,
            block_frames=self._block_frames,
            input_latency_s=self._input_latency_s,
            output_latency_s=self._output_latency_s,
            blocks=duplex.blocks,
            frames=duplex.frame_position,
            capture_blocks_dropped=duplex.capture_dropped,
            capture_blocks_queued=duplex.cap_written - duplex.cap_read,
            underruns=duplex.underruns,
            underrun_seconds=duplex.underrun_frames / self._device_rate,
            device_underflows=duplex.device_underflows,
            device_overflows=duplex.device_overflows,
            frames_played=duplex.frames_played,
            replies=len(self._replies),
            gain=duplex.gain,
            held=duplex.hold_requested and duplex.gain == 0.0,
            silence_requested_at=self._silence_requested_at,
            silent_at=silent_at,
        )
