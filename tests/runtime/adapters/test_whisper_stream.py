"""Whisper's features from audio arriving in blocks equal the one-call front end bit for bit,
whatever the block sizes and lengths (short clips, batch edges, several batches); so do the
windows of features spooled to a temporary file and read back one at a time."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest

from runtime.adapters.whisper_mel import (
    BLOCK_FRAMES,
    HOP_LENGTH,
    PreparedAudio,
    log_mel,
    window_features,
)
from runtime.adapters.whisper_stream import (
    FeatureStream,
    SpooledFeatures,
    prepare_stream,
    spool_stream,
)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

BATCH_SAMPLES = (BLOCK_FRAMES - 1) * HOP_LENGTH + 400
#: Two batches and a little (two minutes): ``make slow``; ``make test`` has one batch and 1.6.
TWO_BATCHES = pytest.param(2 * BATCH_SAMPLES + 123, marks=pytest.mark.slow, id="two-batches")


@pytest.mark.parametrize(
    "samples",
    [
        1,
        50,
        1_599,
        1_600,
        16_000,
        BATCH_SAMPLES - 561,
        BATCH_SAMPLES - 560,
        BATCH_SAMPLES - 559,
        BATCH_SAMPLES,
        95 * 16_000,
        TWO_BATCHES,
    ],
)
@pytest.mark.parametrize("block", [999, 16_000, 65_536])
def test_blocks_give_the_features_of_the_whole(samples: int, block: int) -> None:
    rng = np.random.default_rng(samples)
    audio = (0.1 * rng.standard_normal(samples)).astype(np.float32)
    seen: list[int] = []
    prepared = prepare_stream(
        (audio[i : i + block] for i in range(0, samples, block)), on_block=seen.append
    )
    expected = log_mel(audio)
    assert prepared.samples == samples
    assert prepared.features.shape == expected.shape
    assert np.array_equal(prepared.features, expected)
    assert seen[-1] == samples
    assert seen == sorted(seen)


def test_an_empty_stream_is_refused() -> None:
    with pytest.raises(ValueError, match="no samples"):
        prepare_stream(iter([np.zeros(0, np.float32)]))


@pytest.mark.parametrize("samples", [50, 1_600, BATCH_SAMPLES - 560, TWO_BATCHES])
def test_features_computed_as_blocks_are_fed_equal_the_whole(samples: int) -> None:
    rng = np.random.default_rng(samples)
    audio = (0.1 * rng.standard_normal(samples)).astype(np.float32)
    stream = FeatureStream()
    # 32 ms frames, as a microphone delivers them, with empty ones between.
    for begin in range(0, samples, 512):
        stream.feed(audio[begin : begin + 512])
        stream.feed(np.zeros(0, np.float32))
    assert stream.samples == samples
    assert stream.seconds == samples / 16_000
    prepared = stream.finish()
    assert prepared.samples == samples
    assert np.array_equal(prepared.features, log_mel(audio))
    with pytest.raises(ValueError, match="no samples"):
        FeatureStream().finish()


# -- features spooled to disk --------------------------------------------------------------


def _windows(features: np.ndarray, frames: int = 3000) -> list[tuple[int, int]]:
    """The transcription adapter's windows: ``frames`` frames (3,000 for the 30 s bundles) from
    0 up to the last frame but one."""
    content = features.shape[1] - 1
    return [(seek, min(frames, content - seek)) for seek in range(0, content, frames)]


@pytest.mark.parametrize(
    "samples", [1, 1_599, 1_600, 16_000, BATCH_SAMPLES, 95 * 16_000, TWO_BATCHES]
)
@pytest.mark.parametrize("block", [999, 65_536])
def test_spooled_windows_equal_the_whole_features_windows(samples: int, block: int) -> None:
    """Each window read back from the file equals the same window of the one-call features,
    normalised with the whole audio's maximum (the loud part comes last here)."""
    rng = np.random.default_rng(samples)
    audio = (0.1 * rng.standard_normal(samples)).astype(np.float32)
    audio[: samples // 2] *= 0.001
    seen: list[int] = []
    expected = log_mel(audio)
    with spool_stream(
        (audio[i : i + block] for i in range(0, samples, block)), on_block=seen.append
    ) as spooled:
        assert spooled.finished
        assert spooled.samples == samples
        assert spooled.frames == expected.shape[1]
        assert seen[-1] == samples
        for start, size in _windows(expected) or [(0, 1)]:
            window = spooled.window(start, size)
            assert window.shape == (1, 80, 3000)
            assert np.array_equal(window, window_features(expected, start, size))
        # Any range reads back, not only the adapter's windows.
        middle = expected.shape[1] // 3
        assert np.array_equal(spooled.window(middle, 7), window_features(expected, middle, 7))
    assert spooled.closed
    with pytest.raises(RuntimeError, match="closed before the request read them"):
        spooled.window(0, 1)
    spooled.close()


def test_spooled_features_fed_in_32_ms_frames_equal_the_whole() -> None:
    rng = np.random.default_rng(7)
    audio = (0.1 * rng.standard_normal(BATCH_SAMPLES + 5_000)).astype(np.float32)
    spooled = SpooledFeatures()
    for begin in range(0, audio.size, 512):
        spooled.feed(audio[begin : begin + 512])
    with pytest.raises(RuntimeError, match="only once finished"):
        spooled.window(0, 3000)
    expected = log_mel(audio)
    with spooled.finish():
        for start, size in _windows(expected):
            assert np.array_equal(
                spooled.window(start, size), window_features(expected, start, size)
            )
        with pytest.raises(RuntimeError, match="nothing more can be fed"):
            spooled.feed(audio[:10])


@pytest.mark.parametrize("samples", [1_600, 16_000, 25 * 16_000 + 123])
def test_windows_of_a_shorter_encoder_equal_the_whole_features_windows(samples: int) -> None:
    """The 10 s bundles' windows (1,000 frames), from memory and read back from the file."""
    rng = np.random.default_rng(samples)
    audio = (0.1 * rng.standard_normal(samples)).astype(np.float32)
    expected = log_mel(audio)
    prepared = PreparedAudio(samples, expected)
    windows = _windows(expected, 1000)
    assert len(windows) == -(-(expected.shape[1] - 1) // 1000)
    with spool_stream([audio[: samples // 2], audio[samples // 2 :]]) as spooled:
        for start, size in windows:
            window = window_features(expected, start, size, 1000)
            assert window.shape == (1, 80, 1000)
            assert np.array_equal(window[0, :, :size], expected[:, start : start + size])
            assert not np.any(window[0, :, size:])
            assert np.array_equal(prepared.window(start, size, 1000), window)
            assert np.array_equal(spooled.window(start, size, 1000), window)
        # The default stays Whisper's 30 s window.
        assert spooled.window(0, 5000).shape == (1, 80, 3000)


def test_spooled_features_keep_nothing_in_memory_or_on_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing of the features is kept in memory (the batches go to the file as they are
    computed), and the file has no name in the temporary folder, even while it is open."""
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    rng = np.random.default_rng(3)
    audio = (0.1 * rng.standard_normal(3 * BATCH_SAMPLES)).astype(np.float32)
    spooled = spool_stream(audio[i : i + 16_000] for i in range(0, audio.size, 16_000))
    try:
        assert spooled._stream._spectrum.blocks == []
        assert list(tmp_path.iterdir()) == []
    finally:
        spooled.close()


def test_a_stream_that_fails_while_spooled_lets_the_file_go() -> None:
    made: list[SpooledFeatures] = []

    class Failing(SpooledFeatures):
        def __init__(self, n_mels: int = 80) -> None:
            super().__init__(n_mels)
            made.append(self)

    def blocks() -> Iterator[np.ndarray]:
        yield np.zeros(BATCH_SAMPLES, np.float32)
        raise OSError("the disk went away")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("runtime.adapters.whisper_stream.SpooledFeatures", Failing)
        with pytest.raises(OSError, match="went away"):
            spool_stream(blocks())
    (spooled,) = made
    assert spooled.closed
    with pytest.raises(ValueError, match="no samples"):
        spool_stream(iter([np.zeros(0, np.float32)]))
