"""The one way into the engine: :class:`PipelineSession` and the :class:`RequestHandle` of
each request it admits.

A session parses its pipeline once and loads nothing until :meth:`PipelineSession.load` (or
``with``). Its requests run on the engine's loop thread; a handle streams their outputs,
acknowledges them, cancels them and, for a request submitted with ``streaming=True``, takes
more input after the start (``feed``, then ``end_input``). Everything here is thread-safe
and Qt-free::

    with PipelineSession("assets/pipelines/add.yaml") as session:
        handle = session.submit(streaming=True)
        handle.feed({"a": a[:2], "b": b[:2]})
        handle.feed({"a": a[2:], "b": b[2:]})
        handle.end_input()
        for output in handle:
            print(output.outputs["sum"])
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.config import LlmBackendConfig, PipelineConfig, load_pipeline
from runtime.engine.orchestrator import STOP_GRACE_S, Orchestrator
from runtime.engine.outputs import END, OmniRequestOutput
from runtime.engine.program import program_kind, streams_input
from runtime.errors import UsageError
from runtime.pipeline_input import TENSOR_INPUT

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator, Mapping

    import numpy as np

    from runtime.admission import Resolution
    from runtime.backends.graph import GraphTimeouts
    from runtime.devices import DeviceSelection, Topology
    from runtime.engine.orchestrator import Request
    from runtime.engine.outputs import StreamItem
    from runtime.events import EventBus
    from runtime.ledger import ResourceLedger
    from runtime.metrics import SessionMetrics
    from runtime.records import ExecutionPlan

__all__ = ["PipelineSession", "ProgramOptions", "RequestHandle", "SessionHealth"]


@dataclass(frozen=True, slots=True)
class SessionHealth:
    """Whether a session takes requests, and why not (the failed stage's failure)."""

    usable: bool
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class ProgramOptions:
    """What a server or a studio needs to know of a pipeline's program, as values.

    ``voices`` and ``sample_rate`` are a speaking program's (empty/None otherwise),
    ``max_audio_s`` a transcribing program's, ``max_model_len`` the smallest of the
    language-model stages' (None: no such stage or none set), ``model_dir`` the first
    language-model stage's model folder once loaded."""

    kind: str
    input_kind: str
    streams_input: bool
    voices: tuple[str, ...] = ()
    sample_rate: int | None = None
    max_audio_s: float | None = None
    max_model_len: int | None = None
    model_dir: Path | None = None


def _voices(program: object) -> tuple[str, ...]:
    voices = getattr(program, "voices", None)
    if isinstance(voices, tuple) and all(isinstance(voice, str) for voice in voices):
        return voices
    return ()


def _number(program: object, name: str) -> float | None:
    value = getattr(program, name, None)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class PipelineSession:
    """One pipeline: load it, submit requests, close it. Parsing happens once, here."""

    def __init__(
        self,
        pipeline: PipelineConfig | str | Path,
        *,
        ledger: ResourceLedger | None = None,
        events: EventBus | None = None,
        topology: Topology | None = None,
        selection: DeviceSelection | None = None,
        timeouts: GraphTimeouts | None = None,
        resolution: Resolution | None = None,
    ) -> None:
        """``resolution``: an earlier admission of this pipeline (``plan``, the studio's
        description); loading takes its verified bundles whose files are unchanged."""
        config = pipeline if isinstance(pipeline, PipelineConfig) else load_pipeline(pipeline)
        self._orchestrator = Orchestrator(
            config,
            ledger=ledger,
            events=events,
            topology=topology,
            selection=selection,
            timeouts=timeouts,
            resolution=resolution,
        )

    @classmethod
    def from_yaml(cls, path: str | Path, **options: Any) -> PipelineSession:
        return cls(Path(path), **options)

    # -- what it is --------------------------------------------------------------------

    @property
    def config(self) -> PipelineConfig:
        return self._orchestrator.config

    @property
    def name(self) -> str:
        return self._orchestrator.config.pipeline

    @property
    def kind(self) -> str:
        """What the program is: ``graph``, ``text``, ``speech``, ``chat-speak``, ..."""
        return program_kind(self._orchestrator.program)

    @property
    def input_kind(self) -> str:
        """What a request takes: ``tensors``, ``text``, ``audio``, ..."""
        kind = getattr(self._orchestrator.program, "input_kind", TENSOR_INPUT)
        return kind if isinstance(kind, str) else TENSOR_INPUT

    @property
    def streams_input(self) -> bool:
        """True where ``submit(..., streaming=True)`` is accepted."""
        return streams_input(self._orchestrator.program)

    @property
    def options(self) -> ProgramOptions:
        program = self._orchestrator.program
        rate = _number(program, "sample_rate")
        lengths = [
            stage.backend.engine_args.max_model_len
            for stage in self.config.stages
            if isinstance(stage.backend, LlmBackendConfig)
            and stage.backend.engine_args.max_model_len is not None
        ]
        return ProgramOptions(
            kind=self.kind,
            input_kind=self.input_kind,
            streams_input=self.streams_input,
            voices=_voices(program),
            sample_rate=None if rate is None else int(rate),
            max_audio_s=_number(program, "max_audio_s"),
            max_model_len=min(lengths) if lengths else None,
            model_dir=self._model_dir(),
        )

    def _model_dir(self) -> Path | None:
        for record in self._orchestrator.execution_plan.stages:
            # A language-model stage's record names its model folder (others name none).
            if record.model_dir is not None:
                return record.model_dir
        return None

    # -- lifecycle ---------------------------------------------------------------------

    def load(self) -> ExecutionPlan:
        """Start every stage; blocks until all are ready or raises (everything unwound).
        ``LoadCancelled`` when :meth:`cancel_load` stopped it."""
        return self._orchestrator.start()

    def cancel_load(self) -> bool:
        """Stop a :meth:`load` under way, from any thread; False once loaded or closed."""
        return self._orchestrator.cancel_start()

    def close(self) -> None:
        """Cancel every request, retire every worker, settle the ledger. Idempotent."""
        self._orchestrator.close()

    def __enter__(self) -> PipelineSession:
        if not self.loaded:
            self.load()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def loaded(self) -> bool:
        """Loaded and not closed: requests are admitted."""
        return self._orchestrator.running

    @property
    def execution_plan(self) -> ExecutionPlan:
        return self._orchestrator.execution_plan

    @property
    def health(self) -> SessionHealth:
        """Usable while loaded and every stage is; else why not (the first failure)."""
        if not self._orchestrator.running:
            return SessionHealth(False, f"pipeline {self.name} is not loaded")
        for client in self._orchestrator.clients:
            if not client.usable:
                failure = client.failure
                return SessionHealth(False, str(failure) if failure else f"{client} stopped")
        return SessionHealth(True)

    @property
    def usable(self) -> bool:
        return self.health.usable

    @property
    def concurrency(self) -> int:
        """How many requests run at once (1 for graph pipelines unless their program says
        otherwise, e.g. a voice's ``concurrent_requests``)."""
        return self._orchestrator.concurrency

    def example_inputs(self) -> dict[str, np.ndarray]:
        """The first stage's example inputs (a graph chain's default request)."""
        return self._orchestrator.example_inputs()

    def metrics(self) -> SessionMetrics:
        """Per-stage metrics of every finished request, and totals per stage."""
        return self._orchestrator.metrics()

    # -- requests ----------------------------------------------------------------------

    def prepare(self, inputs: Any) -> Any:
        """What :meth:`submit` makes of ``inputs``, before anything loads: bad input is refused
        here (a speech pipeline's unspeakable text); the result may be submitted as it is."""
        return self._orchestrator.program.prepare(inputs)

    def submit(
        self, inputs: Any = None, *, request_id: str | None = None, streaming: bool = False
    ) -> RequestHandle:
        """Admit a request (or raise ``ResourceUnavailable``/``UsageError``) and return its
        handle. With ``streaming`` the request takes more input through the handle
        (``feed``, ``end_input``); ``inputs``, when given, is then its first chunk."""
        if streaming and not self.streams_input:
            raise UsageError(
                f"pipeline {self.name} ({self.kind}) takes its input whole; streaming=True is "
                "accepted only by pipelines whose program streams input (a graph chain, the "
                "transcription adapter)"
            )
        request = self._orchestrator.submit(inputs, request_id=request_id, streaming=streaming)
        return RequestHandle(self._orchestrator, request)

    def run(self, inputs: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run one request to the end and return its final outputs (copies)."""
        direct = self._orchestrator.run_direct(inputs)
        if direct is not None:
            return direct
        final: dict[str, np.ndarray] = {}
        for output in self.submit(inputs):
            if output.finished:
                # The outputs are valid until acknowledged: the caller keeps a copy.
                final = output.kept_outputs()
        return final

    def cancel(self, request_id: str, *, wait: bool = True) -> bool:
        """Cancel a request by id; False when it is unknown or already finished."""
        return self._orchestrator.cancel(request_id, wait=wait)


def _output(item: StreamItem) -> OmniRequestOutput | None:
    if item is END:
        return None
    if isinstance(item, BaseException):
        raise item
    assert isinstance(item, OmniRequestOutput)
    return item


class RequestHandle:
    """One admitted request: its outputs in order, their acknowledgement, its cancel and, for
    a streaming request, the input that follows the start."""

    def __init__(self, orchestrator: Orchestrator, request: Request) -> None:
        self._orchestrator = orchestrator
        self._request = request
        self._ended = False

    @property
    def request_id(self) -> str:
        return self._request.request_id

    @property
    def streaming(self) -> bool:
        """Submitted with ``streaming=True``: takes ``feed`` until ``end_input``."""
        return self._request.input is not None

    @property
    def finished(self) -> bool:
        """Its last output (or its error) was delivered, or its final output acknowledged."""
        request = self._request
        return self._ended or request.stream.closed or request.final_consumed

    # -- outputs -----------------------------------------------------------------------

    def next(self, timeout: float | None = None) -> OmniRequestOutput | None:
        """The next output (the caller acknowledges it), None at the end; raises the
        request's error, ``TimeoutError`` after ``timeout`` seconds."""
        if self._ended:
            return None
        try:
            output = _output(self._request.stream.next_future().result(timeout))
        except BaseException as exc:
            if not isinstance(exc, TimeoutError):
                self._ended = True
            raise
        if output is None or output.finished:
            self._ended = True
        return output

    async def next_async(self) -> OmniRequestOutput | None:
        """:meth:`next` for asyncio callers (never blocks their loop)."""
        if self._ended:
            return None
        try:
            output = _output(await asyncio.wrap_future(self._request.stream.next_future()))
        except BaseException:
            self._ended = True
            raise
        if output is None or output.finished:
            self._ended = True
        return output

    @staticmethod
    def acknowledge(output: OmniRequestOutput) -> None:
        """Free what ``output`` holds (its stage's slot); idempotent."""
        output.release_stage_buffers()

    def __iter__(self) -> Iterator[OmniRequestOutput]:
        """Each output, acknowledged when iteration advances or closes; leaving early
        cancels the request."""
        try:
            while (output := self.next()) is not None:
                try:
                    yield output
                finally:
                    output.release_stage_buffers()
        finally:
            self.close(wait=True)

    async def __aiter__(self) -> AsyncIterator[OmniRequestOutput]:
        """:meth:`__iter__` for asyncio callers."""
        try:
            while (output := await self.next_async()) is not None:
                try:
                    yield output
                finally:
                    output.release_stage_buffers()
        finally:
            if not self._settled():
                await asyncio.get_running_loop().run_in_executor(None, self.cancel)

    def _settled(self) -> bool:
        request = self._request
        return request.stream.closed or request.final_consumed

    # -- input -------------------------------------------------------------------------

    def feed(self, chunk: Any) -> None:
        """More input (a streaming request only; UsageError otherwise or after end_input)."""
        self._orchestrator.feed(self._request, chunk)

    def end_input(self) -> None:
        """No more input; the program finishes the request with what it was fed."""
        self._orchestrator.end_input(self._request)

    # -- ending ------------------------------------------------------------------------

    def cancel(self, *, wait: bool = True) -> bool:
        """Cancel the request; False when it already finished."""
        return self._orchestrator.cancel(self._request.request_id, wait=wait)

    def close(self, *, wait: bool = False) -> bool:
        """Cancel the request unless it ended (without ``wait``, never blocks); idempotent.
        True when this call cancelled it (a server then looks for a retired stage)."""
        if self._settled():
            return False
        self._ended = True
        return self._orchestrator.cancel(self._request.request_id, wait=wait)

    def stop(self, *, grace_s: float = STOP_GRACE_S) -> bool:
        """For a caller that went away: end the request between stage calls unless it ended
        (never blocks; idempotent). The call in progress completes, so no worker is retired
        for it; the outputs are acknowledged as they come; one still running after
        ``grace_s`` is cancelled as by :meth:`close`. True when this call stopped it."""
        if self._settled():
            return False
        self._ended = True
        return self._orchestrator.stop(self._request.request_id, grace_s=grace_s)
