"""Output devices by name or index, and clear errors when there is none."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.audio import (
    AudioDeviceError,
    AudioPlayer,
    UnknownAudioDevice,
    list_output_devices,
    rescan_output_devices,
    resolve_output_device,
)
from runtime.errors import EXIT_FAILED, EXIT_USAGE


def test_the_null_devices_are_listed(alsa_null: Path) -> None:
    devices = {device.name: device for device in list_output_devices()}
    assert {"default", "omni_speaker_left", "omni_speaker_right"} <= set(devices)
    default = devices["default"]
    assert default.is_default
    assert default.host_api == "ALSA"
    assert default.max_output_channels >= 1
    assert default.default_sample_rate > 0
    assert str(default.index) in default.describe()
    assert "default" in default.describe()


def test_resolve_by_default_index_exact_name_and_substring(alsa_null: Path) -> None:
    devices = {device.name: device for device in list_output_devices()}
    left = devices["omni_speaker_left"]
    assert resolve_output_device(None).name == "default"
    assert resolve_output_device("").name == "default"
    assert resolve_output_device(left.index) == left
    assert resolve_output_device(f" {left.index} ") == left
    assert resolve_output_device("OMNI_SPEAKER_LEFT") == left
    assert resolve_output_device("right").name == "omni_speaker_right"


def test_an_unknown_name_lists_what_is_available(alsa_null: Path) -> None:
    with pytest.raises(UnknownAudioDevice, match="no audio output device matches 'hdmi'") as error:
        resolve_output_device("hdmi")
    assert "omni_speaker_left" in str(error.value)
    assert "default" in str(error.value)
    assert error.value.exit_code == EXIT_USAGE


def test_an_ambiguous_name_lists_the_matches(alsa_null: Path) -> None:
    with pytest.raises(UnknownAudioDevice, match="ambiguous") as error:
        resolve_output_device("omni_speaker")
    assert "omni_speaker_left" in str(error.value)
    assert "omni_speaker_right" in str(error.value)


@pytest.mark.parametrize("spec", [999, "999", True])
def test_a_bad_index_is_refused(alsa_null: Path, spec: object) -> None:
    with pytest.raises(UnknownAudioDevice, match=r"999 does not exist|name or an index"):
        resolve_output_device(spec)  # type: ignore[arg-type]


def test_no_device_at_all_says_how_to_get_one(no_audio_devices: None) -> None:
    assert list_output_devices() == []
    with pytest.raises(AudioDeviceError, match="no audio output device was found") as error:
        resolve_output_device(None)
    assert "asoundrc" in str(error.value)
    assert "type null" in str(error.value)
    assert error.value.exit_code == EXIT_FAILED
    player = AudioPlayer(sample_rate_in=22050)
    with pytest.raises(AudioDeviceError, match="no audio output device was found"):
        player.start()
    player.stop()


def test_rescan_is_refused_while_a_stream_is_open(alsa_null: Path) -> None:
    player = AudioPlayer(sample_rate_in=22050)
    player.start()
    try:
        with pytest.raises(AudioDeviceError, match="while 1 playback stream"):
            rescan_output_devices()
    finally:
        player.stop()
    assert rescan_output_devices()
