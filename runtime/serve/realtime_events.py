"""OpenAI Realtime's events (the GA names) for ``/v1/realtime``: client events parsed into
frozen values, the session's settings, and server events built as JSON documents.

Parsing is the edge: :func:`parse_client_event` reads one WebSocket message into a
:data:`ClientEvent` or raises :class:`RealtimeEventError` naming the field (``param``, a dotted
path such as ``session.audio.input.turn_detection.threshold``), the value and what is
accepted; the connection answers it with an ``error`` event (:func:`error_event`) and goes on.
Audio is PCM16 mono at 24 kHz both ways (``audio/pcm``, OpenAI's default and only rate).

The subset understood: ``session.update`` (instructions, voice, input and output formats,
``server_vad`` turn detection with ``threshold``, ``silence_duration_ms`` and
``prefix_padding_ms``, or none; input transcription), ``input_audio_buffer.append`` /
``commit`` / ``clear``, ``conversation.item.create`` (a user message of ``input_text``),
``response.create`` and ``response.cancel``.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from runtime.serve.errors import INVALID_REQUEST

if TYPE_CHECKING:
    from collections.abc import Mapping

    from runtime.adapters.turns import TurnSettings

__all__ = [
    "AUDIO_FORMAT",
    "AUDIO_RATE",
    "CLIENT_EVENTS",
    "ClientEvent",
    "InputAudioAppend",
    "InputAudioClear",
    "InputAudioCommit",
    "ItemCreate",
    "RealtimeEventError",
    "RealtimeSettings",
    "ResponseCancel",
    "ResponseCreate",
    "ServerVad",
    "SessionUpdate",
    "error_event",
    "new_id",
    "parse_client_event",
    "server_event",
]

#: The audio rate both ways: OpenAI's PCM16 ``audio/pcm`` at 24 kHz.
AUDIO_RATE: Final = 24000
AUDIO_FORMAT: Final = {"type": "audio/pcm", "rate": AUDIO_RATE}
SESSION_UPDATE: Final = "session.update"
APPEND: Final = "input_audio_buffer.append"
COMMIT: Final = "input_audio_buffer.commit"
CLEAR: Final = "input_audio_buffer.clear"
ITEM_CREATE: Final = "conversation.item.create"
RESPONSE_CREATE: Final = "response.create"
RESPONSE_CANCEL: Final = "response.cancel"
CLIENT_EVENTS: Final = (
    SESSION_UPDATE,
    APPEND,
    COMMIT,
    CLEAR,
    ITEM_CREATE,
    RESPONSE_CREATE,
    RESPONSE_CANCEL,
)
#: The keys a ``session`` object may carry here.
SESSION_KEYS: Final = (
    "type",
    "model",
    "instructions",
    "audio",
    "output_modalities",
    "tools",
    "tool_choice",
)
TURN_DETECTION_KEYS: Final = (
    "type",
    "threshold",
    "silence_duration_ms",
    "prefix_padding_ms",
    "create_response",
    "interrupt_response",
    "idle_timeout_ms",
)
#: The longest silence or padding a turn detection may ask for (the turn options' bound).
MAX_MS: Final = 10_000


class RealtimeEventError(Exception):
    """A client event that cannot be done: an ``error`` event with ``code`` and ``param``,
    about the client event ``event_id``; the connection stays usable."""

    def __init__(
        self,
        message: str,
        *,
        code: str = "invalid_value",
        param: str | None = None,
        event_id: str | None = None,
        type: str = INVALID_REQUEST,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.event_id = event_id
        self.type = type


# -- client events -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerVad:
    """``server_vad`` turn detection: the fields given (None: keep the current value)."""

    threshold: float | None = None
    silence_duration_ms: int | None = None
    prefix_padding_ms: int | None = None


@dataclass(frozen=True, slots=True)
class SessionUpdate:
    """``session.update``: each ``*_given`` says whether the field was sent (its value may be
    None: turn detection or transcription turned off)."""

    event_id: str | None
    instructions: str | None = None
    voice: str | None = None
    turn_detection_given: bool = False
    turn_detection: ServerVad | None = None
    transcription_given: bool = False
    #: The transcription model named (None: no input transcripts).
    transcription: str | None = None


@dataclass(frozen=True, slots=True)
class InputAudioAppend:
    """``input_audio_buffer.append``: the audio as float32 samples at 24 kHz."""

    event_id: str | None
    pcm: np.ndarray


@dataclass(frozen=True, slots=True)
class InputAudioCommit:
    event_id: str | None


@dataclass(frozen=True, slots=True)
class InputAudioClear:
    event_id: str | None


@dataclass(frozen=True, slots=True)
class ItemCreate:
    """``conversation.item.create`` of a user message: its text (its ``input_text`` parts
    joined), its id if the client chose one."""

    event_id: str | None
    item_id: str | None
    text: str


@dataclass(frozen=True, slots=True)
class ResponseCreate:
    event_id: str | None


@dataclass(frozen=True, slots=True)
class ResponseCancel:
    event_id: str | None
    response_id: str | None


ClientEvent = (
    SessionUpdate
    | InputAudioAppend
    | InputAudioCommit
    | InputAudioClear
    | ItemCreate
    | ResponseCreate
    | ResponseCancel
)


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _object(value: object, param: str, event_id: str | None) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise RealtimeEventError(
            f"'{param}' is {_type_name(value)}; accepted: an object",
            code="invalid_type",
            param=param,
            event_id=event_id,
        )
    return value


def _only(
    document: Mapping[str, Any], keys: tuple[str, ...], param: str, event_id: str | None
) -> None:
    for key in document:
        if key not in keys:
            raise RealtimeEventError(
                f"'{param}.{key}' is not supported by this server; accepted: {', '.join(keys)}",
                code="unknown_parameter",
                param=f"{param}.{key}",
                event_id=event_id,
            )


def _text(value: object, param: str, event_id: str | None) -> str:
    if not isinstance(value, str):
        raise RealtimeEventError(
            f"'{param}' is {_type_name(value)}; accepted: a string",
            code="invalid_type",
            param=param,
            event_id=event_id,
        )
    return value


def _number(value: object, param: str, event_id: str | None, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise RealtimeEventError(
            f"'{param}' is {value!r}; accepted: a number from {low} to {high}",
            code="invalid_value",
            param=param,
            event_id=event_id,
        )
    return float(value)


def _whole(value: object, param: str, event_id: str | None, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RealtimeEventError(
            f"'{param}' is {value!r}; accepted: an integer from {low} to {high}",
            code="invalid_value",
            param=param,
            event_id=event_id,
        )
    return value


def _audio_format(value: object, param: str, event_id: str | None) -> None:
    document = _object(value, param, event_id)
    kind, rate = document.get("type", "audio/pcm"), document.get("rate", AUDIO_RATE)
    if kind != "audio/pcm" or rate != AUDIO_RATE or set(document) - {"type", "rate"}:
        raise RealtimeEventError(
            f"'{param}' is {json.dumps(document)}; accepted: "
            f'{{"type": "audio/pcm", "rate": {AUDIO_RATE}}} (PCM16 mono)',
            code="invalid_value",
            param=param,
            event_id=event_id,
        )


def _turn_detection(value: object, param: str, event_id: str | None) -> ServerVad | None:
    if value is None:
        return None
    document = _object(value, param, event_id)
    kind = document.get("type")
    if kind != "server_vad":
        raise RealtimeEventError(
            f"'{param}.type' is {kind!r}; accepted: 'server_vad' (or turn_detection null to "
            "commit the input audio by hand)",
            code="invalid_value",
            param=f"{param}.type",
            event_id=event_id,
        )
    _only(document, TURN_DETECTION_KEYS, param, event_id)
    for switch in ("create_response", "interrupt_response"):
        if document.get(switch, True) is not True:
            raise RealtimeEventError(
                f"'{param}.{switch}' is {document[switch]!r}; accepted: true (this server "
                "answers each spoken turn and a new turn interrupts the response)",
                code="invalid_value",
                param=f"{param}.{switch}",
                event_id=event_id,
            )
    if document.get("idle_timeout_ms") is not None:
        raise RealtimeEventError(
            f"'{param}.idle_timeout_ms' is {document['idle_timeout_ms']!r}; accepted: null",
            code="invalid_value",
            param=f"{param}.idle_timeout_ms",
            event_id=event_id,
        )
    threshold = document.get("threshold")
    silence = document.get("silence_duration_ms")
    padding = document.get("prefix_padding_ms")
    return ServerVad(
        threshold=None
        if threshold is None
        else _number(threshold, f"{param}.threshold", event_id, 0.0, 1.0),
        silence_duration_ms=None
        if silence is None
        else _whole(silence, f"{param}.silence_duration_ms", event_id, 0, MAX_MS),
        prefix_padding_ms=None
        if padding is None
        else _whole(padding, f"{param}.prefix_padding_ms", event_id, 0, MAX_MS),
    )


def _session_update(document: Mapping[str, Any], event_id: str | None) -> SessionUpdate:
    session = _object(document.get("session"), "session", event_id)
    _only(session, SESSION_KEYS, "session", event_id)
    if session.get("type", "realtime") != "realtime":
        raise RealtimeEventError(
            f"'session.type' is {session['type']!r}; accepted: 'realtime'",
            param="session.type",
            event_id=event_id,
        )
    if "model" in session:
        _text(session["model"], "session.model", event_id)
    modalities = session.get("output_modalities", ["audio"])
    if modalities != ["audio"]:
        raise RealtimeEventError(
            f"'session.output_modalities' is {json.dumps(modalities)}; accepted: [\"audio\"] "
            "(the reply is spoken, with its transcript)",
            param="session.output_modalities",
            event_id=event_id,
        )
    if session.get("tools", []) != []:
        raise RealtimeEventError(
            "'session.tools' is not empty; accepted: [] (this server calls no tools)",
            param="session.tools",
            event_id=event_id,
        )
    if "tool_choice" in session:
        _text(session["tool_choice"], "session.tool_choice", event_id)
    instructions = session.get("instructions")
    if instructions is not None:
        instructions = _text(instructions, "session.instructions", event_id)
    update = SessionUpdate(event_id, instructions=instructions)
    if "audio" not in session:
        return update
    audio = _object(session["audio"], "session.audio", event_id)
    _only(audio, ("input", "output"), "session.audio", event_id)
    if "output" in audio:
        output = _object(audio["output"], "session.audio.output", event_id)
        _only(output, ("format", "voice", "speed"), "session.audio.output", event_id)
        if "format" in output:
            _audio_format(output["format"], "session.audio.output.format", event_id)
        if output.get("speed", 1.0) != 1.0:
            raise RealtimeEventError(
                f"'session.audio.output.speed' is {output['speed']!r}; accepted: 1.0",
                param="session.audio.output.speed",
                event_id=event_id,
            )
        if "voice" in output:
            voice = _text(output["voice"], "session.audio.output.voice", event_id)
            update = dataclasses.replace(update, voice=voice)
    if "input" in audio:
        param = "session.audio.input"
        source = _object(audio["input"], param, event_id)
        _only(
            source,
            ("format", "transcription", "turn_detection", "noise_reduction"),
            param,
            event_id,
        )
        if "format" in source:
            _audio_format(source["format"], f"{param}.format", event_id)
        if source.get("noise_reduction") is not None:
            raise RealtimeEventError(
                f"'{param}.noise_reduction' is {json.dumps(source['noise_reduction'])}; "
                "accepted: null",
                param=f"{param}.noise_reduction",
                event_id=event_id,
            )
        if "turn_detection" in source:
            update = dataclasses.replace(
                update,
                turn_detection_given=True,
                turn_detection=_turn_detection(
                    source["turn_detection"], f"{param}.turn_detection", event_id
                ),
            )
        if "transcription" in source:
            transcription = source["transcription"]
            model = None
            if transcription is not None:
                found = _object(transcription, f"{param}.transcription", event_id)
                _only(found, ("model", "language", "prompt"), f"{param}.transcription", event_id)
                model = _text(
                    found.get("model", "whisper-1"), f"{param}.transcription.model", event_id
                )
                language = found.get("language")
                if language is not None and language != "en":
                    raise RealtimeEventError(
                        f"'{param}.transcription.language' is {language!r}; accepted: 'en' "
                        "(the recogniser is English only)",
                        param=f"{param}.transcription.language",
                        event_id=event_id,
                    )
            update = dataclasses.replace(update, transcription_given=True, transcription=model)
    return update


def _append(document: Mapping[str, Any], event_id: str | None) -> InputAudioAppend:
    encoded = _text(document.get("audio"), "audio", event_id)
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise RealtimeEventError(
            "'audio' is not valid base64; accepted: base64 of PCM16 little-endian mono samples "
            f"at {AUDIO_RATE} Hz",
            code="invalid_value",
            param="audio",
            event_id=event_id,
        ) from None
    if len(raw) % 2:
        raise RealtimeEventError(
            f"'audio' decodes to {len(raw)} bytes, an odd count; accepted: whole PCM16 samples "
            "(2 bytes each)",
            code="invalid_value",
            param="audio",
            event_id=event_id,
        )
    samples = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    return InputAudioAppend(event_id, samples)


def _item_create(document: Mapping[str, Any], event_id: str | None) -> ItemCreate:
    item = _object(document.get("item"), "item", event_id)
    kind = item.get("type", "message")
    role = item.get("role")
    if kind != "message" or role != "user":
        raise RealtimeEventError(
            f"'item' is a {kind!r} of role {role!r}; accepted: a 'message' of role 'user'",
            param="item.role" if kind == "message" else "item.type",
            event_id=event_id,
        )
    item_id = item.get("id")
    if item_id is not None:
        item_id = _text(item_id, "item.id", event_id)
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise RealtimeEventError(
            f"'item.content' is {_type_name(content)}; accepted: a list of input_text parts",
            code="invalid_type" if not isinstance(content, list) else "invalid_value",
            param="item.content",
            event_id=event_id,
        )
    texts = []
    for index, part in enumerate(content):
        where = f"item.content[{index}]"
        found = _object(part, where, event_id)
        if found.get("type") != "input_text":
            raise RealtimeEventError(
                f"'{where}.type' is {found.get('type')!r}; accepted: 'input_text'",
                param=f"{where}.type",
                event_id=event_id,
            )
        texts.append(_text(found.get("text"), f"{where}.text", event_id))
    text = " ".join(t.strip() for t in texts if t.strip())
    if not text:
        raise RealtimeEventError(
            "'item.content' has no text; accepted: input_text parts with text",
            param="item.content",
            event_id=event_id,
        )
    return ItemCreate(event_id, item_id, text)


def _response_create(document: Mapping[str, Any], event_id: str | None) -> ResponseCreate:
    if "response" in document and document["response"] is not None:
        response = _object(document["response"], "response", event_id)
        _only(response, ("output_modalities", "conversation", "metadata"), "response", event_id)
        if response.get("output_modalities", ["audio"]) != ["audio"]:
            raise RealtimeEventError(
                f"'response.output_modalities' is {json.dumps(response['output_modalities'])}; "
                'accepted: ["audio"]',
                param="response.output_modalities",
                event_id=event_id,
            )
        if response.get("conversation", "auto") != "auto":
            raise RealtimeEventError(
                f"'response.conversation' is {response['conversation']!r}; accepted: 'auto'",
                param="response.conversation",
                event_id=event_id,
            )
    return ResponseCreate(event_id)


def parse_client_event(message: str | bytes) -> ClientEvent:
    """One WebSocket message -> its client event (:class:`RealtimeEventError` otherwise)."""
    try:
        document = json.loads(message)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RealtimeEventError(
            f"the message is not JSON ({exc}); accepted: a JSON object with 'type'",
            code="invalid_json",
        ) from None
    if not isinstance(document, dict):
        raise RealtimeEventError(
            f"the message is a JSON {_type_name(document)}; accepted: a JSON object with 'type'",
            code="invalid_json",
        )
    event_id = document.get("event_id")
    if event_id is not None and not isinstance(event_id, str):
        raise RealtimeEventError(
            f"'event_id' is {_type_name(event_id)}; accepted: a string",
            code="invalid_type",
            param="event_id",
        )
    kind = document.get("type")
    if not isinstance(kind, str) or kind not in CLIENT_EVENTS:
        raise RealtimeEventError(
            f"'type' is {kind!r}; accepted: {', '.join(CLIENT_EVENTS)}",
            code="invalid_type" if not isinstance(kind, str) else "unknown_event",
            param="type",
            event_id=event_id,
        )
    if kind == SESSION_UPDATE:
        return _session_update(document, event_id)
    if kind == APPEND:
        return _append(document, event_id)
    if kind == COMMIT:
        return InputAudioCommit(event_id)
    if kind == CLEAR:
        return InputAudioClear(event_id)
    if kind == ITEM_CREATE:
        return _item_create(document, event_id)
    if kind == RESPONSE_CREATE:
        return _response_create(document, event_id)
    response_id = document.get("response_id")
    if response_id is not None:
        response_id = _text(response_id, "response_id", event_id)
    return ResponseCancel(event_id, response_id)


# -- the session's settings ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RealtimeSettings:
    """What a connection's session holds: the system prompt, the voice, the turn-taking
    settings (``server_vad`` False: the client commits its turns), and the transcription
    model the client named (None: no input transcripts)."""

    model: str
    instructions: str
    voice: str
    voices: tuple[str, ...]
    server_vad: bool
    turns: TurnSettings
    transcription: str | None = None

    def updated(self, update: SessionUpdate) -> RealtimeSettings:
        """These settings with ``update``'s fields, or :class:`RealtimeEventError` naming the
        first field that cannot be used (nothing changes then)."""
        changed = self
        if update.instructions is not None:
            changed = dataclasses.replace(changed, instructions=update.instructions)
        if update.voice is not None:
            if update.voice not in self.voices:
                raise RealtimeEventError(
                    f"'session.audio.output.voice' is {update.voice!r}; accepted: "
                    f"{', '.join(self.voices)}",
                    param="session.audio.output.voice",
                    event_id=update.event_id,
                )
            changed = dataclasses.replace(changed, voice=update.voice)
        if update.transcription_given:
            changed = dataclasses.replace(changed, transcription=update.transcription)
        if update.turn_detection_given:
            vad = update.turn_detection
            if vad is None:
                return dataclasses.replace(changed, server_vad=False)
            values: dict[str, float] = {}
            if vad.threshold is not None:
                values["threshold"] = vad.threshold
            if vad.silence_duration_ms is not None:
                values["end_of_turn_s"] = vad.silence_duration_ms / 1000
            if vad.prefix_padding_ms is not None:
                values["pre_roll_s"] = vad.prefix_padding_ms / 1000
            try:
                turns = dataclasses.replace(self.turns, **values)
            except ValueError as exc:
                param = "session.audio.input.turn_detection"
                field = (
                    "silence_duration_ms"
                    if "end_of_turn_s" in str(exc) or "speculate_s" in str(exc)
                    else "threshold"
                )
                raise RealtimeEventError(
                    f"'{param}.{field}' cannot be used: {exc}",
                    param=f"{param}.{field}",
                    event_id=update.event_id,
                ) from None
            changed = dataclasses.replace(changed, server_vad=True, turns=turns)
        return changed

    def session(self, session_id: str) -> dict[str, Any]:
        """The ``session`` object of ``session.created`` / ``session.updated``."""
        turn_detection = (
            {
                "type": "server_vad",
                "threshold": self.turns.threshold,
                "silence_duration_ms": round(self.turns.end_of_turn_s * 1000),
                "prefix_padding_ms": round(self.turns.pre_roll_s * 1000),
                "create_response": True,
                "interrupt_response": True,
                "idle_timeout_ms": None,
            }
            if self.server_vad
            else None
        )
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": session_id,
            "model": self.model,
            "output_modalities": ["audio"],
            "instructions": self.instructions,
            "audio": {
                "input": {
                    "format": dict(AUDIO_FORMAT),
                    "transcription": None
                    if self.transcription is None
                    else {"model": self.transcription},
                    "noise_reduction": None,
                    "turn_detection": turn_detection,
                },
                "output": {"format": dict(AUDIO_FORMAT), "voice": self.voice, "speed": 1.0},
            },
            "tools": [],
            "tool_choice": "auto",
            "max_output_tokens": "inf",
        }


# -- server events ------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    """An id as OpenAI spells them: ``event_…``, ``item_…``, ``resp_…``, ``sess_…``."""
    return f"{prefix}_{secrets.token_hex(10)}"


def server_event(kind: str, **fields: Any) -> dict[str, Any]:
    """A server event of type ``kind`` with a fresh ``event_id``."""
    return {"type": kind, "event_id": new_id("event"), **fields}


def error_event(error: RealtimeEventError) -> dict[str, Any]:
    """OpenAI's ``error`` event for ``error`` (its ``event_id`` is the client event's)."""
    return server_event(
        "error",
        error={
            "type": error.type,
            "code": error.code,
            "message": error.message,
            "param": error.param,
            "event_id": error.event_id,
        },
    )
