"""``remote.openai.v1``: a language-model stage served by a remote OpenAI-compatible vLLM server.

The client talks to the server (``vllm serve`` or anything exposing the same ``/v1/models``
and ``/v1/completions``) with ``httpx`` on the caller's event loop: no threads. Each
request is its own connection (none is kept alive), streamed as server-sent events
(``"stream": true``) decoded by :mod:`runtime.backends.openai_wire` into the same
:class:`~runtime.backends.vllm_client.Delta` values as the local vLLM client.
:meth:`RemoteLlmStageClient.abort` closes that request's connection, which makes vLLM
abort the request on its side. Proxy variables and ``.netrc`` are ignored: the route's
``url`` is where the client connects.

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
import logging
import math
import os
import ssl
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Final
from urllib.parse import SplitResult, urlsplit

import httpx

from runtime.backends.base import Delta, StageRecord, check_usable
from runtime.backends.llm import RequestDeltaStream, check_admission
from runtime.backends.openai_wire import (
    DONE_DATA,
    END_OF_EVENT,
    MAX_BODY_BYTES,
    MAX_LINE_BYTES,
    CompletionChunk,
    RemoteConnectionLost,
    RemoteModelNotServed,
    RemoteProtocolError,
    RemoteRequestFailed,
    RemoteUnreachable,
    SseDecoder,
    SseEvent,
    SseField,
    completion_body,
    error_message,
    parse_completion_event,
    parse_model_list,
    parse_sse_line,
)
from runtime.errors import OmniError, RequestCancelled, StageRetired, UsageError

if TYPE_CHECKING:
    from runtime.backends.base import LlmClient
    from runtime.contracts import RequestKey
    from runtime.contracts.llm_messages import SamplingSpec
    from runtime.events import EventBus

__all__ = [
    "BACKEND_NAME",
    "END_OF_EVENT",
    "MAX_LINE_BYTES",
    "CompletionChunk",
    "RemoteConnectionLost",
    "RemoteDeltaStream",
    "RemoteEndpoint",
    "RemoteLlmStageClient",
    "RemoteModelNotServed",
    "RemoteProtocolError",
    "RemoteRequestFailed",
    "RemoteUnreachable",
    "SseDecoder",
    "SseEvent",
    "SseField",
    "completion_body",
    "parse_completion_event",
    "parse_sse_line",
]

log = logging.getLogger("omni.backends.remote_llm")

BACKEND_NAME: Final = "remote.openai.v1"
USER_AGENT: Final = "omni-edge"
#: How httpx (h11) words a reply cut short by the server, as against a malformed one.
_DISCONNECT_MESSAGES: Final = ("Server disconnected", "peer closed connection")
#: h11's message prefixes for malformed replies, and the code each becomes.
_HTTP_FAULT_CODES: Final = (
    ("illegal status line", "bad_status_line"),
    ("illegal header line", "bad_header"),
    ("illegal chunk header", "bad_chunk_size"),
)


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


@dataclass(frozen=True, slots=True)
class RemoteStageDetail:
    """What a remote stage reports in ``execution_plan``: the endpoint and what its check found.

    It reserves nothing here (the memory is on the server), so its ``reservation`` is None.
    """

    endpoint: RemoteEndpoint
    offered_models: tuple[str, ...]
    max_model_len: int | None
    check_s: float | None
    usable: bool
    failure: str | None

    # A remote stage has no route, worker, reservation or placement here, and loads nothing.
    route_name: ClassVar[str] = ""
    ep: ClassVar[str] = ""
    worker: ClassVar[None] = None
    reservation: ClassVar[None] = None
    placement: ClassVar[None] = None
    load_s: ClassVar[None] = None
    warmup_s: ClassVar[None] = None
    worker_rss_bytes: ClassVar[None] = None
    model_dir: ClassVar[None] = None

    def to_json(self) -> dict[str, Any]:
        endpoint = self.endpoint
        return {
            "url": endpoint.url_of("completions"),
            "model": endpoint.model,
            "offered_models": list(self.offered_models),
            "max_model_len": self.max_model_len,
            "max_num_seqs": endpoint.max_in_flight,
            "authenticated": endpoint.api_key is not None,
            "connect_timeout_s": endpoint.connect_timeout_s,
            "read_timeout_s": endpoint.read_timeout_s,
            "check_s": self.check_s,
            "reservation": None,
            "usable": self.usable,
            "failure": self.failure,
        }


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


# -- the client -------------------------------------------------------------------------


class _Request:
    """One in-flight request: its HTTP exchange, decoder and undelivered deltas."""

    __slots__ = (
        "chunks",
        "count",
        "decoder",
        "ended",
        "key",
        "opening",
        "pending",
        "reading",
        "response",
        "stop",
    )

    def __init__(self, key: RequestKey) -> None:
        self.key = key
        #: Sending the request, until its reply's head arrives (closing cancels it).
        self.opening: asyncio.Task[httpx.Response] | None = None
        self.response: httpx.Response | None = None
        self.chunks: AsyncIterator[bytes] | None = None
        #: A read of ``chunks`` is pending: closing the response wakes it.
        self.reading = False
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
    on the server) and owns no process or thread, only one connection per request in
    flight. ``events`` is accepted for a uniform constructor: with no worker to retire, a
    remote stage has nothing to publish.
    """

    def __init__(
        self, name: str, endpoint: RemoteEndpoint, *, events: EventBus | None = None
    ) -> None:
        self.name = name
        self.endpoint = endpoint
        self._events = events
        self._http: httpx.AsyncClient | None = None
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
        self._http = _new_http(self.endpoint)
        try:
            self._offered, self._max_model_len = await self._check_models()
        except BaseException:
            http, self._http = self._http, None
            await http.aclose()
            raise
        self._check_s = time.monotonic() - began
        self._ready = True
        return self.record()

    async def _check_models(self) -> tuple[tuple[str, ...], int | None]:
        """The models the server offers (the endpoint's among them) and its max_model_len."""
        http = self._http
        assert http is not None
        url = self.endpoint.url_of("models")
        try:
            async with http.stream("GET", url, headers={"Accept": "application/json"}) as reply:
                body = await _read_body(reply, MAX_BODY_BYTES)
        except httpx.HTTPError as exc:
            unreachable = _unreachable(self.name, self.endpoint, exc, url)
            if unreachable is not None:
                raise unreachable from None
            if isinstance(exc, httpx.TimeoutException):
                raise RemoteUnreachable(
                    f"{self.name}: {url} did not answer within read_timeout_s = "
                    f"{self.endpoint.read_timeout_s} s",
                    url=url,
                ) from None
            fault = _http_fault(exc)
            if fault is None:
                raise RemoteUnreachable(
                    f"{self.name}: {url} closed the connection before answering ({_why(exc)})",
                    url=url,
                ) from None
            raise self._located(fault, url) from None
        except RemoteProtocolError as exc:
            raise self._located(exc, url) from None
        if reply.status_code != 200:
            raise RemoteRequestFailed(
                f"{self.name}: GET {url} answered {reply.status_code} {reply.reason_phrase}: "
                f"{error_message(body)}{_auth_hint(reply.status_code)}",
                status=reply.status_code,
            )
        try:
            offered, max_model_len = parse_model_list(body, self.endpoint.model)
        except RemoteProtocolError as exc:
            raise self._located(exc, url) from None
        if self.endpoint.model not in offered:
            shown = ", ".join(repr(m) for m in offered) or "no models"
            raise RemoteModelNotServed(
                f"{self.name}: {url} does not serve model {self.endpoint.model!r}; it offers "
                f"{shown}",
                url=url,
                model=self.endpoint.model,
                offered=offered,
            )
        return offered, max_model_len

    def record(self) -> StageRecord:
        """This stage's entry of ``execution_plan``."""
        detail = RemoteStageDetail(
            endpoint=self.endpoint,
            offered_models=self._offered,
            max_model_len=self._max_model_len,
            check_s=self._check_s,
            usable=self.usable,
            failure=None if self._failure is None else str(self._failure),
        )
        return StageRecord(stage=self.name, backend=BACKEND_NAME, detail=detail)

    # -- requests --------------------------------------------------------------------

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
        check_usable(self.name, self._failure, running=self.usable, recreate="stage")
        check_admission(self.name, key, self._requests, self.max_num_seqs, "max_in_flight")
        http = self._http
        assert http is not None
        url = self.endpoint.url_of("completions")
        outgoing = http.build_request(
            "POST",
            url,
            content=completion_body(self.endpoint.model, prompt, sampling),
            headers={"Accept": "text/event-stream", "Content-Type": "application/json"},
        )
        request = _Request(key)
        self._requests[key.request_id] = request
        # Its own task, so that abort() can cancel it while it connects or waits.
        request.opening = asyncio.create_task(http.send(outgoing, stream=True))
        try:
            await self._open_stream(request, url)
        except OmniError as exc:
            await self._end(request)
            if isinstance(exc, RemoteUnreachable | RemoteConnectionLost | RemoteProtocolError):
                self._fail(exc)
            raise
        except BaseException:
            # Cancelled: close the exchange, then let the cancellation through.
            await self._end(request)
            raise
        if request.stop is not None:
            # Aborted or closed while the request was being sent.
            await self._end(request)
        return RemoteDeltaStream(self, request)

    async def _open_stream(self, request: _Request, url: str) -> None:
        """Wait for the reply's head; check its status and type; keep its body to stream."""
        opening = request.opening
        assert opening is not None
        try:
            response = await opening
        except asyncio.CancelledError:
            if request.stop is None or _cancelling():
                raise
            return
        except httpx.HTTPError as exc:
            if request.stop is not None:
                return
            raise self._open_error(exc, url) from None
        if request.opening is opening:
            request.opening = None
            request.response = response
        if request.stop is not None:
            return
        status = response.status_code
        if status != 200:
            try:
                message = error_message(await _read_body(response, MAX_BODY_BYTES))
            except httpx.HTTPError as exc:
                if request.ended:
                    return  # abort() or close() closed the response being read
                raise self._open_error(exc, url) from None
            except RemoteProtocolError as exc:
                raise self._located(exc, url) from None
            raise RemoteRequestFailed(
                f"{self.name}: request {request.key.request_id}: POST {url} answered "
                f"{status} {response.reason_phrase}: {message}{_auth_hint(status)}",
                status=status,
            )
        kind = response.headers.get("content-type", "")
        if not kind.lower().startswith("text/event-stream"):
            raise self._located(
                RemoteProtocolError(
                    f"a 200 reply of type {kind!r}; accepted: text/event-stream",
                    code="not_event_stream",
                ),
                url,
            )
        request.chunks = response.aiter_bytes()

    def _open_error(self, exc: httpx.HTTPError, url: str) -> OmniError:
        """The typed error a failure before a reply's body becomes."""
        unreachable = _unreachable(self.name, self.endpoint, exc, url)
        if unreachable is not None:
            return unreachable
        if isinstance(exc, httpx.TimeoutException):
            return RemoteConnectionLost(
                f"{self.name}: {url} sent no reply within read_timeout_s = "
                f"{self.endpoint.read_timeout_s} s",
                url=url,
            )
        fault = _http_fault(exc)
        if fault is None:
            return RemoteConnectionLost(
                f"{self.name}: {url} closed the connection before answering ({_why(exc)})",
                url=url,
            )
        return self._located(fault, url)

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
            chunks = request.chunks
            assert chunks is not None
            try:
                request.reading = True
                try:
                    data = await anext(chunks)
                finally:
                    request.reading = False
                request.decoder.push(data)
                received = time.monotonic()
                while not (request.pending and request.pending[-1].finished):
                    event = request.decoder.next_event()
                    if event is None:
                        break
                    self._on_event(request, event, received)
            except (StopAsyncIteration, httpx.HTTPError, OmniError) as exc:
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
                await self._end(request)
                raise
            if request.pending and request.pending[-1].finished:
                await self._end(request)

    def _stream_error(
        self, exc: StopAsyncIteration | httpx.HTTPError | OmniError, request: _Request, url: str
    ) -> OmniError:
        """The typed error a failed read of ``request``'s stream becomes."""
        key = request.key.request_id
        if isinstance(exc, httpx.TimeoutException):
            return RemoteConnectionLost(
                f"{self.name}: request {key}: {url} sent nothing for read_timeout_s = "
                f"{self.endpoint.read_timeout_s} s",
                url=url,
            )
        if isinstance(exc, httpx.HTTPError):
            fault = _http_fault(exc)
            if fault is not None:
                return self._located(fault, url)
        if isinstance(exc, StopAsyncIteration | httpx.HTTPError):
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
        :class:`~runtime.errors.RequestCancelled`. The slot is free and the connection
        closed when this returns.
        """
        request = self._requests.get(key.request_id)
        if request is None or request.key.epoch != key.epoch:
            return False
        request.stop = RequestCancelled(f"{self.name}: request {key.request_id} was aborted")
        await self._end(request)
        return True

    async def _end(self, request: _Request) -> None:
        """The request is over: free its slot and close its connection."""
        request.ended = True
        if self._requests.get(request.key.request_id) is request:
            del self._requests[request.key.request_id]
        opening, request.opening = request.opening, None
        if opening is not None:
            # Not yet answered: cancelling the send closes its connection.
            opening.cancel()
            await asyncio.wait({opening})
            if not opening.cancelled() and opening.exception() is None:
                request.response = opening.result()
        chunks, request.chunks = request.chunks, None
        if isinstance(chunks, AsyncGenerator) and not request.reading:
            # A pending read ends by itself when the response below is closed.
            await chunks.aclose()
        if request.response is not None:
            await request.response.aclose()

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
        for request in requests:
            await self._end(request)
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()

    def _located(self, exc: RemoteProtocolError, url: str) -> RemoteProtocolError:
        if exc.where is not None:
            return exc
        return RemoteProtocolError(exc.detail, code=exc.code, where=f"{self.name} ({url})")


if TYPE_CHECKING:
    # The engine imports this module only for a pipeline that names a remote route, so it
    # holds the client as an LlmClient: checked here.
    def _is_an_llm_client(client: RemoteLlmStageClient) -> LlmClient:
        return client


# -- plumbing ---------------------------------------------------------------------------


def _new_http(endpoint: RemoteEndpoint) -> httpx.AsyncClient:
    """The stage's HTTP client: no kept-alive connection, no proxy or .netrc from the environment."""
    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
    if endpoint.api_key is not None:
        headers["Authorization"] = f"Bearer {endpoint.api_key}"
    return httpx.AsyncClient(
        headers=headers,
        # read (and write) bound the silence between two reads, not a reply's whole length.
        timeout=httpx.Timeout(endpoint.read_timeout_s, connect=endpoint.connect_timeout_s),
        # Each request has its own connection, so closing a request's touches no other.
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
        # The system's certificate store, as the rest of the system trusts it.
        verify=ssl.create_default_context() if endpoint.tls else True,
        trust_env=False,
    )


