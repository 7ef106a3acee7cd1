"""Streaming resampling joins up exactly like a one-shot conversion."""

from __future__ import annotations

import numpy as np
import pytest
import soxr
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.audio import StreamResampler


def _voice_like(samples: int, rate: int = 22050) -> np.ndarray:
    t = np.arange(samples) / rate
    rng = np.random.default_rng(3)
    tone = 0.4 * np.sin(2 * np.pi * 180 * t) + 0.2 * np.sin(2 * np.pi * 2300 * t)
    return (tone + 0.05 * rng.standard_normal(samples)).astype(np.float32)


def _chunked(resampler: StreamResampler, signal: np.ndarray, sizes: list[int]) -> np.ndarray:
    parts = []
    position = 0
    for size in sizes:
        parts.append(resampler.process(signal[position : position + size]))
        position += size
    parts.append(resampler.process(signal[position:]))
    parts.append(resampler.flush())
    return np.concatenate(parts)


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(min_value=0, max_value=4000), max_size=12))
def test_chunked_output_equals_one_shot(sizes: list[int]) -> None:
    signal = _voice_like(22050)
    whole = soxr.resample(signal, 22050, 48000, quality="HQ")
    joined = _chunked(StreamResampler(22050, 48000), signal, sizes)
    assert joined.dtype == np.float32
    assert joined.shape == whole.shape
    np.testing.assert_allclose(joined, whole, atol=1e-6)


@pytest.mark.parametrize("samples", [1, 511, 22050, 3 * 22050 + 17])
def test_22050_to_48000_keeps_the_duration(samples: int) -> None:
    joined = _chunked(StreamResampler(22050, 48000), _voice_like(samples), [1000] * 5)
    assert abs(len(joined) - samples * 48000 / 22050) <= 1


def test_a_tone_keeps_its_pitch() -> None:
    signal = (0.5 * np.sin(2 * np.pi * 440 * np.arange(22050) / 22050)).astype(np.float32)
    joined = _chunked(StreamResampler(22050, 48000), signal, [300] * 70)
    spectrum = np.abs(np.fft.rfft(joined[4800:-4800]))
    peak_hz = np.argmax(spectrum) * 48000 / len(joined[4800:-4800])
    assert abs(peak_hz - 440) < 2


def test_equal_rates_are_the_identity() -> None:
    resampler = StreamResampler(48000, 48000)
    signal = _voice_like(1000)
    assert resampler.is_identity
    np.testing.assert_array_equal(resampler.process(signal[::2]), signal[::2])
    assert resampler.flush().shape == (0,)


def test_no_input_after_flush() -> None:
    resampler = StreamResampler(22050, 48000)
    resampler.flush()
    assert resampler.flush().shape == (0,)
    with pytest.raises(RuntimeError, match="was flushed"):
        resampler.process(_voice_like(10))


@pytest.mark.parametrize(
    "chunk",
    [np.zeros(10, np.float64), np.zeros((10, 1), np.float32), np.zeros(10, np.int16)],
)
def test_only_mono_float32_is_accepted(chunk: np.ndarray) -> None:
    with pytest.raises(ValueError, match="1-D float32"):
        StreamResampler(22050, 48000).process(chunk)


@pytest.mark.parametrize(("in_rate", "out_rate"), [(0, 48000), (22050, -1), (22050.0, 48000)])
def test_bad_rates_are_refused(in_rate: object, out_rate: object) -> None:
    with pytest.raises(ValueError, match="must be a positive int in Hz"):
        StreamResampler(in_rate, out_rate)  # type: ignore[arg-type]
