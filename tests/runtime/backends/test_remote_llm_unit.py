"""The remote language-model client without vLLM: its pure parsers, its endpoint values, and
its error paths against a small local HTTP server that misbehaves on purpose (real sockets).

The server answers by the first path segment of the endpoint URL, which the client keeps
as a prefix (``http://127.0.0.1:PORT/<scenario>`` -> ``/<scenario>/v1/completions``).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psutil
import pytest

from runtime.backends.base import Delta
from runtime.backends.remote_llm import (
    BACKEND_NAME,
    END_OF_EVENT,
    MAX_LINE_BYTES,
    CompletionChunk,
    RemoteConnectionLost,
    RemoteDeltaStream,
    RemoteEndpoint,
    RemoteLlmStageClient,
    RemoteModelNotServed,
    RemoteProtocolError,
    RemoteRequestFailed,
    RemoteUnreachable,
    SseDecoder,
    SseEvent,
    SseField,
    completion_body,
    parse_completion_event,
    parse_sse_line,
)
from runtime.contracts import RequestKey
from runtime.contracts.llm_messages import SamplingSpec
from runtime.errors import (
    ConfigError,
    RequestCancelled,
    ResourceUnavailable,
    StageRetired,
    UsageError,
    WorkerDied,
)

SAMPLING = SamplingSpec(max_tokens=8, temperature=0.0)
#: The stated bound for an aborted stream to end (a local socket: a few milliseconds).
ABORT_BOUND_S = 1.0
#: The read timeout the stalling scenario runs under, and the slack allowed on top of it.
READ_TIMEOUT_S = 0.3
TIMEOUT_SLACK_S = 1.0


# -- the event-stream line parser ------------------------------------------------------


def test_sse_line_fields_comments_and_blank_lines() -> None:
    assert parse_sse_line(b'data: {"a": 1}') == SseField("data", '{"a": 1}')
    assert parse_sse_line(b"data:x") == SseField("data", "x")
    assert parse_sse_line(b"data:  two spaces") == SseField("data", " two spaces")
    assert parse_sse_line(b"data") == SseField("data", "")
    assert parse_sse_line(b"event: message") == SseField("event", "message")
    assert parse_sse_line(b"id: 7") == SseField("id", "7")
    assert parse_sse_line(b"retry: 1500") == SseField("retry", "1500")
    assert parse_sse_line(b": keep-alive") is None
    assert parse_sse_line(b"") is END_OF_EVENT
    assert parse_sse_line("data: h\u00e9llo \u2713".encode()) == SseField(
        "data", "h\u00e9llo \u2713"
    )


@pytest.mark.parametrize(
    ("raw", "code", "named"),
    [
        (b"data: \xff\xfe broken", "not_utf8", "not UTF-8"),
        (b"hello world", "unknown_field", "'hello world'"),
        (b"Data: x", "unknown_field", "'Data'"),
        (b'{"choices": []}', "unknown_field", "accepted: data, event, id, retry"),
        (b"retry: soon", "bad_retry", "'soon'"),
        (b"retry: -5", "bad_retry", "'-5'"),
        (b"data: a\x00b", "bad_line", "NUL"),
        (b"data: a\nb", "bad_line", "line break"),
        (b"data: " + b"x" * MAX_LINE_BYTES, "line_too_long", f"at most {MAX_LINE_BYTES}"),
    ],
)
def test_malformed_sse_lines_are_typed_errors_naming_the_fault(
    raw: bytes, code: str, named: str
) -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        parse_sse_line(raw)
    assert caught.value.code == code
    assert named in str(caught.value)


def test_the_decoder_handles_every_line_ending_and_split_reads() -> None:
    stream = b'data: {"n": 1}\r\n\r\ndata: a\rdata: b\r\r: note\nid: 9\ndata: c\n\n'
    expected = [
        SseEvent("message", '{"n": 1}'),
        SseEvent("message", "a\nb"),
        SseEvent("message", "c", "9"),
    ]
    assert SseDecoder().feed(stream) == expected
    # Byte by byte: a CR at the end of the bytes so far must wait for a possible LF.
    decoder = SseDecoder()
    events = [event for i in range(len(stream)) for event in decoder.feed(stream[i : i + 1])]
    assert events == expected


def test_the_decoder_keeps_named_events_and_drops_empty_ones() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"event: ping\n\n\n") == []
    assert decoder.feed(b"event: error\ndata: x\n\n") == [SseEvent("error", "x")]
    assert decoder.feed(b"data: partial") == []
    assert decoder.feed(b"\n\n") == [SseEvent("message", "partial")]


def test_the_decoder_refuses_an_endless_line_and_garbage() -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        SseDecoder().feed(b"data: " + b"x" * (MAX_LINE_BYTES + 1))
    assert caught.value.code == "line_too_long"
    with pytest.raises(RemoteProtocolError) as caught:
        SseDecoder().feed(b"<html>502 Bad Gateway</html>\n")
    assert caught.value.code == "unknown_field"
    assert "<html>502 Bad Gateway</html>" in str(caught.value)


def test_events_before_a_malformed_line_come_out_before_its_error() -> None:
    decoder = SseDecoder()
    decoder.push(b"data: one\n\ndata: two\n\nnonsense\ndata: three\n\n")
    assert decoder.next_event() == SseEvent("message", "one")
    assert decoder.next_event() == SseEvent("message", "two")
    with pytest.raises(RemoteProtocolError, match="names field 'nonsense'"):
        decoder.next_event()


# -- completion chunks -------------------------------------------------------------------


def _chunk(**choice: Any) -> str:
    return json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [choice]})


def test_completion_events_parse_text_token_ids_and_finish_reason() -> None:
    assert parse_completion_event(_chunk(index=0, text=" bu", token_ids=[319])) == (
        CompletionChunk(" bu", (319,), None)
    )
    assert parse_completion_event(
        _chunk(index=0, text="", finish_reason="length", token_ids=None)
    ) == CompletionChunk("", (), "length")
    assert parse_completion_event(json.dumps({"choices": [], "usage": {}})) is None


@pytest.mark.parametrize(
    ("data", "code", "named"),
    [
        ("{not json", "bad_json", "not JSON"),
        ("[1, 2]", "bad_chunk", "the event data is '[1, 2]'"),
        (json.dumps({"choices": "x"}), "bad_chunk", "'choices' is"),
        (json.dumps({"object": "x"}), "bad_chunk", "'choices' is 'null'"),
        (
            json.dumps({"choices": [{"text": "a"}, {"text": "b", "index": 1}]}),
            "bad_chunk",
            "one choice",
        ),
        (json.dumps({"choices": [7]}), "bad_chunk", "choices[0] is '7'"),
        (_chunk(index=1, text="a"), "bad_chunk", "choices[0].index is '1'"),
        (_chunk(index=0, text=5), "bad_chunk", "choices[0].text is '5'"),
        (_chunk(index=0), "bad_chunk", "choices[0].text is 'null'"),
        (_chunk(index=0, text="a", token_ids=[1, -2]), "bad_chunk", "choices[0].token_ids"),
        (_chunk(index=0, text="a", token_ids=[True]), "bad_chunk", "choices[0].token_ids"),
        (_chunk(index=0, text="a", token_ids="12"), "bad_chunk", "choices[0].token_ids"),
        (_chunk(index=0, text="a", finish_reason=3), "bad_chunk", "finish_reason is '3'"),
        (_chunk(index=0, text="a", finish_reason=""), "bad_chunk", "finish_reason"),
    ],
)
def test_malformed_completion_events_are_typed_errors_naming_the_field(
    data: str, code: str, named: str
) -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        parse_completion_event(data)
    assert caught.value.code == code
    assert named in str(caught.value), str(caught.value)


def test_an_error_event_is_a_failed_request_with_the_servers_message() -> None:
    data = json.dumps({"error": {"message": "prompt too long", "type": "BadRequestError"}})
    with pytest.raises(RemoteRequestFailed, match="BadRequestError: prompt too long") as caught:
        parse_completion_event(data)
    assert caught.value.status is None


def test_the_request_body_carries_every_sampling_field() -> None:
    spec = SamplingSpec(
        max_tokens=5,
        temperature=0.5,
        top_p=0.9,
        top_k=3,
        min_tokens=2,
        seed=11,
        stop=("x",),
        stop_token_ids=(2,),
        ignore_eos=True,
    )
    body = json.loads(completion_body("tiny", [1, 2, 3], spec))
    assert body == {
        "model": "tiny",
        "prompt": [1, 2, 3],
        "stream": True,
        "n": 1,
        "max_tokens": 5,
        "min_tokens": 2,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 3,
        "stop": ["x"],
        "stop_token_ids": [2],
        "ignore_eos": True,
        "return_token_ids": True,
        "seed": 11,
    }
    assert "seed" not in json.loads(completion_body("tiny", "hi", SAMPLING))


# -- the endpoint ------------------------------------------------------------------------


def test_endpoint_urls_are_split_once_and_v1_is_optional() -> None:
    plain = RemoteEndpoint("http://127.0.0.1:8000", "tiny")
    assert (plain.host, plain.port, plain.tls, plain.api_path) == ("127.0.0.1", 8000, False, "/v1")
    assert RemoteEndpoint("http://127.0.0.1:8000/v1/", "tiny").api_path == "/v1"
    proxied = RemoteEndpoint("https://models.example/llm", "tiny")
    assert (proxied.port, proxied.tls, proxied.api_path) == (443, True, "/llm/v1")
    assert proxied.url_of("completions") == "https://models.example/llm/v1/completions"
    ipv6 = RemoteEndpoint("http://[::1]:9000", "tiny")
    assert (ipv6.host, ipv6.host_header) == ("::1", "[::1]:9000")


def test_the_api_key_is_never_shown() -> None:
    endpoint = RemoteEndpoint("http://127.0.0.1:8000", "tiny", api_key="sk-secret")
    assert "sk-secret" not in repr(endpoint)
    with pytest.raises(ValueError, match="api_key") as caught:
        RemoteEndpoint("http://127.0.0.1:8000", "tiny", api_key="sk-secret\r\nX-Evil: 1")
    assert "sk-secret" not in str(caught.value)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"url": "ftp://127.0.0.1:21"}, "url = 'ftp://127.0.0.1:21' is not accepted; accepted: an"),
        ({"url": "127.0.0.1:8000"}, "url = '127.0.0.1:8000'"),
        ({"url": "http://"}, "a URL with a host name"),
        ({"url": "http://127.0.0.1:99999"}, "url = 'http://127.0.0.1:99999'"),
        ({"url": "http://127.0.0.1:0"}, "a port in 1..65535"),
        ({"url": "http://u:pw@127.0.0.1"}, "give api_key instead"),
        ({"url": "http://127.0.0.1/?x=1"}, "without '?query'"),
        ({"url": "http://127.0.0.1/a b"}, "without spaces"),
        ({"url": 8000}, "url = 8000"),
        ({"model": ""}, "model = ''"),
        ({"model": None}, "model = None"),
        ({"api_key": ""}, "api_key = <hidden>"),
        ({"connect_timeout_s": 0}, "connect_timeout_s = 0 is not accepted"),
        ({"read_timeout_s": float("inf")}, "read_timeout_s = inf"),
        ({"read_timeout_s": True}, "read_timeout_s = True"),
        ({"read_timeout_s": "60"}, "read_timeout_s = '60'"),
        ({"max_in_flight": 0}, "max_in_flight = 0 is not accepted; accepted: an integer >= 1"),
        ({"max_in_flight": 2.0}, "max_in_flight = 2.0"),
    ],
)
def test_bad_endpoints_are_refused_naming_the_field_and_what_is_accepted(
    kwargs: dict[str, Any], named: str
) -> None:
    values: dict[str, Any] = {"url": "http://127.0.0.1:8000", "model": "tiny", **kwargs}
    with pytest.raises(ValueError, match="accepted") as caught:
        RemoteEndpoint(**values)
    assert named in str(caught.value), str(caught.value)


# -- a misbehaving server ------------------------------------------------------------------


MODELS = {"object": "list", "data": [{"id": "tiny", "object": "model", "max_model_len": 2048}]}


def _event(text: str, token: int, finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": text, "token_ids": [token], "finish_reason": finish}
    return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"


GOOD_EVENTS = [_event(" a", 5), _event("b", 6), _event("c", 7, "length"), b"data: [DONE]\n\n"]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self.server.seen.append(("GET", self.path, dict(self.headers)))
        scenario = self.path.split("/")[1]
        if scenario == "models-not-json":
            self._reply(200, b"<html>hello</html>", "text/html")
        elif scenario == "models-shape":
            self._reply(200, json.dumps({"data": [{"name": "tiny"}]}).encode())
        elif scenario == "auth":
            self._reply(401, json.dumps({"error": {"message": "bad key"}}).encode())
        elif scenario == "slow-models":
            self.server.release.wait(10)
        else:
            self._reply(200, json.dumps(MODELS).encode())

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        body = json.loads(self.rfile.read(length))
        self.server.seen.append(("POST", self.path, body))
        scenario = self.path.split("/")[1]
        if scenario == "http400":
            error = {"error": {"message": "max_tokens must be at least 1", "type": "Bad"}}
            self._reply(400, json.dumps(error).encode())
            return
        if scenario == "html":
            self._reply(200, b"<html></html>", "text/html")
            return
        if scenario == "no-reply":
            self.server.release.wait(10)
            self.close_connection = True
            return
        self._start_stream()
        if scenario == "good":
            for event in GOOD_EVENTS:
                self._chunk(event)
            self._chunk(b"")
        elif scenario == "crlf":
            whole = b"".join(GOOD_EVENTS).replace(b"\n\n", b"\r\n\r\n")
            for i in range(0, len(whole), 7):
                self._chunk(whole[i : i + 7])
                time.sleep(0.001)
            self._chunk(b"")
        elif scenario == "garbage":
            self._chunk(_event(" a", 5) + b"this is not an event stream\n\n")
        elif scenario == "bad-json":
            self._chunk(_event(" a", 5) + b"data: {truncated\n\n")
        elif scenario == "error-event":
            self._chunk(_event(" a", 5))
            self._chunk(b'data: {"error": {"message": "engine failed", "type": "Internal"}}\n\n')
        elif scenario == "server-abort":
            usage_only = json.dumps({"choices": [], "usage": {"completion_tokens": 1}})
            self._chunk(_event(" a", 5) + f"data: {usage_only}\n\n".encode())
            self._chunk(_event("", 6, "abort"))
        elif scenario == "done-early":
            self._chunk(_event(" a", 5) + b"data: [DONE]\n\n")
        elif scenario == "bad-chunk-size":
            self.wfile.write(b"zz\r\n")
        elif scenario == "drop":
            self._chunk(_event(" a", 5))
            self._chunk(_event("b", 6))
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        elif scenario == "stall":
            self._chunk(_event(" a", 5))
            self.server.release.wait(10)
        elif scenario == "endless":
            self._endless()
        self.close_connection = True

    def _endless(self) -> None:
        until = time.monotonic() + 10
        try:
            while time.monotonic() < until:
                self._chunk(_event("x", 5))
                time.sleep(0.01)
        except (BrokenPipeError, ConnectionResetError):
            self.server.disconnected.set()

    def _reply(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


class Server(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.release = threading.Event()
        self.disconnected = threading.Event()
        self.seen: list[tuple[str, str, Any]] = []

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def url(self, scenario: str) -> str:
        return f"http://127.0.0.1:{self.port}/{scenario}"


@pytest.fixture
def server() -> Iterator[Server]:
    httpd = Server()
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="misbehaving-server"
    )
    thread.start()
    yield httpd
    httpd.release.set()
    httpd.shutdown()
    httpd.server_close()
    thread.join(10)
    assert not thread.is_alive()


def _client_sockets(port: int) -> list[Any]:
    """This process's open TCP sockets whose far end is ``port`` (the client's side)."""
    return [
        conn
        for conn in psutil.Process().net_connections(kind="tcp")
        if conn.raddr and conn.raddr.port == port
    ]


def _run(server: Server, scenario: str, body: Any, **endpoint: Any) -> None:
    """Run ``body(client)`` on a started client, then close it and check nothing is left."""
    threads_before = set(threading.enumerate())

    async def main() -> None:
        client = RemoteLlmStageClient(
            "llm", RemoteEndpoint(server.url(scenario), "tiny", **endpoint)
        )
        try:
            await client.start()
            await body(client)
        finally:
            await client.close()
        assert client.in_flight == ()
        assert _client_sockets(server.port) == []

    asyncio.run(main())
    new_threads = set(threading.enumerate()) - threads_before
    assert all("process_request" in t.name for t in new_threads), new_threads


async def _collect(stream: RemoteDeltaStream) -> list[Delta]:
    return [delta async for delta in stream]


async def _drain(stream: RemoteDeltaStream, texts: list[str]) -> None:
    async for delta in stream:
        texts.append(delta.text)


def test_a_good_stream_becomes_deltas_and_the_slot_is_freed(server: Server) -> None:
    async def body(client: RemoteLlmStageClient) -> None:
        key = RequestKey("r1", 2)
        stream = await client.generate(key, "hi", SAMPLING)
        assert stream.key == key
        assert list(client.in_flight) == [key]
        deltas = await _collect(stream)
        assert [(d.text, d.token_ids, d.index) for d in deltas] == [
            (" a", (5,), 0),
            ("b", (6,), 1),
            ("c", (7,), 2),
        ]
        assert [d.finished for d in deltas] == [False, False, True]
        assert deltas[-1].finish_reason == "length"
        assert all(d.key == key for d in deltas)
        assert client.in_flight == ()
        assert client.usable
        typed = client.record()
        # What the studio reads: no worker, reservation or placement here, and usable.
        assert (typed.worker, typed.reservation, typed.placement) == (None, None, None)
        assert (typed.route_name, typed.load_s, typed.usable) == ("", None, True)
        record = typed.to_json()
        assert record["backend"] == BACKEND_NAME
        assert record["offered_models"] == ["tiny"]
        assert record["max_model_len"] == 2048
        assert record["reservation"] is None

    _run(server, "good", body)
    method, path, sent = server.seen[-1]
    assert (method, path) == ("POST", "/good/v1/completions")
    assert sent["stream"] is True
    assert sent["return_token_ids"] is True


def test_events_split_across_reads_with_crlf_endings_decode_the_same(server: Server) -> None:
    async def body(client: RemoteLlmStageClient) -> None:
        deltas = await _collect(await client.generate(RequestKey("r"), "hi", SAMPLING))
        assert "".join(d.text for d in deltas) == " abc"
        assert deltas[-1].finish_reason == "length"

    _run(server, "crlf", body)


def test_the_api_key_is_sent_as_a_bearer_token(server: Server) -> None:
    async def body(client: RemoteLlmStageClient) -> None:
        await _collect(await client.generate(RequestKey("r"), "hi", SAMPLING))

    _run(server, "good", body, api_key="sk-local")
    method, _, headers = server.seen[0]
    assert method == "GET"
    assert headers["Authorization"] == "Bearer sk-local"


@pytest.mark.parametrize(
    ("scenario", "code"),
    [
        ("garbage", "unknown_field"),
        ("bad-json", "bad_json"),
        ("done-early", "done_before_finish"),
        ("bad-chunk-size", "bad_chunk_size"),
    ],
)
def test_a_malformed_stream_is_a_protocol_error_and_retires_the_stage(
    server: Server, scenario: str, code: str
) -> None:
    async def body(client: RemoteLlmStageClient) -> None:
        stream = await client.generate(RequestKey("r"), "hi", SAMPLING)
        texts: list[str] = []
        with pytest.raises(RemoteProtocolError) as caught:
            await _drain(stream, texts)
        # What came before the fault is delivered, then the error.
        assert texts == ([] if scenario == "bad-chunk-size" else [" a"])
        assert caught.value.code == code
        assert server.url(scenario) in str(caught.value)
        assert client.in_flight == ()
        assert not client.usable
        assert client.failure is caught.value
        with pytest.raises(StageRetired, match="recreate the stage"):
            await client.generate(RequestKey("next"), "hi", SAMPLING)

    _run(server, scenario, body)


def test_a_non_event_stream_reply_is_refused(server: Server) -> None:
    async def body(client: RemoteLlmStageClient) -> None:
        with pytest.raises(RemoteProtocolError, match="text/html") as caught:
            await client.generate(RequestKey("r"), "hi", SAMPLING)
        assert caught.value.code == "not_event_stream"
        assert client.in_flight == ()

    _run(server, "html", body)


def test_a_dropped_connection_mid_stream_is_connection_lost(server: Server) -> None:
    async def body(client: RemoteLlmStageClient) -> None:
        stream = await client.generate(RequestKey("r"), "hi", SAMPLING)
        texts: list[str] = []
        with pytest.raises(RemoteConnectionLost) as caught:
            await _drain(stream, texts)
        assert texts == [" a", "b"]
        assert isinstance(caught.value, WorkerDied)
        assert caught.value.url == server.url("drop") + "/v1/completions"
        assert "after 2 deltas" in str(caught.value)
        assert not client.usable
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()

    _run(server, "drop", body)


def test_a_silent_server_is_connection_lost_after_the_read_timeout(server: Server) -> None:
    async def body(client: RemoteLlmStageClient) -> None:
        stream = await client.generate(RequestKey("r"), "hi", SAMPLING)
        assert (await stream.__anext__()).text == " a"
        started = time.monotonic()
        with pytest.raises(RemoteConnectionLost, match=r"sent nothing for read_timeout_s = 0\.3 s"):
            await stream.__anext__()
        waited = time.monotonic() - started
        assert READ_TIMEOUT_S * 0.9 <= waited < READ_TIMEOUT_S + TIMEOUT_SLACK_S

    _run(server, "stall", body, read_timeout_s=READ_TIMEOUT_S)


def test_an_error_event_fails_the_request_but_not_the_stage(server: Server) -> None:
    async def body(client: RemoteLlmStageClient) -> None:
        stream = await client.generate(RequestKey("r"), "hi", SAMPLING)
        with pytest.raises(RemoteRequestFailed, match="Internal: engine failed"):
            await _collect(stream)
        assert client.usable
        assert client.in_flight == ()

    _run(server, "error-event", body)


def test_a_request_the_server_aborted_is_cancelled_but_the_stage_stays_usable(
    server: Server,
) -> None:
    async def body(client: RemoteLlmStageClient) -> None:
        stream = await client.generate(RequestKey("r"), "hi", SAMPLING)
        texts: list[str] = []
        with pytest.raises(RequestCancelled, match="request r: the server aborted the request"):
            await _drain(stream, texts)
        assert texts == [" a"]
        assert client.usable
        assert client.in_flight == ()

    _run(server, "server-abort", body)


def test_an_http_error_status_fails_generate_with_the_servers_message(server: Server) -> None:
    async def body(client: RemoteLlmStageClient) -> None:
        with pytest.raises(RemoteRequestFailed, match="answered 400") as caught:
            await client.generate(RequestKey("r"), "hi", SAMPLING)
        assert caught.value.status == 400
        assert "Bad: max_tokens must be at least 1" in str(caught.value)
        assert client.usable
        assert client.in_flight == ()

    _run(server, "http400", body)


def test_abort_closes_the_stream_promptly_and_the_server_sees_the_disconnect(
    server: Server,
) -> None:
    async def body(client: RemoteLlmStageClient) -> None:
        key = RequestKey("r", 1)
        stream = await client.generate(key, "hi", SAMPLING)
        await stream.__anext__()
        reader = asyncio.create_task(_collect(stream))
        await asyncio.sleep(0.05)
        assert not await client.abort(RequestKey("r", 0))
        started = time.monotonic()
        assert await client.abort(key)
        with pytest.raises(RequestCancelled, match="request r was aborted"):
            await reader
        assert time.monotonic() - started < ABORT_BOUND_S
        assert client.in_flight == ()
        assert _client_sockets(server.port) == []
        assert not await client.abort(key)
        assert client.usable

    _run(server, "endless", body)
    assert server.disconnected.wait(5)


async def _until_posted(server: Server) -> None:
    """Wait until the server has read a request's body (it then holds its reply)."""
    deadline = time.monotonic() + 5
    while not any(method == "POST" for method, _, _ in server.seen):
        assert time.monotonic() < deadline, "the server never received the request"
        await asyncio.sleep(0.01)


