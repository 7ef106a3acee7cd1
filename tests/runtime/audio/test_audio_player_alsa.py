"""Functional playback on ALSA null devices (a working output that is not paced in time).

A null device takes audio as fast as the callback supplies it, so these tests check what
was played, the controls and the cleanup; timing under real-time pacing is tested on a
JACK dummy server (``test_audio_player_jack.py``).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import soxr

from runtime.audio import (
    AudioDeviceError,
    AudioPlayer,
    PlaybackBufferFull,
    PlayerState,
    open_stream_count,
)
from runtime.errors import RequestCancelled, UsageError

RATE = 22050
REPO = Path(__file__).resolve().parents[3]
CANCEL_MARGIN_S = 0.005

pytestmark = pytest.mark.usefixtures("alsa_null", "thread_baseline")


def tone(seconds: float, hz: float = 440.0) -> np.ndarray:
    t = np.arange(round(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def feed_in_chunks(player: AudioPlayer, pcm: np.ndarray, chunk: int = 2048) -> None:
    for start in range(0, len(pcm), chunk):
        player.feed(pcm[start : start + chunk])
    player.end_of_stream()


def wait_until(condition: Callable[[], bool], timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.002)


@pytest.mark.parametrize("seconds", [0.1, 0.5, 1.3])
def test_an_utterance_plays_to_the_end(seconds: float) -> None:
    pcm = tone(seconds)
    player = AudioPlayer(sample_rate_in=RATE)
    player.mark_request_start()
    player.start()
    producer = threading.Thread(target=feed_in_chunks, args=(player, pcm))
    producer.start()
    assert player.wait(5.0)
    producer.join()
    metrics = player.metrics()
    assert player.state is PlayerState.FINISHED
    assert (metrics.device_name, metrics.host_api, metrics.device_rate) == ("default", "ALSA", RATE)
    assert metrics.frames_played == metrics.frames_queued == len(pcm)
    assert metrics.time_to_first_playback_s is not None
    assert 0 < metrics.time_to_first_playback_s < 2.0
    assert metrics.cancel_latency_s is None
    assert open_stream_count() == 0


def test_an_empty_stream_finishes_without_playing() -> None:
    player = AudioPlayer(sample_rate_in=RATE)
    player.start()
    player.end_of_stream()
    assert player.wait(5.0)
    metrics = player.metrics()
    assert player.state is PlayerState.FINISHED
    assert (metrics.frames_played, metrics.blocks_played, metrics.underruns) == (0, 0, 0)
    assert metrics.time_to_first_playback_s is None


def test_the_device_rate_is_reached_by_resampling() -> None:
    pcm = tone(0.7, hz=300)
    player = AudioPlayer(sample_rate_in=RATE, device_rate=48000)
    player.start()
    feed_in_chunks(player, pcm, chunk=1500)
    assert player.wait(5.0)
    metrics = player.metrics()
    assert (metrics.input_rate, metrics.device_rate) == (RATE, 48000)
    expected = len(soxr.resample(pcm, RATE, 48000))
    assert metrics.frames_played == metrics.frames_queued == expected


def test_pause_holds_the_queue_and_resume_plays_the_rest() -> None:
    first, rest = tone(0.3), tone(1.0, hz=600)
    player = AudioPlayer(sample_rate_in=RATE)
    player.start()
    player.feed(first)
    wait_until(lambda: player.metrics().frames_played > 0)
    player.pause()
    assert player.state is PlayerState.PAUSED
    player.feed(rest)
    time.sleep(0.02)
    held = player.metrics().frames_played
    time.sleep(0.1)
    assert player.metrics().frames_played == held, "a paused player must output nothing"
    assert held < len(first) + len(rest)
    player.resume()
    player.end_of_stream()
    assert player.wait(5.0)
    assert player.metrics().frames_played == len(first) + len(rest)


def test_stop_mid_stream_is_quick_and_frees_everything() -> None:
    player = AudioPlayer(sample_rate_in=RATE)
    player.start()
    player.feed(tone(3.0))
    wait_until(lambda: player.metrics().frames_played > 0)
    began = time.monotonic()
    player.stop()
    took = time.monotonic() - began
    metrics = player.metrics()
    assert player.state is PlayerState.STOPPED
    assert took < 0.3
    assert metrics.cancel_latency_s is not None
    assert metrics.cancel_latency_s <= player.block_duration_s + CANCEL_MARGIN_S
    assert open_stream_count() == 0
    with pytest.raises(RequestCancelled, match="stopped"):
        player.feed(tone(0.1))
    with pytest.raises(RequestCancelled, match="stopped"):
        player.end_of_stream()
    player.stop()
    assert player.wait(0) is True
    assert player.metrics() == metrics


def test_stop_releases_a_producer_waiting_for_room() -> None:
    player = AudioPlayer(sample_rate_in=RATE, cushion_s=0.05, max_cushion_s=0.1, buffer_s=0.25)
    player.start()
    player.pause()
    outcome: list[BaseException] = []

    def produce() -> None:
        try:
            player.feed(tone(2.0))
        except RequestCancelled as error:
            outcome.append(error)

    producer = threading.Thread(target=produce)
    producer.start()
    wait_until(lambda: player.metrics().frames_queued == 0 and producer.is_alive())
    time.sleep(0.05)
    assert producer.is_alive(), "a full buffer must hold the producer back"
    began = time.monotonic()
    player.stop()
    producer.join(1.0)
    assert not producer.is_alive()
    assert time.monotonic() - began < 1.0
    assert len(outcome) == 1


def test_a_full_buffer_times_out_with_a_clear_error() -> None:
    player = AudioPlayer(sample_rate_in=RATE, cushion_s=0.05, max_cushion_s=0.1, buffer_s=0.25)
    with player:
        player.pause()
        began = time.monotonic()
        with pytest.raises(PlaybackBufferFull, match=r"stayed full for 0\.1 s .* frames were not"):
            player.feed(tone(1.0), timeout_s=0.1)
        assert 0.1 <= time.monotonic() - began < 0.5
    assert open_stream_count() == 0


def test_an_underrun_is_counted_and_grows_the_cushion() -> None:
    player = AudioPlayer(sample_rate_in=RATE, cushion_s=0.15, max_cushion_s=1.0)
    player.start()
    player.feed(tone(0.2))
    wait_until(lambda: player.metrics().underruns == 1)
    assert player.metrics().cushion_s == pytest.approx(0.225, abs=1e-3)
    assert player.state is PlayerState.BUFFERING
    player.feed(tone(0.1))
    time.sleep(0.05)
    assert player.metrics().frames_played == round(0.2 * RATE), "below the new cushion: wait"
    player.end_of_stream()
    assert player.wait(5.0)
    metrics = player.metrics()
    assert metrics.underruns == 1
    assert metrics.underrun_seconds > 0
    assert metrics.frames_played == round(0.3 * RATE)


def test_first_playback_is_timed_from_the_marked_request_start() -> None:
    player = AudioPlayer(sample_rate_in=RATE)
    player.mark_request_start(time.monotonic() - 1.0)
    player.start()
    feed_in_chunks(player, tone(0.2))
    assert player.wait(5.0)
    first = player.metrics().time_to_first_playback_s
    assert first is not None
    assert 1.0 <= first < 2.0


def test_a_failing_device_ends_playback_with_an_error(alsa_null: Path) -> None:
    with (alsa_null / "alsa" / "asoundrc").open("a") as config:
        config.write('pcm.omni_full { type file slave.pcm null file "/dev/full" format "raw" }\n')
    from runtime.audio import rescan_output_devices

    rescan_output_devices()
    player = AudioPlayer("omni_full", sample_rate_in=RATE)
    player.start()

    def feed_until_the_device_fails() -> None:
        for _ in range(100):
            player.feed(tone(0.2))
            time.sleep(0.01)

    with pytest.raises(AudioDeviceError, match="ended unexpectedly"):
        feed_until_the_device_fails()
    assert player.wait(2.0)
    assert player.state is PlayerState.FAILED
    assert open_stream_count() == 0


def test_a_rate_the_device_refuses_is_reported() -> None:
    player = AudioPlayer(sample_rate_in=RATE, device_rate=1)
    with pytest.raises(AudioDeviceError, match=r"accepts none of the sample rates \[1\] Hz"):
        player.start()
    assert open_stream_count() == 0


def test_the_context_manager_stops_on_error() -> None:
    player = AudioPlayer(sample_rate_in=RATE)

    def play_and_fail() -> None:
        with player:
            player.feed(tone(0.5))
            raise KeyError("synthesis failed")

    with pytest.raises(KeyError):
        play_and_fail()
    assert player.state is PlayerState.STOPPED
    assert open_stream_count() == 0


def test_a_forgotten_player_closes_its_stream() -> None:
    player = AudioPlayer(sample_rate_in=RATE)
    player.start()
    player.feed(tone(0.2))
    assert open_stream_count() == 1
    del player
    gc.collect()
    assert open_stream_count() == 0


def test_misuse_is_refused_with_what_to_do() -> None:
    player = AudioPlayer(sample_rate_in=RATE)
    with pytest.raises(UsageError, match=r"call start\(\) first"):
        player.feed(tone(0.1))
    with pytest.raises(UsageError, match="no metrics yet"):
        player.metrics()
    player.start()
    with pytest.raises(UsageError, match="already started"):
        player.start()
    with pytest.raises(UsageError, match="1-D float32"):
        player.feed(tone(0.1).astype(np.float64))
    with pytest.raises(UsageError, match="1-D float32"):
        player.feed(np.zeros((10, 2), np.float32))
    with pytest.raises(UsageError, match="NaN or infinite"):
        player.feed(np.array([0.0, np.inf], np.float32))
    player.end_of_stream()
    with pytest.raises(UsageError, match="already called"):
        player.feed(tone(0.1))
    assert player.wait(5.0)
    player.stop()
    with pytest.raises(UsageError, match="create a new AudioPlayer"):
        player.start()


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        ({"sample_rate_in": 0}, "sample_rate_in must be a positive int"),
        ({"sample_rate_in": RATE, "block_frames": 8}, "block_frames must be an int"),
        ({"sample_rate_in": RATE, "cushion_s": 0}, "cushion_s must be a positive"),
        ({"sample_rate_in": RATE, "cushion_s": float("inf")}, "cushion_s must be finite"),
        ({"sample_rate_in": RATE, "cushion_s": 0.5, "max_cushion_s": 0.2}, "at least cushion_s"),
        ({"sample_rate_in": RATE, "buffer_s": 1.0}, "at least twice max_cushion_s"),
        ({"sample_rate_in": RATE, "latency": "fast"}, "latency must be 'low', 'high'"),
        ({"sample_rate_in": RATE, "channels": 0}, "channels must be a positive int"),
        ({"sample_rate_in": RATE, "device_rate": 44100.0}, "device_rate must be a positive int"),
    ],
)
def test_bad_settings_are_refused(arguments: dict[str, object], match: str) -> None:
    with pytest.raises(UsageError, match=match):
        AudioPlayer(**arguments)  # type: ignore[arg-type]


def test_more_channels_than_the_device_has_are_refused() -> None:
    player = AudioPlayer(sample_rate_in=RATE, channels=4096)
    with pytest.raises(UsageError, match="output channel"):
        player.start()
    assert open_stream_count() == 0


EXIT_SCRIPT = """
import atexit
import numpy as np

def report():
    from runtime.audio import open_stream_count
    metrics = player.metrics()
    print("open streams after the exit hooks:", open_stream_count(), flush=True)
    print("state:", player.state.value, flush=True)
    print("silenced by the callback:", metrics.cancel_latency_s < 0.1, flush=True)

atexit.register(report)
from runtime.audio import AudioPlayer

player = AudioPlayer(sample_rate_in=22050)
player.start()
player.feed(np.zeros(44100, np.float32))
print("playing", flush=True)
"""


def test_a_player_left_open_at_exit_ends_cleanly() -> None:
    completed = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines() == [
        "playing",
        "open streams after the exit hooks: 0",
        "state: stopped",
        "silenced by the callback: True",
    ]
    assert "Traceback" not in completed.stderr
