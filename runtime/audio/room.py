"""A simulated room on a JACK server: the user's voice and the speaker's echo reach a microphone.

A :class:`Room` is a JACK client of its own (in the process that creates it) standing on the
other side of an application's full-duplex stream:

- it **listens to the speaker**: one input port per application playback port it is given,
  recorded (their mean, mono) into a preallocated buffer indexed by JACK frame time, so every
  sample the speaker played has the exact frame at which the room received it;
- it **speaks into the microphone**: one output port connected to each of the application's
  capture ports, carrying a noise floor, the echo of the speaker and the user's scheduled
  clips (:meth:`Room.schedule`, :meth:`Room.say`), each clip reporting the JACK frame at which
  its first sample went out;
- the **echo path**: what it received at frame ``f``, scaled by ``echo_gain`` (and convolved
  with ``impulse``), goes out at frame ``f + round(echo_delay_s * rate)``, exactly.

The feedback cycle. The room and the application form a loop in JACK's graph (room ->
application capture, application playback -> room). JACK runs a loop's clients in one order
and makes the connection that closed the loop a *feedback* connection: its reader gets the
buffer its writer filled in the previous cycle, one period late. :meth:`Room.start` connects
the microphone before the speaker, so the speaker's connection is the feedback one:

- a clip's first sample reaches the application's capture callback in the cycle whose frame
  time the room reported (offset 0);
- what the application plays in its cycle at frame ``f`` is recorded at ``f + period``;
- the echo loop, application playback to application capture, therefore takes
  ``echo_delay + period`` frames (``tests/runtime/audio/test_room_jack.py`` measures it).

Connections made later with :meth:`Room.connect_microphone` after
:meth:`Room.connect_speaker` close the loop the other way round: the recording then carries
the application's own frame times and clips arrive one period after the reported frame.

The process callback allocates no buffers and takes no lock: it works in numpy views of
arrays made at construction. Each shared counter has one writer: :meth:`schedule` publishes
clips (``_published``), the callback publishes what it recorded (``_recorded_end``) and when
each clip started (``_clip_start``). Frame times are JACK's 32-bit frame counter unwrapped
to 64 bits (equal to JACK's for a server's first 24 hours at 48 kHz).

The analysis helpers (:func:`first_sound_after`, :func:`silent_after`, :class:`Recording`)
are pure functions of a recording, for tests and benchmarks.

``import jack`` (the ``JACK-Client`` package, a development dependency: the product never
makes a room) happens in the constructor, so importing ``runtime.audio`` never needs JACK.
"""

from __future__ import annotations

import importlib
import math
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from runtime.audio.devices import AudioDeviceError
from runtime.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import TracebackType

    import numpy.typing as npt

#: JACK2's largest period (``BUFFER_SIZE_MAX``): the scratch buffers' size.
MAX_PERIOD: Final = 8192
#: The longest impulse response the echo path convolves with (85 ms at 48 kHz).
MAX_IMPULSE: Final = 4096
#: The longest echo delay.
MAX_ECHO_DELAY_S: Final = 10.0
#: The largest echo gain (magnitude).
MAX_ECHO_GAIN: Final = 4.0
#: Chunk of the analysis helpers (bounds their temporary memory).
_CHUNK: Final = 1 << 18
_WRAP: Final = 1 << 32
_POLL_S: Final = 0.002


def _amplitude(dbfs: float) -> float:
    return float(10.0 ** (dbfs / 20.0))


