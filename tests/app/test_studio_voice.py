"""The conversation view's microphone without a language model: the voice-chat pipeline opens
the view with the microphone's controls (another chat pipeline offers to open it); without an
input device the studio says why and starts or loads nothing; a conversation's events become
the view's turns (the words being heard as the pending message, the reply streaming in, an
interrupted reply marked) and its turns' latency rows the Metrics panel's; push to talk feeds
silence while the button is up.

The conversation itself, spoken in a JACK room and answered by the real vLLM worker, is
``test_studio_voice_chat.py``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from PySide6.QtCore import Qt

from app.bridge_voice import MutableDuplexAudio, VoiceStart, VoiceTalk
from app.models import RunState
from app.voice_presenters import VoiceTurns
from runtime.audio import AudioDeviceError, open_stream_count
from runtime.audio.duplex import CapturedBlock, DuplexAudio
from runtime.conversation import ConversationEvent
from tests.app.support import open_pipeline, wait_topology
from tests.app.voice_support import voice_chat_data
from tests.runtime.audio.conftest import no_audio_devices  # noqa: F401 - the fixture

if TYPE_CHECKING:
    from collections.abc import Callable

    from app.window import MainWindow


@pytest.fixture
def voice_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The voice-chat pipeline's bundles (no language model: its plan is refused, so nothing
    loads in the background)."""
    data = voice_chat_data(tmp_path / "voice-data", tmp_path_factory)
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(data))
    return data


def open_voice_chat(qtbot: Any, make_window: Callable[..., Any], demo_root: Path) -> MainWindow:
    window: MainWindow = make_window()
    wait_topology(qtbot, window)
    info = open_pipeline(qtbot, window, demo_root / "pipelines" / "voice-chat.yaml")
    assert info.voice
    assert not info.chat
    return window


@pytest.mark.model  # the voice-chat pipeline's bundles (exported once)
def test_the_voice_chat_pipeline_shows_the_microphone_and_a_chat_offers_to_open_it(
    voice_data: Path, make_window: Callable[..., Any], qtbot: Any, demo_root: Path
) -> None:
    window = make_window()
    wait_topology(qtbot, window)
    chat = window.chat
    controls = chat.voice
    info = open_pipeline(qtbot, window, demo_root / "pipelines" / "chat.yaml")
    assert info.chat
    assert not info.voice
    # A chat: the message box, and an offer to open the voice-chat pipeline.
    assert chat.composer.isVisibleTo(window)
    assert controls.offer_button.isVisibleTo(window)
    assert not controls.talk_button.isVisibleTo(window)
    assert "voice-chat.yaml" in controls.offer_button.toolTip()
    with qtbot.waitSignal(window.bridge.pipeline_opened, timeout=30_000) as opened:
        qtbot.mouseClick(controls.offer_button, Qt.MouseButton.LeftButton)
    assert opened.args[0].voice
    assert opened.args[0].path.name == "voice-chat.yaml"
    # The spoken conversation's view: the microphone in place of the message box.
    assert chat.isVisibleTo(window)
    assert not window.output.isVisibleTo(window)
    assert not window.transcribe.view.isVisibleTo(window)
    for widget in (chat.composer, chat.send_button, chat.dictate_button, chat.system_prompt):
        assert not widget.isVisibleTo(window)
    for widget in (controls.talk_button, controls.mode_box, controls.state, controls.meter):
        assert widget.isVisibleTo(window)
    assert not controls.offer_button.isVisibleTo(window)
    assert not controls.end_button.isVisibleTo(window)
    assert controls.talk_button.text() == "Talk"
    assert controls.state.text() == "not talking"
    assert "Press Talk" in chat.transcript.toPlainText()
    assert not window.run_pane.run_button.isVisibleTo(window)
    assert not window.run_pane.audio_row.isVisibleTo(window)
    # Push to talk: the button is held, and End shows once a conversation runs.
    controls.mode_box.setCurrentIndex(1)
    assert controls.push_to_talk
    assert controls.talk_button.text() == "Hold to talk"
    assert not controls.talk_button.isCheckable()
    controls.set_running(True)
    assert controls.end_button.isVisibleTo(window)
    assert not controls.mode_box.isEnabled()
    controls.set_running(False)
    # The voice activity bundle was made on first use, into the user data folder.
    assert (voice_data / "vad" / "silero" / "manifest.json").is_file()


