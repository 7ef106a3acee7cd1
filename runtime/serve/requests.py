"""Request bodies of the OpenAI endpoints parsed into typed values, without I/O.

Each parser takes the decoded JSON document and the limits and raises :class:`ApiError`
(400) naming the field, the value found and what is accepted.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from runtime.artifacts import NPZ_ERRORS
from runtime.chat import ROLES, ChatMessage
from runtime.contracts.structured import ResponseFormatError, parse_response_format
from runtime.serve.errors import invalid

if TYPE_CHECKING:
    from runtime.serve.limits import ServeLimits

#: Fields of a chat request that are read; ``IGNORED_CHAT_FIELDS`` are accepted and unused.
CHAT_FIELDS: Final = (
    "model",
    "messages",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "n",
    "response_format",
)
IGNORED_CHAT_FIELDS: Final = ("user", "presence_penalty", "frequency_penalty", "logit_bias")
SPEECH_FIELDS: Final = ("model", "input", "voice", "response_format", "speed", "instructions")
SPEECH_FORMATS: Final = ("wav", "pcm")
MAX_STOP: Final = 4


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A checked ``/v1/chat/completions`` body. ``sampling`` holds only what the client set
    (names of :class:`~runtime.contracts.llm_messages.SamplingSpec`)."""

    model: str
    messages: tuple[ChatMessage, ...]
    stream: bool
    include_usage: bool
    sampling: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class SpeechRequest:
    """A checked ``/v1/audio/speech`` body."""

    model: str
    input: str
    voice: str
    response_format: str