@dataclass(frozen=True, slots=True)
class RoomSettings:
    """The room's acoustics.

    ``echo_delay_s``: from the speaker back to the microphone (rounded to whole frames);
    ``echo_gain``: its scale (0: no echo; negative inverts); ``noise_dbfs``: RMS of a white
    noise floor on the microphone (None: none, the microphone is digitally silent but for
    clips and echo); ``impulse``: an impulse response the echo is convolved with (at the
    server's rate, at most :data:`MAX_IMPULSE` taps; None: a pure delay). An array may be
    given for ``impulse``; it is kept as a tuple of floats.
    """

    echo_delay_s: float = 0.0
    echo_gain: float = 0.0
    noise_dbfs: float | None = None
    impulse: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        delay = self.echo_delay_s
        if not (isinstance(delay, int | float) and math.isfinite(delay)) or not (
            0.0 <= delay <= MAX_ECHO_DELAY_S
        ):
            raise UsageError(
                f"echo_delay_s must be between 0 and {MAX_ECHO_DELAY_S} seconds, not {delay!r}"
            )
        gain = self.echo_gain
        if not (isinstance(gain, int | float) and math.isfinite(gain)) or abs(gain) > (
            MAX_ECHO_GAIN
        ):
            raise UsageError(
                f"echo_gain must be a finite number of magnitude at most {MAX_ECHO_GAIN}, "
                f"not {gain!r}"
            )
        noise = self.noise_dbfs
        if noise is not None and (
            not (isinstance(noise, int | float) and math.isfinite(noise)) or noise > 0.0
        ):
            raise UsageError(f"noise_dbfs must be a level at or below 0 dBFS, not {noise!r}")
        if self.impulse is not None:
            try:
                taps = np.asarray(self.impulse, dtype=np.float64)
            except (TypeError, ValueError) as error:
                raise UsageError(f"impulse must be a sequence of numbers: {error}") from None
            if taps.ndim != 1 or not 1 <= taps.size <= MAX_IMPULSE:
                raise UsageError(
                    f"impulse must be a 1-D array of 1 to {MAX_IMPULSE} taps, "
                    f"not of shape {taps.shape}"
                )
            if not np.all(np.isfinite(taps)):
                raise UsageError("impulse must hold finite numbers only")
            object.__setattr__(self, "impulse", tuple(float(tap) for tap in taps))

    def delay_frames(self, rate: int) -> int:
        """The echo delay in frames at ``rate``."""
        return round(self.echo_delay_s * rate)


@dataclass(frozen=True, slots=True)
class RoomStats:
    """What the room's callback did so far."""

    rate: int
    period: int
    cycles: int
    #: Frame time of the room's first cycle (None before it ran).
    first_frame: int | None
    #: The recording covers ``[first_frame, recorded_until)``.
    recorded_until: int | None
    #: The recording buffer was full: later speaker audio was not recorded.
    recording_full: bool
    xruns: int
    #: Cycles whose frame time was not the previous cycle's plus its period: a cycle that
    #: ran late (as around an xrun) reads the next cycle's frame time, so the audio near it
    #: may sit a period off in the recording and the clips' frames.
    frame_glitches: int
    clips_scheduled: int
    clips_started: int
    clips_done: int
    #: The callback's exception, if it raised one (the room then sends silence).
    failure: str | None


@dataclass(frozen=True, slots=True, eq=False)
class ScheduledClip:
    """A clip handed to :meth:`Room.schedule`; ``start_frame`` is known once it went out."""

    room: Room = field(repr=False)
    index: int
    #: The frame asked for (None: as soon as possible).
    requested_frame: int | None
    frames: int

    @property
    def start_frame(self) -> int | None:
        """JACK frame time at which the clip's first sample went out (None: not yet)."""
        start = int(self.room._clip_start[self.index])
        return None if start < 0 else start

    @property
    def end_frame(self) -> int | None:
        """The frame after the clip's last sample (None until it started)."""
        start = self.start_frame
        return None if start is None else start + self.frames

    @property
    def done(self) -> bool:
        """Every sample went out."""
        return bool(self.room._clip_done[self.index])

    def wait_started(self, timeout_s: float = 5.0) -> int:
        """Wait until the clip's first sample went out; its frame time."""
        deadline = time.monotonic() + timeout_s
        while (start := self.start_frame) is None:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"clip {self.index} did not start within {timeout_s} s")
            time.sleep(_POLL_S)
        return start

    def wait_done(self, timeout_s: float = 30.0) -> int:
        """Wait until the clip's last sample went out; the frame after it."""
        deadline = time.monotonic() + timeout_s
        while not self.done:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"clip {self.index} did not finish within {timeout_s} s")
            time.sleep(_POLL_S)
        end = self.end_frame
        assert end is not None
        return end


