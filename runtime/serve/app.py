"""The ASGI application: OpenAI's endpoints over the served pipelines.

- ``GET /v1/models``: every pipeline as a model (``id`` = pipeline name, ``kind``).
- ``POST /v1/chat/completions``: pipelines with a language-model stage, streamed (SSE) or not.
- ``POST /v1/audio/speech``: speech pipelines; a WAV (streaming size) or raw PCM16 streamed as
  it is produced.
- ``POST /v1/audio/transcriptions``: transcription pipelines, OpenAI's multipart form in;
  json, text, verbose_json, srt or vtt out, or server-sent transcript events
  (:mod:`runtime.serve.transcriptions`).
- ``POST /v1/embeddings``: embedding pipelines, OpenAI's request and answer
  (:mod:`runtime.serve.embeddings`).
- ``POST /v1/omni/run``: graph pipelines, an ``.npz`` in and an ``.npz`` out
  (``?model=NAME``).
- ``GET /v1/omni/pipelines``: each pipeline's state and the requests holding its slots.

- ``GET /metrics``: Prometheus metrics (:mod:`runtime.serve.metrics`).

Admission is the runtime's; a request to a busy pipeline waits in the pipeline's bounded FIFO
queue (:mod:`runtime.serve.queueing`), and only a full queue answers 429 with
``Retry-After``. A client that disconnects leaves the queue, or stops its request between
stage calls through the pipeline's session (:meth:`~runtime.api.RequestHandle.stop`).
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute

from runtime.adapters.embed import EmbeddingInputError
from runtime.api import AudioChunk
from runtime.audio.reader import TARGET_RATE
from runtime.errors import OmniError
from runtime.serve.embeddings import (
    collect_embeddings,
    embeddings_body,
    parse_embedding_request,
)
from runtime.serve.endpoints import PATHS
from runtime.serve.errors import AUTHENTICATION, NOT_FOUND, ApiError, from_runtime_error, invalid
from runtime.serve.limits import ServeLimits
from runtime.serve.metrics import CONTENT_TYPE as METRICS_MEDIA
from runtime.serve.metrics import ServeMetrics
from runtime.serve.queueing import DEFAULT_MAX_QUEUE, AdmissionQueue
from runtime.serve.realtime import RealtimeEndpoint
from runtime.serve.registry import CHAT, EMBEDDING, GRAPH, SPEECH, TRANSCRIPTION, Submitted
from runtime.serve.requests import (
    decode_json,
    dump_npz,
    load_npz,
    parse_chat_request,
    parse_speech_request,
)
from runtime.serve.transcriptions import (
    collect_transcript,
    decode_upload,
    parse_transcription_form,
    read_transcription_form,
    transcript_events,
    transcription_body,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from starlette.requests import HTTPConnection, Request
    from starlette.types import Receive, Scope, Send

    from runtime.api import OmniRequestOutput
    from runtime.serve.registry import PipelineRegistry, ServedPipeline
    from runtime.serve.requests import ChatRequest

log = logging.getLogger("omni.serve")

T = TypeVar("T")
NPZ_MEDIA: Final = "application/x-npz"
#: The size a streamed WAV declares: unknown, as OpenAI's streamed WAVs do.
STREAMING_SIZE: Final = 0xFFFFFFFF
#: Requests the server remembers for :meth:`ServeStats.recent`.
RECENT: Final = 200


@dataclass(frozen=True, slots=True)
class ServedRequest:
    """One answered request, as the studio lists it: ``duration_s`` runs until the answer
    started (a streamed answer goes on after)."""

    method: str
    path: str
    model: str | None
    status: int
    duration_s: float
    finished_at: float


class ServeStats:
    """Counts of answered requests and the most recent ones; ``listener`` hears each."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._recent: deque[ServedRequest] = deque(maxlen=RECENT)
        self.total = 0
        self.listener: Callable[[ServedRequest], None] | None = None
        #: Hears a pipeline's queue depth (name, depth) whenever it changes.
        self.queue_listener: Callable[[str, int], None] | None = None

    def record(self, served: ServedRequest) -> None:
        with self._lock:
            self.total += 1
            self._recent.append(served)
        listener = self.listener
        if listener is not None:
            listener(served)

    def recent(self) -> list[ServedRequest]:
        with self._lock:
            return list(self._recent)

    def record_queue(self, name: str, depth: int) -> None:
        listener = self.queue_listener
        if listener is not None:
            listener(name, depth)


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


