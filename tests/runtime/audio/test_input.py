"""Audio input on ALSA null devices (delivered as fast as it is asked for; what they hold is
undefined, silence or stale memory): devices by name or index, 16 kHz mono chunks, the bounded
queue, a clean close, and every refusal. What arrives, and when, is checked on JACK
(``test_input_jack.py``)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from runtime.audio import (
    AudioDeviceError,
    AudioInput,
    UnknownAudioDevice,
    level_dbfs,
    list_input_devices,
    open_stream_count,
    rescan_output_devices,
    resolve_input_device,
)
from runtime.audio.input import SILENCE_DBFS
from runtime.errors import EXIT_FAILED, EXIT_USAGE, UsageError


def test_the_null_inputs_are_listed_and_resolved(alsa_null: Path) -> None:
    devices = {device.name: device for device in list_input_devices()}
    assert {"default", "omni_speaker_left"} <= set(devices)
    default = devices["default"]
    assert default.is_default
    assert default.max_input_channels >= 1
    assert "ch in" in default.describe()
    assert resolve_input_device(None).name == "default"
    left = devices["omni_speaker_left"]
    assert resolve_input_device(left.index) == left
    assert resolve_input_device(str(left.index)) == left
    assert resolve_input_device("OMNI_SPEAKER_LEFT") == left


def test_an_unknown_input_names_it_and_what_is_available(alsa_null: Path) -> None:
    source = AudioInput("studio microphone")
    with pytest.raises(UnknownAudioDevice, match="no audio input device matches") as error:
        source.start()
    message = str(error.value)
    assert "'studio microphone'" in message
    for device in list_input_devices():
        assert device.describe() in message
    assert error.value.exit_code == EXIT_USAGE
    source.close()
    with pytest.raises(UnknownAudioDevice, match="input device index 999 does not exist"):
        resolve_input_device(999)
    with pytest.raises(UnknownAudioDevice, match="ambiguous"):
        resolve_input_device("omni_speaker")


def test_no_input_device_at_all_is_said(no_audio_devices: None) -> None:
    assert list_input_devices() == []
    source = AudioInput()
    with pytest.raises(AudioDeviceError, match="no audio input device was found") as error:
        source.start()
    assert error.value.exit_code == EXIT_FAILED
    source.close()


def test_chunks_are_16_khz_mono_and_the_meter_reads_them(
    alsa_null: Path, thread_baseline: None
) -> None:
    with AudioInput("default") as source:
        assert source.sample_rate == 16000
        received = 0
        while received < 16000:
            chunk = source.read(timeout=2.0)
            assert chunk is not None
            assert chunk.dtype == np.float32
            assert chunk.ndim == 1
            # Whatever the device held, the samples are finite and (but for the resampler's
            # ringing) within full scale.
            assert np.isfinite(chunk).all()
            assert np.abs(chunk).max(initial=0.0) < 2.0
            received += chunk.size
        level = source.level()
        assert SILENCE_DBFS <= level.rms_dbfs <= level.peak_dbfs <= 0.0
        assert 0.05 <= level.window_s < 0.2
        metrics = source.metrics()
        assert metrics.host_api == "ALSA"
        assert metrics.device_rate == source.device.default_sample_rate  # type: ignore[union-attr]
        assert metrics.samples_delivered >= received
        assert open_stream_count() == 1
    assert open_stream_count() == 0
    assert source.closed


def test_the_queue_is_bounded_and_drops_what_the_reader_did_not_take(alsa_null: Path) -> None:
    with AudioInput("default", queue_s=0.1) as source:
        # The null device is not paced: unread, it fills the queue at once.
        deadline = time.monotonic() + 5.0
        while source.metrics().blocks_dropped == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        metrics = source.metrics()
        capacity = max(4, int(np.ceil(0.1 * metrics.device_rate / metrics.block_frames)))
        assert metrics.blocks_dropped > 0
        assert metrics.queued_blocks <= capacity


def test_close_ends_a_waiting_reader_and_leaves_nothing(
    alsa_null: Path, thread_baseline: None
) -> None:
    source = AudioInput("default", queue_s=0.1)
    source.start()
    seen: list[int] = []

    def consume() -> None:
        for chunk in source:
            seen.append(chunk.size)

    reader = threading.Thread(target=consume, name="input reader")
    reader.start()
    time.sleep(0.2)
    started = time.monotonic()
    source.close()
    reader.join(2.0)
    assert not reader.is_alive(), "the reader must see the end once the input closed"
    assert time.monotonic() - started < 1.5
    assert seen
    assert source.read(timeout=0.1) is None
    source.close()
    assert open_stream_count() == 0


def test_rescan_is_refused_while_an_input_is_open(alsa_null: Path) -> None:
    with AudioInput("default"):
        with pytest.raises(AudioDeviceError, match="while 1"):
            rescan_output_devices()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sample_rate": 0}, "sample_rate must be a positive int"),
        ({"device_rate": 44100.0}, "device_rate must be a positive int"),
        ({"channels": 0}, "channels must be a positive int"),
        ({"block_frames": 8}, "block_frames must be an int from 16"),
        ({"queue_s": 0}, "queue_s must be a positive number"),
        ({"latency": "lowest"}, "latency must be 'low', 'high' or seconds"),
    ],
)
def test_bad_options_are_refused(options: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        AudioInput(**options)  # type: ignore[arg-type]


def test_use_before_start_and_after_close_is_refused(alsa_null: Path) -> None:
    source = AudioInput("default")
    with pytest.raises(UsageError, match="not started"):
        source.read()
    with pytest.raises(UsageError, match="not started"):
        source.level()
    source.close()
    with pytest.raises(UsageError, match="was closed"):
        source.start()


def test_too_many_channels_names_the_device(alsa_null: Path) -> None:
    source = AudioInput("default", channels=1000)
    with pytest.raises(UsageError, match=r"default .* input channel\(s\); 1000 were requested"):
        source.start()
    source.close()


def test_level_dbfs() -> None:
    assert level_dbfs(1.0) == 0.0
    assert level_dbfs(0.5) == pytest.approx(-6.0206)
    assert level_dbfs(0.0) == SILENCE_DBFS
    assert level_dbfs(1e-9) == SILENCE_DBFS


def test_the_devices_command_lists_audio_inputs_and_outputs(
    alsa_null: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from runtime.cli import main

    assert main(["devices", "--audio"]) == 0
    text = capsys.readouterr().out
    inputs, outputs = text.split("audio inputs:\n")[1].split("audio outputs:\n")
    for device in list_input_devices():
        assert f"  {device.describe()}" in inputs
    assert "ch in" in inputs
    assert "omni_speaker_left" in outputs
    assert main(["devices", "--audio", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    names = {device["name"] for device in document["audio"]["inputs"]}
    assert {"default", "omni_speaker_left"} <= names
    assert all(device["max_input_channels"] >= 1 for device in document["audio"]["inputs"])
    assert any(device["is_default"] for device in document["audio"]["outputs"])
    assert main(["devices", "--json"]) == 0
    assert "audio" not in json.loads(capsys.readouterr().out), "listed only when asked for"
