"""The pipelines a server serves: each loaded once, named by its pipeline name, with its kind.

A :class:`ServedPipeline` owns one :class:`~runtime.api.Omni`; requests go straight to its
orchestrator (:meth:`ServedPipeline.submit`), which admits them or raises
``ResourceUnavailable`` by the runtime's rules. A cancelled call that retired a graph stage
leaves the pipeline unusable; the pipeline is then recreated in the background (requests
meanwhile get 503 with ``Retry-After``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from runtime.adapters.tts import SpeechAdapter
from runtime.api import Omni
from runtime.chat import ChatTemplate
from runtime.config import LlmBackendConfig, PipelineConfig, load_pipeline
from runtime.engine.outputs import END, OmniRequestOutput
from runtime.errors import UsageError
from runtime.events import EventBus, RequestAdmitted, RequestFinished
from runtime.ledger import ResourceLedger
from runtime.pipeline_input import TENSOR_INPUT, input_kind
from runtime.serve.errors import RESTART_RETRY_AFTER_S, SERVER, ApiError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from runtime.devices import DeviceSelection, Topology
    from runtime.engine.orchestrator import Request
    from runtime.events import Event

log = logging.getLogger("omni.serve")

CHAT: Final = "chat"
SPEECH: Final = "speech"
GRAPH: Final = "graph"
TRANSCRIPTION: Final = "transcription"
KINDS: Final = (CHAT, SPEECH, GRAPH, TRANSCRIPTION)
#: How long a cancelled request may take to be wound up before its stages are looked at.
SETTLE_S: Final = 30.0


def pipeline_kind(config: PipelineConfig) -> str:
    """``chat`` (a language-model stage), ``speech`` (the speech adapter), ``transcription``
    (the transcription adapter) or ``graph`` (tensors in, tensors out); UsageError for a
    pipeline none of the endpoints can drive."""
    if any(isinstance(stage.backend, LlmBackendConfig) for stage in config.stages):
        return CHAT
    if config.adapter is not None and config.adapter.name.endswith(":SpeechAdapter"):
        return SPEECH
    if config.adapter is not None and config.adapter.name.endswith(":TranscribeAdapter"):
        return TRANSCRIPTION
    if input_kind(config) == TENSOR_INPUT:
        return GRAPH
    raise UsageError(
        f"pipeline {config.pipeline} ({config.source}) cannot be served: accepted: a pipeline "
        "with a language-model stage (chat), the speech adapter (speech), the transcription "
        "adapter (transcription) or tensors in (graph)"
    )


class Submitted:
    """One request in a pipeline, read output by output from the server's event loop.

    Each output is acknowledged when the next is asked for or on :meth:`close`; closing a
    request that has not ended cancels it through the orchestrator."""

    def __init__(self, pipeline: ServedPipeline, omni: Omni, request: Request) -> None:
        self.pipeline = pipeline
        self._omni = omni
        self.request = request
        self._current: OmniRequestOutput | None = None
        self._ended = False

    @property
    def request_id(self) -> str:
        return self.request.request_id

    async def next(self) -> OmniRequestOutput | None:
        """The next output (the previous one is acknowledged first), None at the end."""
        self._release()
        if self._ended:
            return None
        item = await asyncio.wrap_future(self.request.stream.next_future())
        if item is END:
            self._ended = True
            return None
        if isinstance(item, BaseException):
            self._ended = True
            raise item
        assert isinstance(item, OmniRequestOutput)
        self._current = item
        if item.finished:
            self._ended = True
        return item

    def _release(self) -> None:
        current, self._current = self._current, None
        if current is not None:
            current.release_stage_buffers()

    def close(self) -> None:
        """Acknowledge what is held; cancel the request unless it ended. Idempotent, any
        thread, never blocks (the cancel runs on the orchestrator's loop)."""
        self._release()
        request = self.request
        if request.stream.closed or request.final_consumed:
            return
        self._ended = True
        self.pipeline.cancel(self._omni, request.request_id)


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
    """One served pipeline: its configuration, kind, running :class:`Omni` and counters."""

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
        self._omni: Omni | None = self._start()
        self._state = "ready"
        self.chat_template = (
            ChatTemplate.from_model_dir(self._model_dir()) if self.kind == CHAT else None
        )

    def _start(self) -> Omni:
        return Omni(
            self.config,
            ledger=self._ledger,
            events=self.events,
            topology=self._topology,
            selection=self._selection,
        )

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

    def _model_dir(self) -> Path | None:
        omni = self._omni
        if omni is None:
            return None
        for stage in omni.execution_plan.to_json()["stages"]:
            model_dir = stage.get("model_dir")
            if isinstance(model_dir, str):
                return Path(model_dir)
        return None

    # -- what the endpoints read -------------------------------------------------------

    @property
    def voices(self) -> tuple[str, ...]:
        program = self._omni.orchestrator.program if self._omni is not None else None
        if isinstance(program, SpeechAdapter):
            return (program.options.voice,)
        return ()

    @property
    def sample_rate(self) -> int:
        program = self._omni.orchestrator.program if self._omni is not None else None
        if not isinstance(program, SpeechAdapter):
            raise UsageError(f"pipeline {self.name} does not speak")
        return int(program.sample_rate)

    @property
    def max_audio_s(self) -> float:
        """The longest audio a transcription request may bring (the adapter's option)."""
        # Imported here: the recogniser's modules bring ONNX in, which other pipelines skip.
        from runtime.adapters.whisper import TranscribeAdapter

        program = self._omni.orchestrator.program if self._omni is not None else None
        if not isinstance(program, TranscribeAdapter):
            raise UsageError(f"pipeline {self.name} does not transcribe")
        return program.options.max_audio_s

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
        omni = self._omni
        with self._lock:
            in_flight = len(self._in_flight)
            finished = dict(self._finished)
            state = self._state
        if state == "ready" and omni is not None and not self._usable(omni):
            # A cancelled call retired a stage: the pipeline is about to be recreated.
            state = "restarting"
        return PipelineStatus(
            name=self.name,
            kind=self.kind,
            state=state,
            in_flight=in_flight,
            concurrency=omni.orchestrator.concurrency if omni is not None else 0,
            max_queued=self.config.max_queued,
            source=str(self.config.source),
            finished=finished,
        )

    # -- requests ----------------------------------------------------------------------

    def submit(self, inputs: Any) -> Submitted:
        """Admit a request (any thread) or raise: the runtime's errors, or a 503 while the
        pipeline is being recreated or closed."""
        with self._lock:
            omni, state = self._omni, self._state
        if omni is None or state != "ready":
            raise self._unavailable(state)
        try:
            request = omni.orchestrator.submit(inputs)
        except UsageError:
            if not omni.orchestrator.running:
                # Closed under this request by a restart or the server stopping.
                raise self._unavailable("restarting") from None
            raise
        return Submitted(self, omni, request)

    def _unavailable(self, state: str) -> ApiError:
        return ApiError(
            503,
            f"pipeline {self.name} is {state}; retry shortly",
            type=SERVER,
            code="pipeline_unavailable",
            headers={"Retry-After": str(RESTART_RETRY_AFTER_S)},
        )

    @staticmethod
    def _usable(omni: Omni) -> bool:
        return all(client.usable for client in omni.orchestrator.clients)

    def cancel(self, omni: Omni, request_id: str) -> None:
        """Cancel at once (never blocks); a stage the cancel retired gets the pipeline
        recreated in the background."""
        omni.orchestrator.cancel(request_id, wait=False)
        self._background.submit(self._renew_if_retired, omni, request_id)

    def _renew_if_retired(self, omni: Omni, request_id: str) -> None:
        # The request is wound up once its stages were cancelled: then look at what is left.
        with self._settled:
            self._settled.wait_for(lambda: request_id not in self._in_flight, SETTLE_S)
        if self._usable(omni):
            return
        with self._lock:
            if self._omni is not omni or self._state != "ready":
                return
            self._state = "restarting"
        reasons = "; ".join(
            str(client.failure)
            for client in omni.orchestrator.clients
            if not client.usable and client.failure is not None
        )
        log.warning(
            "pipeline %s: a cancelled call retired a stage (%s); recreating it",
            self.name,
            reasons or "a stage stopped",
        )
        omni.close()
        try:
            renewed = self._start()
        except Exception:  # the background task's top level reports what it caught
            log.exception("pipeline %s could not be recreated", self.name)
            with self._lock:
                self._omni, self._state = None, "failed"
            return
        with self._lock:
            if self._state == "restarting":
                self._omni, self._state = renewed, "ready"
                log.warning("pipeline %s is ready again", self.name)
                return
        renewed.close()

    def close(self) -> None:
        with self._lock:
            omni, self._omni, self._state = self._omni, None, "closed"
        if omni is not None:
            omni.close()


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
                from runtime.adapters.whisper_export import export_missing_recognisers

                # A speech recogniser a pipeline names is made on first use, before it loads.
                export_missing_recognisers(Path(path), progress or (lambda line: None))
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
