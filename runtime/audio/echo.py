"""Acoustic echo cancellation: take the played reply (the far end) out of the microphone signal.

On speakers the voice's reply reaches the microphone; before the voice activity detector hears
it as the user talking (a false barge-in), an echo canceller subtracts what the player played,
as it arrived at the microphone. Headphones need none: ``kind="off"`` is a pass-through.

Two cancellers, chosen by measurement (``benchmarks/echo_compare.py``, ``docs/echo.md``):

- ``"webrtc"``: WebRTC's AEC3 (the echo canceller of Chrome's audio processing module) through
  the ``pywebrtc-audio`` wheel: a delay estimator, an adaptive filter, then a residual-echo
  suppressor, after a high-pass filter. On the simulated paths (20 to 300 ms) it keeps the
  echo under the VAD's threshold from the reply's first word (ERLE 25 to 34 dB: down to the
  simulated noise floor) and needs no tail length; it holds back the first syllable of the
  user talking over a reply.
- ``"speex"``: SpeexDSP's MDF canceller plus its preprocessor's residual-echo suppression,
  through ``ctypes`` on Debian's ``libspeexdsp1``. Deep once converged, but its filter must
  cover the whole echo path (``tail_s``) and takes seconds to converge: the first words of a
  reply get through as speech (a false barge-in on every path measured).

``"auto"`` is WebRTC when its wheel is installed, else Speex when the library is there.

Every canceller takes frames of :attr:`EchoCanceller.frame_samples` float32 mono samples at
16 kHz (10 ms, what WebRTC's module works in) and returns the cleaned frame at once; inside the
algorithm the signal is delayed by about 8 ms (WebRTC) or 10 ms (Speex's preprocessor).
:class:`StreamEchoCanceller` cuts the blocks a microphone callback delivers into those frames
(holding back less than one frame) and takes the reference the player plays on its own path.
:class:`EchoPath` simulates what a microphone picks up from a loudspeaker, for the tests and
the benchmark.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import weakref
from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

import numpy as np

from runtime.errors import RefusedError, UsageError

if TYPE_CHECKING:
    import pywebrtc_audio

__all__ = [
    "ECHO_KINDS",
    "FRAME_SAMPLES",
    "SAMPLE_RATE",
    "SPEEXDSP_LIBRARY",
    "EchoCanceller",
    "EchoCancellerUnavailable",
    "EchoPath",
    "NoEchoCanceller",
    "SpeexEchoCanceller",
    "StreamEchoCanceller",
    "UnknownEchoCanceller",
    "WebRtcEchoCanceller",
    "make_echo_canceller",
]

#: The one rate the cancellers run at: the microphone input's and the speech models'.
SAMPLE_RATE: Final = 16000
#: 10 ms at 16 kHz: WebRTC's module works in 10 ms frames; Speex is given the same.
FRAME_SAMPLES: Final = 160
#: What :func:`make_echo_canceller` accepts; ``auto`` is the first of webrtc, speex installed.
ECHO_KINDS: Final = ("auto", "webrtc", "speex", "off")
#: The echo path Speex's filter covers unless told: loudspeaker and microphone latency plus the
#: room's reverberation that matters (measured: 150 ms delay + 60 ms room fit in 256 ms).
DEFAULT_TAIL_S: Final = 0.256
#: Debian's name of the SpeexDSP library.
SPEEXDSP_SONAME: Final = "libspeexdsp.so.1"
#: The library Speex is loaded from (a seam: tests point it at a missing name). The default
#: falls back to what the system's linker knows as ``speexdsp`` (other systems' names).
SPEEXDSP_LIBRARY = SPEEXDSP_SONAME
SPEEXDSP_PACKAGE: Final = "libspeexdsp1"
WEBRTC_PACKAGE: Final = "pywebrtc-audio"
#: Reference audio kept for frames the microphone has not delivered yet; older is dropped.
MAX_REFERENCE_S: Final = 2.0

# speex/speex_echo.h and speex/speex_preprocess.h (SpeexDSP 1.2).
_SPEEX_ECHO_SET_SAMPLING_RATE: Final = 24
_SPEEX_PREPROCESS_SET_ECHO_STATE: Final = 24
_INT16_SCALE: Final = 32768.0


class EchoCancellerUnavailable(RefusedError):
    """The echo canceller's native library or wheel is not installed; says what to install."""


