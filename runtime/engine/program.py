"""Programs: how one request moves through a pipeline's stages.

The default :class:`ChainProgram` is the seed's linear chain: each stage's outputs pass
through the next stage's ``custom_process_input_func``, and the final stage's result is
held (its slot occupied) until the caller acknowledges it. A pipeline may instead name a
model adapter (``adapter: {name: module:Class, options: {...}}``), a program that drives
the stages itself through a :class:`RequestContext` — the speech adapter, for example,
calls the decoder stage once per audio chunk and streams each chunk out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from runtime.config import resolve_callable
from runtime.engine.events import EventBus, RequestOutputReady, StageCallFinished
from runtime.engine.outputs import OmniRequestOutput
from runtime.errors import ModelError, RequestCancelled, UsageError

if TYPE_CHECKING:
    from runtime.backends.base import CallResult, TensorSpec
    from runtime.backends.graph import GraphStageClient
    from runtime.config import PipelineConfig
    from runtime.engine.orchestrator import Request

Transform = Callable[[Mapping[str, np.ndarray]], Mapping[str, Any]]

#: Outputs a request may have delivered but not yet acknowledged before ``emit`` waits.
DEFAULT_WINDOW = 8


class RequestContext:
    """What a program may do for one request: call stages and emit outputs."""

    def __init__(
        self,
        request: Request,
        clients: list[GraphStageClient],
        events: EventBus,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        self.request = request
        self._clients = clients
        self._events = events
        self._window = window
        self._outstanding = 0
        self._acknowledged = asyncio.Event()
        self._index = 0

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def stage_count(self) -> int:
        return len(self._clients)

    def stage_inputs(self, stage: int) -> tuple[TensorSpec, ...]:
        """The fixed input bucket of a stage (names, dtypes, shapes)."""
        return self._clients[stage].inputs

    def stage_name(self, stage: int) -> str:
        return self._clients[stage].name

    def example_inputs(self, stage: int = 0) -> dict[str, np.ndarray]:
        return self._clients[stage].example_inputs()

    async def call(
        self, stage: int, tensors: Mapping[str, np.ndarray], *, hold: bool = False
    ) -> CallResult:
        """One call of ``stage``. Its result arrays are already the caller's copies, so the
        slot is acknowledged at once unless ``hold`` keeps it (release with :meth:`release`).

        A request cancelled while the program ran (during a handoff, say) starts no new call,
        so no worker is retired for a call that had not begun."""
        if self.request.cancel_requested:
            raise RequestCancelled(f"request {self.request_id} was cancelled")
        client = self._clients[stage]
        started = time.perf_counter()
        result = await client.call(self.request.key, tensors)
        queue_s = (
            max(0.0, started - self.request.submitted_at) if not self.request.stage_metrics else 0.0
        )
        entry: dict[str, Any] = {
            "stage": client.name,
            "queue_s": queue_s,
            "run_s": result.run_s,
            "transfer_s": result.transfer_s,
            "bytes_in": result.bytes_in,
            "bytes_out": result.bytes_out,
        }
        self.request.stage_metrics.append(entry)
        self._events.publish(StageCallFinished(request_id=self.request_id, **entry))
        if not hold:
            client.acknowledge(self.request.key)
        return result

    def release(self, stage: int) -> None:
        """Free a slot kept with ``hold=True``."""
        self._clients[stage].acknowledge(self.request.key)

    async def emit(
        self,
        outputs: Mapping[str, Any],
        *,
        stage: str,
        finished: bool = False,
        wait: bool = False,
        metrics: Mapping[str, Any] | None = None,
    ) -> None:
        """Hand one output to the caller. ``wait`` blocks until the caller acknowledges it;
        otherwise this waits only while ``window`` outputs are unacknowledged."""
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

        output = OmniRequestOutput(
            request_id=self.request_id,
            stage=stage,
            outputs=dict(outputs),
            finished=finished,
            index=self._index,
            metrics={"stages": list(self.request.stage_metrics), **(metrics or {})},
        )
        output._release = lambda: self._release_from_any_thread(loop, acknowledged)
        self._outstanding += 1
        self._index += 1
        self.request.stream.put(output)
        self._events.publish(
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
    """A model adapter: validates a request's input, then drives the stages for it."""

    def prepare(self, request_input: Any) -> Any:
        """Check and convert the caller's input (in the caller's thread); raise UsageError."""
        ...

    async def run(self, ctx: RequestContext, prepared: Any) -> None:
        """Call stages and emit outputs; the last emitted output has ``finished=True``."""
        ...


class ChainProgram:
    """The linear chain of graph stages with model-owned handoff transforms."""

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

    async def run(self, ctx: RequestContext, prepared: Mapping[str, np.ndarray] | None) -> None:
        inputs = prepared if prepared is not None else ctx.example_inputs(0)
        last = ctx.stage_count - 1
        for index in range(ctx.stage_count):
            result = await ctx.call(index, inputs, hold=index == last)
            if index < last:
                inputs = self.handoff(index + 1, result.outputs)
                continue
            try:
                await ctx.emit(
                    result.outputs, stage=ctx.stage_name(index), finished=True, wait=True
                )
            finally:
                ctx.release(index)

    def handoff(self, stage_id: int, outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model-owned transform and copy its tensors (before acknowledgement)."""
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
        return {str(name): np.array(value, copy=True) for name, value in tensors.items()}


def load_program(config: PipelineConfig) -> PipelineProgram:
    """The pipeline's adapter when it names one, else the linear chain."""
    if config.adapter is None:
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