def _segment(
    samples: npt.NDArray[np.float32], start_frame: int, frame: int
) -> tuple[npt.NDArray[np.float32], int]:
    """``samples`` from ``frame`` on (clamped to the recording's start) and that frame."""
    first = max(frame, start_frame)
    return samples[first - start_frame :], first


def first_sound_after(
    samples: npt.NDArray[np.float32],
    start_frame: int,
    frame: int,
    rate: int,
    *,
    threshold_dbfs: float = -50.0,
    min_run_s: float = 0.01,
) -> int | None:
    """The frame of the first sample at or after ``frame`` that starts a sound: its magnitude
    reaches ``threshold_dbfs`` and so do at least half of the samples in the ``min_run_s``
    from it (a click is no sound; a tone's zero crossings do not break one). ``samples[0]`` is
    at ``start_frame``. None: no such sound in the recording (a sound too close to its end to
    have ``min_run_s`` after it does not count yet)."""
    segment, first = _segment(samples, start_frame, frame)
    threshold = _amplitude(threshold_dbfs)
    run = max(1, round(min_run_s * rate))
    for offset in range(0, max(0, segment.size - run + 1), _CHUNK):
        piece = segment[offset : offset + _CHUNK + run - 1]
        positions = piece.size - run + 1
        loud = np.abs(piece) >= threshold
        counts = np.empty(piece.size + 1, np.int64)
        counts[0] = 0
        np.cumsum(loud, out=counts[1:])
        lasting = 2 * (counts[run:] - counts[:positions]) >= run
        found = np.flatnonzero(loud[:positions] & lasting)
        if found.size:
            return first + offset + int(found[0])
    return None


def silent_after(
    samples: npt.NDArray[np.float32],
    start_frame: int,
    frame: int,
    rate: int,
    *,
    threshold_dbfs: float = -50.0,
    hold_s: float = 0.1,
) -> int | None:
    """The first frame at or after ``frame`` from which every sample stays below
    ``threshold_dbfs`` for at least ``hold_s``; ``samples[0]`` is at ``start_frame``. None:
    the recording does not show such a silence (yet)."""
    segment, first = _segment(samples, start_frame, frame)
    threshold = _amplitude(threshold_dbfs)
    hold = max(1, round(hold_s * rate))
    quiet_from = 0
    for offset in range(0, segment.size, _CHUNK):
        loud = np.flatnonzero(np.abs(segment[offset : offset + _CHUNK]) >= threshold) + offset
        if loud.size:
            starts = np.empty_like(loud)
            starts[0] = quiet_from
            starts[1:] = loud[:-1] + 1
            long_enough = np.flatnonzero(loud - starts >= hold)
            if long_enough.size:
                return first + int(starts[long_enough[0]])
            quiet_from = int(loud[-1]) + 1
    return first + quiet_from if segment.size - quiet_from >= hold else None


