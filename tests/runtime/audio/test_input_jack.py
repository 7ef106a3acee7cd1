"""Audio input in real time: a JACK dummy server at 48 kHz that each test starts and stops, a
JACK client playing a known clip into the ports of the input stream, and
:class:`runtime.audio.AudioInput` reading it through PortAudio as it would a microphone
(see ``jack_capture_child.py``, which also reports what each scenario left behind)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.runtime.audio.test_audio_player_jack import assert_left_nothing

if TYPE_CHECKING:
    from typing import Any

    from conftest import JackServer

CHILD = Path(__file__).with_name("jack_capture_child.py")
VAD_PIPELINE = Path(__file__).resolve().parents[1] / "adapters" / "vad_pipeline.yaml"

pytestmark = pytest.mark.audio


def left_nothing(result: dict[str, Any]) -> None:
    """As the player's scenarios, counting only what the scenario's process could have made:
    the runtime's segments of another controller (``oe-<pid>-``) and Python multiprocessing's
    (``psm_``, ``sem.mp-``, which neither JACK nor the runtime use) come from other processes
    on the machine."""
    result = dict(result)
    own = f"oe-{result['pid']}-"
    result["new_shm_after_release"] = [
        name
        for name in result["new_shm_after_release"]
        if not name.startswith(("psm_", "sem.mp-")) and (name.startswith(own) or "oe-" not in name)
    ]
    assert_left_nothing(result)


def test_the_input_delivers_a_clip_paced_in_real_time(jack_server: JackServer) -> None:
    # The dummy server runs without real-time scheduling: on a machine busy elsewhere it
    # misses cycles (xruns) and the input overflows, which loses audio. Such a run proves
    # nothing about the input; it is tried again, up to three times.
    for attempt in range(3):
        result = jack_server.run_scenario("capture", child=CHILD)
        print(
            f"attempt {attempt}: clip {result['clip_s']:.2f} s found at {result['lag_s']:.3f} s, "
            f"correlation {result['correlation']:.5f}, SNR {result['snr_db']:.1f} dB; read "
            f"{result['captured_s']:.2f} s of audio in {result['reading_s']:.2f} s (rate "
            f"{result['read_rate']:.0f}/s); close {result['close_s'] * 1e3:.1f} ms; server xruns "
            f"{result['xruns']}, input overflows {result['device_overflows']}"
        )
        lost = result["xruns"] or result["device_overflows"] or result["blocks_dropped"]
        if not lost or result["snr_db"] > 30.0:
            break
    assert (result["host_api"], result["device_rate"]) == ("JACK Audio Connection Kit", 48000)
    assert len(result["targets"]) == 1, "the input stream opens one (mono) port"
    # The clip arrives whole and unchanged: the input's 48 -> 16 kHz conversion of it against
    # the same conversion in one piece (bit-exact when the clip starts on a multiple of three
    # server frames, else within the resampler's phase error).
    assert result["correlation"] > 0.999
    assert result["snr_db"] > 30.0
    # Paced by the server's clock: 16,000 samples a second, not faster.
    assert 0.9 * 16000 <= result["read_rate"] <= 1.1 * 16000
    assert result["clip_end_s"] <= result["captured_s"]
    assert result["blocks_dropped"] == 0
    assert result["max_level_dbfs"] > result["reference_rms_dbfs"] - 6.0
    assert result["close_s"] < 1.0
    assert result["read_after_end"]
    left_nothing(result)


def test_an_unknown_input_device_names_it_and_lists_the_inputs(jack_server: JackServer) -> None:
    result = jack_server.run_scenario("unknown_device", child=CHILD)
    assert "no audio input device matches 'no such microphone'" in result["message"]
    assert "available inputs:" in result["message"]
    assert result["inputs"]
    for device in result["inputs"]:
        assert device in result["message"]
    left_nothing(result)


def test_voice_activity_follows_the_input_live(jack_server: JackServer, tmp_path: Path) -> None:
    """The input as a live source of the voice activity pipeline: the events come while the
    voice speaks, each one in step with the audio the server's clock delivered."""
    from runtime.adapters.vad_bundle import ensure_vad_bundle

    ensure_vad_bundle(tmp_path / "data" / "vad" / "silero")
    environment = {
        "OMNI_EDGE_DATA_DIR": str(tmp_path / "data"),
        "VAD_PIPELINE": str(VAD_PIPELINE),
    }
    with pytest.MonkeyPatch.context() as patch:
        for key, value in environment.items():
            patch.setenv(key, value)
        # Cycles the server lost (xruns, on a machine busy elsewhere) shift the audio's time:
        # such a run is tried again, up to three times.
        for _attempt in range(3):
            result = jack_server.run_scenario("vad_live", timeout_s=90.0, child=CHILD)
            print(result)
            if not result["xruns"]:
                break
    assert result["kinds"] == ["SpeechStarted", "SpeechEnded"]
    sound_start, sound_end = result["sound_s"]
    # Stream times count from the input's start, a little before the clip began to play.
    offset = result["start_t"][0] - sound_start
    assert 0.0 <= offset <= result["play_offset_s"] + 0.3
    assert result["end_t"][0] - result["start_t"][0] == pytest.approx(
        sound_end - sound_start, abs=0.25
    )
    # Live: the start arrives while the voice still speaks, about min_speech_s after its sound
    # began; the end about the hangover after its sound ended; not when the input closed.
    assert result["start_arrived_s"][0] < sound_end
    assert result["start_arrived_s"][0] == pytest.approx(sound_start + 0.25, abs=0.4)
    assert result["end_arrived_s"][0] == pytest.approx(sound_end + 0.5, abs=0.4)
    assert result["end_arrived_s"][0] < result["clip_s"]
    assert result["audio_seconds"] >= result["clip_s"]
    left_nothing(result)