class _ClosingStream(StreamingResponse):
    """A streamed answer whose request is closed (cancelled unless it ended) however the
    stream ends: finished, failed, or cut by the client's disconnect."""

    def __init__(
        self, content: AsyncIterator[bytes], submitted: Submitted, media_type: str
    ) -> None:
        super().__init__(content, media_type=media_type)
        self._submitted = submitted

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._submitted.close()


def _has_room(pipeline: ServedPipeline) -> bool:
    """Whether the pipeline would admit a request now, by its count of requests admitted and
    not wound up (a pipeline that is not ready answers for itself: its 503)."""
    status = pipeline.status()
    if status.state != "ready":
        return True
    return status.in_flight < status.concurrency + status.max_queued


def _error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def _read_body(request: Request, limit: int, what: str) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(
            413,
            f"the {what} body has {declared} bytes; accepted: at most {limit}",
            code="request_too_large",
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(
                413,
                f"the {what} body has more than {limit} bytes; accepted: at most {limit}",
                code="request_too_large",
            )
        chunks.append(chunk)
    return b"".join(chunks)


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result, or ClientGone as soon as the client disconnects (``work`` is then
    cancelled)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        # The handler itself was cancelled (the server stops): so is the work.
        task.cancel()
        raise
    finally:
        watch.cancel()
    if task.done():
        return task.result()
    task.cancel()
    raise ClientGone


def _sse(document: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(document, separators=(',', ':'))}\n\n".encode()


def _usage(output: OmniRequestOutput | None, prompt_tokens: int) -> dict[str, int]:
    completion = 0
    if output is not None:
        tokens = output.metrics.get("tokens")
        if isinstance(tokens, int):
            completion = tokens
        else:
            completion = sum(
                int(call.get("tokens") or 0) for call in output.metrics.get("stages", ())
            )
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }


def _finish_reason(output: OmniRequestOutput | None) -> str:
    if output is None:
        return "stop"
    reason = output.metrics.get("finish_reason")
    if reason is None:
        reasons = [call.get("finish_reason") for call in output.metrics.get("stages", ())]
        reason = next((r for r in reversed(reasons) if r), None)
    return "length" if reason == "length" else "stop"


def _prompt_tokens(output: OmniRequestOutput | None) -> int:
    if output is None:
        return 0
    tokens = output.metrics.get("prompt_tokens")
    return tokens if isinstance(tokens, int) else 0


def _pcm16(pcm: np.ndarray) -> bytes:
    samples: np.ndarray = (np.clip(pcm, -1.0, 1.0) * 32767.0).astype("<i2")
    return samples.tobytes()


def wav_header(sample_rate: int, *, data_bytes: int = STREAMING_SIZE) -> bytes:
    """A 44-byte header of mono 16-bit PCM; by default with the streaming (unknown) size."""
    riff = STREAMING_SIZE if data_bytes == STREAMING_SIZE else 36 + data_bytes
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", data_bytes)
    )


