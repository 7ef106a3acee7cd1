"""Streaming speech in real time: the speak pipeline (two worker processes) feeding the player
on a JACK dummy server at 48 kHz that the test starts and stops. Five utterances of different
lengths must play with zero underruns once playback started; a cancel mid-utterance must be
silent within one block and leave no process, stream, thread or shared memory behind."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.helpers.voice import export_once

if TYPE_CHECKING:
    from conftest import JackServer

CHILD = Path(__file__).with_name("speech_playback_child.py")
CANCEL_MARGIN_S = 0.005
#: Shared memory the runtime (``oe-``), libjack and PortAudio's JACK client (``jack``,
#: semaphores) create.
OURS = ("oe-", "jack", "sem.")

pytestmark = pytest.mark.audio


def test_five_utterances_stream_without_underruns_and_a_cancel_leaves_nothing(
    jack_server: JackServer,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(export_once(tmp_path_factory).data_dir))
    result = jack_server.run_scenario("speech", timeout_s=240.0, child=CHILD)

    assert len(result["utterances"]) == 5
    lengths = [played["audio_seconds"] for played in result["utterances"]]
    assert lengths == sorted(lengths)
    assert len(set(lengths)) == 5
    for played in result["utterances"]:
        playback = played["playback"]
        print(
            f"{played['audio_seconds']:.2f} s of speech: first audio "
            f"{played['time_to_first_audio_s']:.3f} s, first playback "
            f"{played['time_to_first_playback_s']:.3f} s, real-time factor "
            f"{played['real_time_factor']:.3f}, longest chunk gap {played['max_chunk_gap_s']:.3f}"
            f" s, underruns {played['underruns']} ({played['underrun_seconds']:.3f} s), device "
            f"underflows {playback['device_underflows']}"
        )
        assert played["status"] == "completed"
        if played["underruns"] and played["real_time_factor"] > 1.0:
            # Streaming cannot outrun a CPU that synthesizes slower than real time.
            pytest.skip(
                f"this machine's CPU synthesized slower than real time (real-time factor "
                f"{played['real_time_factor']:.2f} under load); gap-free real-time playback "
                "needs a real-time factor below 1"
            )
        assert (playback["host_api"], playback["device_rate"]) == (
            "JACK Audio Connection Kit",
            48000,
        )
        assert played["underruns"] == 0
        assert played["underrun_seconds"] == 0.0
        assert playback["frames_played"] == playback["frames_queued"] > 0
        assert 0 < played["time_to_first_audio_s"] <= played["time_to_first_playback_s"]
        # Paced by the server's clock: playing took (nearly) the audio's own duration.
        assert playback["playback_elapsed_s"] >= 0.9 * played["audio_seconds"]

    cancelled = result["cancelled"]
    print(
        f"cancel: silent {cancelled['cancel_latency_s'] * 1000:.1f} ms after the cancel (block "
        f"{cancelled['block_duration_s'] * 1000:.1f} ms), request cancelled after "
        f"{cancelled['engine_cancel_s']:.3f} s"
    )
    assert cancelled["status"] == "cancelled"
    assert cancelled["frames_at_cancel"], "the cancel must come while the utterance plays"
    assert cancelled["cancel_latency_s"] <= cancelled["block_duration_s"] + CANCEL_MARGIN_S
    assert cancelled["underruns"] == 0
    # Nothing more is played after the silent block.
    assert cancelled["frames_played_after"] <= cancelled["frames_at_cancel"][0] + 2 * 512
    assert cancelled["wav"] is None

    assert result["workers_alive"] == []
    assert result["open_streams"] == 0
    assert result["threads_left"] == []
    assert result["os_threads_left"] <= 0
    # /dev/shm is the machine's: only names this process tree could make are counted.
    assert [name for name in result["new_shm_after_release"] if name.startswith(OURS)] == []
    assert result["device_names"] == ["system"]