class UnknownEchoCanceller(UsageError):
    """An echo canceller kind that does not exist; names the accepted ones."""


@runtime_checkable
class EchoCanceller(Protocol):
    """Removes the far end's echo from the near end, one frame at a time.

    ``process(near, far)``: ``near`` is one frame of the microphone, ``far`` the frame of the
    reference (what was played) paired with it, both float32 of shape ``(frame_samples,)`` at
    ``sample_rate``; returns the cleaned near frame (a new array). The echo of a far frame must
    reach the microphone in the same frame or later, within the canceller's tail.
    """

    @property
    def kind(self) -> str: ...

    @property
    def sample_rate(self) -> int: ...

    @property
    def frame_samples(self) -> int: ...

    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray: ...

    def reset(self) -> None: ...

    def close(self) -> None: ...


def _check_rate(sample_rate: int) -> None:
    if sample_rate != SAMPLE_RATE:
        raise UsageError(
            f"echo cancellation runs at {SAMPLE_RATE} Hz, not {sample_rate} Hz; accepted: "
            f"{SAMPLE_RATE} (resample the microphone and the reference to it first)"
        )


def _check_frame(name: str, frame: np.ndarray, samples: int) -> None:
    if not isinstance(frame, np.ndarray) or frame.dtype != np.float32:
        got = frame.dtype if isinstance(frame, np.ndarray) else type(frame).__name__
        raise UsageError(f"the {name} frame is {got}; accepted: float32 samples")
    if frame.shape != (samples,):
        raise UsageError(
            f"the {name} frame has shape {frame.shape}; accepted: ({samples},), one mono frame "
            f"of {samples} samples (use StreamEchoCanceller for blocks of any length)"
        )


def _check_block(name: str, block: np.ndarray) -> None:
    if not isinstance(block, np.ndarray) or block.dtype != np.float32:
        got = block.dtype if isinstance(block, np.ndarray) else type(block).__name__
        raise UsageError(f"the {name} block is {got}; accepted: float32 samples")
    if block.ndim != 1:
        raise UsageError(
            f"the {name} block has shape {block.shape}; accepted: one dimension (mono samples)"
        )


class _Frames16k:
    """What every canceller here shares: 16 kHz, frames of FRAME_SAMPLES, both checked."""

    @property
    def sample_rate(self) -> int:
        return SAMPLE_RATE

    @property
    def frame_samples(self) -> int:
        return FRAME_SAMPLES

    @staticmethod
    def _check_frames(near: np.ndarray, far: np.ndarray) -> None:
        _check_frame("near", near, FRAME_SAMPLES)
        _check_frame("far", far, FRAME_SAMPLES)


class NoEchoCanceller(_Frames16k):
    """The pass-through (headphones: nothing played reaches the microphone)."""

    kind: Final = "off"

    def __init__(self, *, sample_rate: int = SAMPLE_RATE) -> None:
        _check_rate(sample_rate)

    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        self._check_frames(near, far)
        return near.copy()

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass


# -- WebRTC AEC3 (pywebrtc-audio) ---------------------------------------------------------------


