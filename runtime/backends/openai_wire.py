"""The OpenAI-compatible wire format of the remote route, without I/O.

What :mod:`runtime.backends.remote_llm` sends to and reads from a server such as
``vllm serve``: the errors a reply can become, the server-sent events of a streamed reply
(decoded strictly: a line that is not UTF-8, too long, or names an unknown field is an
error naming it, not skipped, so a proxy's error page never passes for an empty stream),
the ``/v1/completions`` request body and stream chunks, and the ``/v1/models`` list.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from runtime.errors import ConfigError, ExecutionError, ModelError, ResourceUnavailable, WorkerDied

if TYPE_CHECKING:
    from runtime.contracts.llm_messages import SamplingSpec

#: The longest event-stream line accepted, in bytes.
MAX_LINE_BYTES: Final = 1 << 20
#: The largest non-streamed body read (the model list, an error reply), in bytes.
MAX_BODY_BYTES: Final = 8 << 20
#: The data of the event that ends an OpenAI-style stream.
DONE_DATA: Final = "[DONE]"
#: Event-stream fields (the WHATWG server-sent events format); any other is refused.
SSE_FIELDS: Final = frozenset({"data", "event", "id", "retry"})


# -- errors ---------------------------------------------------------------------------


class RemoteUnreachable(ResourceUnavailable):
    """No connection to the server could be made; nothing was sent. ``url`` names it."""

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url


class RemoteConnectionLost(WorkerDied):
    """An established stream to the server broke or went silent; its output is cut short."""

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url


class RemoteProtocolError(ExecutionError):
    """The server's reply broke HTTP/1.1, server-sent events or the completion schema.

    ``code`` names the rule: event stream (``not_utf8``, ``line_too_long``, ``bad_line``,
    ``unknown_field``, ``bad_retry``), completion chunks (``bad_json``, ``bad_chunk``,
    ``done_before_finish``), HTTP (``bad_status_line``, ``bad_header``, ``bad_chunk_size``,
    ``bad_http`` for any other framing fault, ``not_event_stream``) and the model list
    (``bad_models``); ``detail`` says what was wrong.
    """

    def __init__(self, message: str, *, code: str, where: str | None = None) -> None:
        super().__init__(f"{where}: {code}: {message}" if where else f"{code}: {message}")
        self.detail = message
        self.code = code
        self.where = where


class RemoteModelNotServed(ConfigError):
    """The server does not serve the configured model; ``offered`` lists what it does."""

    def __init__(self, message: str, *, url: str, model: str, offered: tuple[str, ...]) -> None:
        super().__init__(message, key="model")
        self.url = url
        self.model = model
        self.offered = offered


class RemoteRequestFailed(ModelError):
    """The server refused or failed one request. ``status`` is None for an in-stream error."""

    def __init__(self, message: str, *, status: int | None) -> None:
        super().__init__(message)
        self.status = status


# -- server-sent events (pure) ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SseField:
    """One line of an event stream: a field and its value; a blank line has ``name`` ''."""

    name: str
    value: str


#: What :func:`parse_sse_line` returns for a blank line: the end of an event.
END_OF_EVENT: Final = SseField("", "")


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched event: its type (``message`` unless named) and its joined data."""

    event: str
    data: str
    id: str | None = None


def _shown(raw: bytes | str, limit: int = 80) -> str:
    text = repr(raw[:limit])
    return text + ("..." if len(raw) > limit else "")


