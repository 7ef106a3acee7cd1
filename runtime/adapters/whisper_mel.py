"""Whisper's log-mel front end in NumPy, computed as faster-whisper computes it.

16 kHz mono float32 audio -> ``[80, frames]`` log-mel: the audio padded with 160 zeros at its
end, a centred STFT (400-point periodic Hann window, hop 160, reflect padding) of which the
last frame is dropped, the power spectrum through Slaney-scaled mel filters, ``log10`` clipped
at 1e-10, floored at the maximum less 8 and scaled as ``(x + 4) / 4``. The maximum is taken
over the whole audio, so windows cut from one call's features agree with faster-whisper's.
Each encoder window (3,000 frames, 30 s, for the full-window bundles; the encoder bundle says
how many) is the features' slice, zero-padded after normalising. The spectrum is computed a
block of frames at a time, so a long file needs the memory of its features (32 KB a second)
and one block, not of its whole spectrum.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

__all__ = [
    "BLOCK_FRAMES",
    "FRAMES_PER_WINDOW",
    "HOP_LENGTH",
    "N_FFT",
    "SAMPLE_RATE",
    "PreparedAudio",
    "log_mel",
    "mel_filters",
    "normalise_features",
    "window_features",
]

SAMPLE_RATE: Final = 16_000
N_FFT: Final = 400
HOP_LENGTH: Final = 160
#: Frames of one 30 s window: Whisper's own (the full-window bundles' encoder input).
FRAMES_PER_WINDOW: Final = 3000
#: Frames whose spectrum :func:`log_mel` computes at once (a minute of audio).
BLOCK_FRAMES: Final = 6000
_PADDING: Final = 160


@dataclass(frozen=True, slots=True)
class PreparedAudio:
    """A request's audio at 16 kHz mono and its log-mel features ``[80, frames]``."""

    samples: int
    features: np.ndarray

    @property
    def seconds(self) -> float:
        return self.samples / SAMPLE_RATE

    @property
    def frames(self) -> int:
        """Frames of features (the audio's samples // 160 + 1)."""
        return int(self.features.shape[1])

    def window(self, start: int, size: int, frames: int = FRAMES_PER_WINDOW) -> np.ndarray:
        """Frames ``start .. start + size`` as one encoder window of ``frames`` frames (see
        :func:`window_features`)."""
        return window_features(self.features, start, size, frames)


@functools.cache
def mel_filters(n_mels: int = 80) -> np.ndarray:
    """Slaney-style mel filters ``[n_mels, 201]`` (float32), as faster-whisper builds them."""
    fftfreqs = np.fft.rfftfreq(n=N_FFT, d=1.0 / SAMPLE_RATE)
    mels = np.linspace(0.0, 45.245640471924965, n_mels + 2)
    f_sp = 200.0 / 3
    freqs = f_sp * mels
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    log_t = mels >= min_log_mel
    freqs[log_t] = min_log_hz * np.exp(logstep * (mels[log_t] - min_log_mel))
    fdiff = np.diff(freqs)
    ramps = freqs.reshape(-1, 1) - fftfreqs.reshape(1, -1)
    lower = -ramps[:-2] / np.expand_dims(fdiff[:-1], axis=1)
    upper = ramps[2:] / np.expand_dims(fdiff[1:], axis=1)
    weights = np.maximum(np.zeros_like(lower), np.minimum(lower, upper))
    enorm = 2.0 / (freqs[2 : n_mels + 2] - freqs[:n_mels])
    weights *= np.expand_dims(enorm, axis=1)
    filters = weights.astype(np.float32)
    filters.setflags(write=False)
    return filters


def log_mel(
    audio: np.ndarray,
    n_mels: int = 80,
    *,
    block_frames: int = BLOCK_FRAMES,
    normalise: bool = True,
) -> np.ndarray:
    """The log-mel features ``[n_mels, frames]`` (float32) of 16 kHz mono audio (see the
    module); ``frames`` is ``len(audio) // 160 + 1``. ``normalise=False`` leaves out the floor
    and scaling (:func:`normalise_features` applies them later, given the whole audio's maximum).

    The spectrum is computed ``block_frames`` frames at a time into the result, so the memory
    beside the audio and the features stays that of one block whatever the audio's length;
    every frame's value is the one a single pass over the whole audio gives."""
    waveform = np.pad(np.asarray(audio, dtype=np.float32).reshape(-1), (0, _PADDING))
    window = np.hanning(N_FFT + 1)[:-1].astype(np.float32)
    half = N_FFT // 2
    padded = np.pad(waveform, (half, half), mode="reflect")
    count = 1 + (padded.size - N_FFT) // HOP_LENGTH
    frames = np.lib.stride_tricks.as_strided(
        padded, (count, N_FFT), (HOP_LENGTH * padded.strides[0], padded.strides[0])
    )
    # The last STFT frame is dropped, as faster-whisper drops it.
    features = np.empty((n_mels, count - 1), dtype=np.float32)
    filters = mel_filters(n_mels)
    for start in range(0, count - 1, max(1, block_frames)):
        end = min(start + block_frames, count - 1)
        stft = np.fft.rfft(frames[start:end] * window, n=N_FFT, axis=-1).T.astype(np.complex64)
        magnitudes = np.abs(stft) ** 2
        features[:, start:end] = np.log10(np.clip(filters @ magnitudes, a_min=1e-10, a_max=None))
    if normalise:
        normalise_features(features, features.max())
    return features


def normalise_features(features: np.ndarray, maximum: np.floating[Any]) -> None:
    """Whisper's floor and scaling, in place: ``(max(x, maximum - 8) + 4) / 4``, ``maximum``
    being the unnormalised features' maximum over the whole audio. Element by element, so a
    slice normalised alone equals the same slice of the whole normalised at once."""
    np.maximum(features, maximum - 8.0, out=features)
    features += 4.0
    features /= 4.0


def window_features(
    features: np.ndarray, start: int, size: int, frames: int = FRAMES_PER_WINDOW
) -> np.ndarray:
    """Frames ``start .. start + size`` of ``features`` (at most ``frames`` of them),
    zero-padded to one encoder window and shaped ``[1, n_mels, frames]`` (3,000 frames: a 30 s
    window)."""
    out = np.zeros((1, features.shape[0], frames), dtype=np.float32)
    size = min(size, frames, features.shape[1] - start)
    out[0, :, :size] = features[:, start : start + size]
    return out