def test_abort_while_the_reply_is_awaited_closes_the_connection(server: Server) -> None:
    async def body(client: RemoteLlmStageClient) -> None:
        key = RequestKey("r", 1)
        opening = asyncio.create_task(client.generate(key, "hi", SAMPLING))
        await _until_posted(server)
        assert len(_client_sockets(server.port)) == 1
        started = time.monotonic()
        assert await client.abort(key)
        stream = await opening
        assert time.monotonic() - started < ABORT_BOUND_S
        assert client.in_flight == ()
        assert _client_sockets(server.port) == []
        with pytest.raises(RequestCancelled, match="request r was aborted"):
            await stream.__anext__()
        assert client.usable

    _run(server, "no-reply", body)


def test_cancelling_the_caller_of_generate_frees_the_slot_and_the_socket(server: Server) -> None:
    async def body(client: RemoteLlmStageClient) -> None:
        opening = asyncio.create_task(client.generate(RequestKey("r"), "hi", SAMPLING))
        await _until_posted(server)
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        assert client.in_flight == ()
        assert _client_sockets(server.port) == []
        assert client.usable

    _run(server, "no-reply", body)


def test_closing_a_stream_early_aborts_its_request(server: Server) -> None:
    async def body(client: RemoteLlmStageClient) -> None:
        stream = await client.generate(RequestKey("r"), "hi", SAMPLING)
        await stream.__anext__()
        await stream.aclose()
        assert client.in_flight == ()
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()

    _run(server, "endless", body)
    assert server.disconnected.wait(5)