class WebRtcEchoCanceller(_Frames16k):
    """WebRTC's AEC3 through ``pywebrtc-audio``: a delay estimator, an adaptive filter and a
    residual-echo suppressor, after a high-pass filter. It finds the echo's delay itself
    (``tail_s`` is not needed); ``stream_delay_ms`` may hint it."""

    kind: Final = "webrtc"

    def __init__(self, *, sample_rate: int = SAMPLE_RATE, stream_delay_ms: int = 0) -> None:
        _check_rate(sample_rate)
        try:
            import pywebrtc_audio
        except ImportError:
            raise EchoCancellerUnavailable(
                f"the webrtc echo canceller needs the {WEBRTC_PACKAGE} wheel, which is not "
                f"installed; install it with: pip install {WEBRTC_PACKAGE} (accepted kinds: "
                f"{', '.join(ECHO_KINDS)}; speex needs the Debian package {SPEEXDSP_PACKAGE})"
            ) from None
        self._module = pywebrtc_audio
        self.stream_delay_ms = stream_delay_ms
        self._aec: pywebrtc_audio.EchoCanceller | None = self._new()

    def _new(self) -> pywebrtc_audio.EchoCanceller:
        return self._module.EchoCanceller(
            sample_rate=SAMPLE_RATE, num_channels=1, stream_delay_ms=self.stream_delay_ms
        )

    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        self._check_frames(near, far)
        if self._aec is None:
            raise UsageError("the webrtc echo canceller is closed")
        return np.asarray(self._aec.process(near, far), dtype=np.float32)

    def reset(self) -> None:
        # A new canceller, not the wheel's reset(): that keeps the delay estimator's state.
        if self._aec is not None:
            self._aec = self._new()

    def close(self) -> None:
        self._aec = None


# -- SpeexDSP (Debian's libspeexdsp1 through ctypes) --------------------------------------------


class _SpeexLibrary:
    """The functions of libspeexdsp this module calls, with their C signatures."""

    def __init__(self, name: str) -> None:
        path = name if "/" in name else (_find_speexdsp(name) or name)
        try:
            lib = ctypes.CDLL(path)
        except OSError as error:
            raise EchoCancellerUnavailable(
                f"the speex echo canceller needs SpeexDSP ({name}), which cannot be loaded "
                f"({error}); install the Debian package {SPEEXDSP_PACKAGE} "
                f"(apt-get install {SPEEXDSP_PACKAGE}), or use kind 'webrtc' "
                f"(pip install {WEBRTC_PACKAGE}); accepted kinds: {', '.join(ECHO_KINDS)}"
            ) from None
        state, i16 = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int16)
        self.echo_init = lib.speex_echo_state_init
        self.echo_init.argtypes, self.echo_init.restype = [ctypes.c_int, ctypes.c_int], state
        self.echo_destroy = lib.speex_echo_state_destroy
        self.echo_destroy.argtypes, self.echo_destroy.restype = [state], None
        self.echo_reset = lib.speex_echo_state_reset
        self.echo_reset.argtypes, self.echo_reset.restype = [state], None
        self.echo_ctl = lib.speex_echo_ctl
        self.echo_ctl.argtypes = [state, ctypes.c_int, ctypes.c_void_p]
        self.echo_ctl.restype = ctypes.c_int
        self.cancel = lib.speex_echo_cancellation
        self.cancel.argtypes, self.cancel.restype = [state, i16, i16, i16], None
        self.pre_init = lib.speex_preprocess_state_init
        self.pre_init.argtypes, self.pre_init.restype = [ctypes.c_int, ctypes.c_int], state
        self.pre_destroy = lib.speex_preprocess_state_destroy
        self.pre_destroy.argtypes, self.pre_destroy.restype = [state], None
        self.pre_ctl = lib.speex_preprocess_ctl
        self.pre_ctl.argtypes = [state, ctypes.c_int, ctypes.c_void_p]
        self.pre_ctl.restype = ctypes.c_int
        self.pre_run = lib.speex_preprocess_run
        self.pre_run.argtypes, self.pre_run.restype = [state, i16], ctypes.c_int


def _find_speexdsp(name: str) -> str | None:
    """Debian's soname when it loads; else whatever the system's linker knows as speexdsp."""
    if name != SPEEXDSP_SONAME:
        return None
    try:
        ctypes.CDLL(name)
    except OSError:
        return ctypes.util.find_library("speexdsp")
    return name


def _speex_free(lib: _SpeexLibrary, echo: int | None, pre: int | None) -> None:
    if pre:
        lib.pre_destroy(pre)
    if echo:
        lib.echo_destroy(echo)