@pytest.mark.model  # the voice-chat pipeline's bundles (exported once)
def test_without_an_input_device_the_studio_says_why_and_starts_nothing(
    no_audio_devices: None,  # noqa: F811 - the fixture imported above
    voice_data: Path,
    make_window: Callable[..., Any],
    qtbot: Any,
    demo_root: Path,
) -> None:
    window = open_voice_chat(qtbot, make_window, demo_root)
    state = window.bridge.state
    assert state is RunState.READY
    assert not window.bridge.loading
    controls = window.chat.voice
    qtbot.mouseClick(controls.talk_button, Qt.MouseButton.LeftButton)
    assert window.banner.isVisibleTo(window)
    assert "microphone" in window.banner.title.text()
    assert "no audio input device" in window.banner.message.text()
    assert window.bridge.state is state
    assert not window.bridge.loading
    assert window.voice.phase == "idle"
    assert not window.bridge.voice.running
    assert not controls.talk_button.isChecked()
    assert controls.talk_button.text() == "Talk"
    assert window.bridge.ledger_snapshot().is_empty
    # Push to talk too.
    window.banner.dismiss()
    controls.mode_box.setCurrentIndex(1)
    qtbot.mousePress(controls.talk_button, Qt.MouseButton.LeftButton)
    qtbot.mouseRelease(controls.talk_button, Qt.MouseButton.LeftButton)
    assert window.banner.isVisibleTo(window)
    assert window.voice.phase == "idle"
    assert open_stream_count() == 0


def test_a_start_that_cannot_open_the_device_leaves_nothing_open(
    no_audio_devices: None,  # noqa: F811 - the fixture imported above
    qtbot: Any,
) -> None:
    """The bridge's start (on its control thread) raises the device's error with the stream
    closed and no request submitted."""
    submitted: list[object] = []
    session = type(
        "Session",
        (),
        {
            "kind": "voice-chat",
            "name": "voice-chat",
            "options": type("Options", (), {"sample_rate": 22050})(),
            "submit": lambda self, *args, **kwargs: submitted.append(args),
        },
    )()
    talk = VoiceTalk(post=lambda callback: callback(), submit=lambda job: job())
    before = threading.active_count()
    with pytest.raises(AudioDeviceError, match="no audio input device"):
        talk.start_job(session, VoiceStart(echo="off"))  # type: ignore[arg-type]
    assert submitted == []
    assert not talk.running
    assert open_stream_count() == 0
    assert threading.active_count() == before


def _block(near: np.ndarray) -> CapturedBlock:
    far = np.full_like(near, 0.25)
    return CapturedBlock(near, far, 16000, 0, 0.0, 0.0, 0, 0.0, 0.0, -10.0, -6.0, 0, False)


def test_push_to_talk_feeds_silence_while_the_button_is_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    voice = np.linspace(-0.5, 0.5, 512, dtype=np.float32)
    monkeypatch.setattr(DuplexAudio, "read", lambda self, timeout=None: _block(voice))
    muted = threading.Event()
    audio = MutableDuplexAudio(muted, None)
    heard = audio.read(0.1)
    assert heard is not None
    assert np.array_equal(heard.near, voice)
    muted.set()
    silent = audio.read(0.1)
    assert silent is not None
    assert not silent.near.any()
    assert silent.near.shape == voice.shape
    # The rest of the block (the played reference, the timing) is as captured.
    assert np.array_equal(silent.far, np.full_like(voice, 0.25))
    assert silent.position == heard.position
    muted.clear()
    again = audio.read(0.1)
    assert again is not None
    assert np.array_equal(again.near, voice)
    audio.close()


