"""The public Python API: ``Omni`` (synchronous) and ``AsyncOmni`` (asyncio).

Both run a pipeline in an orchestrator thread of their own. A request's outputs are
yielded as :class:`OmniRequestOutput`; the generator acknowledges each output when
iteration advances or closes, which frees the stage for the next request. Leaving a
generator early cancels its request. Use them as context managers so every worker,
shared-memory segment and reservation is gone when the block ends::

    with Omni.from_yaml("assets/pipelines/add.yaml") as omni:
        for output in omni.generate():
            print(output.outputs["sum"])
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.config import PipelineConfig, load_pipeline
from runtime.engine.orchestrator import Orchestrator
from runtime.engine.outputs import END, OmniRequestOutput

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator, Mapping

    import numpy as np

    from runtime.backends.graph import GraphTimeouts
    from runtime.devices import DeviceSelection, Topology
    from runtime.engine.orchestrator import Request
    from runtime.events import EventBus
    from runtime.ledger import ResourceLedger

__all__ = ["AsyncOmni", "Omni", "OmniRequestOutput"]


def _orchestrator(
    pipeline: PipelineConfig | str | Path,
    ledger: ResourceLedger | None,
    events: EventBus | None,
    topology: Topology | None,
    selection: DeviceSelection | None,
    timeouts: GraphTimeouts | None,
) -> Orchestrator:
    config = pipeline if isinstance(pipeline, PipelineConfig) else load_pipeline(pipeline)
    return Orchestrator(
        config,
        ledger=ledger,
        events=events,
        topology=topology,
        selection=selection,
        timeouts=timeouts,
    )


def _item(request: Request, timeout: float | None = None) -> OmniRequestOutput | None:
    item = request.stream.next_future().result(timeout)
    if item is END:
        return None
    if isinstance(item, BaseException):
        raise item
    assert isinstance(item, OmniRequestOutput)
    return item


class Omni:
    """Run a pipeline synchronously. Starting loads every stage (or raises, unwound)."""

    def __init__(
        self,
        pipeline: PipelineConfig | str | Path,
        *,
        ledger: ResourceLedger | None = None,
        events: EventBus | None = None,
        topology: Topology | None = None,
        selection: DeviceSelection | None = None,
        timeouts: GraphTimeouts | None = None,
    ) -> None:
        self.orchestrator = _orchestrator(pipeline, ledger, events, topology, selection, timeouts)
        self.orchestrator.start()

    @classmethod
    def from_yaml(cls, path: str | Path, **options: Any) -> Omni:
        return cls(Path(path), **options)

    @property
    def execution_plan(self) -> dict[str, Any]:
        return self.orchestrator.execution_plan

    def example_inputs(self) -> dict[str, np.ndarray]:
        return self.orchestrator.example_inputs()

    def generate(
        self, inputs: Any = None, *, request_id: str | None = None
    ) -> Iterator[OmniRequestOutput]:
        """Submit a request (on first ``next``) and yield its outputs.

        ``inputs`` is what the pipeline takes: a mapping of arrays for a graph chain (None:
        the example inputs), text for a speech pipeline, text or ``{"text": ..., <sampling
        options>}`` for a language-model pipeline, whose outputs stream the text as it is
        generated (:attr:`OmniRequestOutput.text`).
        """
        request = self.orchestrator.submit(inputs, request_id=request_id)
        try:
            while (output := _item(request)) is not None:
                try:
                    yield output
                finally:
                    output.release_stage_buffers()
                if output.finished:
                    # Nothing follows a final output: the loop winds the request up alone.
                    return
        finally:
            if not request.stream.closed and not request.final_consumed:
                self.orchestrator.cancel(request.request_id)

    def run(self, inputs: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run one request to the end and return its final outputs."""
        direct = self.orchestrator.run_direct(inputs)
        if direct is not None:
            return direct
        final: dict[str, np.ndarray] = {}
        for output in self.generate(inputs):
            if output.finished:
                # The outputs are valid until acknowledged: the caller keeps a copy.
                final = output.kept_outputs()
        return final

    def cancel(self, request_id: str) -> bool:
        return self.orchestrator.cancel(request_id)

    def metrics(self) -> dict[str, Any]:
        return self.orchestrator.metrics()

    def close(self) -> None:
        self.orchestrator.close()

    def __enter__(self) -> Omni:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncOmni:
    """Run a pipeline from asyncio code: ``async with AsyncOmni.from_yaml(path) as omni``."""

    def __init__(
        self,
        pipeline: PipelineConfig | str | Path,
        *,
        ledger: ResourceLedger | None = None,
        events: EventBus | None = None,
        topology: Topology | None = None,
        selection: DeviceSelection | None = None,
        timeouts: GraphTimeouts | None = None,
    ) -> None:
        self.orchestrator = _orchestrator(pipeline, ledger, events, topology, selection, timeouts)

    @classmethod
    def from_yaml(cls, path: str | Path, **options: Any) -> AsyncOmni:
        return cls(Path(path), **options)

    async def start(self) -> dict[str, Any]:
        """Load every stage without blocking the caller's event loop."""
        return await asyncio.get_running_loop().run_in_executor(None, self.orchestrator.start)

    @property
    def execution_plan(self) -> dict[str, Any]:
        return self.orchestrator.execution_plan

    async def generate(
        self, inputs: Any = None, *, request_id: str | None = None
    ) -> AsyncIterator[OmniRequestOutput]:
        request = self.orchestrator.submit(inputs, request_id=request_id)
        try:
            while True:
                item = await asyncio.wrap_future(request.stream.next_future())
                if item is END:
                    return
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, OmniRequestOutput)
                try:
                    yield item
                finally:
                    item.release_stage_buffers()
                if item.finished:
                    return
        finally:
            if not request.stream.closed and not request.final_consumed:
                await asyncio.get_running_loop().run_in_executor(
                    None, self.orchestrator.cancel, request.request_id
                )

    async def run(self, inputs: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        final: dict[str, np.ndarray] = {}
        async for output in self.generate(inputs):
            if output.finished:
                final = output.kept_outputs()
        return final

    async def cancel(self, request_id: str) -> bool:
        return await asyncio.get_running_loop().run_in_executor(
            None, self.orchestrator.cancel, request_id
        )

    def metrics(self) -> dict[str, Any]:
        return self.orchestrator.metrics()

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.orchestrator.close)

    async def __aenter__(self) -> AsyncOmni:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
