"""``/v1/realtime``: OpenAI's Realtime API over a WebSocket, on a voice-chat pipeline.

A connection (``ws://HOST/v1/realtime?model=NAME``, the server's key as ``Authorization:
Bearer``) is one duplex request of a ``realtime`` pipeline
(:mod:`runtime.adapters.voice_chat`), held until the client disconnects. When it does, the
reply in progress is stopped and the request's input ended, so that it finishes between stage
calls and frees its slot at once (a cancel that cut a stage call short would retire that
stage's worker and restart the pipeline under the other conversations); a request that has not
finished within ``HANG_UP_S`` is cancelled. The pipeline holds as many
conversations at once as its language model's ``max_num_seqs`` (2 in voice-chat.yaml); a
connection beyond them gets an ``error`` event (``pipeline_busy``) and is closed (code 1013,
try again later).

Input audio (``input_audio_buffer.append``, PCM16 mono 24 kHz) is resampled to 16 kHz and, with
``server_vad`` turn detection (the default), fed to the conversation as it comes: its turn
detector (Silero VAD; ``threshold``, ``silence_duration_ms`` and ``prefix_padding_ms`` map to
its ``threshold``, ``end_of_turn_s`` and ``pre_roll_s``) starts and ends each turn
(``input_audio_buffer.speech_started`` / ``speech_stopped`` / ``committed``, the user item),
and every turn gets a response at once (``response.created``, the reply's transcript and audio
deltas, resampled to 24 kHz, ``response.done`` with the language model's ``usage``). Input
transcripts (``conversation.item.input_audio_transcription.completed``) come when the session
asks for ``audio.input.transcription``. With ``turn_detection`` null the server keeps the
audio until ``input_audio_buffer.commit``; ``response.create`` then answers the committed
audio (transcribed then, so its transcript comes with the response) or the user's
``conversation.item.create`` text.

Speech over a response that is still being made interrupts it (barge-in, as the conversation
does): the response ends with ``response.done`` status ``cancelled`` (reason
``turn_detected``), and ``response.cancel`` ends it the same way (``client_cancelled``). The
server cannot know what the client played: it counts a response's audio as played as soon
as it is sent, so once a response is done, speech starts the next turn without cancelling it,
and the conversation's history keeps the whole reply.

Every client event that cannot be done gets an ``error`` event in OpenAI's shape naming the
field and the client's ``event_id``; the connection stays usable.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import soxr
from starlette.websockets import WebSocketDisconnect, WebSocketState

from runtime.adapters.turns import TurnSettings
from runtime.adapters.voice_chat import VoiceChatOptions
from runtime.conversation import (
    INTERRUPTED,
    REPLY_AUDIO,
    REPLY_DONE,
    REPLY_TEXT,
    SPEECH_STARTED,
    TRANSCRIPT,
    TURN_ENDED,
    ConversationEvent,
    ConversationUpdate,
    SpokenTurn,
    StopReply,
    TextTurn,
    VoiceFrame,
)
from runtime.errors import OmniError
from runtime.serve.errors import SERVER, ApiError, from_runtime_error
from runtime.serve.realtime_events import (
    AUDIO_RATE,
    InputAudioAppend,
    InputAudioClear,
    InputAudioCommit,
    ItemCreate,
    RealtimeEventError,
    RealtimeSettings,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
    error_event,
    new_id,
    parse_client_event,
    server_event,
)
from runtime.serve.registry import REALTIME

if TYPE_CHECKING:
    from collections.abc import Callable

    from starlette.requests import HTTPConnection
    from starlette.websockets import WebSocket

    from runtime.serve.metrics import ServeMetrics
    from runtime.serve.realtime_events import ClientEvent
    from runtime.serve.registry import PipelineRegistry, ServedPipeline, Submitted

log = logging.getLogger("omni.serve")

#: The conversation's input rate.
INPUT_RATE: Final = 16000
#: WebSocket close codes: a policy refusal (bad key, unknown model), try again later (busy).
CLOSE_POLICY: Final = 1008
CLOSE_RETRY: Final = 1013
CLOSE_ERROR: Final = 1011
#: How long the conversation of a client that left may take to finish before it is cancelled.
HANG_UP_S: Final = 10.0


def _pcm16_base64(pcm: np.ndarray) -> str:
    samples = (np.clip(pcm, -1.0, 1.0) * 32767.0).astype("<i2")
    return base64.b64encode(samples.tobytes()).decode("ascii")


@dataclass(slots=True)
class _UserInput:
    """A user item waiting for ``response.create``: typed text or committed audio."""

    item_id: str
    text: str | None = None
    pcm: np.ndarray | None = None


@dataclass(slots=True)
class _Response:
    """One response: its ids, the conversation turn it answers (None until the conversation
    says), what it has sent, and how it ends."""

    id: str
    item_id: str
    turn: int | None = None
    #: The user item whose audio this turn transcribes (for its transcript event).
    user_item: str | None = None
    user_audio: bool = False
    started: bool = False
    transcript: str = ""
    #: Reply samples sent, at the voice's rate (what the conversation counts as played).
    samples: int = 0
    resampler: Any = None
    cancel_reason: str | None = None
    finished: bool = False
    usage: dict[str, Any] = field(default_factory=dict)


class RealtimeConnection:
    """One ``/v1/realtime`` connection over one duplex request (see the module)."""

    def __init__(
        self,
        websocket: WebSocket,
        pipeline: ServedPipeline,
        submitted: Submitted,
        settings: RealtimeSettings,
        metrics: ServeMetrics | None = None,
    ) -> None:
        self.ws = websocket
        self.metrics = metrics
        self.pipeline = pipeline
        self.submitted = submitted
        self.settings = settings
        self.session_id = new_id("sess")
        self.voice_rate = pipeline.sample_rate
        self._send_lock = asyncio.Lock()
        self._input = soxr.ResampleStream(AUDIO_RATE, INPUT_RATE, 1, dtype="float32")
        #: Audio appended since the last commit (24 kHz samples), and, without server VAD,
        #: the audio itself at 16 kHz.
        self._buffered = 0
        self._held: list[np.ndarray] = []
        self._pending: list[_UserInput] = []
        #: Responses by the conversation's turn, and those created by response.create that the
        #: conversation has not started yet.
        self._responses: dict[int, _Response] = {}
        self._unbound: list[_Response] = []
        #: Turns the turn detector started, with their user item.
        self._spoken: dict[int, str] = {}
        self._playing: _Response | None = None
        self._last_item: str | None = None
        #: The client left: nothing more is sent.
        self._gone = False

    # -- plumbing ------------------------------------------------------------------------

    async def send(self, document: dict[str, Any]) -> None:
        if self._gone:
            return
        async with self._send_lock:
            await self.ws.send_text(json.dumps(document, separators=(",", ":")))

    def _feed(self, chunk: object) -> None:
        self.submitted.handle.feed(chunk)

    async def run(self) -> None:
        """Serve the connection until the client leaves or the request ends."""
        self._feed(self._update())
        await self.send(
            server_event("session.created", session=self.settings.session(self.session_id))
        )
        receiver = asyncio.ensure_future(self._receive())
        reader = asyncio.ensure_future(self._read())
        try:
            done, _ = await asyncio.wait({receiver, reader}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
            if receiver in done and reader not in done:
                await self._hang_up(reader)
        finally:
            for task in (receiver, reader):
                task.cancel()
            await asyncio.gather(receiver, reader, return_exceptions=True)

    async def _hang_up(self, reader: asyncio.Future[None]) -> None:
        """The client left: stop the reply, end the input and let the request finish between
        stage calls (read to its end, sending nothing); the caller's close cancels it if it
        has not finished within :data:`HANG_UP_S`."""
        self._gone = True
        try:
            self._feed(StopReply())
            self.submitted.handle.end_input()
        except OmniError as exc:  # the request already ended
            log.debug("realtime conversation %s: %s", self.submitted.request_id, exc)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(reader), HANG_UP_S)

    def _update(self) -> ConversationUpdate:
        return ConversationUpdate(
            system_prompt=self.settings.instructions, turns=self.settings.turns
        )

    # -- client events ---------------------------------------------------------------------

    async def _receive(self) -> None:
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("text")
            if data is None:
                data = message.get("bytes") or b""
            try:
                await self._on_client(parse_client_event(data))
            except RealtimeEventError as refused:
                await self.send(error_event(refused))

    async def _on_client(self, event: ClientEvent) -> None:
        if isinstance(event, InputAudioAppend):
            self._append(event)
        elif isinstance(event, SessionUpdate):
            changed = self.settings.updated(event)
            if changed.server_vad != self.settings.server_vad:
                # The buffer's audio belonged to the other way of committing: it goes.
                self._held, self._buffered = [], 0
            self.settings = changed
            self._feed(self._update())
            await self.send(
                server_event("session.updated", session=changed.session(self.session_id))
            )
        elif isinstance(event, InputAudioCommit):
            await self._commit(event)
        elif isinstance(event, InputAudioClear):
            self._held, self._buffered = [], 0
            await self.send(server_event("input_audio_buffer.cleared"))
        elif isinstance(event, ItemCreate):
            item_id = event.item_id or new_id("item")
            self._pending.append(_UserInput(item_id, text=event.text))
            item = _user_item(item_id, [{"type": "input_text", "text": event.text}])
            await self._item_added(item)
        elif isinstance(event, ResponseCreate):
            await self._create(event)
        elif isinstance(event, ResponseCancel):
            await self._cancel(event)

    def _append(self, event: InputAudioAppend) -> None:
        pcm = self._input.resample_chunk(event.pcm)
        self._buffered += event.pcm.size
        if self.metrics is not None:
            self.metrics.audio(self.pipeline.name, "in", event.pcm.size / AUDIO_RATE)
        if not self.settings.server_vad:
            self._held.append(pcm)
            return
        playing = self._playing
        if playing is not None and playing.turn is not None:
            self._feed(VoiceFrame(pcm, reply=playing.turn, played_samples=playing.samples))
        else:
            self._feed(VoiceFrame(pcm))

    async def _commit(self, event: InputAudioCommit) -> None:
        if self._buffered == 0:
            raise RealtimeEventError(
                "the input audio buffer is empty; accepted: input_audio_buffer.commit after "
                "input_audio_buffer.append",
                code="input_audio_buffer_commit_empty",
                event_id=event.event_id,
            )
        if self.settings.server_vad:
            raise RealtimeEventError(
                "with server_vad turn detection the server commits the input audio at the end "
                "of each spoken turn; accepted: session.update with "
                "audio.input.turn_detection null, then commit by hand",
                code="turn_detection_active",
                param="session.audio.input.turn_detection",
                event_id=event.event_id,
            )
        pcm = np.concatenate(self._held)
        self._held, self._buffered = [], 0
        item_id = new_id("item")
        self._pending.append(_UserInput(item_id, pcm=pcm))
        await self.send(
            server_event(
                "input_audio_buffer.committed",
                item_id=item_id,
                previous_item_id=self._last_item,
            )
        )
        await self._item_added(_user_item(item_id, [{"type": "input_audio", "transcript": None}]))

    def _active(self) -> _Response | None:
        if self._unbound:
            return self._unbound[-1]
        live = [r for r in self._responses.values() if not r.finished]
        return live[-1] if live else None

    async def _create(self, event: ResponseCreate) -> None:
        active = self._active()
        if active is not None:
            raise RealtimeEventError(
                f"the conversation already has an active response ({active.id}); accepted: "
                "response.create after its response.done, or response.cancel first",
                code="conversation_already_has_active_response",
                event_id=event.event_id,
            )
        pending, self._pending = self._pending, []
        if not pending:
            raise RealtimeEventError(
                "there is no user input to respond to; accepted: response.create after "
                "conversation.item.create (a user message of input_text) or "
                "input_audio_buffer.commit",
                code="no_user_input",
                event_id=event.event_id,
            )
        audio = [p.pcm for p in pending if p.pcm is not None]
        texts = [p.text for p in pending if p.text is not None]
        response = _Response(new_id("resp"), new_id("item"))
        if audio:
            if texts:
                raise RealtimeEventError(
                    "the user items since the last response mix typed text and committed audio "
                    "(they are dropped); accepted: one kind per response, sent again",
                    code="mixed_user_input",
                    event_id=event.event_id,
                )
            response.user_item, response.user_audio = pending[-1].item_id, True
            self._feed(SpokenTurn(np.concatenate(audio)))
        else:
            self._feed(TextTurn(" ".join(texts)))
        self._unbound.append(response)
        await self._created(response)

    async def _cancel(self, event: ResponseCancel) -> None:
        active = self._active()
        if active is None:
            raise RealtimeEventError(
                "there is no response in progress to cancel",
                code="response_cancel_not_active",
                event_id=event.event_id,
            )
        if event.response_id is not None and event.response_id != active.id:
            raise RealtimeEventError(
                f"'response_id' is {event.response_id!r}; accepted: the response in progress, "
                f"{active.id}",
                param="response_id",
                event_id=event.event_id,
            )
        active.cancel_reason = "client_cancelled"
        self._feed(StopReply())

    # -- the conversation's outputs ----------------------------------------------------------

    async def _read(self) -> None:
        try:
            while (output := await self.submitted.next()) is not None:
                if output.finished:
                    return
                event = ConversationEvent.from_outputs(output.outputs, output.text)
                if event is None:
                    continue
                pcm = None
                if event.event == REPLY_AUDIO:
                    chunk = output.audio
                    pcm = None if chunk is None else np.array(chunk.pcm, np.float32)
                await self._on_conversation(event, pcm)
        except OmniError as exc:
            mapped = from_runtime_error(exc)
            failure = RealtimeEventError(mapped.message, code=mapped.code or "server_error")
            failure.type = SERVER
            with contextlib.suppress(Exception):
                await self.send(error_event(failure))
            with contextlib.suppress(Exception):
                await self.ws.close(CLOSE_ERROR)

    async def _on_conversation(self, event: ConversationEvent, pcm: np.ndarray | None) -> None:
        name, turn = event.event, event.turn
        if name == SPEECH_STARTED:
            item_id = new_id("item")
            self._spoken[turn] = item_id
            await self.send(
                server_event(
                    "input_audio_buffer.speech_started",
                    audio_start_ms=round((event.t or 0.0) * 1000),
                    item_id=item_id,
                )
            )
            return
        if name == TURN_ENDED and turn in self._spoken:
            item_id = self._spoken[turn]
            self._buffered = 0
            await self.send(
                server_event(
                    "input_audio_buffer.speech_stopped",
                    audio_end_ms=round((event.t or 0.0) * 1000),
                    item_id=item_id,
                )
            )
            await self.send(
                server_event(
                    "input_audio_buffer.committed",
                    item_id=item_id,
                    previous_item_id=self._last_item,
                )
            )
            await self._item_added(
                _user_item(item_id, [{"type": "input_audio", "transcript": None}])
            )
            response = _Response(
                new_id("resp"), new_id("item"), turn=turn, user_item=item_id, user_audio=True
            )
            self._responses[turn] = response
            await self._created(response)
            return
        found = self._responses.get(turn)
        if found is None and turn not in self._spoken and self._unbound:
            # The first word of a turn the client asked for (its transcript, or its stop when
            # response.cancel came first) says which turn answers the oldest response.create.
            found = self._unbound.pop(0)
            found.turn = turn
            self._responses[turn] = found
        if found is None or found.finished:
            return
        response = found
        if name == TRANSCRIPT:
            if response.user_audio and self.settings.transcription is not None:
                await self.send(
                    server_event(
                        "conversation.item.input_audio_transcription.completed",
                        item_id=response.user_item,
                        content_index=0,
                        transcript=event.text or "",
                        usage={"type": "duration", "seconds": 0.0},
                    )
                )
        elif name == REPLY_TEXT:
            await self._start_output(response)
            response.transcript += event.text or ""
            await self.send(
                server_event(
                    "response.output_audio_transcript.delta",
                    delta=event.text or "",
                    **self._where(response),
                )
            )
        elif name == REPLY_AUDIO and pcm is not None:
            await self._start_output(response)
            response.samples += pcm.size
            self._playing = response
            await self._audio(response, pcm, last=False)
        elif name == REPLY_DONE:
            tokens, prompt = (
                int(event.values.get("tokens", 0)),
                int(event.values.get("prompt_tokens", 0)),
            )
            response.usage = {
                "total_tokens": tokens + prompt,
                "input_tokens": prompt,
                "output_tokens": tokens,
                "input_token_details": {"text_tokens": prompt, "audio_tokens": 0},
                "output_token_details": {"text_tokens": tokens, "audio_tokens": 0},
            }
            await self._done(response, "completed", None)
        elif name == INTERRUPTED:
            await self._done(response, "cancelled", response.cancel_reason or "turn_detected")

    # -- building a response's events ------------------------------------------------------

    @staticmethod
    def _where(response: _Response) -> dict[str, Any]:
        return {
            "response_id": response.id,
            "item_id": response.item_id,
            "output_index": 0,
            "content_index": 0,
        }

    def _assistant_item(self, response: _Response, status: str) -> dict[str, Any]:
        return {
            "id": response.item_id,
            "type": "message",
            "object": "realtime.item",
            "status": status,
            "role": "assistant",
            "content": [{"type": "output_audio", "transcript": response.transcript}],
        }

    async def _item_added(self, item: dict[str, Any]) -> None:
        previous, self._last_item = self._last_item, item["id"]
        for kind in ("conversation.item.added", "conversation.item.done"):
            await self.send(server_event(kind, item=item, previous_item_id=previous))

    async def _created(self, response: _Response) -> None:
        await self.send(
            server_event("response.created", response=self._response(response, "in_progress"))
        )

    def _response(
        self, response: _Response, status: str, reason: str | None = None
    ) -> dict[str, Any]:
        output = []
        if response.started:
            output.append(self._assistant_item(response, "completed"))
        return {
            "object": "realtime.response",
            "id": response.id,
            "status": status,
            "status_details": None
            if status == "in_progress"
            else {"type": status, "reason": reason, "error": None},
            "output": output,
            "conversation_id": None,
            "output_modalities": ["audio"],
            "audio": {
                "output": {
                    "format": {"type": "audio/pcm", "rate": AUDIO_RATE},
                    "voice": self.settings.voice,
                }
            },
            "max_output_tokens": "inf",
            "usage": response.usage or None,
            "metadata": None,
        }

    async def _start_output(self, response: _Response) -> None:
        if response.started:
            return
        response.started = True
        response.resampler = soxr.ResampleStream(self.voice_rate, AUDIO_RATE, 1, dtype="float32")
        item = self._assistant_item(response, "in_progress")
        item["content"] = []
        await self.send(
            server_event(
                "response.output_item.added", response_id=response.id, output_index=0, item=item
            )
        )
        previous, self._last_item = self._last_item, response.item_id
        await self.send(
            server_event("conversation.item.added", item=item, previous_item_id=previous)
        )
        await self.send(
            server_event(
                "response.content_part.added",
                part={"type": "audio", "transcript": ""},
                **self._where(response),
            )
        )

    async def _audio(self, response: _Response, pcm: np.ndarray, *, last: bool) -> None:
        resampled = response.resampler.resample_chunk(pcm, last=last)
        if resampled.size:
            await self.send(
                server_event(
                    "response.output_audio.delta",
                    delta=_pcm16_base64(resampled),
                    **self._where(response),
                )
            )

    async def _done(self, response: _Response, status: str, reason: str | None) -> None:
        response.finished = True
        if self.metrics is not None:
            self.metrics.realtime_response(self.pipeline.name, status)
            self.metrics.audio(self.pipeline.name, "out", response.samples / self.voice_rate)
            usage = response.usage
            self.metrics.tokens(
                self.pipeline.name,
                prompt=int(usage.get("input_tokens", 0)),
                completion=int(usage.get("output_tokens", 0)),
            )
        if response in self._unbound:
            self._unbound.remove(response)
        if self._playing is response and status != "completed":
            self._playing = None
        if response.started:
            await self._audio(response, np.zeros(0, np.float32), last=True)
            where = self._where(response)
            await self.send(server_event("response.output_audio.done", **where))
            await self.send(
                server_event(
                    "response.output_audio_transcript.done",
                    transcript=response.transcript,
                    **where,
                )
            )
            await self.send(
                server_event(
                    "response.content_part.done",
                    part={"type": "audio", "transcript": response.transcript},
                    **where,
                )
            )
            item = self._assistant_item(
                response, "completed" if status == "completed" else "incomplete"
            )
            await self.send(
                server_event(
                    "response.output_item.done", response_id=response.id, output_index=0, item=item
                )
            )
            await self.send(server_event("conversation.item.done", item=item))
        await self.send(
            server_event("response.done", response=self._response(response, status, reason))
        )


def _user_item(item_id: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "object": "realtime.item",
        "status": "completed",
        "role": "user",
        "content": content,
    }


def initial_settings(pipeline: ServedPipeline) -> RealtimeSettings:
    """The session a connection starts with: the pipeline's system prompt, voice and turn
    settings, server VAD on, no input transcripts (OpenAI's defaults)."""
    options = pipeline.config.adapter.options if pipeline.config.adapter is not None else {}
    voices = pipeline.voices
    return RealtimeSettings(
        model=pipeline.name,
        instructions=VoiceChatOptions.parse(
            {k: v for k, v in options.items() if k == "system_prompt"}
        ).system_prompt,
        voice=voices[0] if voices else "",
        voices=voices,
        server_vad=True,
        turns=TurnSettings.parse(options),
    )


class RealtimeEndpoint:
    """The ``/v1/realtime`` WebSocket endpoint over a registry; ``check_key`` raises an
    :class:`ApiError` for a connection without the server's key."""

    def __init__(
        self,
        registry: PipelineRegistry,
        check_key: Callable[[HTTPConnection], None],
        metrics: ServeMetrics | None = None,
    ) -> None:
        self.registry = registry
        self.check_key = check_key
        self.metrics = metrics

    async def serve(self, websocket: WebSocket) -> None:
        try:
            self.check_key(websocket)
        except ApiError as refused:
            # Refused before the handshake completes: the client sees HTTP 403.
            log.info("realtime connection refused: %s", refused.message)
            await websocket.close(CLOSE_POLICY, reason=refused.code or "refused")
            return
        await websocket.accept()
        submitted: Submitted | None = None
        model = websocket.query_params.get("model")
        try:
            pipeline = self._pipeline(model)
            submitted = await self._submit(pipeline)
            if self.metrics is not None:
                self.metrics.realtime_session(model, "accepted")
            connection = RealtimeConnection(
                websocket, pipeline, submitted, initial_settings(pipeline), self.metrics
            )
            await connection.run()
        except _Refused as refused:
            if self.metrics is not None:
                self.metrics.realtime_session(model, "refused")
            await _refuse(websocket, refused.event, refused.close_code)
        except WebSocketDisconnect:
            pass
        except Exception as exc:  # a client gone mid-send; the request is closed below
            if websocket.application_state == WebSocketState.CONNECTED and (
                websocket.client_state == WebSocketState.CONNECTED
            ):
                raise
            log.debug("realtime connection ended: %s", exc)
        finally:
            if submitted is not None:
                submitted.close()
            if websocket.client_state == WebSocketState.CONNECTED:
                with contextlib.suppress(Exception):
                    await websocket.close()

    def _pipeline(self, name: str | None) -> ServedPipeline:
        served = sorted(p.name for p in self.registry.pipelines.values() if p.kind == REALTIME)
        if not name:
            raise _Refused(
                RealtimeEventError(
                    "the URL names no model; accepted: /v1/realtime?model=NAME with a realtime "
                    f"pipeline: {', '.join(served) or 'none is served'}",
                    code="missing_model",
                    param="model",
                ),
                CLOSE_POLICY,
            )
        pipeline = self.registry.pipelines.get(name)
        if pipeline is None or pipeline.kind != REALTIME:
            what = "does not exist" if pipeline is None else f"is a {pipeline.kind} pipeline"
            raise _Refused(
                RealtimeEventError(
                    f"the model {name!r} {what}; /v1/realtime takes realtime pipelines: "
                    f"{', '.join(served) or 'none is served'}",
                    code="model_not_found" if pipeline is None else "wrong_model_kind",
                    param="model",
                ),
                CLOSE_POLICY,
            )
        return pipeline

    @staticmethod
    async def _submit(pipeline: ServedPipeline) -> Submitted:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(None, lambda: pipeline.submit(None, streaming=True))
        except (ApiError, OmniError) as exc:
            mapped = exc if isinstance(exc, ApiError) else from_runtime_error(exc)
            busy = mapped.status in (429, 503)
            refusal = RealtimeEventError(
                mapped.message,
                code=mapped.code or "refused",
                type=mapped.type,
            )
            raise _Refused(refusal, CLOSE_RETRY if busy else CLOSE_ERROR) from None


class _Refused(Exception):
    def __init__(self, event: RealtimeEventError, close_code: int) -> None:
        super().__init__(event.message)
        self.event = event
        self.close_code = close_code


async def _refuse(websocket: WebSocket, refused: RealtimeEventError, code: int) -> None:
    with contextlib.suppress(Exception):
        await websocket.send_text(json.dumps(error_event(refused)))
        await websocket.close(code, reason=refused.code[:100])
