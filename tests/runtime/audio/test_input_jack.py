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

pytestmark = pytest.mark.audio


def left_nothing(result: dict[str, Any]) -> None:
    """As the player's scenarios; segments of the runtime's own (``oe-``) come from other
    processes on the machine: these scenarios start no pipeline."""
    result = dict(result)
    result["new_shm_after_release"] = [
        name for name in result["new_shm_after_release"] if not name.startswith("oe-")
    ]
    assert_left_nothing(result)


def test_the_input_delivers_a_clip_paced_in_real_time(jack_server: JackServer) -> None:
    result = jack_server.run_scenario("capture", child=CHILD)
    print(
        f"clip {result['clip_s']:.2f} s found at {result['lag_s']:.3f} s, correlation "
        f"{result['correlation']:.5f}, SNR {result['snr_db']:.1f} dB; read "
        f"{result['captured_s']:.2f} s of audio in {result['reading_s']:.2f} s (rate "
        f"{result['read_rate']:.0f}/s); close {result['close_s'] * 1e3:.1f} ms"
    )
    assert (result["host_api"], result["device_rate"]) == ("JACK Audio Connection Kit", 48000)
    assert len(result["targets"]) == 1, "the input stream opens one (mono) port"
    # The clip arrives whole and unchanged but for the two resamplings (22.05 -> 48 -> 16 kHz
    # against 22.05 -> 16 kHz directly).
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