class ServeApp:
    """The endpoints over one registry; :attr:`asgi` is the Starlette application."""

    def __init__(
        self,
        registry: PipelineRegistry,
        *,
        api_key: str | None = None,
        limits: ServeLimits | None = None,
        stats: ServeStats | None = None,
        max_queue: int = DEFAULT_MAX_QUEUE,
    ) -> None:
        self.registry = registry
        self.limits = limits or ServeLimits()
        self.stats = stats or ServeStats()
        #: Each pipeline's queue of requests waiting for it (``--max-queue``).
        self.queues = {
            name: AdmissionQueue(
                name,
                max_queue,
                pipeline.events,
                has_room=functools.partial(_has_room, pipeline),
                on_change=self.stats.record_queue,
            )
            for name, pipeline in registry.pipelines.items()
        }
        self.metrics = ServeMetrics(self._live)
        self._api_key = api_key.encode() if api_key else None
        self.created = int(time.time())
        routes = [
            Route("/v1/models", self._wrap(self.models), methods=["GET"]),
            Route("/v1/models/{model:path}", self._wrap(self.model), methods=["GET"]),
            Route("/v1/chat/completions", self._wrap(self.chat), methods=["POST"]),
            Route("/v1/embeddings", self._wrap(self.embeddings), methods=["POST"]),
            Route("/v1/audio/speech", self._wrap(self.speech), methods=["POST"]),
            Route("/v1/audio/transcriptions", self._wrap(self.transcriptions), methods=["POST"]),
            Route("/v1/omni/run", self._wrap(self.graph_run), methods=["POST"]),
            Route("/v1/omni/pipelines", self._wrap(self.pipelines), methods=["GET"]),
            Route("/metrics", self._wrap(self.prometheus), methods=["GET"]),
            WebSocketRoute(
                "/v1/realtime", RealtimeEndpoint(registry, self._check_key, self.metrics).serve
            ),
        ]
        self.asgi = Starlette(
            routes=routes, exception_handlers={HTTPException: self._http_exception}
        )

    # -- plumbing ----------------------------------------------------------------------

    async def _http_exception(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            error = ApiError(
                404,
                f"no endpoint {request.url.path}; accepted: {', '.join(PATHS)}",
                type=NOT_FOUND,
                code="unknown_url",
            )
        else:
            error = ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")
        return _error_response(error)

    def _check_key(self, request: HTTPConnection) -> None:
        if self._api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), self._api_key
        ):
            problem = "no API key was given" if not header else "the API key is not the server's"
            raise ApiError(
                401,
                f"{problem}; accepted: the header 'Authorization: Bearer <key>' with the key "
                "the server was started with",
                type=AUTHENTICATION,
                code="invalid_api_key",
            )

    def _wrap(
        self, handler: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            started = time.perf_counter()
            status = 500
            try:
                self._check_key(request)
                response = await handler(request)
                status = response.status_code
                return response
            except ApiError as refused:
                status = refused.status
                return _error_response(refused)
            except OmniError as exc:
                mapped = from_runtime_error(exc)
                status = mapped.status
                return _error_response(mapped)
            except (ClientGone, ClientDisconnect):
                # ClientDisconnect: the client went away while its body was being read.
                status = 499
                return Response(status_code=499)
            finally:
                served = ServedRequest(
                    request.method,
                    request.url.path,
                    request.scope.get("omni.model"),
                    status,
                    time.perf_counter() - started,
                    time.time(),
                )
                self.stats.record(served)
                route = request.scope.get("route")
                endpoint = getattr(route, "path", request.url.path)
                self.metrics.request(endpoint, served.model, status, served.duration_s)

        return endpoint

    def _pipeline(self, request: Request, name: str, kind: str) -> ServedPipeline:
        request.scope["omni.model"] = name
        pipeline = self.registry.get(name)
        if pipeline.kind != kind:
            fitting = sorted(p.name for p in self.registry.pipelines.values() if p.kind == kind)
            raise invalid(
                f"the model {name!r} is a {pipeline.kind} pipeline; {request.url.path} takes "
                f"{kind} pipelines: {', '.join(fitting) or 'none is served'}",
                param="model",
                code="wrong_model_kind",
            )
        return pipeline

    async def _submit(
        self, pipeline: ServedPipeline, inputs: Any, request: Request | None = None
    ) -> Submitted:
        """Admit a request, waiting in the pipeline's queue while it is busy (429 when the
        queue is full); with ``request``, a client that disconnects meanwhile leaves the
        queue at once (ClientGone)."""
        queue = self.queues.get(pipeline.name)
        if queue is None:
            # Not served by this application's registry when it started: no queue.
            return await asyncio.get_running_loop().run_in_executor(None, pipeline.submit, inputs)
        admission = queue.admit(functools.partial(pipeline.submit, inputs))
        if request is None:
            return await admission
        return await _unless_disconnected(request, admission)

    def _live(self) -> list[tuple[str, int, int]]:
        """Each pipeline's name, requests queued and requests in flight (any thread)."""
        return [
            (name, queue.depth, pipeline.status().in_flight)
            for name, pipeline in list(self.registry.pipelines.items())
            if (queue := self.queues.get(name)) is not None
        ]

    def close_queues(self, reason: str = "the server stopped") -> None:
        """Fail every queued request with a 503 and queue no more (any thread)."""
        for queue in self.queues.values():
            queue.close(reason)

    # -- endpoints ---------------------------------------------------------------------

    def _model_entry(self, pipeline: ServedPipeline) -> dict[str, Any]:
        return {
            "id": pipeline.name,
            "object": "model",
            "created": self.created,
            "owned_by": "omni-edge",
            "kind": pipeline.kind,
        }

    async def models(self, request: Request) -> Response:
        entries = [self._model_entry(p) for p in self.registry.pipelines.values()]
        return JSONResponse({"object": "list", "data": entries})

    async def model(self, request: Request) -> Response:
        name = request.path_params["model"]
        request.scope["omni.model"] = name
        return JSONResponse(self._model_entry(self.registry.get(name)))

    async def pipelines(self, request: Request) -> Response:
        statuses = []
        for name, pipeline in self.registry.pipelines.items():
            entry = pipeline.status().to_json()
            queue = self.queues.get(name)
            entry["queued"] = queue.depth if queue is not None else 0
            entry["max_queue"] = queue.max_queue if queue is not None else 0
            statuses.append(entry)
        return JSONResponse({"object": "list", "data": statuses})

    async def prometheus(self, request: Request) -> Response:
        # Open like the other endpoints when the server has no key; with one, it needs it.
        return Response(self.metrics.exposition(), media_type=METRICS_MEDIA)

    async def chat(self, request: Request) -> Response:
        document = decode_json(await _read_body(request, self.limits.max_json_bytes, "JSON"))
        chat = parse_chat_request(document, self.limits)
        pipeline = self._pipeline(request, chat.model, CHAT)
        max_len = pipeline.max_model_len
        wanted = chat.sampling.get("max_tokens")
        if max_len is not None and isinstance(wanted, int) and wanted >= max_len:
            raise invalid(
                f"'max_tokens' is {wanted}; accepted: less than the model's max_model_len "
                f"{max_len}",
                param="max_tokens",
            )
        assert pipeline.chat_template is not None
        # Rendered here too, so that a template refusing the turns is a 400 before anything runs.
        prompt = pipeline.chat_template.render(chat.messages)
        if chat.messages[-1].role == "user":
            # The pipeline renders the turns with its model's template (chat-speak speaks the
            # reply as well); a conversation ending otherwise goes as the rendered text.
            turns = [message.to_json() for message in chat.messages]
            submitted = await self._submit(pipeline, {"messages": turns, **chat.sampling}, request)
        else:
            submitted = await self._submit(pipeline, {"text": prompt, **chat.sampling}, request)
        completion_id = f"chatcmpl-{submitted.request_id}"
        if chat.stream:
            peeked: list[OmniRequestOutput | None] = []
            if "structured_output" in chat.sampling:
                # A constraint the model cannot honour fails its first output: refused with
                # a 400 before the stream starts.
                peeked.append(await self._first_output(request, submitted))
            return _ClosingStream(
                self._chat_chunks(chat, submitted, completion_id, peeked),
                submitted,
                "text/event-stream",
            )
        try:
            text, final = await _unless_disconnected(request, self._chat_text(submitted))
        finally:
            submitted.close()
        usage = _usage(final, _prompt_tokens(final))
        self.metrics.tokens(
            chat.model, prompt=usage["prompt_tokens"], completion=usage["completion_tokens"]
        )
        return JSONResponse(
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": chat.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": _finish_reason(final),
                        "logprobs": None,
                    }
                ],
                "usage": usage,
            }
        )

    @staticmethod
    async def _chat_text(submitted: Submitted) -> tuple[str, OmniRequestOutput | None]:
        parts: list[str] = []
        final = None
        while (output := await submitted.next()) is not None:
            if output.finished:
                final = output
            elif output.text:
                parts.append(output.text)
        return "".join(parts), final

    @staticmethod
    async def _first_output(request: Request, submitted: Submitted) -> OmniRequestOutput | None:
        """The request's first output; the request is closed if it fails instead."""
        try:
            return await _unless_disconnected(request, submitted.next())
        except BaseException:
            submitted.close()
            raise

    async def _chat_chunks(
        self,
        chat: ChatRequest,
        submitted: Submitted,
        completion_id: str,
        peeked: list[OmniRequestOutput | None],
    ) -> AsyncIterator[bytes]:
        """The stream's events; ``peeked`` holds the first output when it was read already."""
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
            return {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": chat.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        yield _sse(chunk({"role": "assistant", "content": ""}, None))
        final = None
        try:
            while (output := peeked.pop() if peeked else await submitted.next()) is not None:
                if output.finished:
                    final = output
                elif output.text:
                    yield _sse(chunk({"content": output.text}, None))
        except OmniError as exc:
            yield _sse(from_runtime_error(exc).body())
            yield b"data: [DONE]\n\n"
            return
        yield _sse(chunk({}, _finish_reason(final)))
        usage = _usage(final, _prompt_tokens(final))
        self.metrics.tokens(
            chat.model, prompt=usage["prompt_tokens"], completion=usage["completion_tokens"]
        )
        if chat.include_usage:
            document = chunk({}, None)
            document["choices"] = []
            document["usage"] = usage
            yield _sse(document)
        yield b"data: [DONE]\n\n"

    async def speech(self, request: Request) -> Response:
        document = decode_json(await _read_body(request, self.limits.max_json_bytes, "JSON"))
        voices = {p.name: p.voices for p in self.registry.pipelines.values() if p.kind == SPEECH}
        speech = parse_speech_request(document, self.limits, voices)
        pipeline = self._pipeline(request, speech.model, SPEECH)
        rate = pipeline.sample_rate
        submitted = await self._submit(pipeline, speech.input, request)
        media = "audio/wav" if speech.response_format == "wav" else "audio/pcm"
        return _ClosingStream(
            self._audio(submitted, rate, wav=speech.response_format == "wav"), submitted, media
        )

    async def _audio(self, submitted: Submitted, rate: int, *, wav: bool) -> AsyncIterator[bytes]:
        if wav:
            yield wav_header(rate)
        samples = 0
        try:
            while (output := await submitted.next()) is not None:
                chunk = AudioChunk.from_output(output)
                if chunk is not None and chunk.pcm.size:
                    samples += chunk.pcm.size
                    yield _pcm16(chunk.pcm)
        finally:
            # What was produced, also when the client left before the end.
            self.metrics.audio(submitted.pipeline.name, "out", samples / rate)

    async def transcriptions(self, request: Request) -> Response:
        form = await read_transcription_form(request, self.limits.max_audio_bytes)
        try:
            transcription, upload = parse_transcription_form(form)
            pipeline = self._pipeline(request, transcription.model, TRANSCRIPTION)
            decode = functools.partial(decode_upload, upload, max_seconds=pipeline.max_audio_s)
            audio = await asyncio.get_running_loop().run_in_executor(None, decode)
        finally:
            # The upload's temporary file goes as soon as the audio is decoded.
            await form.close()
        submitted = await self._submit(
            pipeline, {"audio": audio, "sample_rate": TARGET_RATE}, request
        )
        self.metrics.audio(pipeline.name, "in", audio.size / TARGET_RATE)
        del audio
        if transcription.stream:
            return _ClosingStream(transcript_events(submitted), submitted, "text/event-stream")
        try:
            transcript = await _unless_disconnected(request, collect_transcript(submitted))
        finally:
            submitted.close()
        body, media = transcription_body(transcription.response_format, transcript)
        if media is None:
            return JSONResponse(body)
        return Response(body, media_type=media)

    async def embeddings(self, request: Request) -> Response:
        document = decode_json(await _read_body(request, self.limits.max_json_bytes, "JSON"))
        embedding = parse_embedding_request(document)
        pipeline = self._pipeline(request, embedding.model, EMBEDDING)
        try:
            submitted = await self._submit(pipeline, embedding.pipeline_input(), request)
        except EmbeddingInputError as refused:
            # The pipeline's own limits (texts, their length, its size) name the field.
            raise invalid(str(refused), param=refused.param) from None
        try:
            result = await _unless_disconnected(request, collect_embeddings(submitted))
        finally:
            submitted.close()
        self.metrics.tokens(embedding.model, prompt=result.prompt_tokens, completion=0)
        return JSONResponse(embeddings_body(embedding, result))

    async def graph_run(self, request: Request) -> Response:
        name = request.query_params.get("model")
        if not name:
            served = sorted(p.name for p in self.registry.pipelines.values() if p.kind == GRAPH)
            raise invalid(
                f"no model was named; accepted: /v1/omni/run?model=NAME with NAME one of "
                f"{', '.join(served) or 'none is served'}",
                param="model",
                code="missing_model",
            )
        pipeline = self._pipeline(request, name, GRAPH)
        inputs = load_npz(await _read_body(request, self.limits.max_npz_bytes, ".npz"))
        submitted = await self._submit(pipeline, inputs, request)
        try:
            body = await _unless_disconnected(request, self._graph_outputs(submitted))
        finally:
            submitted.close()
        return Response(body, media_type=NPZ_MEDIA)

    @staticmethod
    async def _graph_outputs(submitted: Submitted) -> bytes:
        body = b""
        while (output := await submitted.next()) is not None:
            if output.finished:
                # The outputs are views over the worker's memory until acknowledged: the
                # archive is their one copy.
                body = dump_npz(output.outputs)
        return body
