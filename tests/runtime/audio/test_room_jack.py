"""The simulated room (:mod:`runtime.audio.room`) on a JACK dummy server at 48 kHz that each
test starts and stops. A plain JACK client stands in for the application's full-duplex stream
(``room_child.py``, which runs each scenario in its own process and reports what it left
behind); the room listens to its playback port and speaks into its capture port.

JACK runs the loop room -> device -> room with one feedback connection, the one that closed
the loop: the room connects the microphone first, so the speaker's connection is the feedback
one and carries what the device played one period late. The tests measure that period."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from runtime.audio.room import RoomSettings, first_sound_after, silent_after
from runtime.errors import UsageError
from tests.runtime.audio import test_input_jack

if TYPE_CHECKING:
    from typing import Any

    from conftest import JackServer

CHILD = Path(__file__).with_name("room_child.py")
RATE = 48000


def left_nothing(result: dict[str, Any], jack_server: JackServer) -> None:
    """As the input's scenarios; JACK's shared memory of other servers (other tests' on the
    machine, ``jack_<server>_...``) is not this scenario's."""
    result = dict(result)
    result["new_shm_after_release"] = [
        name
        for name in result["new_shm_after_release"]
        if not (name.startswith("jack_") and jack_server.name not in name)
    ]
    test_input_jack.left_nothing(result)


def run(jack_server: JackServer, scenario: str) -> dict[str, Any]:
    """The scenario, whose measurements are made again while the server lost cycles during
    them (xruns and late cycles: the dummy server runs without real-time scheduling, and a late
    cycle shifts audio by a period); the whole scenario again if every try lost some."""
    for attempt in range(2):
        result = jack_server.run_scenario(scenario, child=CHILD)
        print(f"run {attempt}: {result}")
        if not result["lost"]:
            break
    return result


@pytest.mark.audio
def test_a_scheduled_clip_reaches_the_microphone_at_the_reported_frame(
    jack_server: JackServer,
) -> None:
    result = run(jack_server, "clips")
    period = result["period"]
    assert period == jack_server.period
    timed, soon, later = result["clips"]
    # At the frame asked for, mid-period.
    assert timed["reported"] == timed["requested"] == result["now"] + 12345
    # As soon as possible: the next cycle, within two periods of asking.
    assert soon["requested"] is None
    assert result["now"] <= soon["reported"] <= result["now"] + 2 * period
    assert later["reported"] == later["requested"]
    for clip in (timed, soon, later):
        # The device's capture callback gets the clip's first sample in the cycle of the
        # reported frame (the room -> device connection is direct: no offset), bit-exact.
        assert clip["found"] == clip["reported"]
        assert clip["exact"]
    # A frame already past: the clip starts in the next cycle instead.
    assert result["late_requested"] < result["late_reported"]
    assert result["late_reported"] <= result["late_requested"] + 1000 + 2 * period
    assert result["clips_done"] == 4 * result["attempts"]
    assert result["failure"] is None
    left_nothing(result, jack_server)


@pytest.mark.audio
def test_the_echo_comes_back_delayed_by_the_setting_and_one_period(
    jack_server: JackServer,
) -> None:
    result = run(jack_server, "echo")
    period = result["period"]
    # The measured loop: the echo delay plus one period (JACK's feedback connection).
    assert result["lag"] == result["delay_frames"] + period == 4800 + 512
    assert result["gain"] == pytest.approx(0.5, rel=0.01)
    assert result["exact"], "a pure delay and gain of float32 samples is exact"
    assert result["before_echo_peak"] == 0.0
    assert result["off_peak"] == 0.0, "the echo switched off sends nothing back"
    # With an impulse response: the convolution comes back, plus the noise floor only.
    assert result["impulse_correlation"] > 0.999
    assert result["noise_dbfs"] == pytest.approx(-60.0, abs=1.0)
    assert result["impulse_residual_dbfs"] == pytest.approx(-60.0, abs=1.0)
    left_nothing(result, jack_server)


@pytest.mark.audio
def test_the_room_finds_where_the_speakers_sound_starts_and_stops(
    jack_server: JackServer,
) -> None:
    result = run(jack_server, "on_off")
    period = result["period"]
    # Where the room heard the tone's edges: one period after the device played them.
    (on1, off1), (on2, off2) = result["edges"]
    found = result["found"]

    def near(frame: int | None, expected: int) -> bool:
        return frame is not None and abs(frame - expected) <= period

    assert near(found["first_sound"], on1)
    assert near(found["second_sound"], on2)
    assert near(found["first_silence"], off1)
    assert near(found["second_silence"], off2)
    # The gap between the tones is shorter than 0.35 s: the lasting silence is the last one.
    assert near(found["long_silence"], off2)
    assert found["no_sound_after_the_end"] is None
    # The recording is what the device played, sample for sample, one period later.
    assert result["recording_exact"]
    left_nothing(result, jack_server)


