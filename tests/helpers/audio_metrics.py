"""Audio comparison measures for tests, in plain NumPy: log-mel spectrograms and their correlation."""

from __future__ import annotations

import numpy as np


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    return 2595.0 * np.log10(1.0 + hz / 700.0)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)


def mel_filterbank(sample_rate: int, n_fft: int, n_mels: int) -> np.ndarray:
    """Triangular filters on the HTK mel scale, shape [n_mels, n_fft // 2 + 1]."""
    bins = np.linspace(0.0, sample_rate / 2.0, n_fft // 2 + 1)
    edges = _mel_to_hz(np.linspace(0.0, _hz_to_mel(np.array(sample_rate / 2.0)), n_mels + 2))
    low, centre, high = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins[None, :] - low) / (centre - low)
    falling = (high - bins[None, :]) / (high - centre)
    return np.maximum(0.0, np.minimum(rising, falling))


def log_mel(
    audio: np.ndarray,
    sample_rate: int,
    *,
    n_fft: int = 1024,
    hop: int = 256,
    n_mels: int = 80,
    floor: float = 1e-5,
) -> np.ndarray:
    """Log mel power spectrogram [frames, n_mels] of a mono signal (Hann window, centred)."""
    signal = np.asarray(audio, dtype=np.float64).reshape(-1)
    padded = np.pad(signal, (n_fft // 2, n_fft // 2), mode="reflect")
    count = 1 + (padded.size - n_fft) // hop
    frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop][:count]
    spectrum = np.abs(np.fft.rfft(frames * np.hanning(n_fft), axis=1)) ** 2
    mel = spectrum @ mel_filterbank(sample_rate, n_fft, n_mels).T
    return np.log(np.maximum(mel, floor))


def log_mel_correlation(a: np.ndarray, b: np.ndarray, sample_rate: int) -> float:
    """Pearson correlation of two signals' log-mel spectrograms (cut to the shorter one)."""
    mel_a = log_mel(a, sample_rate)
    mel_b = log_mel(b, sample_rate)
    frames = min(len(mel_a), len(mel_b))
    return float(np.corrcoef(mel_a[:frames].ravel(), mel_b[:frames].ravel())[0, 1])
