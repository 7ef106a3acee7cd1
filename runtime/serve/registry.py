"""The pipelines a server serves: each loaded once, named by its pipeline name, with its kind.

A :class:`ServedPipeline` owns one loaded :class:`~runtime.api.PipelineSession`; requests go
straight to it (:meth:`ServedPipeline.submit`), which admits them or raises
``ResourceUnavailable`` by the runtime's rules. A cancelled call that retired a graph stage
leaves the pipeline unusable; the pipeline is then recreated in the background (requests
meanwhile get 503 with ``Retry-After``).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from runtime.api import PipelineSession
from runtime.chat import ChatTemplate
from runtime.config import LlmBackendConfig, PipelineConfig, load_pipeline
from runtime.errors import UsageError
from runtime.events import EventBus, RequestAdmitted, RequestFinished
from runtime.ledger import ResourceLedger
from runtime.pipeline_input import TENSOR_INPUT, input_kind
from runtime.serve.errors import RESTART_RETRY_AFTER_S, SERVER, ApiError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from runtime.api import OmniRequestOutput, ProgramOptions, RequestHandle
    from runtime.devices import DeviceSelection, Topology
    from runtime.events import Event

log = logging.getLogger("omni.serve")

CHAT: Final = "chat"
SPEECH: Final = "speech"
GRAPH: Final = "graph"
TRANSCRIPTION: Final = "transcription"
EMBEDDING: Final = "embedding"
#: A spoken conversation (the voice-chat adapter), served over ``/v1/realtime``.
REALTIME: Final = "realtime"
KINDS: Final = (CHAT, SPEECH, GRAPH, TRANSCRIPTION, EMBEDDING, REALTIME)
#: How long a cancelled request may take to be wound up before its stages are looked at.
SETTLE_S: Final = 30.0


def pipeline_kind(config: PipelineConfig) -> str:
    """``chat`` (a language-model stage), ``speech`` (the speech adapter), ``transcription``
    (the transcription adapter), ``embedding`` (the embedding adapter) or ``graph`` (tensors
    in, tensors out), ``realtime`` (the voice-chat adapter, checked first: it has a
    language-model stage); UsageError for a pipeline none of the endpoints can drive."""
    if config.adapter is not None and config.adapter.name.endswith(":VoiceChatProgram"):
        return REALTIME
    if any(isinstance(stage.backend, LlmBackendConfig) for stage in config.stages):
        return CHAT
    if config.adapter is not None and config.adapter.name.endswith(":SpeechAdapter"):
        return SPEECH
    if config.adapter is not None and config.adapter.name.endswith(":TranscribeAdapter"):
        return TRANSCRIPTION
    if config.adapter is not None and config.adapter.name.endswith(":EmbeddingAdapter"):
        return EMBEDDING
    if input_kind(config) == TENSOR_INPUT:
        return GRAPH
    raise UsageError(
        f"pipeline {config.pipeline} ({config.source}) cannot be served: accepted: a pipeline "
        "with a language-model stage (chat), the speech adapter (speech), the transcription "
        "adapter (transcription), the embedding adapter (embedding), the voice-chat adapter "
        "(realtime) or tensors in (graph)"
    )


class Submitted:
    """One request in a pipeline, read output by output from the server's event loop.

    Each output is acknowledged when the next is asked for or on :meth:`close`; closing a
    request that has not ended cancels it through its session."""

    def __init__(
        self, pipeline: ServedPipeline, session: PipelineSession, handle: RequestHandle
    ) -> None:
        self.pipeline = pipeline
        self._session = session
        self.handle = handle
        self._current: OmniRequestOutput | None = None

    @property
    def request_id(self) -> str:
        return self.handle.request_id

    async def next(self) -> OmniRequestOutput | None:
        """The next output (the previous one is acknowledged first), None at the end."""
        self._release()
        output = await self.handle.next_async()
        self._current = output
        return output

    def _release(self) -> None:
        current, self._current = self._current, None
        if current is not None:
            self.handle.acknowledge(current)

    def close(self) -> None:
        """Acknowledge what is held; stop the request unless it ended: its client went away,
        so it ends between stage calls (no worker is retired for a call cut short) and is
        cancelled only if it overruns the grace. Idempotent, any thread, never blocks."""
        self._release()
        if self.handle.stop():
            self.pipeline.renew_if_retired(self._session, self.request_id)


@dataclass(frozen=True, slots=True)
class PipelineStatus:
    """What ``GET /v1/omni/pipelines`` reports of one pipeline."""

    name: str
    kind: str
    state: str
    in_flight: int
    concurrency: int
    max_queued: int
    source: str
    #: Requests wound up since the server started, by status (completed, cancelled, failed).
    finished: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.name,
            "kind": self.kind,
            "state": self.state,
            "in_flight": self.in_flight,
            "concurrency": self.concurrency,
            "max_queued": self.max_queued,
            "source": self.source,
            "finished": dict(self.finished),
        }


class ServedPipeline:
    """One served pipeline: its configuration, kind, loaded session and counters."""

    def __init__(
        self,
        config: PipelineConfig,
        *,
        ledger: ResourceLedger,
        topology: Topology | None,
        selection: DeviceSelection | None,
        background: cf.ThreadPoolExecutor,
    ) -> None:
        self.config = config
        self.name = config.pipeline
        self.kind = pipeline_kind(config)
        self._ledger = ledger
        self._topology = topology
        self._selection = selection
        self._background = background
        self._lock = threading.Lock()
        self._in_flight: set[str] = set()
        self._finished: dict[str, int] = {"completed": 0, "cancelled": 0, "failed": 0}
        #: Notified whenever a request of this pipeline is wound up.
        self._settled = threading.Condition(self._lock)
        self._state = "starting"
        self.events = EventBus()
        self.events.subscribe(self._on_event)
        self._session: PipelineSession | None = self._start()
        self._state = "ready"
        self.chat_template = (
            ChatTemplate.from_model_dir(self._model_dir()) if self.kind == CHAT else None
        )

    def _start(self) -> PipelineSession:
        session = PipelineSession(
            self.config,
            ledger=self._ledger,
            events=self.events,
            topology=self._topology,
            selection=self._selection,
        )
        try:
            session.load()
        except BaseException:
            session.close()
            raise
        return session

    def _on_event(self, event: Event) -> None:
        # The runtime's own count of what holds a slot: admitted and not yet wound up.
        if isinstance(event, RequestAdmitted):
            with self._lock:
                self._in_flight.add(event.request_id)
        elif isinstance(event, RequestFinished):
            with self._lock:
                if event.request_id in self._in_flight:
                    self._in_flight.discard(event.request_id)
                    self._finished[event.status] = self._finished.get(event.status, 0) + 1
                self._settled.notify_all()

    def _options(self) -> ProgramOptions | None:
        session = self._session
        return None if session is None else session.options

    def _model_dir(self) -> Path | None:
        options = self._options()
        return None if options is None else options.model_dir

    # -- what the endpoints read -------------------------------------------------------

    @property
    def voices(self) -> tuple[str, ...]:
        options = self._options()
        speaks = self.kind in (SPEECH, REALTIME)
        return options.voices if options is not None and speaks else ()

    @property
    def sample_rate(self) -> int:
        options = self._options()
        if options is None or self.kind not in (SPEECH, REALTIME) or options.sample_rate is None:
            raise UsageError(f"pipeline {self.name} does not speak")
        return options.sample_rate

    @property
    def max_audio_s(self) -> float:
        """The longest audio a transcription request may bring (the adapter's option)."""
        options = self._options()
        if options is None or self.kind != TRANSCRIPTION or options.max_audio_s is None:
            raise UsageError(f"pipeline {self.name} does not transcribe")
        return options.max_audio_s

    @property
    def max_model_len(self) -> int | None:
        lengths = [
            stage.backend.engine_args.max_model_len
            for stage in self.config.stages
            if isinstance(stage.backend, LlmBackendConfig)
            and stage.backend.engine_args.max_model_len is not None
        ]
        return min(lengths) if lengths else None

    def status(self) -> PipelineStatus:
        session = self._session
        with self._lock:
            in_flight = len(self._in_flight)
            finished = dict(self._finished)
            state = self._state
        if state == "ready" and session is not None and not session.usable:
            # A cancelled call retired a stage: the pipeline is about to be recreated.
            state = "restarting"
        return PipelineStatus(
            name=self.name,
            kind=self.kind,
            state=state,
            in_flight=in_flight,
            concurrency=session.concurrency if session is not None else 0,
            max_queued=self.config.max_queued,
            source=str(self.config.source),
            finished=finished,
        )

    # -- requests ----------------------------------------------------------------------

    def submit(self, inputs: Any, *, streaming: bool = False) -> Submitted:
        """Admit a request (any thread) or raise: the runtime's errors, or a 503 while the
        pipeline is being recreated or closed. ``streaming``: a duplex request, fed through
        ``Submitted.handle``."""
        with self._lock:
            session, state = self._session, self._state
        if session is None or state != "ready":
            raise self._unavailable(state)
        try:
            handle = session.submit(inputs, streaming=streaming)
        except UsageError:
            if not session.loaded:
                # Closed under this request by a restart or the server stopping.
                raise self._unavailable("restarting") from None
            raise
        return Submitted(self, session, handle)

    def _unavailable(self, state: str) -> ApiError:
        return ApiError(
            503,
            f"pipeline {self.name} is {state}; retry shortly",
            type=SERVER,
            code="pipeline_unavailable",
            headers={"Retry-After": str(RESTART_RETRY_AFTER_S)},
        )

    def renew_if_retired(self, session: PipelineSession, request_id: str) -> None:
        """After a cancel (never blocks): a stage the cancel retired gets the pipeline
        recreated in the background."""
        self._background.submit(self._renew_if_retired, session, request_id)

    def _renew_if_retired(self, session: PipelineSession, request_id: str) -> None:
        # The request is wound up once its stages were cancelled: then look at what is left.
        with self._settled:
            self._settled.wait_for(lambda: request_id not in self._in_flight, SETTLE_S)
        health = session.health
        if health.usable:
            return
        with self._lock:
            if self._session is not session or self._state != "ready":
                return
            self._state = "restarting"
        log.warning(
            "pipeline %s: a cancelled call retired a stage (%s); recreating it",
            self.name,
            health.reason or "a stage stopped",
        )
        session.close()
        try:
            renewed = self._start()
        except Exception:  # the background task's top level reports what it caught
            log.exception("pipeline %s could not be recreated", self.name)
            with self._lock:
                self._session, self._state = None, "failed"
            return
        with self._lock:
            if self._state == "restarting":
                self._session, self._state = renewed, "ready"
                log.warning("pipeline %s is ready again", self.name)
                return
        renewed.close()

    def close(self) -> None:
        with self._lock:
            session, self._session, self._state = self._session, None, "closed"
        if session is not None:
            session.close()


class PipelineRegistry:
    """The served pipelines, by name, sharing one ledger (the machine's memory, or the
    caller's ``ledger``: the studio's own); loads them in order and closes every one (also
    those loaded before a failure). A pipeline that does not fit beside those loaded before
    it is refused by the ledger, naming them and what they hold."""

    def __init__(
        self,
        paths: Sequence[str | Path | PipelineConfig],
        *,
        topology: Topology | None = None,
        selection: DeviceSelection | None = None,
        progress: Callable[[str], None] | None = None,
        ledger: ResourceLedger | None = None,
    ) -> None:
        self.ledger = ledger if ledger is not None else ResourceLedger(name="serve")
        self._background = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="omni-serve")
        self.pipelines: dict[str, ServedPipeline] = {}
        for path in paths:
            if not isinstance(path, PipelineConfig):
                from runtime.adapters.embed_bundle import export_missing_embedders
                from runtime.adapters.whisper_export import export_missing_recognisers

                # A speech recogniser or an embedder a pipeline names is made on first use,
                # before it loads.
                export_missing_recognisers(Path(path), progress or (lambda line: None))
                export_missing_embedders(Path(path), progress or (lambda line: None))
        configs = [
            path if isinstance(path, PipelineConfig) else load_pipeline(Path(path))
            for path in paths
        ]
        names = [config.pipeline for config in configs]
        for name in names:
            if names.count(name) > 1:
                raise UsageError(
                    f"two pipelines are named {name!r}; accepted: pipelines with distinct names "
                    "(each is served as the model of that name)"
                )
        try:
            for config in configs:
                if progress is not None:
                    progress(f"starting {config.pipeline} ({config.source})")
                started = time.perf_counter()
                self.pipelines[config.pipeline] = ServedPipeline(
                    config,
                    ledger=self.ledger,
                    topology=topology,
                    selection=selection,
                    background=self._background,
                )
                if progress is not None:
                    kind = self.pipelines[config.pipeline].kind
                    progress(
                        f"{config.pipeline} ready ({kind}) in {time.perf_counter() - started:.1f} s"
                    )
        except BaseException:
            self.close()
            raise

    def get(self, name: str) -> ServedPipeline:
        """The pipeline served as ``name``, or a 404 naming the models served."""
        pipeline = self.pipelines.get(name)
        if pipeline is None:
            served = ", ".join(sorted(self.pipelines)) or "none"
            raise ApiError(
                404,
                f"the model {name!r} does not exist; served: {served}",
                type="invalid_request_error",
                param="model",
                code="model_not_found",
            )
        return pipeline

    def close(self) -> None:
        """Close every pipeline (cancelling their requests); idempotent. A recreation under
        way sees its pipeline closed and closes what it started."""
        pipelines, self.pipelines = list(self.pipelines.values()), {}
        for pipeline in reversed(pipelines):
            pipeline.close()
        self._background.shutdown(wait=True, cancel_futures=True)