@dataclass(frozen=True, slots=True, eq=False)
class Recording:
    """What the room heard from the speaker: ``samples[i]`` arrived at ``start_frame + i``
    (frames the server skipped hold zeros). Read-only."""

    samples: npt.NDArray[np.float32] = field(repr=False)
    start_frame: int
    rate: int

    @property
    def end_frame(self) -> int:
        return self.start_frame + int(self.samples.size)

    def first_sound_after(
        self, frame: int, threshold_dbfs: float = -50.0, min_run_s: float = 0.01
    ) -> int | None:
        """See :func:`first_sound_after`."""
        return first_sound_after(
            self.samples,
            self.start_frame,
            frame,
            self.rate,
            threshold_dbfs=threshold_dbfs,
            min_run_s=min_run_s,
        )

    def silent_after(
        self, frame: int, threshold_dbfs: float = -50.0, hold_s: float = 0.1
    ) -> int | None:
        """See :func:`silent_after`."""
        return silent_after(
            self.samples,
            self.start_frame,
            frame,
            self.rate,
            threshold_dbfs=threshold_dbfs,
            hold_s=hold_s,
        )

    def between(self, start_frame: int, end_frame: int) -> npt.NDArray[np.float32]:
        """A copy of the samples of frames ``[start_frame, end_frame)``."""
        if not self.start_frame <= start_frame <= end_frame <= self.end_frame:
            raise UsageError(
                f"frames [{start_frame}, {end_frame}) are not all in the recording, which holds "
                f"[{self.start_frame}, {self.end_frame})"
            )
        return self.samples[start_frame - self.start_frame : end_frame - self.start_frame].copy()


def _jack_module() -> Any:
    try:
        # JACK-Client has no type stubs: the module is used as ``Any``.
        jack = importlib.import_module("jack")
    except (ImportError, OSError) as error:
        raise AudioDeviceError(
            f"a Room needs the JACK-Client package and libjack ({error}); install the "
            "project's dev extra and the Debian package jackd2"
        ) from None
    return jack