class SpeexEchoCanceller(_Frames16k):
    """SpeexDSP's MDF echo canceller with its preprocessor's residual-echo suppression.

    ``tail_s``: the longest echo path to cover (delay plus reverberation); the filter is that
    long, so a longer tail costs CPU and converges more slowly. ``residual_suppression=False``
    leaves out the preprocessor (it also removes some stationary noise). Samples are handed to
    the library as 16-bit integers (clipped to [-1, 1)).
    """

    kind: Final = "speex"

    def __init__(
        self,
        *,
        sample_rate: int = SAMPLE_RATE,
        tail_s: float = DEFAULT_TAIL_S,
        residual_suppression: bool = True,
        library: str | None = None,
    ) -> None:
        _check_rate(sample_rate)
        if not 0.01 <= tail_s <= 2.0:
            raise UsageError(f"tail_s is {tail_s}; accepted: 0.01 to 2.0 seconds")
        self._lib = _SpeexLibrary(SPEEXDSP_LIBRARY if library is None else library)
        self.filter_samples = round(tail_s * SAMPLE_RATE)
        self.residual_suppression = residual_suppression
        self._echo: int | None = None
        self._pre: int | None = None
        self._buffers = [np.zeros(FRAME_SAMPLES, np.int16) for _ in range(3)]
        i16 = ctypes.POINTER(ctypes.c_int16)
        self._pointers = [buffer.ctypes.data_as(i16) for buffer in self._buffers]
        self._open()

    def _open(self) -> None:
        lib = self._lib
        echo = lib.echo_init(FRAME_SAMPLES, self.filter_samples)
        if not echo:
            raise EchoCancellerUnavailable("speex_echo_state_init failed (out of memory?)")
        self._echo = echo
        rate = ctypes.c_int(SAMPLE_RATE)
        lib.echo_ctl(echo, _SPEEX_ECHO_SET_SAMPLING_RATE, ctypes.byref(rate))
        if self.residual_suppression:
            pre = lib.pre_init(FRAME_SAMPLES, SAMPLE_RATE)
            if not pre:
                lib.echo_destroy(echo)
                self._echo = None
                raise EchoCancellerUnavailable("speex_preprocess_state_init failed")
            self._pre = pre
            lib.pre_ctl(pre, _SPEEX_PREPROCESS_SET_ECHO_STATE, ctypes.c_void_p(echo))
        self._finalizer = weakref.finalize(self, _speex_free, lib, self._echo, self._pre)

    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        self._check_frames(near, far)
        if self._echo is None:
            raise UsageError("the speex echo canceller is closed")
        near16, far16, out16 = self._buffers
        np.copyto(near16, np.clip(near * _INT16_SCALE, -32768, 32767), casting="unsafe")
        np.copyto(far16, np.clip(far * _INT16_SCALE, -32768, 32767), casting="unsafe")
        near_p, far_p, out_p = self._pointers
        self._lib.cancel(self._echo, near_p, far_p, out_p)
        if self._pre is not None:
            self._lib.pre_run(self._pre, out_p)
        return out16.astype(np.float32) / np.float32(_INT16_SCALE)

    def reset(self) -> None:
        if self._echo is None:
            return
        self.close()
        self._open()

    def close(self) -> None:
        if self._echo is not None:
            self._finalizer()
            self._echo = self._pre = None


# -- the factory ----------------------------------------------------------------------------------