async def _read_body(response: httpx.Response, limit: int) -> bytes:
    """A non-streamed reply's whole body; more than ``limit`` bytes is refused."""
    parts: list[bytes] = []
    size = 0
    async for data in response.aiter_bytes():
        size += len(data)
        if size > limit:
            raise RemoteProtocolError(f"a reply body of more than {limit} bytes", code="bad_header")
        parts.append(data)
    return b"".join(parts)


def _unreachable(
    name: str, endpoint: RemoteEndpoint, exc: httpx.HTTPError, url: str
) -> RemoteUnreachable | None:
    """The error a failed connection attempt becomes; None when ``exc`` is no such failure."""
    if isinstance(exc, httpx.ConnectTimeout):
        return RemoteUnreachable(
            f"{name}: no connection to {url} within connect_timeout_s = "
            f"{endpoint.connect_timeout_s} s; check that the server is running and reachable",
            url=url,
        )
    if isinstance(exc, httpx.ConnectError):
        return RemoteUnreachable(
            f"{name}: cannot connect to {url} ({_why(exc)}); check that the server "
            "is running and listening there",
            url=url,
        )
    return None


def _http_fault(exc: httpx.HTTPError) -> RemoteProtocolError | None:
    """The protocol error a malformed reply is; None for a connection cut short or timed out."""
    if isinstance(exc, httpx.NetworkError | httpx.TimeoutException):
        return None
    message = str(exc)
    if isinstance(exc, httpx.RemoteProtocolError) and message.startswith(_DISCONNECT_MESSAGES):
        return None
    for prefix, code in _HTTP_FAULT_CODES:
        if message.startswith(prefix):
            return RemoteProtocolError(message, code=code)
    return RemoteProtocolError(message or type(exc).__name__, code="bad_http")


def _cancelling() -> bool:
    """Whether the current task is being cancelled (rather than a task it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _why(exc: BaseException) -> str:
    """What ended a connection, in a few words: the operating system's reason if it gave one."""
    seen: set[int] = set()
    causes: list[BaseException] = [exc]
    while causes:
        cause = causes.pop(0)
        if id(cause) in seen:
            continue
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.errno:
            return os.strerror(cause.errno)
        if isinstance(cause, BaseExceptionGroup):
            causes.extend(cause.exceptions)
        causes.extend(c for c in (cause.__cause__, cause.__context__) if c is not None)
    if isinstance(exc, StopAsyncIteration) or str(exc).startswith(_DISCONNECT_MESSAGES):
        return "the server closed it"
    return str(exc) or type(exc).__name__


def _auth_hint(status: int) -> str:
    return "; check the endpoint's api_key" if status in (401, 403) else ""
