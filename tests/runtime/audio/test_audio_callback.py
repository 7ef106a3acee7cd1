"""The audio callback's jitter buffer, driven block by block without a device.

The device tests show the callback working under PortAudio; these pin down its decisions
(when output starts, what counts as an underrun, how the cushion grows) exactly.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import pytest

from runtime.audio.devices import sounddevice_module
from runtime.audio.player import _Playback
from runtime.audio.ring import SampleRing

BLOCK = 64


@pytest.fixture
def sd() -> Any:
    return sounddevice_module()


def _playback(sd: Any, cushion: int = 100, max_cushion: int = 200) -> _Playback:
    return _Playback(SampleRing(1000), cushion=cushion, max_cushion=max_cushion, sd=sd)


def _block(playback: _Playback, sd: Any, flags: Any = None) -> np.ndarray:
    out = np.full((BLOCK, 2), 9.0, dtype=np.float32)
    playback.callback(out, BLOCK, None, flags if flags is not None else sd.CallbackFlags())
    return out


def _ramp(start: int, count: int) -> np.ndarray:
    return np.arange(start, start + count, dtype=np.float32) / 1000


def test_output_starts_only_once_the_cushion_is_queued(sd: Any) -> None:
    playback = _playback(sd)
    playback.ring.write(_ramp(1, 99))
    assert not _block(playback, sd).any(), "below the cushion the output is silent"
    assert playback.t_first is None
    playback.ring.write(_ramp(100, 1))
    out = _block(playback, sd)
    np.testing.assert_array_equal(out[:, 0], _ramp(1, BLOCK))
    np.testing.assert_array_equal(out[:, 1], out[:, 0])
    assert playback.t_first is not None
    assert (playback.blocks_played, playback.frames_played, playback.underruns) == (1, BLOCK, 0)


def test_an_underrun_is_counted_once_and_grows_the_cushion(sd: Any) -> None:
    playback = _playback(sd, cushion=100, max_cushion=200)
    playback.ring.write(_ramp(1, 100))
    _block(playback, sd)
    out = _block(playback, sd)
    assert np.all(out[36:] == 0.0)
    assert out[35, 0] == pytest.approx(0.1)
    assert playback.underruns == 1
    assert playback.underrun_frames == BLOCK - 36
    assert playback.cushion == 150
    playback.ring.write(_ramp(101, 149))
    assert not _block(playback, sd).any(), "rebuffering until the grown cushion is queued"
    assert (playback.underruns, playback.underrun_frames) == (1, 2 * BLOCK - 36)
    playback.ring.write(_ramp(250, 1))
    out = _block(playback, sd)
    np.testing.assert_array_equal(out[:, 0], _ramp(101, BLOCK))
    assert playback.frames_played == 100 + BLOCK


def test_the_cushion_stops_growing_at_its_maximum(sd: Any) -> None:
    playback = _playback(sd, cushion=100, max_cushion=200)
    for size in (100, 150, 200, 200):
        playback.ring.write(_ramp(0, size))
        while playback.ring.readable():
            _block(playback, sd)
        _block(playback, sd)
    assert playback.underruns == 4
    assert playback.cushion == 200


def test_the_end_of_stream_plays_a_short_tail_and_finishes_without_underrun(sd: Any) -> None:
    playback = _playback(sd)
    playback.ring.write(_ramp(1, 90))
    assert not _block(playback, sd).any()
    playback.eos = True
    _block(playback, sd)
    with pytest.raises(sd.CallbackStop):
        _block(playback, sd)
    assert (playback.frames_played, playback.underruns, playback.underrun_frames) == (90, 0, 0)


def test_pause_outputs_silence_and_keeps_the_queue(sd: Any) -> None:
    playback = _playback(sd)
    playback.ring.write(_ramp(1, 300))
    _block(playback, sd)
    playback.paused = True
    for _ in range(5):
        assert not _block(playback, sd).any()
    assert playback.ring.readable() == 300 - BLOCK
    playback.paused = False
    np.testing.assert_array_equal(_block(playback, sd)[:, 0], _ramp(1 + BLOCK, BLOCK))
    assert playback.underruns == 0


def test_cancel_outputs_one_silent_block_and_ends_the_stream(sd: Any) -> None:
    playback = _playback(sd)
    playback.ring.write(_ramp(1, 300))
    _block(playback, sd)
    playback.cancel = True
    out = np.full((BLOCK, 2), 9.0, dtype=np.float32)
    with pytest.raises(sd.CallbackAbort):
        playback.callback(out, BLOCK, None, sd.CallbackFlags())
    assert not out.any()
    assert playback.t_silenced is not None


def test_portaudio_underflow_flags_are_counted_apart(sd: Any) -> None:
    playback = _playback(sd)
    flags = sd.CallbackFlags()
    flags.output_underflow = True
    _block(playback, sd, flags)
    _block(playback, sd, flags)
    assert (playback.device_underflows, playback.underruns) == (2, 0)


def test_the_callback_allocates_no_sample_memory(sd: Any) -> None:
    playback = _playback(sd, cushion=100, max_cushion=200)
    flags = sd.CallbackFlags()
    out = np.zeros((512, 2), dtype=np.float32)
    chunk = _ramp(0, 700)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        baseline, _ = tracemalloc.get_traced_memory()
        for _ in range(300):
            playback.ring.write(chunk[: playback.ring.writable()])
            playback.callback(out, 512, None, flags)
            playback.callback(out, 512, None, flags)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert playback.blocks_played > 300
    assert playback.underruns > 0
    # One block of output is 4 KiB: any per-call sample allocation would show here.
    assert peak - baseline < 2048, f"the callback path allocated {peak - baseline} bytes"