class Room:
    """A JACK client standing for the room around an application's speaker and microphone.

    ``server_name``: the JACK server (None: ``JACK_DEFAULT_SERVER``, else ``default``).
    ``speaker`` and ``microphone``: the application's playback (JACK output) ports and capture
    (JACK input) ports, each a regular expression (JACK's, searched in the full port names, so
    a client name such as ``"PortAudio"`` selects that client's ports) or a sequence of exact
    port names; connected by :meth:`start`, or later with :meth:`connect_speaker` and
    :meth:`connect_microphone`. ``record_s``: the recording's length (at most that much of the
    speaker is kept, from the room's first cycle on). ``exclusive_microphone``: the room
    becomes the capture ports' only source (other connections to them are removed).
    ``expected_rate``: refuse a server at another rate.
    """

    def __init__(
        self,
        server_name: str | None = None,
        *,
        speaker: str | Sequence[str] | None = None,
        microphone: str | Sequence[str] | None = None,
        settings: RoomSettings | None = None,
        record_s: float = 120.0,
        name: str = "omni-room",
        max_clips: int = 1024,
        expected_rate: int | None = None,
        exclusive_microphone: bool = True,
        seed: int = 0,
    ) -> None:
        settings = RoomSettings() if settings is None else settings
        if not isinstance(settings, RoomSettings):
            raise UsageError(f"settings must be a RoomSettings, not {type(settings).__name__}")
        if not (math.isfinite(record_s) and 0.0 < record_s <= 3600.0):
            raise UsageError(f"record_s must be between 0 and 3600 seconds, not {record_s!r}")
        if not 1 <= max_clips <= 1_000_000:
            raise UsageError(f"max_clips must be between 1 and 1000000, not {max_clips!r}")
        if not name or ":" in name:
            raise UsageError(f"the room's client name must be non-empty without ':', not {name!r}")
        jack = _jack_module()
        self._jack = jack
        self.settings = settings
        self._speaker_spec = speaker
        self._microphone_spec = microphone
        self._exclusive = exclusive_microphone
        try:
            client = jack.Client(name, no_start_server=True, servername=server_name)
        except jack.JackError as error:
            where = "the default JACK server" if server_name is None else repr(server_name)
            raise AudioDeviceError(
                f"the room could not open a JACK client on {where}: {error}"
            ) from None
        self._client: Any = client
        self._closed = False
        self._started = False
        try:
            self.rate: int = int(client.samplerate)
            if expected_rate is not None and expected_rate != self.rate:
                raise UsageError(
                    f"the JACK server runs at {self.rate} Hz, not the expected {expected_rate} Hz"
                )
            self._prepare(settings, record_s, max_clips, seed)
            self._mic_port: Any = client.outports.register("microphone")
            self._speaker_ports: tuple[Any, ...] = ()
            client.set_process_callback(self._process)
            client.set_xrun_callback(self._xrun)
        except BaseException:
            client.close()
            self._closed = True
            raise

    def _prepare(self, settings: RoomSettings, record_s: float, max_clips: int, seed: int) -> None:
        """Every buffer the callback uses, made and touched now (no page faults later)."""
        self._record = np.zeros(round(record_s * self.rate), np.float32)
        self._record.fill(0.0)
        self._mono = np.zeros(MAX_PERIOD, np.float32)
        self._scratch = np.zeros(MAX_PERIOD, np.float32)
        self._delay = settings.delay_frames(self.rate)
        impulse = (1.0,) if settings.impulse is None else settings.impulse
        taps = len(impulse)
        # What the echo path may read: the delay, the impulse and one period, a power of two.
        span = 1 << (self._delay + taps + MAX_PERIOD).bit_length()
        self._span = span
        # The history twice over ("mirror"): any window shorter than ``span`` is contiguous.
        self._history = np.zeros(2 * span, np.float32)
        self._windows = np.lib.stride_tricks.as_strided(
            self._history,
            shape=(2 * span - taps + 1, taps),
            strides=(self._history.strides[0], self._history.strides[0]),
            writeable=False,
        )
        self._taps_reversed = (settings.echo_gain * np.asarray(impulse[::-1], np.float64)).astype(
            np.float32
        )
        self._gain = np.float32(settings.echo_gain)
        self._pure_delay = taps == 1
        self._has_echo = settings.echo_gain != 0.0
        self._noise_amplitude = (
            None if settings.noise_dbfs is None else np.float32(_amplitude(settings.noise_dbfs))
        )
        self._rng = np.random.default_rng(seed)
        # Clips: written by schedule() up to _published, then by the callback.
        self._clips: list[npt.NDArray[np.float32] | None] = [None] * max_clips
        self._clip_at = np.full(max_clips, -1, np.int64)
        self._clip_start = np.full(max_clips, -1, np.int64)
        self._clip_position = np.zeros(max_clips, np.int64)
        self._clip_done = np.zeros(max_clips, np.bool_)
        self._published = 0
        self._lowest_pending = 0  # callback-only
        self._clips_started = 0
        self._clips_finished = 0
        self._schedule_lock = threading.Lock()  # between schedulers; the callback never takes it
        # Callback state and counters.
        self._echo_on = True
        self._origin = -1
        self._last_frame = -1
        self._history_end = -1
        self._recorded_end = -1
        self._recording_full = False
        self._cycles = 0
        self._period = 0
        self._xruns = 0
        self._glitches = 0
        self._failure: str | None = None

    # Lifecycle ----------------------------------------------------------------------------

    def start(self) -> Room:
        """Activate the client, then connect the microphone and the speaker given to the
        constructor (in that order: see the module's notes on the feedback cycle)."""
        self._check_open()
        if self._started:
            return self
        self._client.activate()
        self._started = True
        try:
            if self._microphone_spec is not None:
                self.connect_microphone(self._microphone_spec)
            if self._speaker_spec is not None:
                self.connect_speaker(self._speaker_spec)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Deactivate and close the client (its threads end); the recording stays readable.
        Closing twice does nothing."""
        if self._closed:
            return
        self._closed = True
        if self._started:
            self._client.deactivate()
        self._client.close()

    def __enter__(self) -> Room:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def name(self) -> str:
        """The room's JACK client name (the server may have made it unique)."""
        return str(self._client.name)

    @property
    def period(self) -> int:
        """The server's period (frames per cycle)."""
        return int(self._client.blocksize)

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("the room is closed")

    def _check_started(self, what: str) -> None:
        self._check_open()
        if not self._started:
            raise UsageError(f"start the room before {what}")

    # Connections --------------------------------------------------------------------------

    def _resolve(self, spec: str | Sequence[str], *, inputs: bool) -> list[str]:
        kind = "capture (input)" if inputs else "playback (output)"
        own = f"{self.name}:"
        if isinstance(spec, str):
            found = [
                port.name
                for port in self._client.get_ports(
                    spec, is_audio=True, is_input=inputs, is_output=not inputs
                )
                if not port.name.startswith(own)
            ]
            if not found:
                available = [
                    port.name
                    for port in self._client.get_ports(
                        is_audio=True, is_input=inputs, is_output=not inputs
                    )
                    if not port.name.startswith(own)
                ]
                raise UsageError(
                    f"no JACK audio {kind} port matches {spec!r}; such ports: "
                    f"{', '.join(available) or 'none'}"
                )
            return found
        names = list(spec)
        if not names:
            raise UsageError(f"no JACK audio {kind} port named: the list is empty")
        for port_name in names:
            try:
                port = self._client.get_port_by_name(port_name)
            except self._jack.JackError:
                raise UsageError(f"no JACK port is named {port_name!r}") from None
            if not port.is_audio or (port.is_input if inputs else port.is_output) is False:
                raise UsageError(f"the JACK port {port_name!r} is not an audio {kind} port")
        return names

    def connect_microphone(self, ports: str | Sequence[str]) -> list[str]:
        """Send the room's sound to the application's capture ports (a pattern or names);
        the names connected."""
        self._check_started("connecting it")
        targets = self._resolve(ports, inputs=True)
        for target in targets:
            if self._exclusive:
                for source in self._client.get_all_connections(target):
                    if source.name != self._mic_port.name:
                        self._client.disconnect(source.name, target)
            if self._mic_port.name not in {
                port.name for port in self._client.get_all_connections(target)
            }:
                self._client.connect(self._mic_port, target)
        return targets

    def connect_speaker(self, ports: str | Sequence[str]) -> list[str]:
        """Listen to the application's playback ports (a pattern or names), one room input
        port each; the names connected."""
        self._check_started("connecting it")
        sources = self._resolve(ports, inputs=False)
        added: list[Any] = []
        for source in sources:
            port = self._client.inports.register(f"speaker_{len(self._speaker_ports) + len(added)}")
            added.append(port)
            self._client.connect(source, port)
        # One assignment: the callback reads the tuple once per cycle.
        self._speaker_ports = (*self._speaker_ports, *added)
        return sources

    # The user's voice and the echo --------------------------------------------------------

    def schedule(
        self, clip: npt.ArrayLike, at_frame: int | None = None, *, rate: int | None = None
    ) -> ScheduledClip:
        """Play ``clip`` (mono, at the server's rate; ``rate`` checks that) into the microphone
        from JACK frame ``at_frame`` (None: the next cycle; a frame already past: the next
        cycle too). The clips, the echo and the noise add up."""
        self._check_open()
        if rate is not None and rate != self.rate:
            raise UsageError(
                f"the clip is at {rate} Hz but the JACK server runs at {self.rate} Hz: "
                "resample it first"
            )
        if at_frame is not None and (not isinstance(at_frame, int) or at_frame < 0):
            raise UsageError(f"at_frame must be a frame time (an int >= 0), not {at_frame!r}")
        samples = np.array(clip, dtype=np.float32, copy=True)
        if samples.ndim != 1 or samples.size == 0:
            raise UsageError(f"a clip must be 1-D and not empty, not of shape {samples.shape}")
        if not np.all(np.isfinite(samples)):
            raise UsageError("a clip must hold finite samples only")
        samples.flags.writeable = False
        with self._schedule_lock:
            index = self._published
            if index >= len(self._clips):
                raise UsageError(
                    f"the room plays at most {len(self._clips)} clips (max_clips) in its life"
                )
            self._clips[index] = samples
            self._clip_at[index] = -1 if at_frame is None else at_frame
            self._published = index + 1  # publish last
        return ScheduledClip(self, index, at_frame, int(samples.size))

    def say(self, clip: npt.ArrayLike, after_s: float = 0.0) -> ScheduledClip:
        """Play ``clip`` ``after_s`` seconds from now (the server's current frame time)."""
        self._check_started("saying anything")
        if not (math.isfinite(after_s) and after_s >= 0.0):
            raise UsageError(f"after_s must be a number of seconds >= 0, not {after_s!r}")
        return self.schedule(clip, self.now() + round(after_s * self.rate))

    @property
    def echo_on(self) -> bool:
        """Whether the echo path is open (switchable while running)."""
        return self._echo_on

    @echo_on.setter
    def echo_on(self, on: bool) -> None:
        self._echo_on = bool(on)

    # Time, the recording and its analysis -------------------------------------------------

    def now(self) -> int:
        """The server's estimated current frame time (unwrapped as the room's frames are)."""
        self._check_started("asking its time")
        current = int(self._client.frame_time)
        last = self._last_frame
        if last < 0:
            return current
        ahead = (current - last) % _WRAP
        return last + ahead if ahead < _WRAP // 2 else last + ahead - _WRAP

    @property
    def recorded_until(self) -> int | None:
        """The frame after the last one recorded (None before the first cycle)."""
        end = self._recorded_end
        return None if end < 0 else end

    def wait_for_frame(self, frame: int, timeout_s: float = 10.0) -> None:
        """Wait until the recording reaches ``frame`` (or the recording buffer is full)."""
        deadline = time.monotonic() + timeout_s
        while self._recorded_end < frame and not self._recording_full:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the room did not reach frame {frame} within {timeout_s} s")
            self._check_open()
            time.sleep(_POLL_S)

    def snapshot(self) -> Recording:
        """The recording so far, as a read-only view (what is in it never changes)."""
        origin, end = self._origin, self._recorded_end
        if origin < 0 or end < 0:
            raise UsageError("the room has recorded nothing yet")
        view = self._record[: end - origin].view()
        view.flags.writeable = False
        return Recording(view, origin, self.rate)

    def recording(self, start_frame: int, end_frame: int) -> npt.NDArray[np.float32]:
        """A copy of the speaker's output received in frames ``[start_frame, end_frame)``."""
        return self.snapshot().between(start_frame, end_frame)

    def first_sound_after(
        self, frame: int, threshold_dbfs: float = -50.0, min_run_s: float = 0.01
    ) -> int | None:
        """See :func:`first_sound_after` (on the recording so far)."""
        return self.snapshot().first_sound_after(frame, threshold_dbfs, min_run_s)

    def silent_after(
        self, frame: int, threshold_dbfs: float = -50.0, hold_s: float = 0.1
    ) -> int | None:
        """See :func:`silent_after` (on the recording so far)."""
        return self.snapshot().silent_after(frame, threshold_dbfs, hold_s)

    def stats(self) -> RoomStats:
        return RoomStats(
            rate=self.rate,
            period=self._period,
            cycles=self._cycles,
            first_frame=None if self._origin < 0 else self._origin,
            recorded_until=self.recorded_until,
            recording_full=self._recording_full,
            xruns=self._xruns,
            frame_glitches=self._glitches,
            clips_scheduled=self._published,
            clips_started=self._clips_started,
            clips_done=self._clips_finished,
            failure=self._failure,
        )

    # The JACK callbacks -------------------------------------------------------------------

    def _xrun(self, _delay_us: float) -> None:
        self._xruns += 1

    def _process(self, frames: int) -> None:
        if self._failure is not None:
            self._mic_port.get_array().fill(0.0)
            return
        try:
            self._cycle(frames)
        except Exception as error:  # noqa: BLE001 - kept for stats(); the room goes silent
            self._failure = f"{type(error).__name__}: {error}"
            self._mic_port.get_array().fill(0.0)

    def _cycle(self, n: int) -> None:
        frame32 = int(self._client.last_frame_time)
        last = self._last_frame
        t = frame32 if last < 0 else last + ((frame32 - last) % _WRAP)
        if self._origin < 0:
            self._origin = t
            self._history_end = t
        elif t != last + self._period:
            self._glitches += 1
        self._last_frame = t
        self._period = n
        # The speaker: the mean of the room's input ports.
        mono = self._mono[:n]
        ports = self._speaker_ports
        if ports:
            np.copyto(mono, ports[0].get_array()[:n])
            for port in ports[1:]:
                np.add(mono, port.get_array()[:n], out=mono)
            if len(ports) > 1:
                np.multiply(mono, np.float32(1.0 / len(ports)), out=mono)
        else:
            mono.fill(0.0)
        self._record_block(t, mono)
        self._remember(t, mono)
        # The microphone: noise, echo, clips.
        out = self._mic_port.get_array()[:n]
        if self._noise_amplitude is not None:
            self._rng.standard_normal(out=out, dtype=np.float32)
            np.multiply(out, self._noise_amplitude, out=out)
        else:
            out.fill(0.0)
        if self._echo_on and self._has_echo:
            echo = self._scratch[:n]
            taps = self._taps_reversed.size
            position = (t - self._delay - (taps - 1)) % self._span
            if self._pure_delay:
                np.multiply(self._history[position : position + n], self._gain, out=echo)
            else:
                np.matmul(self._windows[position : position + n], self._taps_reversed, out=echo)
            np.add(out, echo, out=out)
        self._play_clips(t, n, out)
        self._cycles += 1

    def _record_block(self, t: int, mono: npt.NDArray[np.float32]) -> None:
        if self._recording_full:
            return
        position = t - self._origin
        room = self._record.size - position
        n = mono.size
        if room <= 0:
            self._recording_full = True
            return
        if n > room:
            self._record[position:] = mono[:room]
            self._recorded_end = self._origin + self._record.size
            self._recording_full = True
            return
        self._record[position : position + n] = mono
        self._recorded_end = t + n  # publish after the samples

    def _write_history(self, start: int, block: npt.NDArray[np.float32] | None, n: int) -> None:
        """History frames ``[start, start + n)`` := ``block`` (None: zeros), both copies."""
        span = self._span
        position = start % span
        first = min(n, span - position)
        history = self._history
        if block is None:
            history[position : position + first] = 0.0
            history[position + span : position + span + first] = 0.0
            history[: n - first] = 0.0
            history[span : span + n - first] = 0.0
        else:
            history[position : position + first] = block[:first]
            history[position + span : position + span + first] = block[:first]
            history[: n - first] = block[first:]
            history[span : span + n - first] = block[first:]

    def _remember(self, t: int, mono: npt.NDArray[np.float32]) -> None:
        gap = t - self._history_end
        if gap > 0:  # frames the server skipped: nothing was heard then
            self._write_history(max(self._history_end, t - self._span), None, min(gap, self._span))
        self._write_history(t, mono, mono.size)
        self._history_end = t + mono.size

    def _play_clips(self, t: int, n: int, out: npt.NDArray[np.float32]) -> None:
        published = self._published
        index = self._lowest_pending
        while index < published:
            if self._clip_done[index]:
                index += 1
                continue
            clip = self._clips[index]
            assert clip is not None
            start = int(self._clip_start[index])
            if start < 0:
                at = int(self._clip_at[index])
                if at >= t + n:
                    index += 1
                    continue
                start = max(at, t)
                self._clip_start[index] = start
                self._clips_started += 1
            played = int(self._clip_position[index])
            offset = max(start - t, 0)
            take = min(n - offset, clip.size - played)
            target = out[offset : offset + take]
            np.add(target, clip[played : played + take], out=target)
            played += take
            self._clip_position[index] = played
            if played >= clip.size:
                self._clip_done[index] = True
                self._clips_finished += 1
            index += 1
        lowest = self._lowest_pending
        while lowest < published and self._clip_done[lowest]:
            lowest += 1
        self._lowest_pending = lowest