def parse_sse_line(raw: bytes) -> SseField | None:
    """Parse one event-stream line (without its line ending).

    A blank line is :data:`END_OF_EVENT`; a comment (``:`` first) is None. One space after
    the colon is dropped, as the format says; a line without a colon is a field with an
    empty value. Raises :class:`RemoteProtocolError` for a line that is not UTF-8, is
    longer than :data:`MAX_LINE_BYTES`, holds a line break or NUL, names a field outside
    :data:`SSE_FIELDS`, or gives ``retry`` a value that is not digits.
    """
    if len(raw) > MAX_LINE_BYTES:
        raise RemoteProtocolError(
            f"an event-stream line of {len(raw)} bytes; accepted: at most {MAX_LINE_BYTES}",
            code="line_too_long",
        )
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(
            f"event-stream line {_shown(raw)} is not UTF-8 (byte {exc.start})", code="not_utf8"
        ) from None
    if any(c in line for c in "\r\n\x00"):
        raise RemoteProtocolError(
            f"event-stream line {_shown(line)} holds a line break or NUL; accepted: one line",
            code="bad_line",
        )
    if not line:
        return END_OF_EVENT
    if line.startswith(":"):
        return None
    name, colon, value = line.partition(":")
    if colon and value.startswith(" "):
        value = value[1:]
    if name not in SSE_FIELDS:
        raise RemoteProtocolError(
            f"event-stream line {_shown(line)} names field {_shown(name, 40)}; accepted: "
            f"{', '.join(sorted(SSE_FIELDS))}, or ':' for a comment",
            code="unknown_field",
        )
    if name == "retry" and not (value.isascii() and value.isdigit()):
        raise RemoteProtocolError(
            f"retry value {_shown(value, 40)}; accepted: a whole number of milliseconds",
            code="bad_retry",
        )
    return SseField(name, value)


class SseDecoder:
    """Bytes of an event stream in, whole events out; no I/O.

    Lines end with CRLF, LF or CR (a CR at the end of the bytes so far waits for the next
    bytes, which may start with its LF). An event is dispatched at a blank line when it has
    data; ``id`` and ``retry`` are kept as the format says but only ``id`` is reported.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None

    def push(self, data: bytes) -> None:
        """Add received bytes; :meth:`next_event` decodes them."""
        self._buffer += data

    def next_event(self) -> SseEvent | None:
        """The next whole event of the bytes pushed so far; None until more bytes come.

        Events before a malformed line are returned by earlier calls; the call that reaches
        the malformed line raises.
        """
        buffer = self._buffer
        while True:
            newline = _find_line_end(buffer, 0)
            if newline < 0:
                if len(buffer) > MAX_LINE_BYTES:
                    raise RemoteProtocolError(
                        f"an event-stream line of more than {MAX_LINE_BYTES} bytes without a "
                        "line ending",
                        code="line_too_long",
                    )
                return None
            after = newline + 1
            if buffer[newline] == 0x0D:
                if after == len(buffer):
                    return None
                if buffer[after] == 0x0A:
                    after += 1
            line = bytes(buffer[:newline])
            del buffer[:after]
            event = self._take(parse_sse_line(line))
            if event is not None:
                return event

    def feed(self, data: bytes) -> list[SseEvent]:
        """Push ``data`` and return every event now complete, in order."""
        self.push(data)
        return list(iter(self.next_event, None))

    def _take(self, line: SseField | None) -> SseEvent | None:
        if line is None:
            return None
        if line is END_OF_EVENT:
            data, event = self._data, self._event
            self._data, self._event = [], ""
            if not data:
                return None
            return SseEvent(event or "message", "\n".join(data), self._id)
        if line.name == "data":
            self._data.append(line.value)
        elif line.name == "event":
            self._event = line.value
        elif line.name == "id":
            self._id = line.value
        return None


def _find_line_end(buffer: bytearray, start: int) -> int:
    lf = buffer.find(b"\n", start)
    cr = buffer.find(b"\r", start)
    if lf < 0:
        return cr
    if cr < 0:
        return lf
    return min(lf, cr)


# -- completion chunks (pure) -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompletionChunk:
    """The one choice of a streamed completion event: new text, token ids, finish reason."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None


def _bad_chunk(what: str, value: object, accepted: str) -> RemoteProtocolError:
    return RemoteProtocolError(
        f"{what} is {_shown(json.dumps(value), 60)}; accepted: {accepted}", code="bad_chunk"
    )


def _server_message(error: object) -> str:
    if isinstance(error, Mapping):
        message = error.get("message")
        kind = error.get("type")
        if isinstance(message, str):
            return f"{kind}: {message}" if isinstance(kind, str) else message
    return _shown(json.dumps(error), 200)


