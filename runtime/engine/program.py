"""Programs: how one request moves through a pipeline's stages.

The default :class:`ChainProgram` is the seed's linear chain: each stage's outputs pass
through the next stage's ``custom_process_input_func``, and the final stage's result is
held (its slot occupied) until the caller acknowledges it. A pipeline whose only stage is a
language model runs :class:`TextProgram`: the prompt in, the text streamed out. A pipeline
may instead name a model adapter (``adapter: {name: module:Class, options: {...}}``), a
program that drives the stages itself through a :class:`RequestContext` — the speech
adapter, for example, calls the decoder stage once per audio chunk and streams each chunk
out, and the chat-to-speech adapter streams a language model's text into the voice.

A pipeline with a language-model stage runs several requests at once (up to the stage's
``max_num_seqs``); its graph stages keep their one call at a time, so a request waits for
a graph stage another request is using (:meth:`RequestContext.call`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeGuard

import numpy as np

from runtime.chat import ChatMessage, parse_messages
from runtime.config import LlmBackendConfig, resolve_callable
from runtime.contracts.llm_messages import SamplingSpec
from runtime.contracts.messages import MessageError
from runtime.contracts.structured import ResponseFormatError, structured_option
from runtime.engine.inputs import InputStream, concatenated_chunks
from runtime.engine.outputs import OmniRequestOutput
from runtime.engine.stages import GraphStage, LlmStage, StageHandle
from runtime.errors import ModelError, RequestCancelled, UsageError
from runtime.events import EventBus, RequestOutputReady, StageCallFinished
from runtime.metrics import GenerationMetrics, StageCallMetrics, recorded_prompt
from runtime.pipeline_input import TENSOR_INPUT, TEXT_INPUT

if TYPE_CHECKING:
    from types import TracebackType

    from runtime.backends.base import CallResult, Delta
    from runtime.config import PipelineConfig
    from runtime.contracts import RequestKey
    from runtime.contracts.messages import TensorSpec
    from runtime.engine.request import Request

Transform = Callable[[Mapping[str, np.ndarray]], Mapping[str, Any]]

#: Outputs a request may have delivered but not yet acknowledged before ``emit`` waits.
DEFAULT_WINDOW = 8
#: The per-request sampling options a caller may give (:class:`SamplingSpec`'s fields).
SAMPLING_OPTIONS: Final = tuple(field.name for field in dataclasses.fields(SamplingSpec))
#: The longest prompt a text request may have, in characters.
MAX_PROMPT_CHARS: Final = 100_000
#: The output name under which an output's text also travels (beside the ``pcm`` of audio).
TEXT_OUTPUT: Final = "text"


@dataclass(frozen=True, slots=True)
class Emitted:
    """One output as a program emits it (what a narrowed context hands to its hook)."""

    outputs: Mapping[str, Any]
    stage: str
    finished: bool
    metrics: Mapping[str, Any] | None
    text: str | None


EmitHook = Callable[[Emitted], Awaitable[None]]


def sampling_with(
    defaults: SamplingSpec, options: Mapping[str, Any], *, where: str
) -> SamplingSpec:
    """``defaults`` with ``options`` (fields of :class:`SamplingSpec`) replaced, checked
    (``structured_output`` may also be OpenAI's ``response_format`` object)."""
    unknown = sorted(set(options) - set(SAMPLING_OPTIONS))
    if unknown:
        raise UsageError(
            f"{where}: unknown sampling option {unknown[0]!r}; accepted: {', '.join(SAMPLING_OPTIONS)}"
        )
    values: dict[str, Any] = {
        name: tuple(value) if isinstance(value, list) else value for name, value in options.items()
    }
    wanted = values.get("max_tokens")
    if "min_tokens" not in values and isinstance(wanted, int) and wanted < defaults.min_tokens:
        # A shorter answer than the default minimum was asked for: the default gives way.
        values["min_tokens"] = max(0, wanted)
    try:
        if "structured_output" in values:
            values["structured_output"] = structured_option(values["structured_output"])
        return dataclasses.replace(defaults, **values)
    except (MessageError, TypeError, ResponseFormatError) as exc:
        raise UsageError(f"{where}: {exc}") from None


class _Resources:
    """What one request holds across its contexts: graph stages kept with ``hold=True`` and
    language-model streams not yet ended (both let go by :meth:`RequestContext.aclose`)."""

    __slots__ = ("held", "streams")

    def __init__(self) -> None:
        self.held: list[GraphStage] = []
        self.streams: list[TextStream] = []


class TextStream(AsyncIterator[str]):
    """The text of one language-model request, delta by delta (from :meth:`RequestContext.generate`).

    The request starts on the first ``__anext__``. It ends when the engine finishes it, or
    when the stream is closed early (``aclose`` or leaving ``async with``), which aborts it
    inside the engine. A cancelled request (its epoch fenced) raises RequestCancelled.
    ``text``, ``tokens`` and ``finish_reason`` describe what arrived so far.
    """

    def __init__(
        self,
        ctx: RequestContext,
        stage: LlmStage,
        prompt: str | Sequence[int],
        sampling: SamplingSpec,
    ) -> None:
        self._ctx = ctx
        self._stage = stage
        self._prompt = prompt
        self.sampling = sampling
        self._deltas: AsyncIterator[Delta] | None = None
        self._key: RequestKey | None = None
        self._ended = False
        self._parts: list[str] = []
        self.tokens = 0
        #: The prompt's length in tokens, once the engine reported it (None: not reported).
        self.prompt_tokens: int | None = None
        self.finish_reason: str | None = None
        self._started_at = 0.0
        self._first_at: float | None = None
        self._finished_at: float | None = None

    @property
    def text(self) -> str:
        """Everything generated so far."""
        return "".join(self._parts)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def __aiter__(self) -> TextStream:
        return self

    async def __aenter__(self) -> TextStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def __anext__(self) -> str:
        if self._ended:
            raise StopAsyncIteration
        request = self._ctx.request
        if self._deltas is None:
            self._ctx.check_cancelled()
            self._key = request.key
            self._started_at = time.perf_counter()
            try:
                self._deltas = await self._stage.client.generate(
                    self._key, self._prompt, self.sampling
                )
            except BaseException:
                self._forget()
                raise
        while True:
            if request.cancel_requested or request.key != self._key:
                await self.aclose()
                raise RequestCancelled(f"request {request.request_id} was cancelled")
            try:
                delta = await anext(self._deltas)
            except BaseException:
                self._forget()
                raise
            if delta.text:
                if self._first_at is None:
                    self._first_at = time.perf_counter()
                self._parts.append(delta.text)
            self.tokens += len(delta.token_ids)
            if delta.prompt_tokens is not None:
                self.prompt_tokens = delta.prompt_tokens
            if delta.finished:
                self.finish_reason = delta.finish_reason or "stop"
                self._finished_at = time.perf_counter()
                self._forget()
                self._record()
            if delta.text:
                return delta.text
            if delta.finished:
                raise StopAsyncIteration

    async def aclose(self) -> None:
        """End the stream; a request still running is aborted inside the engine. Idempotent."""
        if self._ended:
            return
        self._forget()
        if self._deltas is not None and self._key is not None:
            await self._stage.client.abort(self._key)

    def _forget(self) -> None:
        self._ended = True
        streams = self._ctx.resources.streams
        if self in streams:
            streams.remove(self)

    def metrics(self) -> dict[str, Any]:
        """What this request measured: tokens, the finish reason, time to first text, speed."""
        end = time.perf_counter() if self._finished_at is None else self._finished_at
        run_s = end - self._started_at if self._started_at else 0.0
        return {
            "tokens": self.tokens,
            "prompt_tokens": self.prompt_tokens,
            "finish_reason": self.finish_reason,
            "text_chars": sum(len(part) for part in self._parts),
            "time_to_first_token_s": None
            if self._first_at is None
            else self._first_at - self._started_at,
            "generation_s": run_s,
            "tokens_per_s": self.tokens / run_s if run_s > 0 else None,
            "prompt": recorded_prompt(self._prompt),
        }

    def _record(self) -> None:
        request = self._ctx.request
        finished = self._finished_at or time.perf_counter()
        queue_s = (
            max(0.0, self._started_at - request.submitted_at) if not request.stage_metrics else 0.0
        )
        prompt = self._prompt
        entry = StageCallMetrics(
            stage=self._stage.name,
            queue_s=queue_s,
            run_s=finished - self._started_at,
            transfer_s=0.0,
            bytes_in=len(prompt.encode("utf-8")) if isinstance(prompt, str) else 4 * len(prompt),
            bytes_out=len(self.text.encode("utf-8")),
            generation=GenerationMetrics(
                tokens=self.tokens,
                finish_reason=self.finish_reason,
                time_to_first_token_s=None
                if self._first_at is None
                else self._first_at - self._started_at,
                started_at=self._started_at,
                finished_at=finished,
                prompt=recorded_prompt(prompt),
            ),
        )
        request.stage_metrics.append(entry)
        self._ctx.events.publish(
            StageCallFinished(
                request_id=request.request_id,
                stage=entry.stage,
                queue_s=entry.queue_s,
                run_s=entry.run_s,
                transfer_s=entry.transfer_s,
                bytes_in=entry.bytes_in,
                bytes_out=entry.bytes_out,
            )
        )


def _acknowledge(stage: GraphStage, key: RequestKey) -> None:
    stage.client.acknowledge(key)


def _record_call(
    request: Request, events: EventBus, stage: str, queue_s: float, result: CallResult
) -> StageCallMetrics:
    """Record one graph call in the request's metrics and publish it."""
    entry = StageCallMetrics(
        stage=stage,
        queue_s=queue_s,
        run_s=result.run_s,
        transfer_s=result.transfer_s,
        bytes_in=result.bytes_in,
        bytes_out=result.bytes_out,
        copied_bytes=result.copied_bytes,
    )
    request.stage_metrics.append(entry)
    if events.wanted:
        events.publish(
            StageCallFinished(
                request_id=request.request_id,
                stage=entry.stage,
                queue_s=entry.queue_s,
                run_s=entry.run_s,
                transfer_s=entry.transfer_s,
                bytes_in=entry.bytes_in,
                bytes_out=entry.bytes_out,
                copied_bytes=result.copied_bytes,
            )
        )
    return entry


class RequestContext:
    """What a program may do for one request: call graph stages, stream language-model
    text, and emit outputs."""

    def __init__(
        self,
        request: Request,
        stages: Sequence[StageHandle],
        events: EventBus,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        self.request = request
        self.events = events
        self.resources = _Resources()
        self._stages = list(stages)
        self._window = window
        self._outstanding = 0
        self._acknowledged = asyncio.Event()
        self._index = 0
        #: How many of the request's calls its partial outputs carried (a streaming request).
        self._calls_sent = 0
        self._hook: EmitHook | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def stage_count(self) -> int:
        return len(self._stages)

    def stage_kind(self, stage: int) -> str:
        """``graph`` or ``llm``."""
        return self._stages[stage].kind

    def stage_inputs(self, stage: int) -> tuple[TensorSpec, ...]:
        """The fixed input bucket of a graph stage (names, dtypes, shapes)."""
        return self._graph(stage).client.inputs

    def stage_name(self, stage: int) -> str:
        return self._stages[stage].name

    def example_inputs(self, stage: int = 0) -> dict[str, np.ndarray]:
        return self._graph(stage).client.example_inputs()

    def _graph(self, stage: int) -> GraphStage:
        handle = self._stages[stage]
        if not isinstance(handle, GraphStage):
            raise UsageError(f"{handle.name} is a language-model stage; use generate(), not call()")
        return handle

    def chat_prompt(self, stage: int, messages: Sequence[ChatMessage]) -> str:
        """``messages`` rendered into the prompt of language-model ``stage`` with its model's
        chat template (UsageError when the template refuses them)."""
        return self._llm(stage).chat_template.render(messages)

    def _llm(self, stage: int) -> LlmStage:
        handle = self._stages[stage]
        if not isinstance(handle, LlmStage):
            raise UsageError(f"{handle.name} is a graph stage; use call(), not generate()")
        return handle

    def check_cancelled(self) -> None:
        """Raise RequestCancelled once a cancel was asked for (from any thread)."""
        if self.request.cancel_requested:
            raise RequestCancelled(f"request {self.request_id} was cancelled")

    def narrowed(self, first: int, emit: EmitHook) -> RequestContext:
        """A view of stages ``first``, ``first + 1``, ... numbered from 0, whose outputs go to
        ``emit`` instead of the caller: a program runs another program on some of its stages."""
        view = RequestContext(self.request, self._stages[first:], self.events, self._window)
        view.resources = self.resources
        view._hook = emit
        return view

    async def call(
        self,
        stage: int,
        tensors: Mapping[str, np.ndarray],
        *,
        hold: bool = False,
        then_release: int | None = None,
        retain: Collection[str] = (),
    ) -> CallResult:
        """One call of graph ``stage``.

        With ``hold`` the result's arrays are read in place (views over the worker's shared
        memory) and the stage keeps its slot until :meth:`release`; the arrays are valid
        until then. Without it, the arrays are copied once and the slot is acknowledged at
        once. ``then_release`` names a stage held earlier whose slot is freed as soon as
        this call's inputs are written (a handoff reads the previous stage's outputs in
        place and copies them once, into this stage's input buffers). Inputs named in
        ``retain`` stay in the stage's input buffers for the request's later calls: passing
        the same array object again (unchanged) sends it without a copy; they are freed when
        the request ends or is cancelled, or when another array is passed under that name.

        While another request of the pipeline uses the stage, this waits its turn. A request
        cancelled while the program ran (during a handoff, say) starts no new call, so no
        worker is retired for a call that had not begun."""
        handle = self._graph(stage)
        self.check_cancelled()
        waited_from = time.perf_counter()
        await handle.lock.acquire()
        on_sent = None if then_release is None else functools.partial(self.release, then_release)
        try:
            self.check_cancelled()
            started = time.perf_counter()
            result = await handle.client.call(
                self.request.key, tensors, on_sent=on_sent, retain=retain
            )
        except BaseException:
            handle.lock.release()
            raise
        if not hold:
            kept = {name: np.array(value, copy=True) for name, value in result.outputs.items()}
            result = dataclasses.replace(
                result, outputs=kept, copied_bytes=result.copied_bytes + result.bytes_out
            )
        queue_s = (
            max(0.0, started - self.request.submitted_at)
            if not self.request.stage_metrics
            else started - waited_from
        )
        _record_call(self.request, self.events, handle.name, queue_s, result)
        if hold:
            self.resources.held.append(handle)
        else:
            handle.client.acknowledge(self.request.key)
            handle.lock.release()
        return result

    def release(self, stage: int) -> None:
        """Free a slot kept with ``hold=True``."""
        handle = self._graph(stage)
        handle.client.acknowledge(self.request.key)
        if handle in self.resources.held:
            self.resources.held.remove(handle)
            handle.lock.release()

    def generate(self, stage: int, prompt: str | Sequence[int], **sampling: Any) -> TextStream:
        """Stream the text a language-model ``stage`` generates for ``prompt`` (text or token
        ids), delta by delta. ``sampling`` replaces the stage's defaults for this request
        (fields of :class:`SamplingSpec`: max_tokens, temperature, top_p, seed, stop, ...).

        Use ``async with ctx.generate(...) as text:`` so that leaving early aborts the
        request inside the engine at once; a cancel of the request aborts it too."""
        handle = self._llm(stage)
        spec = sampling_with(handle.sampling, sampling, where=handle.name)
        stream = TextStream(self, handle, prompt, spec)
        self.resources.streams.append(stream)
        return stream

    async def aclose(self) -> None:
        """Abort the request's unfinished text streams and free the graph slots it holds."""
        for stream in list(self.resources.streams):
            await stream.aclose()
        for handle in list(self.resources.held):
            self.resources.held.remove(handle)
            await handle.cancel(self.request.key)
            handle.lock.release()

    async def emit(
        self,
        outputs: Mapping[str, Any],
        *,
        stage: str,
        finished: bool = False,
        wait: bool = False,
        metrics: Mapping[str, Any] | None = None,
        text: str | None = None,
    ) -> None:
        """Hand one output to the caller. ``wait`` blocks until the caller acknowledges it;
        otherwise this waits only while ``window`` outputs are unacknowledged. ``text`` is a
        language-model stage's text (see :attr:`OmniRequestOutput.text`); it also goes into
        the outputs as ``text``."""
        if self._hook is not None:
            await self._hook(Emitted(dict(outputs), stage, finished, metrics, text))
            return
        while self._outstanding >= self._window:
            self._acknowledged.clear()
            await self._acknowledged.wait()
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def acknowledged() -> None:
            self._outstanding -= 1
            self._acknowledged.set()
            if not done.done():
                done.set_result(None)

        values = dict(outputs)
        if text is not None:
            values[TEXT_OUTPUT] = text
        calls = self.request.stage_metrics
        if self.request.input is not None and not finished:
            # A streaming request may run for hours: each partial output carries the calls
            # made since the previous one, the final output all of them.
            calls = calls[self._calls_sent :]
            self._calls_sent += len(calls)
        output = OmniRequestOutput(
            request_id=self.request_id,
            stage=stage,
            outputs=values,
            finished=finished,
            index=self._index,
            metrics={"stages": [call.to_json() for call in calls], **(metrics or {})},
            text=text,
            calls=tuple(calls),
        )
        request = self.request

        def release() -> None:
            if finished:
                # From the caller's thread: the request is consumed; no need to wait for the
                # loop before admitting the next one.
                request.final_consumed = True
            self._release_from_any_thread(loop, acknowledged)

        output._release = release
        self._outstanding += 1
        self._index += 1
        self.request.stream.put(output)
        self.events.publish(
            RequestOutputReady(
                request_id=self.request_id, stage=stage, index=output.index, finished=finished
            )
        )
        if wait:
            await done

    @staticmethod
    def _release_from_any_thread(
        loop: asyncio.AbstractEventLoop, acknowledged: Callable[[], None]
    ) -> None:
        if not loop.is_closed():
            loop.call_soon_threadsafe(acknowledged)


class PipelineProgram(Protocol):
    """A model adapter: validates a request's input, then drives the stages for it.

    A program that takes input after its request started says ``streams_input = True`` and
    offers ``prepare_chunk(chunk)`` (check one chunk, in the caller's thread) and
    ``async run_streaming(ctx, chunks: InputStream)`` (read the chunks until the caller ends
    its input). It may name what it is in ``kind`` (``graph``, ``speech``, ...)."""

    def prepare(self, request_input: Any) -> Any:
        """Check and convert the caller's input (in the caller's thread); raise UsageError."""
        ...

    async def run(self, ctx: RequestContext, prepared: Any) -> None:
        """Call stages and emit outputs; the last emitted output has ``finished=True``."""
        ...


class StreamingProgram(PipelineProgram, Protocol):
    """A program that takes input after its request started (``streams_input = True``)."""

    def prepare_chunk(self, chunk: Any) -> Any:
        """Check and convert one chunk (in the caller's thread); raise UsageError."""
        ...

    async def run_streaming(self, ctx: RequestContext, chunks: InputStream) -> None:
        """Read the chunks until the caller ends its input; emit as :meth:`run` does."""
        ...


def streams_input(program: object) -> TypeGuard[StreamingProgram]:
    """Whether ``program`` takes input after its request started (``streams_input``)."""
    return getattr(program, "streams_input", False) is True


def program_kind(program: object) -> str:
    """What ``program`` is, in a word: its ``kind``, else ``adapter``."""
    kind = getattr(program, "kind", None)
    return kind if isinstance(kind, str) else "adapter"


class ChainProgram:
    """The linear chain of graph stages with model-owned handoff transforms."""

    input_kind: Final = TENSOR_INPUT
    kind: Final = "graph"
    #: Fed in chunks (mappings of arrays), joined along axis 0 at the end of input, then run.
    streams_input: Final = True

    def __init__(self, config: PipelineConfig) -> None:
        self.config = config
        self._transforms: dict[int, Transform] = {}
        for stage in config.stages:
            if stage.custom_process_input_func is not None:
                self._transforms[stage.stage_id] = resolve_callable(
                    stage.custom_process_input_func,
                    file=str(config.source),
                    line=stage.location.line,
                    key=f"stages[{stage.stage_id}].custom_process_input_func",
                )

    def prepare(self, request_input: Any) -> Mapping[str, np.ndarray] | None:
        if request_input is None:
            return None
        if not isinstance(request_input, Mapping):
            raise UsageError(
                f"pipeline {self.config.pipeline} takes a mapping of input name to array, "
                f"not {type(request_input).__name__}"
            )
        return {str(name): np.asarray(value) for name, value in request_input.items()}

    def prepare_chunk(self, chunk: Any) -> dict[str, np.ndarray]:
        """One chunk of a streaming request: a non-empty mapping of arrays with an axis 0."""
        prepared = self.prepare(chunk)
        if not prepared:
            raise UsageError(
                f"pipeline {self.config.pipeline}: a chunk is a non-empty mapping of input "
                f"name to array, not {chunk!r}"
            )
        for name, value in prepared.items():
            if value.ndim == 0:
                raise UsageError(
                    f"pipeline {self.config.pipeline}: chunk input {name!r} is a scalar; "
                    "accepted: arrays with at least one axis (chunks are joined along axis 0)"
                )
        return dict(prepared)

    async def run_streaming(self, ctx: RequestContext, chunks: InputStream) -> None:
        """Gather the chunks until the end of input, then run the chain once on them."""
        gathered = [chunk async for chunk in chunks]
        ctx.check_cancelled()
        await self.run(ctx, concatenated_chunks(gathered, pipeline=self.config.pipeline))

    async def run(self, ctx: RequestContext, prepared: Mapping[str, np.ndarray] | None) -> None:
        inputs = prepared if prepared is not None else ctx.example_inputs(0)
        last = ctx.stage_count - 1
        for index in range(ctx.stage_count):
            # Each stage's result is read in place and held until the next stage's inputs
            # are written: the handoff costs one copy, into the next worker's input buffer.
            result = await ctx.call(
                index, inputs, hold=True, then_release=index - 1 if index else None
            )
            if index < last:
                inputs = self.handoff(index + 1, result.outputs)
                continue
            try:
                await ctx.emit(
                    result.outputs, stage=ctx.stage_name(index), finished=True, wait=True
                )
            finally:
                ctx.release(index)

    def run_direct(
        self, request: Request, stages: Sequence[GraphStage], events: EventBus
    ) -> dict[str, np.ndarray]:
        """Run ``request`` on the calling thread (not the loop's) and return its final
        outputs, copied once: the same chain as :meth:`run`, each stage called with
        ``call_direct``. The orchestrator takes this way only while the request is the only
        one admitted, so no other request waits for these stages."""
        prepared: Mapping[str, np.ndarray] | None = request.inputs
        inputs = prepared if prepared is not None else stages[0].client.example_inputs()
        last = len(stages) - 1
        held: tuple[GraphStage, RequestKey] | None = None
        try:
            for index, handle in enumerate(stages):
                if request.cancel_requested:
                    raise RequestCancelled(f"request {request.request_id} was cancelled")
                key = request.key
                on_sent = None if held is None else functools.partial(_acknowledge, *held)
                started = time.perf_counter()
                result = handle.client.call_direct(key, inputs, on_sent=on_sent)
                held = (handle, key)
                queue_s = max(0.0, started - request.submitted_at) if index == 0 else 0.0
                _record_call(request, events, handle.name, queue_s, result)
                if index < last:
                    inputs = self.handoff(index + 1, result.outputs)
                    continue
                # The final outputs outlive the slot: the caller's one copy.
                kept = {name: np.array(value, copy=True) for name, value in result.outputs.items()}
                if events.wanted:
                    events.publish(
                        RequestOutputReady(
                            request_id=request.request_id, stage=handle.name, index=0, finished=True
                        )
                    )
                return kept
        finally:
            if held is not None:
                _acknowledge(*held)
        raise AssertionError("a chain has at least one stage")

    def handoff(self, stage_id: int, outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model-owned transform on the previous stage's outputs (read in place).

        The tensors it returns are copied once, when the next call writes them into its
        worker's input buffer; the previous stage is acknowledged right after that."""
        transform = self._transforms.get(stage_id)
        if transform is None:
            raise UsageError(f"stage-{stage_id} has no custom_process_input_func")
        handed = transform(outputs)
        tensors = handed.get("tensors") if isinstance(handed, Mapping) else None
        if not isinstance(tensors, Mapping) or not tensors:
            raise ModelError(
                f"stage-{stage_id}'s custom_process_input_func must return "
                f"{{'tensors': {{name: array}}}}, got {type(handed).__name__}"
            )
        return {str(name): np.asarray(value) for name, value in tensors.items()}


@dataclass(frozen=True, slots=True)
class TextRequest:
    """A checked text request: the prompt, or a conversation (``messages``, rendered with the
    model's chat template when the request runs; ``prompt`` is then the last user turn), and
    the sampling options replacing the stage's."""

    prompt: str
    sampling: Mapping[str, Any]
    messages: tuple[ChatMessage, ...] | None = None


def parse_text_request(
    request_input: object, *, pipeline: str, defaults: SamplingSpec, extra_keys: Sequence[str] = ()
) -> tuple[TextRequest, dict[str, Any]]:
    """Text, ``{"text": str, <sampling options>...}`` or ``{"messages": [{"role", "content"},
    ...], <sampling options>...}`` -> a :class:`TextRequest`.

    ``extra_keys`` are other keys the caller's program accepts; their values come back in the
    second item. Raises UsageError naming what is accepted.
    """
    accepted = (
        "a string, {'text': str} or {'messages': [{'role', 'content'}, ...]}, with sampling "
        f"options ({', '.join(SAMPLING_OPTIONS)})"
    )
    extra: dict[str, Any] = {}
    messages: tuple[ChatMessage, ...] | None = None
    if isinstance(request_input, str):
        text: object = request_input
        options: dict[str, Any] = {}
    elif isinstance(request_input, Mapping):
        keys = [str(key) for key in request_input]
        unknown = sorted(set(keys) - {"text", "messages", *SAMPLING_OPTIONS, *extra_keys})
        given = [key for key in ("text", "messages") if key in request_input]
        if unknown or len(given) != 1:
            problem = (
                f"unknown key {unknown[0]!r}"
                if unknown
                else "both 'text' and 'messages'"
                if given
                else "no 'text' or 'messages'"
            )
            raise UsageError(
                f"pipeline {pipeline}: the request has {problem}; accepted: {accepted}"
            )
        if given == ["messages"]:
            messages = parse_messages(request_input["messages"], where=f"pipeline {pipeline}")
            text = messages[-1].content
        else:
            text = request_input["text"]
        options = {key: value for key, value in request_input.items() if key in SAMPLING_OPTIONS}
        extra = {key: value for key, value in request_input.items() if key in extra_keys}
    else:
        found = "nothing" if request_input is None else type(request_input).__name__
        raise UsageError(f"pipeline {pipeline} takes text; got {found}; accepted: {accepted}")
    if not isinstance(text, str) or not text.strip():
        raise UsageError(
            f"pipeline {pipeline}: the text is {'empty' if isinstance(text, str) else type(text).__name__}; "
            f"accepted: {accepted}"
        )
    if len(text) > MAX_PROMPT_CHARS:
        raise UsageError(
            f"pipeline {pipeline}: the text has {len(text)} characters; accepted: at most "
            f"{MAX_PROMPT_CHARS}"
        )
    sampling_with(defaults, options, where=f"pipeline {pipeline}")
    return TextRequest(text, options, messages), extra


#: Where a prompt template puts the request's text.
PROMPT_SLOT: Final = "{text}"
#: The prompt template that makes a text request the user's turn in the model's chat template.
CHAT_TEMPLATE: Final = "chat"


def check_prompt_template(template: object, *, where: str) -> str:
    """A prompt template (``{text}`` exactly once, or ``chat``); UsageError otherwise."""
    if not isinstance(template, str) or (
        template != CHAT_TEMPLATE and template.count(PROMPT_SLOT) != 1
    ):
        raise UsageError(
            f"{where}: {template!r} is not a prompt template; accepted: a string with "
            f"{PROMPT_SLOT} exactly once, where the request's text goes, or {CHAT_TEMPLATE!r} "
            "(the text as the user's turn in the model's chat template)"
        )
    return template


def text_prompt(ctx: RequestContext, stage: int, request: TextRequest, template: str) -> str:
    """The prompt of language-model ``stage`` for ``request``: its conversation in the
    model's chat template, or its text placed by ``template`` (``chat``: as the user's turn)."""
    if request.messages is not None:
        return ctx.chat_prompt(stage, request.messages)
    if template == CHAT_TEMPLATE:
        return ctx.chat_prompt(stage, (ChatMessage("user", request.prompt),))
    return template.replace(PROMPT_SLOT, request.prompt)


class TextProgram:
    """A lone language-model stage: the prompt in, its text streamed out.

    As a pipeline's adapter (``runtime.engine.program:TextProgram``) it takes the option
    ``prompt_template``: ``{text}`` (the default: the text as it is), a template with
    ``{text}`` once, or ``chat`` (the text as the user's turn in the model's chat template).

    Each partial output carries the new text in :attr:`OmniRequestOutput.text`; the final one
    carries the whole text, and its ``metrics`` hold the tokens, the finish reason, the time to
    the first text and the speed.
    """

    input_kind: Final = TEXT_INPUT
    kind: Final = "text"
    example_text: Final = "The river and the mountain"

    def __init__(self, config: PipelineConfig, options: Mapping[str, Any] | None = None) -> None:
        backend = config.stages[0].backend
        if not isinstance(backend, LlmBackendConfig) or len(config.stages) != 1:
            raise UsageError(
                f"pipeline {config.pipeline}: a text program runs one language-model stage"
            )
        self.config = config
        self.sampling = backend.sampling
        options = dict(options or {})
        where = f"pipeline {config.pipeline}: adapter.options"
        unknown = sorted(set(options) - {"prompt_template", "example_text"})
        if unknown:
            raise UsageError(
                f"{where}: unknown option {unknown[0]!r}; accepted: prompt_template, example_text"
            )
        self.prompt_template = check_prompt_template(
            options.get("prompt_template", PROMPT_SLOT), where=f"{where}.prompt_template"
        )

    def prepare(self, request_input: Any) -> TextRequest:
        request, _ = parse_text_request(
            request_input, pipeline=self.config.pipeline, defaults=self.sampling
        )
        return request

    async def run(self, ctx: RequestContext, request: TextRequest) -> None:
        stage = ctx.stage_name(0)
        prompt = text_prompt(ctx, 0, request, self.prompt_template)
        async with ctx.generate(0, prompt, **request.sampling) as stream:
            async for text in stream:
                await ctx.emit({}, stage=stage, text=text)
        await ctx.emit(
            {}, stage=stage, finished=True, text=stream.text, metrics=stream.metrics(), wait=False
        )


def load_program(config: PipelineConfig) -> PipelineProgram:
    """The pipeline's adapter when it names one, else the linear chain (or the text program
    of a lone language-model stage)."""
    if config.adapter is None:
        if isinstance(config.stages[0].backend, LlmBackendConfig):
            return TextProgram(config)
        return ChainProgram(config)
    factory = resolve_callable(
        config.adapter.name,
        file=str(config.source),
        line=config.adapter.line,
        key="adapter.name",
    )
    program = factory(config, dict(config.adapter.options))
    if not hasattr(program, "run") or not hasattr(program, "prepare"):
        raise UsageError(f"adapter {config.adapter.name} does not provide prepare() and run()")
    return program  # type: ignore[no-any-return]