def _event(name: str, turn: int, text: str | None = None, **values: float) -> ConversationEvent:
    return ConversationEvent(name, turn, None, text, values)


@pytest.mark.model  # the voice-chat pipeline's bundles (exported once)
def test_the_conversations_events_fill_the_view_and_its_latency_the_metrics_panel(
    voice_data: Path, make_window: Callable[..., Any], qtbot: Any, demo_root: Path
) -> None:
    window = open_voice_chat(qtbot, make_window, demo_root)
    chat = window.chat
    talk = window.bridge.voice
    hook = window.voice
    hook.turns = VoiceTurns(chat.conversation)

    def shown() -> str:
        chat.redraw()
        return chat.transcript.toPlainText()

    talk.conversation_event.emit(_event("speech_started", 1))
    talk.state_changed.emit("listening")
    assert chat.voice.state.text() == "listening"
    talk.conversation_event.emit(_event("transcript_partial", 1, "What is the capital"))
    assert "What is the capital …" in shown()
    assert "hearing" in shown()
    talk.conversation_event.emit(_event("turn_ended", 1))
    talk.state_changed.emit("thinking")
    assert chat.voice.state.text() == "thinking"
    talk.conversation_event.emit(_event("transcript", 1, "What is the capital of France?"))
    talk.conversation_event.emit(_event("reply_text", 1, "The capital"))
    assert "hearing" not in shown()
    assert "What is the capital of France?" in shown()
    assert "The capital ▍" in shown()
    talk.state_changed.emit("speaking")
    assert "speaking" in shown()
    talk.conversation_event.emit(_event("reply_done", 1, "The capital is Paris.", samples=9))
    text = shown()
    assert "The capital is Paris." in text
    assert "▍" not in text
    # Each turn is saved as a typed chat's is.
    saved = chat.store.load(chat.conversation.id)
    assert [(t.role, t.content) for t in saved.turns] == [
        ("user", "What is the capital of France?"),
        ("assistant", "The capital is Paris."),
    ]
    assert saved.pipeline == "voice-chat"
    # A reply the user spoke over is marked and kept as heard.
    for item in (
        _event("speech_started", 2),
        _event("transcript", 2, "Tell me a story."),
        _event("reply_text", 2, "Once upon a time there was a dragon"),
        _event("barge_in", 2),
        _event("interrupted", 2, played_samples=50, samples=100),
    ):
        talk.conversation_event.emit(item)
    assert "Assistant · interrupted" in shown()
    assert chat.store.load(chat.conversation.id).turns[-1].content == "Once upon a time"
    # The Metrics panel lists each turn's wait.
    panel = window.metrics_panel
    assert not panel.turns.isVisibleTo(window)
    talk.timings_changed.emit(
        (
            {"turn": 1, "end_of_turn_s": 0.45, "transcription_s": 0.5, "first_clause_s": 0.6,
             "first_audio_s": 0.7, "player_lead_s": 0.05, "output_latency_s": 0.02,
             "interrupted": False},
            {"turn": 2, "player_lead_s": 0.04, "output_latency_s": 0.02, "interrupted": True},
        )
    )  # fmt: skip
    window.show_panel("metrics")
    assert panel.turns.isVisibleTo(window)
    cells = [
        [panel.turns.item(row, column).text() for column in range(panel.turns.columnCount())]
        for row in range(panel.turns.rowCount())
    ]
    assert cells == [
        ["1", "450.0 ms", "500.0 ms", "600.0 ms", "700.0 ms", "50.0 ms", "750.0 ms"],
        ["2 (interrupted)", "…", "…", "…", "…", "40.0 ms", "…"],
    ]
