"""Fuzzing ``/v1/realtime``: generated sequences of client events (valid events of every type,
events with fields dropped, added or replaced by any JSON value, text that is not JSON, JSON
that is not an object, binary messages, audio that is odd, noise or not base64), sent in any
order over one WebSocket to a real ``omni-edge serve`` of the shipped voice-chat pipeline in
its real workers (Silero VAD, Whisper tiny.en, the built-in assistant
on vLLM, the voice).

After each sequence the client sends a valid ``session.update`` and reads events until its
``session.updated``: the connection must still be usable. Every event the server sent must be
one of its event types, and every ``error`` event must carry OpenAI's shape (``type``,
``code`` and ``message``). The socket then closes; nothing may be left: the conversation's
request wound up, the same worker processes (none retired by a call cut short) and the same
shared memory.

The default profile runs :data:`FAST_EXAMPLES` sequences; under ``HYPOTHESIS_PROFILE=slow``
(``make reliability``) :data:`SLOW_SEQUENCES`, or ``OMNI_FUZZ_EXAMPLES`` when fewer.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect

from runtime.adapters.vad_bundle import ensure_vad_bundle
from runtime.adapters.voice_export import ensure_voice_bundles
from runtime.adapters.whisper_export import export_missing_recognisers
from tests.reliability.conftest import PROFILE, SLOW_EXAMPLES
from tests.reliability.test_fuzz import FUZZ, Examples, examples, json_values
from tests.runtime.serve.support import ServeProcess, wait_until
from tests.runtime.vllm.support import START_TIMEOUT_S

__all__ = ["examples"]

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / "assets" / "pipelines" / "voice-chat.yaml"
MODEL = "voice-chat"
FAST_EXAMPLES = 25
SLOW_SEQUENCES = 1000
EXAMPLES = min(SLOW_EXAMPLES, SLOW_SEQUENCES) if PROFILE == "slow" else FAST_EXAMPLES
RATE = 24_000
#: How long a reply the fuzzed events started may take before the probe is answered.
REPLY_TIMEOUT_S = 120.0
#: Events the server may send (OpenAI Realtime's GA names, the subset served).
SERVER_EVENTS = {
    "error",
    "session.created",
    "session.updated",
    "input_audio_buffer.speech_started",
    "input_audio_buffer.speech_stopped",
    "input_audio_buffer.committed",
    "input_audio_buffer.cleared",
    "conversation.item.added",
    "conversation.item.created",
    "conversation.item.done",
    "conversation.item.input_audio_transcription.delta",
    "conversation.item.input_audio_transcription.completed",
    "conversation.item.input_audio_transcription.failed",
    "response.created",
    "response.output_item.added",
    "response.output_item.done",
    "response.content_part.added",
    "response.content_part.done",
    "response.output_audio.delta",
    "response.output_audio.done",
    "response.output_audio_transcript.delta",
    "response.output_audio_transcript.done",
    "response.done",
    "rate_limits.updated",
}

words = st.text(st.sampled_from("ab .,?!-'\"\\/é\x00\U0001f600\n0123"), max_size=16)
anything = json_values | words | st.integers(-(2**40), 2**40) | st.floats()


def _b64(samples: np.ndarray) -> str:
    return base64.b64encode((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()).decode()


SILENCE = _b64(np.zeros(RATE // 10, np.float32))
NOISE = _b64(0.05 * np.random.default_rng(7).standard_normal(RATE // 10).astype(np.float32))
TONE = _b64(0.3 * np.sin(np.arange(RATE // 5) * 2 * np.pi * 220 / RATE).astype(np.float32))
AUDIO = st.sampled_from(
    (SILENCE, NOISE, TONE, "", "%%%", base64.b64encode(b"\x01\x02\x03").decode(), "AAAA=")
)
TURN_DETECTION = st.sampled_from(
    (
        None,
        {"type": "server_vad"},
        {"type": "server_vad", "threshold": 0.6, "silence_duration_ms": 400},
        {"type": "server_vad", "threshold": 2},
        {"type": "semantic_vad"},
        {"type": "server_vad", "create_response": False},
        {"type": "server_vad", "silence_duration_ms": -5},
    )
)
SESSIONS = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(("realtime", "transcription", "x")),
        "instructions": st.sampled_from(("Be brief.", "", 5)) | words,
        "audio": st.fixed_dictionaries(
            {},
            optional={
                "input": st.fixed_dictionaries(
                    {},
                    optional={
                        "turn_detection": TURN_DETECTION,
                        "format": st.sampled_from(
                            ({"type": "audio/pcm", "rate": 24000}, {"type": "audio/pcmu"}, "pcm16")
                        ),
                        "transcription": st.sampled_from(
                            ({"model": "whisper-1"}, None, {"model": 3})
                        ),
                    },
                ),
                "output": st.fixed_dictionaries(
                    {},
                    optional={
                        "voice": st.sampled_from(("joe", "alloy", "")),
                        "format": st.sampled_from(({"type": "audio/pcm", "rate": 24000}, {})),
                    },
                ),
            },
        ),
        "output_modalities": st.sampled_from((["audio"], ["text"], [], "audio")),
        "tools": st.sampled_from(([], [{"type": "function", "name": "f"}])),
    },
)
ITEMS = st.sampled_from(
    (
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ""}]},
        {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "x"}]},
        {"type": "message", "role": "user", "content": []},
        {"type": "function_call", "name": "f"},
        {"type": "message", "role": "user", "content": "Hi."},
    )
)
#: Valid-looking events of every client type, before mutation.
EVENTS: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "session.update": st.builds(lambda s: {"session": s}, SESSIONS),
    "input_audio_buffer.append": st.builds(lambda a: {"audio": a}, AUDIO),
    "input_audio_buffer.commit": st.just({}),
    "input_audio_buffer.clear": st.just({}),
    "conversation.item.create": st.builds(lambda i: {"item": i}, ITEMS),
    "response.create": st.sampled_from(({}, {"response": {}}, {"response": {"x": 1}})),
    "response.cancel": st.sampled_from(({}, {"response_id": "resp_x"})),
    "conversation.item.truncate": st.just({"item_id": "x", "content_index": 0}),
    "session.delete": st.just({}),
}
#: Appends are most of a real client's traffic; responses the slowest events.
WEIGHTED_TYPES = (
    ["input_audio_buffer.append"] * 4
    + ["session.update"] * 2
    + [name for name in EVENTS if name not in ("input_audio_buffer.append", "session.update")]
)


@st.composite
def messages(draw: st.DrawFn) -> str | bytes:
    """One WebSocket message: an event (often mutated) or something that is not one."""
    how = draw(st.sampled_from(("event",) * 6 + ("mutated",) * 3 + ("text", "json", "binary")))
    if how == "text":
        return draw(st.sampled_from(("{not json", "", "null", "[]", "\x00"))) + draw(words)
    if how == "json":
        return json.dumps(draw(anything))
    if how == "binary":
        return draw(st.binary(max_size=32))
    kind = draw(st.sampled_from(WEIGHTED_TYPES))
    event: dict[str, Any] = {"type": kind, **draw(EVENTS[kind])}
    if draw(st.booleans()):
        event["event_id"] = draw(st.sampled_from(("e1", "", "x" * 40)) | words)
    if how == "mutated":
        field = draw(st.sampled_from(sorted(event)))
        if draw(st.booleans()):
            event.pop(field)
        else:
            event[field] = draw(anything)
        if draw(st.booleans()):
            event[draw(words)] = draw(anything)
    return json.dumps(event)


@pytest.fixture
def server(smollm2_model: Path) -> Iterator[ServeProcess]:
    """``omni-edge serve`` of voice-chat (loaded once per test), warmed up by one
    connection."""
    ensure_voice_bundles("joe")
    ensure_vad_bundle()
    export_missing_recognisers(PIPELINE, lambda line: None)
    process = ServeProcess([PIPELINE], start_timeout_s=START_TIMEOUT_S)
    try:
        with _connect(process) as socket:
            socket.send(json.dumps({"type": "input_audio_buffer.append", "audio": NOISE}))
            _usable(socket)
        _settled(process)
        yield process
    finally:
        assert process.stop() == 130, "\n".join(process.stderr)
        assert not process.segments()


@contextlib.contextmanager
def _connect(server: ServeProcess) -> Iterator[Any]:
    url = server.url.replace("http://", "ws://") + f"/realtime?model={MODEL}"
    with connect(url, additional_headers=server.headers(), open_timeout=30) as socket:
        created = json.loads(socket.recv(timeout=30))
        assert created["type"] == "session.created", created
        yield socket


def _usable(socket: Any) -> list[dict[str, Any]]:
    """Send a valid update and read until it is applied; every event read, checked."""
    socket.send(json.dumps({"type": "session.update", "event_id": "probe", "session": {}}))
    received = []
    while True:
        event = json.loads(socket.recv(timeout=REPLY_TIMEOUT_S))
        assert isinstance(event, dict), event
        assert event.get("type") in SERVER_EVENTS, event
        received.append(event)
        if event["type"] == "error":
            error = event["error"]
            for key in ("type", "code", "message"):
                assert isinstance(error[key], str), event
                assert error[key], event
            assert error.get("event_id") != "probe", event
        if event["type"] == "session.updated":
            return received


def _settled(server: ServeProcess) -> dict[str, Any]:
    return wait_until(
        lambda: (
            entry
            if (entry := server.pipelines()[MODEL])["in_flight"] == 0 and entry["state"] == "ready"
            else None
        ),
        "the conversation to be wound up",
    )


@settings(FUZZ, max_examples=EXAMPLES)
@given(sequence=st.lists(messages(), min_size=1, max_size=8))
def test_realtime_event_sequences(
    examples: Examples, server: ServeProcess, sequence: list[str | bytes]
) -> None:
    workers, segments = server.workers(), server.segments()
    examples.count += 1
    with _connect(server) as socket:
        for message in sequence:
            socket.send(message)
        _usable(socket)
    _settled(server)
    # Nothing restarted (a worker retired by a cut call) and nothing more held.
    assert server.workers() == workers
    assert server.segments() == segments


from tests.runtime.vllm.conftest import smollm2_model, vllm_env  # noqa: E402

__all__ += ["smollm2_model", "vllm_env"]