def decode_json(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 saying what it is instead."""
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise invalid(
            f"the body is not valid JSON: {exc}", param=None, code="invalid_json"
        ) from None
    if not isinstance(document, dict):
        raise invalid(
            f"the body is a JSON {type(document).__name__}; accepted: a JSON object",
            param=None,
            code="invalid_json",
        )
    return document


def _model(document: Mapping[str, Any]) -> str:
    model = document.get("model")
    if not isinstance(model, str) or not model:
        raise invalid(
            f"'model' is {model!r}; accepted: the name of a served pipeline (GET /v1/models)",
            param="model",
            code="missing_model" if model is None else "invalid_value",
        )
    return model


def _unknown(document: Mapping[str, Any], accepted: tuple[str, ...]) -> None:
    unknown = sorted(set(document) - set(accepted))
    if unknown:
        raise invalid(
            f"unknown field {unknown[0]!r}; accepted: {', '.join(accepted)}",
            param=unknown[0],
            code="unknown_field",
        )


def _number(
    document: Mapping[str, Any], name: str, low: float, high: float, *, open_low: bool = False
) -> float | None:
    value = document.get(name)
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and (value > low if open_low else value >= low) and value <= high:
        return float(value)
    bracket = "(" if open_low else "["
    raise invalid(
        f"'{name}' is {value!r}; accepted: a number in {bracket}{low:g}, {high:g}]", param=name
    )


def _integer(document: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    value = document.get(name)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
        return value
    raise invalid(f"'{name}' is {value!r}; accepted: an integer in [{low}, {high}]", param=name)


def _content(value: object, index: int) -> str:
    """A message's content: a string, or a list of ``{"type": "text", "text": str}`` parts."""
    param = f"messages[{index}].content"
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part_index, part in enumerate(value):
            if (
                not isinstance(part, Mapping)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise invalid(
                    f"{param}[{part_index}] is not a text part; accepted: "
                    "{'type': 'text', 'text': str} (this server takes text only)",
                    param=f"{param}[{part_index}]",
                )
            texts.append(part["text"])
        return "".join(texts)
    raise invalid(
        f"{param} is {type(value).__name__}; accepted: a string or a list of text parts",
        param=param,
    )


def parse_chat_request(document: Mapping[str, Any], limits: ServeLimits) -> ChatRequest:
    """A ``/v1/chat/completions`` body -> :class:`ChatRequest`, or a 400 naming the field."""
    _unknown(document, CHAT_FIELDS + IGNORED_CHAT_FIELDS)
    model = _model(document)
    raw = document.get("messages")
    if not isinstance(raw, list) or not raw:
        found = "missing" if raw is None else "empty" if raw == [] else type(raw).__name__
        raise invalid(
            f"'messages' is {found}; accepted: a non-empty list of {{'role', 'content'}} objects",
            param="messages",
        )
    if len(raw) > limits.max_messages:
        raise invalid(
            f"'messages' has {len(raw)} entries; accepted: at most {limits.max_messages}",
            param="messages",
        )
    messages = []
    for index, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            raise invalid(
                f"messages[{index}] is {type(entry).__name__}; accepted: an object with "
                "'role' and 'content'",
                param=f"messages[{index}]",
            )
        role = entry.get("role")
        if role not in ROLES:
            raise invalid(
                f"messages[{index}].role is {role!r}; accepted: {', '.join(ROLES)}",
                param=f"messages[{index}].role",
            )
        messages.append(ChatMessage(str(role), _content(entry.get("content"), index)))
    chars = sum(len(message.content) for message in messages)
    if chars > limits.max_prompt_chars:
        raise invalid(
            f"the messages hold {chars} characters; accepted: at most {limits.max_prompt_chars}",
            param="messages",
            code="context_length_exceeded",
        )
    if not any(message.content.strip() for message in messages):
        raise invalid("every message is empty; accepted: some text to answer", param="messages")
    stream = document.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid(f"'stream' is {stream!r}; accepted: true or false", param="stream")
    options = document.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, Mapping) or set(options) - {"include_usage"}:
            raise invalid(
                f"'stream_options' is {options!r}; accepted: {{'include_usage': bool}}",
                param="stream_options",
            )
        include_usage = bool(options.get("include_usage", False))
    _integer(document, "n", 1, 1)  # several choices per request are not offered
    sampling: dict[str, Any] = {}
    for name in ("max_completion_tokens", "max_tokens"):
        tokens = _integer(document, name, 1, limits.max_tokens)
        if tokens is not None:
            sampling["max_tokens"] = tokens
    temperature = _number(document, "temperature", 0.0, 2.0)
    if temperature is not None:
        sampling["temperature"] = temperature
    top_p = _number(document, "top_p", 0.0, 1.0, open_low=True)
    if top_p is not None:
        sampling["top_p"] = top_p
    seed = _integer(document, "seed", 0, 2**53 - 1)
    if seed is not None:
        sampling["seed"] = seed
    stop = document.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if (
            not isinstance(stops, list)
            or not 1 <= len(stops) <= MAX_STOP
            or not all(isinstance(item, str) and item for item in stops)
        ):
            raise invalid(
                f"'stop' is {stop!r}; accepted: a non-empty string or a list of 1 to {MAX_STOP}",
                param="stop",
            )
        sampling["stop"] = tuple(stops)
    if document.get("response_format") is not None:
        try:
            structured = parse_response_format(document["response_format"])
        except ResponseFormatError as exc:
            raise invalid(str(exc), param=exc.param) from None
        if structured is not None:
            sampling["structured_output"] = structured
    return ChatRequest(model, tuple(messages), stream, include_usage, sampling)


def parse_speech_request(
    document: Mapping[str, Any], limits: ServeLimits, voices: Mapping[str, tuple[str, ...]]
) -> SpeechRequest:
    """A ``/v1/audio/speech`` body -> :class:`SpeechRequest`. ``voices`` maps each speech
    model to the voices it speaks."""
    _unknown(document, SPEECH_FIELDS)
    model = _model(document)
    text = document.get("input")
    if not isinstance(text, str) or not text.strip():
        found = "empty" if isinstance(text, str) else repr(text)
        raise invalid(f"'input' is {found}; accepted: text to speak", param="input")
    if len(text) > limits.max_speech_chars:
        raise invalid(
            f"'input' has {len(text)} characters; accepted: at most {limits.max_speech_chars}",
            param="input",
        )
    accepted = voices.get(model, ())
    voice = document.get("voice")
    if voice is None and accepted:
        voice = accepted[0]
    if not isinstance(voice, str) or (accepted and voice not in accepted):
        raise invalid(
            f"'voice' is {voice!r}; accepted: {', '.join(accepted) or 'the pipeline voice'}",
            param="voice",
        )
    response_format = document.get("response_format", "wav")
    if response_format not in SPEECH_FORMATS:
        raise invalid(
            f"'response_format' is {response_format!r}; accepted: {', '.join(SPEECH_FORMATS)}",
            param="response_format",
        )
    speed = document.get("speed")
    if speed is not None and speed != 1 and speed != 1.0:
        raise invalid(f"'speed' is {speed!r}; accepted: 1.0", param="speed")
    return SpeechRequest(model, text, voice, str(response_format))


def load_npz(body: bytes) -> dict[str, np.ndarray]:
    """An ``.npz`` body -> its arrays (never pickled objects), or a 400 saying why not."""
    if not body.startswith(b"PK"):
        found = "a single .npy array" if body.startswith(b"\x93NUMPY") else "not an archive"
        raise invalid(
            f"the body is {found}; accepted: an .npz archive of named arrays (numpy.savez)",
            param=None,
            code="invalid_npz",
        )
    try:
        with np.load(io.BytesIO(body), allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except NPZ_ERRORS as exc:
        raise invalid(
            f"the body is not a readable .npz archive ({exc}); accepted: numpy.savez output "
            "without object arrays",
            param=None,
            code="invalid_npz",
        ) from None
    if not arrays:
        raise invalid(
            "the .npz archive holds no arrays; accepted: the pipeline's named inputs",
            param=None,
            code="invalid_npz",
        )
    return arrays


def dump_npz(arrays: Mapping[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    named: dict[str, Any] = {name: np.asarray(value) for name, value in arrays.items()}
    np.savez(buffer, **named)
    return buffer.getvalue()
