"""Whisper's features from audio arriving in blocks equal the one-call front end bit for bit,
whatever the block sizes and lengths (short clips, batch edges, several batches)."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.adapters.whisper_mel import BLOCK_FRAMES, HOP_LENGTH, log_mel
from runtime.adapters.whisper_stream import FeatureStream, prepare_stream

BATCH_SAMPLES = (BLOCK_FRAMES - 1) * HOP_LENGTH + 400


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
        2 * BATCH_SAMPLES + 123,
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


@pytest.mark.parametrize("samples", [50, 1_600, BATCH_SAMPLES - 560, 2 * BATCH_SAMPLES + 123])
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