@pytest.mark.audio
def test_the_room_names_what_it_cannot_connect_and_closes_twice(
    jack_server: JackServer,
) -> None:
    result = jack_server.run_scenario("errors", child=CHILD)
    messages = result["messages"]
    print(messages)
    assert (
        "no JACK audio playback (output) port matches 'no-such-app:out.*'"
        in (messages["no_speaker"])
    )
    assert "omni-device:playback" in messages["no_speaker"], "the ports there are listed"
    assert "no JACK audio capture (input) port matches 'nobody'" in messages["no_microphone"]
    assert (
        "'omni-device:playback' is not an audio capture (input) port"
        in (messages["wrong_direction"])
    )
    assert "no JACK port is named 'omni-device:nothing'" in messages["unknown_name"]
    for case in ("no_speaker", "no_microphone", "wrong_direction", "unknown_name"):
        assert messages[f"{case}_closed"] == "True", "a failed start closes the room"
    assert "runs at 48000 Hz, not the expected 44100 Hz" in messages["rate"]
    assert "could not open a JACK client" in messages["no_server"]
    assert "1-D" in messages["clip_shape"]
    assert "16000 Hz" in messages["clip_rate"]
    assert messages["closed_twice"] == "True"
    assert messages["after_close"] == "the room is closed"
    left_nothing(result, jack_server)


# The settings and the analysis helpers, without a server.


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"echo_delay_s": -0.1}, "echo_delay_s"),
        ({"echo_delay_s": float("nan")}, "echo_delay_s"),
        ({"echo_delay_s": 11.0}, "echo_delay_s"),
        ({"echo_gain": float("inf")}, "echo_gain"),
        ({"echo_gain": 5.0}, "echo_gain"),
        ({"noise_dbfs": 3.0}, "noise_dbfs"),
        ({"impulse": ()}, "impulse"),
        ({"impulse": ((1.0, 2.0),)}, "impulse"),
        ({"impulse": (1.0, float("nan"))}, "impulse"),
        ({"impulse": tuple(np.ones(5000))}, "impulse"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(settings: dict[str, Any], named: str) -> None:
    with pytest.raises(UsageError, match=named):
        RoomSettings(**settings)


def test_settings_are_frozen_and_keep_an_impulse_as_floats() -> None:
    settings = RoomSettings(echo_delay_s=0.1, echo_gain=0.3, impulse=tuple(np.array([1, 0.5])))
    assert settings.impulse == (1.0, 0.5)
    assert all(type(tap) is float for tap in settings.impulse)
    assert settings.delay_frames(RATE) == 4800
    assert settings == RoomSettings(echo_delay_s=0.1, echo_gain=0.3, impulse=(1.0, 0.5))
    with pytest.raises(AttributeError):
        settings.echo_gain = 1.0  # type: ignore[misc]


def _tone(samples: np.ndarray, start: int, end: int, amplitude: float = 0.1) -> None:
    t = np.arange(end - start) / RATE
    samples[start:end] = amplitude * np.cos(2 * np.pi * 440 * t)


def test_first_sound_after_finds_the_first_lasting_sound_to_the_sample() -> None:
    samples = np.zeros(RATE, np.float32)
    samples[1000] = 0.5  # a click: no sound
    _tone(samples, 5000, 9000)
    origin = 100_000
    assert first_sound_after(samples, origin, origin, RATE) == origin + 5000
    assert first_sound_after(samples, origin, 0, RATE) == origin + 5000, "clamped to the start"
    assert first_sound_after(samples, origin, origin, RATE, min_run_s=0.0) == origin + 1000
    assert first_sound_after(samples, origin, origin + 9000, RATE) is None
    # Too quiet for the threshold.
    assert first_sound_after(samples, origin, origin, RATE, threshold_dbfs=-10.0) is None
    # A sound too close to the end to last min_run_s is not one yet.
    tail = np.zeros(1000, np.float32)
    _tone(tail, 800, 1000)
    assert first_sound_after(tail, 0, 0, RATE, min_run_s=0.01) is None


def test_silent_after_finds_where_a_lasting_silence_begins() -> None:
    samples = np.zeros(2 * RATE, np.float32)
    _tone(samples, 1000, 5000)
    _tone(samples, 8000, 20000)
    hold = round(0.1 * RATE)
    # The first tone's last sample above -50 dBFS, then the gap (3000 frames) is too short.
    last_loud = int(np.flatnonzero(np.abs(samples[:8000]) >= 10 ** (-50 / 20))[-1])
    assert silent_after(samples, 0, 1000, RATE, hold_s=0.05) == last_loud + 1
    after_second = int(np.flatnonzero(np.abs(samples) >= 10 ** (-50 / 20))[-1]) + 1
    assert silent_after(samples, 0, 1000, RATE, hold_s=0.1) == after_second
    assert silent_after(np.zeros(RATE, np.float32), 7, 0, RATE) == 7, "quiet from the start"
    # Quiet, but not yet for hold_s: unknown.
    assert silent_after(samples[: after_second + hold - 1], 0, 1000, RATE) is None
    assert silent_after(samples[: after_second + hold], 0, 1000, RATE) == after_second