def parse_completion_event(data: str) -> CompletionChunk | None:
    """Parse the data of one ``/v1/completions`` stream event.

    Returns None for an event without a choice (a usage-only event). Raises
    :class:`RemoteRequestFailed` for an ``{"error": ...}`` event and
    :class:`RemoteProtocolError` (``bad_json``, ``bad_chunk``) for data that is not such a
    chunk, naming the field and value.
    """
    try:
        body = json.loads(data)
    except json.JSONDecodeError as exc:
        raise RemoteProtocolError(
            f"event data {_shown(data)} is not JSON ({exc.msg} at {exc.pos})", code="bad_json"
        ) from None
    if not isinstance(body, dict):
        raise _bad_chunk("the event data", body, "a JSON object")
    if "error" in body:
        raise RemoteRequestFailed(
            f"the server failed the request: {_server_message(body['error'])}", status=None
        )
    choices = body.get("choices")
    if not isinstance(choices, list):
        raise _bad_chunk("'choices'", choices, "a list")
    if not choices:
        return None
    if len(choices) != 1:
        raise _bad_chunk("'choices'", choices, "one choice (the request asks for n = 1)")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise _bad_chunk("choices[0]", choice, "a JSON object")
    index = choice.get("index", 0)
    if index != 0 or isinstance(index, bool):
        raise _bad_chunk("choices[0].index", index, "0")
    text = choice.get("text")
    if not isinstance(text, str):
        raise _bad_chunk("choices[0].text", text, "a string")
    raw_ids = choice.get("token_ids")
    if raw_ids is None:
        token_ids: tuple[int, ...] = ()
    elif isinstance(raw_ids, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in raw_ids
    ):
        token_ids = tuple(raw_ids)
    else:
        raise _bad_chunk("choices[0].token_ids", raw_ids, "null or a list of token ids >= 0")
    reason = choice.get("finish_reason")
    if reason is not None and (not isinstance(reason, str) or not reason):
        raise _bad_chunk("choices[0].finish_reason", reason, "null or a non-empty string")
    return CompletionChunk(text, token_ids, reason)


def completion_body(model: str, prompt: str | Sequence[int], sampling: SamplingSpec) -> bytes:
    """The JSON body of a streamed ``/v1/completions`` request for ``sampling``.

    ``return_token_ids`` is vLLM's extension: each event then carries its new token ids.
    """
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt if isinstance(prompt, str) else list(prompt),
        "stream": True,
        "n": 1,
        "max_tokens": sampling.max_tokens,
        "min_tokens": sampling.min_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "stop": list(sampling.stop),
        "stop_token_ids": list(sampling.stop_token_ids),
        "ignore_eos": sampling.ignore_eos,
        "return_token_ids": True,
    }
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.structured_output is not None:
        # OpenAI's shape, which vLLM's server also takes on /v1/completions.
        body["response_format"] = sampling.structured_output.to_response_format()
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


# -- error replies and the model list (pure) -------------------------------------------


def error_message(body: bytes) -> str:
    """The server's message in an error reply's body (JSON or text), shortened for a message."""
    try:
        parsed = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _shown(body.decode("utf-8", "replace"), 200) if body else "(empty reply)"
    if isinstance(parsed, dict):
        if "error" in parsed:
            return _server_message(parsed["error"])
        if isinstance(parsed.get("message"), str):
            return str(parsed["message"])
    return _shown(json.dumps(parsed), 200)


def parse_model_list(body: bytes, model: str) -> tuple[tuple[str, ...], int | None]:
    """The names a ``/v1/models`` reply offers, and ``model``'s ``max_model_len`` if given.

    Raises :class:`RemoteProtocolError` (``bad_models``) for a body that is not such a list.
    """

    def bad(what: str) -> RemoteProtocolError:
        return RemoteProtocolError(
            f"the model list {what}; accepted: {{'data': [{{'id': name, ...}}, ...]}}",
            code="bad_models",
        )

    try:
        parsed = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise bad(f"is not JSON: {_shown(body)}") from None
    data = parsed.get("data") if isinstance(parsed, dict) else None
    if not isinstance(data, list):
        raise bad(f"has no 'data' list: {_shown(json.dumps(parsed))}")
    offered: list[str] = []
    max_model_len: int | None = None
    for entry in data:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise bad(f"has an entry without a string 'id': {_shown(json.dumps(entry))}")
        offered.append(entry["id"])
        length = entry.get("max_model_len")
        if entry["id"] == model and isinstance(length, int):
            max_model_len = length
    return tuple(offered), max_model_len