def test_close_ends_open_streams_and_leaves_no_socket(server: Server) -> None:
    async def body(client: RemoteLlmStageClient) -> None:
        streams = [await client.generate(RequestKey(f"r{i}"), "hi", SAMPLING) for i in range(2)]
        await streams[0].__anext__()
        assert len(_client_sockets(server.port)) == 2
        await client.close()
        assert _client_sockets(server.port) == []
        for stream in streams:
            with pytest.raises(StageRetired, match="llm was closed"):
                await stream.__anext__()
        with pytest.raises(StageRetired, match="not running"):
            await client.generate(RequestKey("late"), "hi", SAMPLING)
        await client.close()

    _run(server, "endless", body)


def test_slots_are_limited_and_keys_are_unique(server: Server) -> None:
    async def body(client: RemoteLlmStageClient) -> None:
        assert client.max_num_seqs == 2
        first = await client.generate(RequestKey("a"), "hi", SAMPLING)
        with pytest.raises(ResourceUnavailable, match="request a is already in flight"):
            await client.generate(RequestKey("a"), "hi", SAMPLING)
        await client.generate(RequestKey("b"), "hi", SAMPLING)
        with pytest.raises(ResourceUnavailable, match="max_in_flight = 2"):
            await client.generate(RequestKey("c"), "hi", SAMPLING)
        await first.aclose()
        third = await client.generate(RequestKey("c"), "hi", SAMPLING)
        assert set(client.in_flight) == {RequestKey("b"), RequestKey("c")}
        await third.aclose()

    _run(server, "endless", body, max_in_flight=2)


