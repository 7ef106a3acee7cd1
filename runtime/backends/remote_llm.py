"""``remote.openai.v1``: a language-model stage served by a remote OpenAI-compatible vLLM server.

The client speaks plain HTTP/1.1 to the server (``vllm serve`` or anything exposing the
same ``/v1/models`` and ``/v1/completions``), on asyncio streams from the standard
library: no threads, no extra dependencies. Each request is its own connection, streamed
as server-sent events (``"stream": true``) and read by :class:`RemoteDeltaStream`, which
yields the same :class:`~runtime.backends.vllm_client.Delta` values as the local vLLM
client. :meth:`RemoteLlmStageClient.abort` closes that request's connection, which makes
vLLM abort the request on its side.

No ledger charge: the model's memory lives on the server's machine, which this runtime
neither measures nor manages, so a remote stage reserves nothing and has no process to
retire. Its only local resources are its sockets, all closed by
:meth:`RemoteLlmStageClient.close`.

Failures, by what the caller should do:

* :class:`RemoteUnreachable` (a :class:`~runtime.errors.ResourceUnavailable`): no
  connection could be made (refused, unresolvable, timed out). Nothing was sent, so the
  server holds nothing for the request; trying again once the server is up is safe. Raised
  by ``generate()`` it also makes the stage unusable, as a lost connection does.
* :class:`RemoteConnectionLost` (a :class:`~runtime.errors.WorkerDied`): an established
  stream broke or went silent for ``read_timeout_s``. Like a dead local worker the output
  is cut short, and the stage becomes unusable: recreate it, which checks the server again.
* :class:`RemoteProtocolError`: the server's reply was not valid HTTP, server-sent events
  or completion chunks; ``code`` names the broken rule. The stage becomes unusable.
* :class:`RemoteModelNotServed` (a :class:`~runtime.errors.ConfigError`): ``start()`` found
  that the server does not serve the configured model; it lists the models offered.
* :class:`RemoteRequestFailed` (a :class:`~runtime.errors.ModelError`): the server refused
  or failed one request (an HTTP error status or an error in its stream); the stage stays
  usable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import ssl
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import SplitResult, urlsplit

from runtime.backends.base import StageRecord
from runtime.backends.llm import RequestDeltaStream, check_admission
from runtime.backends.vllm_client import Delta, StageRetired
from runtime.errors import (
    ConfigError,
    ExecutionError,
    ModelError,
    OmniError,
    RequestCancelled,
    ResourceUnavailable,
    UsageError,
    WorkerDied,
)

if TYPE_CHECKING:
    from runtime.contracts import RequestKey
    from runtime.contracts.llm_messages import SamplingSpec
    from runtime.engine.events import EventBus

log = logging.getLogger("omni.backends.remote_llm")

BACKEND_NAME: Final = "remote.openai.v1"
#: The longest HTTP header line, chunk-size line or event-stream line accepted, in bytes.
MAX_LINE_BYTES: Final = 1 << 20
#: The most header lines one HTTP response may have.
MAX_HEADERS: Final = 100
#: The largest non-streamed body read (the model list, an error reply), in bytes.
MAX_BODY_BYTES: Final = 8 << 20
#: The data of the event that ends an OpenAI-style stream.
DONE_DATA: Final = "[DONE]"
#: Event-stream fields (the WHATWG server-sent events format); any other is refused.
SSE_FIELDS: Final = frozenset({"data", "event", "id", "retry"})
USER_AGENT: Final = "omni-edge"
#: How long closing a socket may take before it is abandoned to the event loop, in seconds.
CLOSE_WAIT_S: Final = 2.0


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
    ``not_event_stream``) and the model list (``bad_models``); ``detail`` says what was
    wrong.
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


# -- the endpoint -----------------------------------------------------------------------


def _endpoint_error(name: str, shown: str, accepted: str) -> ValueError:
    return ValueError(f"remote endpoint: {name} = {shown} is not accepted; accepted: {accepted}")


def _check_seconds(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _endpoint_error(name, repr(value), "a finite number of seconds above 0")
    if not math.isfinite(value) or value <= 0:
        raise _endpoint_error(name, repr(value), "a finite number of seconds above 0")


@dataclass(frozen=True, slots=True)
class RemoteEndpoint:
    """Where a remote language-model stage is served, and how patiently to talk to it.

    ``url`` is the server's base URL, ``http://`` or ``https://``, with or without the
    trailing ``/v1`` (``http://host:8000`` and ``http://host:8000/v1`` are the same
    server); a path before ``/v1`` is kept (a reverse proxy's prefix). ``model`` is the
    name the server serves the model under. ``api_key`` is sent as a bearer token and never
    shown. ``read_timeout_s`` bounds the silence between two reads of a reply, not its
    whole length. ``max_in_flight`` caps this client's concurrent requests.
    """

    url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    max_in_flight: int = 8

    def __post_init__(self) -> None:
        if not isinstance(self.url, str):
            raise _endpoint_error("url", repr(self.url), "an http:// or https:// URL string")
        _split_url(self.url)
        if not isinstance(self.model, str) or not self.model.strip():
            raise _endpoint_error("model", repr(self.model), "the served model's name")
        if self.api_key is not None and (
            not isinstance(self.api_key, str)
            or not self.api_key
            or any(ord(c) < 0x21 or ord(c) == 0x7F for c in self.api_key)
        ):
            raise _endpoint_error(
                "api_key",
                "<hidden>",
                "null or a non-empty token without spaces or control characters",
            )
        _check_seconds("connect_timeout_s", self.connect_timeout_s)
        _check_seconds("read_timeout_s", self.read_timeout_s)
        if (
            not isinstance(self.max_in_flight, int)
            or isinstance(self.max_in_flight, bool)
            or self.max_in_flight < 1
        ):
            raise _endpoint_error("max_in_flight", repr(self.max_in_flight), "an integer >= 1")

    @property
    def tls(self) -> bool:
        return _split_url(self.url).scheme == "https"

    @property
    def host(self) -> str:
        hostname = _split_url(self.url).hostname
        assert hostname is not None
        return hostname

    @property
    def port(self) -> int:
        parts = _split_url(self.url)
        return parts.port or (443 if parts.scheme == "https" else 80)

    @property
    def api_path(self) -> str:
        """The path ``/models`` and ``/completions`` are appended to (ends in ``/v1``)."""
        path = _split_url(self.url).path.rstrip("/")
        return path if path.endswith("/v1") else f"{path}/v1"

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.tls else 80
        return host if self.port == default else f"{host}:{self.port}"

    def url_of(self, endpoint: str) -> str:
        """The full URL of ``endpoint`` (``models``, ``completions``), for messages."""
        parts = _split_url(self.url)
        return f"{parts.scheme}://{self.host_header}{self.api_path}/{endpoint}"


def _split_url(url: str) -> SplitResult:
    """``url`` split and checked: http(s), a host, a valid port, no credentials or query."""
    shown = repr(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise _endpoint_error("url", shown, f"a well-formed http(s) URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise _endpoint_error(
            "url", shown, f"an http:// or https:// URL (scheme {parts.scheme!r} is not)"
        )
    if not parts.hostname:
        raise _endpoint_error("url", shown, "a URL with a host name, e.g. http://127.0.0.1:8000")
    if parts.username is not None or parts.password is not None:
        raise _endpoint_error(
            "url", "<with credentials>", "a URL without user:password (give api_key instead)"
        )
    if parts.query or parts.fragment:
        raise _endpoint_error("url", shown, "a base URL without '?query' or '#fragment'")
    if port == 0:
        raise _endpoint_error("url", shown, "a port in 1..65535")
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        raise _endpoint_error("url", shown, "a URL without spaces or control characters")
    return parts


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
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


# -- HTTP/1.1 over asyncio streams ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Head:
    status: int
    reason: str
    headers: Mapping[str, str]

    def header(self, name: str) -> str | None:
        return self.headers.get(name)


async def _read_line(reader: asyncio.StreamReader, what: str, code: str = "bad_header") -> bytes:
    """One CRLF- or LF-terminated line without its ending; EOF raises IncompleteReadError."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise RemoteProtocolError(
            f"{what} is longer than {MAX_LINE_BYTES} bytes", code=code
        ) from None
    return line.rstrip(b"\r\n")


