"""OpenAI Realtime's client events parsed into values, the session's settings and the server
events built for them, without a server: each refusal names its field, and what the server
sends validates against the official ``openai`` package's event types."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest
from openai.types.realtime import (
    RealtimeErrorEvent,
    ResponseDoneEvent,
    SessionCreatedEvent,
)

from runtime.adapters.turns import TurnSettings
from runtime.serve.realtime_events import (
    InputAudioAppend,
    InputAudioClear,
    InputAudioCommit,
    ItemCreate,
    RealtimeEventError,
    RealtimeSettings,
    ResponseCancel,
    ResponseCreate,
    ServerVad,
    SessionUpdate,
    error_event,
    parse_client_event,
    server_event,
)


def parse(document: Any) -> Any:
    return parse_client_event(json.dumps(document))


def refused(document: Any) -> RealtimeEventError:
    with pytest.raises(RealtimeEventError) as caught:
        parse_client_event(document if isinstance(document, str) else json.dumps(document))
    return caught.value


def settings() -> RealtimeSettings:
    return RealtimeSettings(
        model="voice-chat",
        instructions="Be brief.",
        voice="joe",
        voices=("joe",),
        server_vad=True,
        turns=TurnSettings(end_of_turn_s=0.45, pre_roll_s=0.3),
    )


def test_session_update_reads_the_supported_fields() -> None:
    update = parse(
        {
            "type": "session.update",
            "event_id": "evt_1",
            "session": {
                "type": "realtime",
                "instructions": "Answer in French.",
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcm", "rate": 24000},
                        "transcription": {"model": "whisper-1"},
                        "turn_detection": {
                            "type": "server_vad",
                            "threshold": 0.6,
                            "silence_duration_ms": 700,
                            "prefix_padding_ms": 200,
                        },
                    },
                    "output": {"format": {"type": "audio/pcm"}, "voice": "joe"},
                },
            },
        }
    )
    assert update == SessionUpdate(
        "evt_1",
        instructions="Answer in French.",
        voice="joe",
        turn_detection_given=True,
        turn_detection=ServerVad(0.6, 700, 200),
        transcription_given=True,
        transcription="whisper-1",
    )
    changed = settings().updated(update)
    assert changed.turns.threshold == 0.6
    assert changed.turns.end_of_turn_s == 0.7
    assert changed.turns.pre_roll_s == 0.2
    assert changed.instructions == "Answer in French."
    assert changed.transcription == "whisper-1"
    session = SessionCreatedEvent.model_validate(
        server_event("session.created", session=changed.session("sess_1"))
    ).session
    assert session.audio is not None
    assert session.audio.input is not None
    detection = session.audio.input.turn_detection
    assert detection is not None
    assert detection.type == "server_vad"
    assert detection.silence_duration_ms == 700
    assert detection.threshold == 0.6


def test_turn_detection_null_turns_server_vad_off_and_back_on() -> None:
    off = settings().updated(
        parse(
            {
                "type": "session.update",
                "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}},
            }
        )
    )
    assert not off.server_vad
    assert off.session("s")["audio"]["input"]["turn_detection"] is None
    on = off.updated(
        parse(
            {
                "type": "session.update",
                "session": {"audio": {"input": {"turn_detection": {"type": "server_vad"}}}},
            }
        )
    )
    assert on.server_vad
    assert on.turns == off.turns


@pytest.mark.parametrize(
    ("session", "param"),
    [
        ({"instructions": 5}, "session.instructions"),
        ({"type": "transcription"}, "session.type"),
        ({"voices": "joe"}, "session.voices"),
        ({"output_modalities": ["text"]}, "session.output_modalities"),
        ({"tools": [{"type": "function", "name": "f"}]}, "session.tools"),
        ({"audio": []}, "session.audio"),
        ({"audio": {"input": {"format": {"type": "audio/pcmu"}}}}, "session.audio.input.format"),
        (
            {"audio": {"output": {"format": {"type": "audio/pcm", "rate": 16000}}}},
            "session.audio.output.format",
        ),
        ({"audio": {"output": {"speed": 1.5}}}, "session.audio.output.speed"),
        (
            {"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}},
            "session.audio.input.turn_detection.type",
        ),
        (
            {"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 2}}}},
            "session.audio.input.turn_detection.threshold",
        ),
        (
            {"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": "x"}}}},
            "session.audio.input.turn_detection.threshold",
        ),
        (
            {
                "audio": {
                    "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 1.5}}
                }
            },
            "session.audio.input.turn_detection.silence_duration_ms",
        ),
        (
            {
                "audio": {
                    "input": {"turn_detection": {"type": "server_vad", "create_response": False}}
                }
            },
            "session.audio.input.turn_detection.create_response",
        ),
        (
            {"audio": {"input": {"transcription": {"model": "x", "language": "de"}}}},
            "session.audio.input.transcription.language",
        ),
        (
            {"audio": {"input": {"noise_reduction": {"type": "near_field"}}}},
            "session.audio.input.noise_reduction",
        ),
    ],
)
def test_session_update_refusals_name_the_field(session: dict[str, Any], param: str) -> None:
    error = refused({"type": "session.update", "event_id": "evt_9", "session": session})
    assert error.param == param
    assert error.event_id == "evt_9"
    assert param.rsplit(".", 1)[-1] in error.message


def test_settings_refuse_a_voice_and_a_silence_the_turns_cannot_use() -> None:
    voice = parse({"type": "session.update", "session": {"audio": {"output": {"voice": "alloy"}}}})
    with pytest.raises(RealtimeEventError) as caught:
        settings().updated(voice)
    assert caught.value.param == "session.audio.output.voice"
    assert "joe" in caught.value.message
    short = parse(
        {
            "type": "session.update",
            "session": {
                "audio": {
                    "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 10}}
                }
            },
        }
    )
    with pytest.raises(RealtimeEventError) as caught:
        settings().updated(short)
    assert caught.value.param == "session.audio.input.turn_detection.silence_duration_ms"


def test_append_decodes_pcm16_and_refuses_odd_or_invalid_audio() -> None:
    samples = np.array([0, 16384, -32768, 32767], "<i2")
    event = parse(
        {"type": "input_audio_buffer.append", "audio": base64.b64encode(samples.tobytes()).decode()}
    )
    assert isinstance(event, InputAudioAppend)
    assert event.pcm.dtype == np.float32
    np.testing.assert_allclose(event.pcm, [0.0, 0.5, -1.0, 32767 / 32768])
    odd = refused(
        {
            "type": "input_audio_buffer.append",
            "event_id": "e",
            "audio": base64.b64encode(b"abc").decode(),
        }
    )
    assert (odd.param, odd.event_id) == ("audio", "e")
    assert "odd" in odd.message
    invalid = refused({"type": "input_audio_buffer.append", "audio": "not base64!"})
    assert invalid.param == "audio"
    assert "base64" in invalid.message
    typed = refused({"type": "input_audio_buffer.append", "audio": 12})
    assert typed.param == "audio"
    assert typed.code == "invalid_type"


def test_the_other_client_events() -> None:
    assert parse({"type": "input_audio_buffer.commit", "event_id": "a"}) == InputAudioCommit("a")
    assert parse({"type": "input_audio_buffer.clear"}) == InputAudioClear(None)
    assert parse({"type": "response.create", "response": {"output_modalities": ["audio"]}}) == (
        ResponseCreate(None)
    )
    assert parse({"type": "response.cancel", "response_id": "resp_1"}) == ResponseCancel(
        None, "resp_1"
    )
    item = parse(
        {
            "type": "conversation.item.create",
            "item": {
                "id": "item_1",
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Hello"},
                    {"type": "input_text", "text": "there."},
                ],
            },
        }
    )
    assert item == ItemCreate(None, "item_1", "Hello there.")


@pytest.mark.parametrize(
    ("message", "param", "code"),
    [
        ("{not json", None, "invalid_json"),
        ("[1, 2]", None, "invalid_json"),
        ('{"type": "session.delete"}', "type", "unknown_event"),
        ('{"type": 3}', "type", "invalid_type"),
        ('{"type": "input_audio_buffer.commit", "event_id": 7}', "event_id", "invalid_type"),
        ('{"type": "session.update", "session": "x"}', "session", "invalid_type"),
        (
            '{"type": "conversation.item.create", "item": {"role": "assistant", "type": "message"}}',
            "item.role",
            "invalid_value",
        ),
        (
            '{"type": "conversation.item.create", "item": {"role": "user", "type": "message", '
            '"content": [{"type": "input_audio", "audio": ""}]}}',
            "item.content[0].type",
            "invalid_value",
        ),
        (
            '{"type": "conversation.item.create", "item": {"role": "user", "content": []}}',
            "item.content",
            "invalid_value",
        ),
        (
            '{"type": "response.create", "response": {"tools": []}}',
            "response.tools",
            "unknown_parameter",
        ),
        ('{"type": "response.cancel", "response_id": 5}', "response_id", "invalid_type"),
    ],
)
def test_malformed_events_are_refused_with_the_field(
    message: str, param: str | None, code: str
) -> None:
    error = refused(message)
    assert (error.param, error.code) == (param, code)
    event = RealtimeErrorEvent.model_validate(error_event(error))
    assert event.error.type == "invalid_request_error"
    assert event.error.param == param
    assert event.event_id.startswith("event_")


def test_response_done_validates_as_openai_s() -> None:
    done = server_event(
        "response.done",
        response={
            "object": "realtime.response",
            "id": "resp_1",
            "status": "cancelled",
            "status_details": {"type": "cancelled", "reason": "turn_detected", "error": None},
            "output": [],
            "usage": {"total_tokens": 3, "input_tokens": 2, "output_tokens": 1},
        },
    )
    event = ResponseDoneEvent.model_validate(done)
    assert event.response.status_details is not None
    assert event.response.status_details.reason == "turn_detected"