def make_echo_canceller(
    kind: str = "auto",
    *,
    sample_rate: int = SAMPLE_RATE,
    tail_s: float = DEFAULT_TAIL_S,
) -> EchoCanceller:
    """An echo canceller of ``kind`` (:data:`ECHO_KINDS`): ``auto`` (webrtc when its wheel is
    installed, else speex), ``webrtc``, ``speex`` or ``off`` (the pass-through, for headphones).
    ``tail_s`` sizes Speex's filter; WebRTC finds the delay itself.

    Raises :class:`UnknownEchoCanceller` for another kind, :class:`EchoCancellerUnavailable`
    naming what to install when the library is missing, ``UsageError`` for another rate.
    """
    _check_rate(sample_rate)
    if kind == "off":
        return NoEchoCanceller(sample_rate=sample_rate)
    if kind == "webrtc":
        return WebRtcEchoCanceller(sample_rate=sample_rate)
    if kind == "speex":
        return SpeexEchoCanceller(sample_rate=sample_rate, tail_s=tail_s)
    if kind == "auto":
        try:
            return WebRtcEchoCanceller(sample_rate=sample_rate)
        except EchoCancellerUnavailable as webrtc_missing:
            try:
                return SpeexEchoCanceller(sample_rate=sample_rate, tail_s=tail_s)
            except EchoCancellerUnavailable:
                raise EchoCancellerUnavailable(
                    f"no echo canceller is installed: install the wheel {WEBRTC_PACKAGE} "
                    f"(pip install {WEBRTC_PACKAGE}) or the Debian package {SPEEXDSP_PACKAGE}, "
                    "or choose kind 'off' (headphones)"
                ) from webrtc_missing
    raise UnknownEchoCanceller(
        f"unknown echo canceller {kind!r}; accepted: {', '.join(ECHO_KINDS)}"
    )


# -- streams of any block size --------------------------------------------------------------------


class StreamEchoCanceller:
    """An :class:`EchoCanceller` over blocks of any length, the reference fed on its own path.

    The player calls :meth:`feed_reference` with what it plays, when it plays it (from its
    output callback, not when it queues audio); the microphone's consumer calls
    :meth:`process` with each captured block. Each near frame is paired with the oldest
    reference samples not yet used; when none are there (nothing is playing) the pair is
    silence, and those samples are not owed later. So the alignment assumption is: the
    reference runs a roughly constant number of samples ahead of its echo in the microphone
    (output latency + acoustic path + input latency, plus the difference in callback timing),
    and that offset stays within the canceller's tail (WebRTC estimates it and follows changes;
    Speex must re-converge when it changes). Reference not consumed within
    :data:`MAX_REFERENCE_S` is dropped (``reference_dropped`` counts the samples).

    ``process(near, far=None)``: ``far``, when given, is fed first (blocks captured and played
    in lockstep, as in tests). Returns the cleaned samples of every complete frame so far:
    output lags the input by less than one frame (``pending`` samples, at most
    ``frame_samples - 1``), and :meth:`flush` returns those (the frame padded with silence).
    Thread safety: :meth:`feed_reference` may run on the player's thread while :meth:`process`
    runs on the microphone's.
    """

    def __init__(
        self, canceller: EchoCanceller, *, max_reference_s: float = MAX_REFERENCE_S
    ) -> None:
        self.canceller = canceller
        self.frame_samples = canceller.frame_samples
        self._max_reference = round(max_reference_s * canceller.sample_rate)
        self._lock = threading.Lock()
        self._reference = np.zeros(0, np.float32)
        self._near = np.zeros(0, np.float32)
        #: Reference samples dropped because the microphone did not keep up with the player.
        self.reference_dropped = 0
        #: Near samples paired with silence because no reference was there.
        self.reference_missing = 0

    @property
    def pending(self) -> int:
        """Near samples held until their frame completes (fewer than one frame)."""
        return int(self._near.size)

    def feed_reference(self, far: np.ndarray) -> None:
        """Add what the loudspeaker plays now (float32 mono at the canceller's rate)."""
        _check_block("far", far)
        with self._lock:
            self._reference = np.concatenate([self._reference, far])
            self._trim_reference()

    def process(self, near: np.ndarray, far: np.ndarray | None = None) -> np.ndarray:
        """Clean a captured block; returns the samples of the frames it completed."""
        _check_block("near", near)
        if far is not None:
            _check_block("far", far)
            with self._lock:
                # Kept whole until this block's frames took their share, however long.
                self._reference = np.concatenate([self._reference, far])
        frame = self.frame_samples
        buffered = np.concatenate([self._near, near])
        whole = buffered.size // frame
        out = np.empty(whole * frame, np.float32)
        for index in range(whole):
            span = slice(index * frame, (index + 1) * frame)
            out[span] = self.canceller.process(buffered[span], self._take_reference(frame))
        self._near = buffered[whole * frame :].copy()
        if far is not None:
            with self._lock:
                self._trim_reference()
        return out

    def _trim_reference(self) -> None:
        excess = self._reference.size - self._max_reference
        if excess > 0:
            self._reference = self._reference[excess:]
            self.reference_dropped += excess

    def flush(self) -> np.ndarray:
        """The held samples, cleaned as a frame padded with silence."""
        held = self._near.size
        if held == 0:
            return np.zeros(0, np.float32)
        padded = np.zeros(self.frame_samples, np.float32)
        padded[:held] = self._near
        self._near = np.zeros(0, np.float32)
        return self.canceller.process(padded, self._take_reference(self.frame_samples))[:held]

    def _take_reference(self, samples: int) -> np.ndarray:
        with self._lock:
            taken = self._reference[:samples]
            self._reference = self._reference[taken.size :]
        if taken.size == samples:
            return np.ascontiguousarray(taken)
        self.reference_missing += samples - taken.size
        return np.concatenate([taken, np.zeros(samples - taken.size, np.float32)])

    def reset(self) -> None:
        """Forget the held audio, the reference and what the canceller learned."""
        with self._lock:
            self._reference = np.zeros(0, np.float32)
        self._near = np.zeros(0, np.float32)
        self.canceller.reset()

    def close(self) -> None:
        self.canceller.close()