async def _read_head(reader: asyncio.StreamReader) -> _Head:
    status_line = await _read_line(reader, "the status line")
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise RemoteProtocolError(
            f"status line {_shown(status_line)}; accepted: 'HTTP/1.x <status> <reason>'",
            code="bad_status_line",
        )
    status = int(parts[1])
    reason = parts[2].decode("latin-1") if len(parts) > 2 else ""
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS + 1):
        line = await _read_line(reader, "a header line")
        if not line:
            return _Head(status, reason, headers)
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise RemoteProtocolError(
                f"header line {_shown(line)}; accepted: 'Name: value'", code="bad_header"
            )
        key = name.decode("latin-1").lower()
        text = value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    raise RemoteProtocolError(f"more than {MAX_HEADERS} header lines", code="bad_header")


class _Body:
    """The body of one response: chunked, sized or read to EOF. ``read()`` is b'' at the end."""

    def __init__(self, reader: asyncio.StreamReader, head: _Head) -> None:
        self._reader = reader
        encoding = (head.header("transfer-encoding") or "").lower()
        length = head.header("content-length")
        self._chunked = False
        self._remaining: int | None = None
        if encoding:
            if encoding != "chunked":
                raise RemoteProtocolError(
                    f"Transfer-Encoding {encoding!r}; accepted: chunked", code="bad_header"
                )
            self._chunked = True
        elif length is not None:
            if not length.isdigit():
                raise RemoteProtocolError(
                    f"Content-Length {length!r}; accepted: a byte count", code="bad_header"
                )
            self._remaining = int(length)
        self._chunk_left = 0
        self._ended = False

    async def read(self) -> bytes:
        if self._ended:
            return b""
        if self._chunked:
            return await self._read_chunked()
        if self._remaining is not None:
            if self._remaining == 0:
                self._ended = True
                return b""
            data = await self._reader.read(min(self._remaining, 65536))
            if not data:
                raise asyncio.IncompleteReadError(b"", self._remaining)
            self._remaining -= len(data)
            return data
        data = await self._reader.read(65536)
        if not data:
            self._ended = True
        return data

    async def _read_chunked(self) -> bytes:
        if self._chunk_left == 0:
            line = await _read_line(self._reader, "a chunk-size line", "bad_chunk_size")
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                size = -1
            if size < 0 or not size_text:
                raise RemoteProtocolError(
                    f"chunk-size line {_shown(line)}; accepted: a hexadecimal size",
                    code="bad_chunk_size",
                )
            if size == 0:
                while await _read_line(self._reader, "a trailer line"):
                    pass
                self._ended = True
                return b""
            self._chunk_left = size
        data = await self._reader.read(min(self._chunk_left, 65536))
        if not data:
            raise asyncio.IncompleteReadError(b"", self._chunk_left)
        self._chunk_left -= len(data)
        if self._chunk_left == 0:
            ending = await self._reader.readexactly(2)
            if ending != b"\r\n":
                raise RemoteProtocolError(
                    f"chunk ends with {_shown(ending)}; accepted: CRLF", code="bad_chunk_size"
                )
        return data

    async def read_all(self, limit: int) -> bytes:
        parts: list[bytes] = []
        size = 0
        while data := await self.read():
            size += len(data)
            if size > limit:
                raise RemoteProtocolError(
                    f"a reply body of more than {limit} bytes", code="bad_header"
                )
            parts.append(data)
        return b"".join(parts)