def test_start_is_required_once(server: Server) -> None:
    async def main() -> None:
        client = RemoteLlmStageClient("llm", RemoteEndpoint(server.url("good"), "tiny"))
        with pytest.raises(StageRetired, match="not running"):
            await client.generate(RequestKey("r"), "hi", SAMPLING)
        await client.start()
        with pytest.raises(UsageError, match="already called"):
            await client.start()
        await client.close()

    asyncio.run(main())


def test_start_against_a_closed_port_names_the_url() -> None:
    # Bound but not listening: connecting is refused, and no other program can take the port.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        client = RemoteLlmStageClient("llm", RemoteEndpoint(f"http://127.0.0.1:{port}", "tiny"))
        with pytest.raises(RemoteUnreachable) as caught:
            asyncio.run(client.start())
    url = f"http://127.0.0.1:{port}/v1/models"
    assert caught.value.url == url
    assert url in str(caught.value)
    assert "(Connection refused)" in str(caught.value)
    assert isinstance(caught.value, ResourceUnavailable)
    assert not client.usable


def test_start_names_the_models_a_server_offers_when_the_model_is_missing(
    server: Server,
) -> None:
    client = RemoteLlmStageClient("llm", RemoteEndpoint(server.url("good"), "llama-70b"))
    with pytest.raises(RemoteModelNotServed) as caught:
        asyncio.run(client.start())
    assert isinstance(caught.value, ConfigError)
    assert caught.value.offered == ("tiny",)
    message = str(caught.value)
    assert "does not serve model 'llama-70b'; it offers 'tiny'" in message
    assert server.url("good") + "/v1/models" in message


@pytest.mark.parametrize(
    ("scenario", "error", "named"),
    [
        ("models-not-json", RemoteProtocolError, "the model list is not JSON"),
        ("models-shape", RemoteProtocolError, "without a string 'id'"),
        ("auth", RemoteRequestFailed, "answered 401 Unauthorized: bad key; check the endpoint"),
    ],
)
def test_start_refuses_a_bad_model_list(
    server: Server, scenario: str, error: type[Exception], named: str
) -> None:
    client = RemoteLlmStageClient("llm", RemoteEndpoint(server.url(scenario), "tiny"))
    with pytest.raises(error) as caught:
        asyncio.run(client.start())
    assert named in str(caught.value)
    assert not client.usable


def test_start_gives_up_on_a_silent_server_after_the_read_timeout(server: Server) -> None:
    client = RemoteLlmStageClient(
        "llm", RemoteEndpoint(server.url("slow-models"), "tiny", read_timeout_s=READ_TIMEOUT_S)
    )
    started = time.monotonic()
    with pytest.raises(RemoteUnreachable, match=r"did not answer within read_timeout_s = 0\.3 s"):
        asyncio.run(client.start())
    assert time.monotonic() - started < READ_TIMEOUT_S + TIMEOUT_SLACK_S