# -- a simulated loudspeaker-to-microphone path ----------------------------------------------------


class EchoPath:
    """What a microphone picks up of what a loudspeaker plays: the played samples delayed by
    ``delay_s``, scaled by ``gain``, optionally through a room (the direct path, then random
    reflections ``room_s`` long decaying by 60 dB in ``rt60_s``: :attr:`impulse_response`),
    plus white noise of ``noise_rms``. Stateful: blocks of any length give the same pickup as
    one call on the whole signal. For tests and benchmarks; deterministic for a ``seed``.
    """

    def __init__(
        self,
        *,
        delay_s: float = 0.08,
        gain: float = 0.5,
        room_s: float = 0.0,
        rt60_s: float = 0.1,
        noise_rms: float = 0.0,
        sample_rate: int = SAMPLE_RATE,
        seed: int = 0,
    ) -> None:
        if delay_s < 0 or room_s < 0 or noise_rms < 0 or rt60_s <= 0:
            raise UsageError("delay_s, room_s and noise_rms must be at least 0, rt60_s above 0")
        self.sample_rate = sample_rate
        self.delay_samples = round(delay_s * sample_rate)
        rng = np.random.default_rng(seed)
        taps = max(1, round(room_s * sample_rate))
        response = np.zeros(taps)
        response[0] = 1.0
        if taps > 1:
            t = np.arange(1, taps) / sample_rate
            # Reflections 60 dB down after rt60_s, a third of the direct path's level at first.
            response[1:] = rng.standard_normal(taps - 1) * 0.3 * 10 ** (-3 * t / rt60_s)
        #: The room's response, scaled so that its energy equals the direct path's: ``gain``
        #: sets the echo's level whatever the room.
        self.impulse_response = (gain * response / np.sqrt(np.sum(response**2))).astype(np.float64)
        self.noise_rms = noise_rms
        self._noise = np.random.default_rng(seed + 1)
        self._history = np.zeros(self.delay_samples + taps - 1)

    def pickup(self, played: np.ndarray) -> np.ndarray:
        """The microphone's samples (float32) while ``played`` plays."""
        played = np.asarray(played, np.float64).reshape(-1)
        signal = np.concatenate([self._history, played])
        echo = np.convolve(signal, self.impulse_response, mode="valid")[: played.size]
        self._history = signal[signal.size - self._history.size :]
        if self.noise_rms:
            echo = echo + self._noise.standard_normal(played.size) * self.noise_rms
        return echo.astype(np.float32)
