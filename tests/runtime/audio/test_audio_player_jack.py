"""Real-time playback on a JACK dummy server at 48 kHz that each test starts and stops.

The dummy driver paces the stream like a sound card, so these tests measure what a
listener would get: no underruns once playback starts, first audio soon after the
request, and silence within one block of a cancel. Each scenario runs in its own process
(see ``jack_playback_child.py``), which also reports what it left behind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import soxr

if TYPE_CHECKING:
    from conftest import JackServer

RATE = 22050
CANCEL_MARGIN_S = 0.005

pytestmark = pytest.mark.audio


def resampled_frames(input_frames: int) -> int:
    return len(soxr.resample(np.zeros(input_frames, np.float32), RATE, 48000))


def assert_left_nothing(result: dict[str, Any]) -> None:
    assert result["open_streams"] == 0
    assert result["threads_left"] == []
    assert result["os_threads_left"] <= 0
    assert result["new_shm_after_release"] == []
    assert result["device_names"] == ["system"], "the scenario must have used the test's server"


def test_five_utterances_play_without_underruns(jack_server: JackServer) -> None:
    result = jack_server.run_scenario("utterances")
    assert len(result["utterances"]) == 5
    for played in result["utterances"]:
        print(
            f"utterance {played['seconds']:.1f} s: first playback "
            f"{played['time_to_first_playback_s']:.3f} s, underruns {played['underruns']} "
            f"({played['underrun_seconds']:.3f} s), device underflows "
            f"{played['device_underflows']}, played for {played['playback_elapsed_s']:.3f} s"
        )
        assert played["finished"]
        assert played["state"] == "finished"
        assert (played["host_api"], played["device_rate"]) == ("JACK Audio Connection Kit", 48000)
        assert played["underruns"] == 0
        assert played["underrun_seconds"] == 0.0
        expected = resampled_frames(played["input_frames"])
        assert played["frames_played"] == played["frames_queued"] == expected
        assert 0 < played["time_to_first_playback_s"] < 1.0
        # Paced by the server's clock: the audio takes (at least nearly) its own duration.
        assert played["playback_elapsed_s"] >= 0.9 * played["seconds"]
    assert_left_nothing(result)


def test_pause_and_resume_in_real_time(jack_server: JackServer) -> None:
    result = jack_server.run_scenario("pause")
    assert result["paused_state"] == "paused"
    assert result["after_pause"] == result["held"], "a paused player must output nothing"
    assert result["finished"]
    assert result["underruns"] == 0
    assert result["frames_played"] == resampled_frames(result["input_frames"])
    assert_left_nothing(result)


def test_cancel_mid_utterance_is_silent_within_one_block_and_leaves_nothing(
    jack_server: JackServer,
) -> None:
    result = jack_server.run_scenario("cancel")
    print(
        f"cancel latency {result['cancel_latency_s']:.4f} s (block "
        f"{result['block_duration_s']:.4f} s), stop() returned after {result['stop_took_s']:.3f}"
        f" s, first playback {result['time_to_first_playback_s']:.3f} s, underruns "
        f"{result['underruns']}"
    )
    assert result["state"] == "stopped"
    assert result["cancel_latency_s"] <= result["block_duration_s"] + CANCEL_MARGIN_S
    assert result["stop_took_s"] < 1.0
    assert result["frames_played"] == result["frames_at_stop"] < 4.0 * 48000
    assert not result["producer_alive"]
    assert result["producer_cancelled"]
    assert result["underruns"] == 0
    assert result["new_shm_after_stop"] == []
    assert_left_nothing(result)
