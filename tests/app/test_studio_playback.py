"""Playback controls on a working (ALSA null) output through the runtime's AudioPlayer."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.models import ReceivedAudio
from app.playback import AudioOutput
from app.widgets.output import OutputArea
from runtime.audio import open_stream_count, rescan_output_devices

RATE = 22050
NULL_ASOUNDRC = 'pcm.!default { type null }\npcm.studio_null { type null hint { show on description "Studio null" } }\n'

pytestmark = pytest.mark.audio


@pytest.fixture
def alsa_null(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """ALSA's default PCM is a null device: a working output that is not paced in time."""
    config = tmp_path / "xdg"
    (config / "alsa").mkdir(parents=True)
    (config / "alsa" / "asoundrc").write_text(NULL_ASOUNDRC)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("JACK_DEFAULT_SERVER", f"omni-absent-{os.getpid()}")
    rescan_output_devices()
    yield
    assert open_stream_count() == 0, "the studio left a playback stream open"
    monkeypatch.undo()
    rescan_output_devices()


def _tone(seconds: float) -> np.ndarray:
    t = np.arange(round(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * 330.0 * t)).astype(np.float32)


def test_audio_plays_as_it_arrives_and_stops_cleanly(alsa_null: None, qtbot: Any) -> None:
    output = AudioOutput()
    area = OutputArea(output)
    qtbot.addWidget(area)
    playback = area.playback
    area.show_streams(True)  # a streaming pipeline lists the output devices
    assert playback.available
    assert any(
        "default" in playback.device_box.itemText(i) for i in range(playback.device_box.count())
    )
    playback.auto_play.setChecked(True)
    area.new_run()
    for index in range(3):
        area.add_audio(ReceivedAudio("r", index, index, _tone(0.2), RATE, 0.1 * index))
    assert output.state in ("playing", "finished")
    area.finished("completed", "")
    # A null device drains at once; the controls notice the end and close the stream.
    qtbot.waitUntil(lambda: output.state == "stopped", timeout=10_000)
    assert not playback.pause_button.isEnabled()
    assert playback.play_button.isEnabled()
    assert output.buffered_s == pytest.approx(0.6)
    assert open_stream_count() == 0

    playback.play()  # again, from the beginning
    qtbot.waitUntil(lambda: output.state == "stopped", timeout=10_000)
    playback.play()
    playback.stop()
    assert output.state == "stopped"
    assert open_stream_count() == 0
    output.close()