class _Connection:
    """One HTTP/1.1 exchange on its own socket (``Connection: close``)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.closed = False

    def abort(self) -> None:
        """Drop the socket now (no lingering send); a pending read wakes with EOF or an error."""
        if not self.closed:
            self.closed = True
            self.writer.transport.abort()

    async def close(self) -> None:
        self.abort()
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(CLOSE_WAIT_S):
                await self.writer.wait_closed()


def _error_message(body: bytes) -> str:
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


# -- the client -------------------------------------------------------------------------


class _Request:
    """One in-flight request: its connection, decoder and undelivered deltas."""

    __slots__ = ("body", "connection", "count", "decoder", "ended", "key", "pending", "stop")

    def __init__(self, key: RequestKey) -> None:
        self.key = key
        self.connection: _Connection | None = None
        self.body: _Body | None = None
        self.decoder = SseDecoder()
        self.pending: deque[Delta] = deque()
        self.count = 0
        self.ended = False
        #: Why the client stopped the request (abort or close): raised from the stream.
        self.stop: OmniError | None = None


class RemoteDeltaStream(RequestDeltaStream["RemoteLlmStageClient", _Request]):
    """The deltas of one remote request, in order. Closing it early aborts the request."""

    async def _next(self) -> Delta:
        try:
            return await self._client._next_delta(self._request)
        except BaseException:
            self._ended = True
            raise


class RemoteLlmStageClient:
    """The engine's client for one ``remote.openai.v1`` stage.

    Mirrors :class:`~runtime.backends.vllm_client.VllmStageClient`: ``start()``, then up
    to ``max_num_seqs`` (the endpoint's ``max_in_flight``) concurrent ``generate()``
    streams, ``abort()`` and ``close()``. It reserves nothing in the ledger (the memory is
    on the server) and owns no process or thread, only one socket per request in flight.
    ``events`` is accepted for a uniform constructor: with no worker to retire, a remote
    stage has nothing to publish.
    """

    def __init__(
        self, name: str, endpoint: RemoteEndpoint, *, events: EventBus | None = None
    ) -> None:
        self.name = name
        self.endpoint = endpoint
        self._events = events
        self._ssl = ssl.create_default_context() if endpoint.tls else None
        self._requests: dict[str, _Request] = {}
        self._failure: OmniError | None = None
        self._started = False
        self._ready = False
        self._closed = False
        self._offered: tuple[str, ...] = ()
        self._max_model_len: int | None = None
        self._check_s: float | None = None

    # -- state -----------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        return self._failure is None and not self._closed and self._ready

    @property
    def failure(self) -> OmniError | None:
        return self._failure

    @property
    def max_num_seqs(self) -> int:
        """How many requests may be in flight at once (the endpoint's ``max_in_flight``)."""
        return self.endpoint.max_in_flight

    @property
    def in_flight(self) -> tuple[RequestKey, ...]:
        """The requests holding a slot now."""
        return tuple(request.key for request in self._requests.values())

    @property
    def offered_models(self) -> tuple[str, ...]:
        """The models the server listed when ``start()`` checked it."""
        return self._offered

    # -- start -----------------------------------------------------------------------

    async def start(self) -> StageRecord:
        """Check that the server answers and serves the model; the record says what it found.

        Raises :class:`RemoteUnreachable` when no connection can be made,
        :class:`RemoteModelNotServed` when the model is not listed, and
        :class:`RemoteRequestFailed` / :class:`RemoteProtocolError` for a bad reply.
        """
        if self._started:
            raise UsageError(f"{self.name}: start() was already called")
        self._started = True
        began = time.monotonic()
        url = self.endpoint.url_of("models")
        connection = await self._connect(url)
        try:
            async with asyncio.timeout(self.endpoint.read_timeout_s):
                await self._send(connection, "GET", "models", None)
                head = await _read_head(connection.reader)
                body = await _Body(connection.reader, head).read_all(MAX_BODY_BYTES)
        except TimeoutError:
            raise RemoteUnreachable(
                f"{self.name}: {url} did not answer within read_timeout_s = "
                f"{self.endpoint.read_timeout_s} s",
                url=url,
            ) from None
        except (OSError, asyncio.IncompleteReadError) as exc:
            raise RemoteUnreachable(
                f"{self.name}: {url} closed the connection before answering ({_why(exc)})",
                url=url,
            ) from None
        except RemoteProtocolError as exc:
            raise self._located(exc, url) from None
        finally:
            await connection.close()
        if head.status != 200:
            raise RemoteRequestFailed(
                f"{self.name}: GET {url} answered {head.status} {head.reason}: "
                f"{_error_message(body)}{_auth_hint(head.status)}",
                status=head.status,
            )
        self._offered, self._max_model_len = self._parse_models(body, url)
        if self.endpoint.model not in self._offered:
            offered = ", ".join(repr(m) for m in self._offered) or "no models"
            raise RemoteModelNotServed(
                f"{self.name}: {url} does not serve model {self.endpoint.model!r}; it offers "
                f"{offered}",
                url=url,
                model=self.endpoint.model,
                offered=self._offered,
            )
        self._check_s = time.monotonic() - began
        self._ready = True
        return self.record()

    def _parse_models(self, body: bytes, url: str) -> tuple[tuple[str, ...], int | None]:
        def bad(what: str) -> RemoteProtocolError:
            return RemoteProtocolError(
                f"the model list {what}; accepted: {{'data': [{{'id': name, ...}}, ...]}}",
                code="bad_models",
                where=f"{self.name} ({url})",
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
            if entry["id"] == self.endpoint.model and isinstance(length, int):
                max_model_len = length
        return tuple(offered), max_model_len

    def record(self) -> StageRecord:
        """This stage's entry of ``execution_plan``."""
        endpoint = self.endpoint
        detail: dict[str, Any] = {
            "url": endpoint.url_of("completions"),
            "model": endpoint.model,
            "offered_models": list(self._offered),
            "max_model_len": self._max_model_len,
            "max_num_seqs": endpoint.max_in_flight,
            "authenticated": endpoint.api_key is not None,
            "connect_timeout_s": endpoint.connect_timeout_s,
            "read_timeout_s": endpoint.read_timeout_s,
            "check_s": self._check_s,
            "reservation": None,
            "usable": self.usable,
            "failure": None if self._failure is None else str(self._failure),
        }
        return StageRecord(stage=self.name, backend=BACKEND_NAME, detail=detail)

    # -- requests --------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise StageRetired(
                f"{self.name} is unusable ({self._failure}); recreate the stage to use it again"
            )
        if self._closed or not self._ready:
            raise StageRetired(f"{self.name} is not running")

    async def generate(
        self, key: RequestKey, prompt: str | Sequence[int], sampling: SamplingSpec
    ) -> RemoteDeltaStream:
        """Send a streamed completion request; return its stream of deltas.

        Returns once the server accepted the request (its reply's status line and headers
        arrived). Raises :class:`ResourceUnavailable` when ``max_num_seqs`` requests are in
        flight or ``key``'s request already is, :class:`RemoteUnreachable` when no
        connection can be made, and :class:`RemoteRequestFailed` when the server refuses
        the request (an HTTP error status, e.g. 400 for sampling it does not accept).
        """
        self._check_usable()
        check_admission(self.name, key, self._requests, self.max_num_seqs, "max_in_flight")
        body = completion_body(self.endpoint.model, prompt, sampling)
        request = _Request(key)
        self._requests[key.request_id] = request
        url = self.endpoint.url_of("completions")
        try:
            request.connection = await self._connect(url)
            if request.stop is None:
                await self._open_stream(request, body, url)
        except OmniError as exc:
            await self._end(request)
            if isinstance(exc, RemoteUnreachable | RemoteConnectionLost | RemoteProtocolError):
                self._fail(exc)
            raise
        except BaseException:
            # Cancelled: drop the socket without waiting, then let the cancellation through.
            self._drop(request)
            raise
        if request.stop is not None:
            # Aborted or closed while connecting: the socket opened after abort() returned.
            await self._end(request)
        return RemoteDeltaStream(self, request)

    async def _open_stream(self, request: _Request, body: bytes, url: str) -> None:
        connection = request.connection
        assert connection is not None
        try:
            async with asyncio.timeout(self.endpoint.read_timeout_s):
                await self._send(connection, "POST", "completions", body)
                head = await _read_head(connection.reader)
                reply = _Body(connection.reader, head)
                if head.status != 200:
                    message = _error_message(await reply.read_all(MAX_BODY_BYTES))
        except TimeoutError:
            raise RemoteConnectionLost(
                f"{self.name}: {url} sent no reply within read_timeout_s = "
                f"{self.endpoint.read_timeout_s} s",
                url=url,
            ) from None
        except (OSError, asyncio.IncompleteReadError) as exc:
            if request.stop is not None:
                return
            raise RemoteConnectionLost(
                f"{self.name}: {url} closed the connection before answering ({_why(exc)})",
                url=url,
            ) from None
        except RemoteProtocolError as exc:
            raise self._located(exc, url) from None
        if head.status != 200:
            raise RemoteRequestFailed(
                f"{self.name}: request {request.key.request_id}: POST {url} answered "
                f"{head.status} {head.reason}: {message}{_auth_hint(head.status)}",
                status=head.status,
            )
        kind = head.header("content-type") or ""
        if not kind.lower().startswith("text/event-stream"):
            raise self._located(
                RemoteProtocolError(
                    f"a 200 reply of type {kind!r}; accepted: text/event-stream",
                    code="not_event_stream",
                ),
                url,
            )
        request.body = reply

    async def _next_delta(self, request: _Request) -> Delta:
        """The request's next delta, reading the stream as far as needed."""
        url = self.endpoint.url_of("completions")
        while True:
            if request.pending:
                return request.pending.popleft()
            if request.stop is not None:
                raise request.stop from None
            if request.ended:
                raise StageRetired(f"{self.name}: request {request.key.request_id} has ended")
            assert request.body is not None
            try:
                async with asyncio.timeout(self.endpoint.read_timeout_s):
                    data = await request.body.read()
                if not data:
                    raise asyncio.IncompleteReadError(b"", None)
                request.decoder.push(data)
                received = time.monotonic()
                while not (request.pending and request.pending[-1].finished):
                    event = request.decoder.next_event()
                    if event is None:
                        break
                    self._on_event(request, event, received)
            except (OSError, asyncio.IncompleteReadError, OmniError) as exc:
                if request.stop is not None:
                    raise request.stop from None
                error = self._stream_error(exc, request, url)
                await self._end(request)
                if isinstance(error, RemoteConnectionLost | RemoteProtocolError):
                    self._fail(error)
                else:
                    log.warning("%s", error)
                # Deltas decoded before the fault are delivered first, then the error.
                request.stop = error
                continue
            except BaseException:
                # Cancelled: the stream's position is unknown, so the request cannot go on.
                self._drop(request)
                raise
            if request.pending and request.pending[-1].finished:
                await self._end(request)

    def _stream_error(
        self, exc: OSError | asyncio.IncompleteReadError | OmniError, request: _Request, url: str
    ) -> OmniError:
        """The typed error a failed read of ``request``'s stream becomes."""
        key = request.key.request_id
        if isinstance(exc, TimeoutError):
            return RemoteConnectionLost(
                f"{self.name}: request {key}: {url} sent nothing for read_timeout_s = "
                f"{self.endpoint.read_timeout_s} s",
                url=url,
            )
        if isinstance(exc, OSError | asyncio.IncompleteReadError):
            return RemoteConnectionLost(
                f"{self.name}: request {key}: the connection to {url} was lost after "
                f"{request.count} deltas, before the completion finished ({_why(exc)})",
                url=url,
            )
        if isinstance(exc, RemoteProtocolError):
            return self._located(exc, url)
        if isinstance(exc, RemoteRequestFailed):
            return RemoteRequestFailed(f"{self.name}: request {key}: {exc}", status=exc.status)
        if isinstance(exc, RequestCancelled):
            return RequestCancelled(f"{self.name}: request {key}: {exc}")
        return exc

    def _on_event(self, request: _Request, event: SseEvent, received: float) -> None:
        """Turn one decoded event into a delta (the finishing one ends the request)."""
        if event.data == DONE_DATA:
            raise RemoteProtocolError(
                f"the stream ended with {DONE_DATA} before a choice had a finish_reason",
                code="done_before_finish",
            )
        chunk = parse_completion_event(event.data)
        if chunk is None:
            return
        if chunk.finish_reason == "abort":
            raise RequestCancelled("the server aborted the request")
        if chunk.finish_reason == "error":
            raise RemoteRequestFailed("the server ended the request with an error", status=None)
        if not chunk.text and not chunk.token_ids and chunk.finish_reason is None:
            return
        request.pending.append(
            Delta(
                key=request.key,
                text=chunk.text,
                token_ids=chunk.token_ids,
                finished=chunk.finish_reason is not None,
                finish_reason=chunk.finish_reason,
                index=request.count,
                received_at=received,
            )
        )
        request.count += 1

    async def abort(self, key: RequestKey) -> bool:
        """Close ``key``'s stream; vLLM aborts a request whose client disconnected.

        Returns False when the request was not in flight. The stream then raises
        :class:`~runtime.errors.RequestCancelled`. The slot is free when this returns.
        """
        request = self._requests.get(key.request_id)
        if request is None or request.key.epoch != key.epoch:
            return False
        request.stop = RequestCancelled(f"{self.name}: request {key.request_id} was aborted")
        await self._end(request)
        return True

    def _drop(self, request: _Request) -> None:
        """The request is over: free its slot and drop its socket (closed on the next loop turn)."""
        request.ended = True
        if self._requests.get(request.key.request_id) is request:
            del self._requests[request.key.request_id]
        if request.connection is not None:
            request.connection.abort()

    async def _end(self, request: _Request) -> None:
        """The request is over: free its slot and wait until its socket is closed."""
        self._drop(request)
        if request.connection is not None:
            await request.connection.close()

    def _fail(self, error: OmniError) -> None:
        if self._failure is None:
            self._failure = error
            log.warning("%s", error)

    async def close(self) -> None:
        """Close every open stream (each then raises ``StageRetired``). Idempotent."""
        self._closed = True
        requests = list(self._requests.values())
        for request in requests:
            if request.stop is None:
                request.stop = StageRetired(f"{self.name} was closed")
            if request.connection is not None:
                request.connection.abort()
        for request in requests:
            await self._end(request)

    # -- plumbing --------------------------------------------------------------------

    async def _connect(self, url: str) -> _Connection:
        endpoint = self.endpoint
        try:
            async with asyncio.timeout(endpoint.connect_timeout_s):
                reader, writer = await asyncio.open_connection(
                    endpoint.host,
                    endpoint.port,
                    ssl=self._ssl,
                    server_hostname=endpoint.host if self._ssl is not None else None,
                    limit=MAX_LINE_BYTES,
                )
        except TimeoutError:
            raise RemoteUnreachable(
                f"{self.name}: no connection to {url} within connect_timeout_s = "
                f"{endpoint.connect_timeout_s} s; check that the server is running and reachable",
                url=url,
            ) from None
        except OSError as exc:
            raise RemoteUnreachable(
                f"{self.name}: cannot connect to {url} ({_why(exc)}); check that the server "
                "is running and listening there",
                url=url,
            ) from None
        return _Connection(reader, writer)

    async def _send(
        self, connection: _Connection, method: str, endpoint: str, body: bytes | None
    ) -> None:
        lines = [
            f"{method} {self.endpoint.api_path}/{endpoint} HTTP/1.1",
            f"Host: {self.endpoint.host_header}",
            f"User-Agent: {USER_AGENT}",
            "Connection: close",
        ]
        if body is not None:
            lines += [
                "Accept: text/event-stream",
                "Content-Type: application/json",
                f"Content-Length: {len(body)}",
            ]
        else:
            lines.append("Accept: application/json")
        if self.endpoint.api_key is not None:
            lines.append(f"Authorization: Bearer {self.endpoint.api_key}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        connection.writer.write(head + (body or b""))
        await connection.writer.drain()

    def _located(self, exc: RemoteProtocolError, url: str) -> RemoteProtocolError:
        if exc.where is not None:
            return exc
        return RemoteProtocolError(exc.detail, code=exc.code, where=f"{self.name} ({url})")


def _why(exc: BaseException) -> str:
    if isinstance(exc, asyncio.IncompleteReadError):
        return "the server closed it"
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _auth_hint(status: int) -> str:
    return "; check the endpoint's api_key" if status in (401, 403) else ""
