"""Dictate in the conversation view, from the test input source: a JACK dummy server whose
client plays a spoken clip into the capture port of the studio's input stream, in real time,
as a microphone would (the same path as ``tests/runtime/audio/test_input_jack.py``). The
input is chosen in the Devices panel; its level meter moves while the clip plays; the second
click stops the recording, the transcription pipeline loaded beside the chat (on the same
ledger) transcribes it, and the text lands in the message box, unsent.

libjack maps JACK's registry once per process: this is the studio's only in-process JACK test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import soxr
from PySide6.QtCore import Qt

from runtime.audio import rescan_output_devices
from tests.app.support import open_pipeline, wait_topology
from tests.app.transcribe_support import api_transcript, recogniser_data, speech, write_wav
from tests.runtime.audio.conftest import JackServer, jack_server  # noqa: F401 - the fixture
from tests.runtime.audio.jack_capture_child import FilePlayer

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.audio

#: What the test source plays: two sentences, about five seconds.
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
)
LEAD_S = 0.5
PIPELINES = Path(__file__).resolve().parents[2] / "assets" / "pipelines"


@pytest.fixture
def jack_input(
    jack_server: JackServer,  # noqa: F811 - the fixture imported above
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[JackServer]:
    """PortAudio restarted against the test's JACK server, and the recogniser's data."""
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(recogniser_data(tmp_path_factory)))
    for name, value in jack_server.environment.items():
        monkeypatch.setenv(name, value)
    rescan_output_devices()
    yield jack_server
    # PortAudio lets go of the server's client before the server stops.
    monkeypatch.undo()
    rescan_output_devices()


def test_dictate_puts_the_clips_transcript_in_the_message_box(
    jack_input: JackServer,
    make_window: Callable[..., Any],
    qtbot: Any,
    demo_root: Path,
    tmp_path: Path,
) -> None:
    clip = speech(SENTENCES)
    _segments, reference = api_transcript(write_wav(tmp_path / "clip.wav", clip))
    assert reference.strip()
    window = make_window()
    wait_topology(qtbot, window)
    info = open_pipeline(qtbot, window, demo_root / "pipelines" / "chat.yaml")
    assert info.chat
    chat = window.chat
    assert chat.dictate_button.isVisibleTo(window)

    # The input chosen in the Devices panel: JACK's capture device.
    box = window.devices_panel.audio_input
    box.refresh_button.click()
    index = box.device_box.findData("system")
    assert index > 0, [box.device_box.itemText(i) for i in range(box.device_box.count())]
    box.device_box.setCurrentIndex(index)
    assert window.settings.input_device == "system"

    sent: list[object] = []
    chat.submit_requested.connect(sent.append)
    recorder = window.transcribe.recorder
    # Test shows the input's level without recording; Dictate then takes the input over.
    with qtbot.waitSignal(recorder.level, timeout=10_000):
        box.test_button.click()
    assert recorder.running
    assert not recorder.keeping
    assert box.meter.updates > 0
    with qtbot.waitSignal(
        recorder.running_changed, timeout=10_000, check_params_cb=lambda on: on and recorder.keeping
    ):
        qtbot.mouseClick(chat.dictate_button, Qt.MouseButton.LeftButton)
    assert not box.test_button.isChecked()
    with qtbot.waitSignal(recorder.level, timeout=10_000):
        pass
    assert chat.dictate_button.isChecked()
    assert chat.dictate_meter.isVisibleTo(window)
    player = FilePlayer(soxr.resample(clip, 16000, jack_input.rate).astype(np.float32))
    try:
        assert player.connect_to_inputs(), "the studio's input stream has a port"
        player.play()
        wanted_s = LEAD_S + clip.size / 16000
        heard: list[float] = []
        recorder.level.connect(lambda level: heard.append(level.rms_dbfs))
        with qtbot.waitSignal(
            recorder.level,
            timeout=int(wanted_s * 1000) + 20_000,
            check_params_cb=lambda level: level.recorded_s >= wanted_s + 0.5,
        ):
            pass
        # The meters moved with the clip: the chat's and the Devices panel's.
        assert max(heard) > -40.0
        assert chat.dictate_meter.updates > 10
        assert box.meter.updates > 10
        transcriber_ready = qtbot.waitSignal(chat.composer.textChanged, timeout=300_000)
        with transcriber_ready:
            qtbot.mouseClick(chat.dictate_button, Qt.MouseButton.LeftButton)
            assert chat.dictate_button.text() in ("Transcribing…", "Stop dictating")
    finally:
        player.close()
    assert chat.composer.toPlainText() == reference.strip()
    assert chat.dictate_button.text() == "Dictate"
    assert chat.dictate_button.isEnabled()
    assert sent == [], "dictation fills the message box; it never sends"
    assert len(chat.conversation.turns) == 0
    # The transcription pipeline is loaded beside the chat, on the studio's one ledger.
    owners = {row.owner for row in window.bridge.ledger_snapshot().reservations}
    assert any("transcribe" in owner for owner in owners), owners


def test_dictated_text_goes_to_the_end_of_the_message_unsent(
    make_window: Callable[..., Any], qtbot: Any
) -> None:
    chat = make_window().chat
    sent: list[object] = []
    chat.submit_requested.connect(sent.append)
    chat.composer.setPlainText("Summarise this:")
    chat.insert_dictation("  The quick brown fox. ")
    chat.insert_dictation("")
    chat.insert_dictation("It jumps.")
    assert chat.composer.toPlainText() == "Summarise this: The quick brown fox. It jumps."
    assert chat.composer.textCursor().position() == len(chat.composer.toPlainText())
    assert sent == []
    chat.set_dictating("recording")
    assert chat.dictate_button.isChecked()
    assert chat.dictate_button.text() == "Stop dictating"
    chat.set_dictating("transcribing")
    assert not chat.dictate_button.isEnabled()
    chat.set_dictating("idle")
    assert chat.dictate_button.text() == "Dictate"
    assert not chat.dictate_button.isChecked()


def test_an_input_that_is_not_there_is_named_and_dictation_returns_to_idle(
    make_window: Callable[..., Any], qtbot: Any
) -> None:
    window = make_window()
    window.settings.input_device = "no such microphone"
    recorder = window.transcribe.recorder
    with qtbot.waitSignal(recorder.stopped, timeout=30_000) as stopped:
        qtbot.mouseClick(window.chat.dictate_button, Qt.MouseButton.LeftButton)
    assert stopped.args[0].error is not None
    assert stopped.args[0].samples.size == 0
    assert window.banner.title.text() == "The audio input could not be used"
    assert "no such microphone" in window.banner.message.text()
    assert window.chat.dictate_button.text() == "Dictate"
    assert not window.chat.dictate_button.isChecked()
    assert not recorder.running


def test_a_dictation_the_pipeline_cannot_load_for_gets_the_reason_and_leaves_nothing(
    make_window: Callable[..., Any], qtbot: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transcription pipeline names a bundle that is not there: the transcriber's load
    fails with the runtime's message (naming the file) and nothing stays reserved."""
    broken = tmp_path / "transcribe.yaml"
    original = PIPELINES / "transcribe.yaml"
    broken.write_text(
        original.read_text(encoding="utf-8").replace(
            "${data}/recognisers/whisper-tiny.en/encoder", str(tmp_path / "nowhere")
        ),
        encoding="utf-8",
    )
    window = make_window()
    wait_topology(qtbot, window)
    hook = window.transcribe
    monkeypatch.setattr(hook, "pipeline_path", lambda: broken)
    hook._set_dictation("transcribing")
    transcriber = hook._ensure_transcriber()
    with qtbot.waitSignal(transcriber.transcribed, timeout=120_000) as done:
        assert transcriber.transcribe(np.zeros(16000, np.float32), 16000)
    assert done.args[0].error is not None
    assert str(broken) in done.args[0].error
    assert f"{tmp_path / 'nowhere'}/manifest.json" in done.args[0].error
    assert "does not exist" in done.args[0].error
    assert window.banner.title.text() == "The dictation was not transcribed"
    assert window.chat.dictate_button.text() == "Dictate"
    assert window.chat.composer.toPlainText() == ""
    assert window.bridge.ledger_snapshot().is_empty
