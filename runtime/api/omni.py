"""``Omni`` (synchronous) and ``AsyncOmni`` (asyncio): a pipeline session that loads when
made (or entered), with request generators.

A request's outputs are yielded as :class:`OmniRequestOutput`; the generator acknowledges
each output when iteration advances or closes, which frees the stage for the next request.
Leaving a generator early cancels its request. Use them as context managers so every
worker, shared-memory segment and reservation is gone when the block ends::

    with Omni.from_yaml("assets/pipelines/add.yaml") as omni:
        for output in omni.generate():
            print(output.outputs["sum"])
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.api.session import PipelineSession

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator, Mapping

    import numpy as np

    from runtime.backends.graph import GraphTimeouts
    from runtime.config import PipelineConfig
    from runtime.devices import DeviceSelection, Topology
    from runtime.engine.outputs import OmniRequestOutput
    from runtime.events import EventBus
    from runtime.ledger import ResourceLedger
    from runtime.records import ExecutionPlan

__all__ = ["AsyncOmni", "Omni"]


class Omni:
    """Run a pipeline synchronously. Making it loads every stage (or raises, unwound)."""

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
        self.session = PipelineSession(
            pipeline,
            ledger=ledger,
            events=events,
            topology=topology,
            selection=selection,
            timeouts=timeouts,
        )
        self.session.load()

    @classmethod
    def from_yaml(cls, path: str | Path, **options: Any) -> Omni:
        return cls(Path(path), **options)

    @property
    def execution_plan(self) -> ExecutionPlan:
        return self.session.execution_plan

    def example_inputs(self) -> dict[str, np.ndarray]:
        return self.session.example_inputs()

    def generate(
        self, inputs: Any = None, *, request_id: str | None = None
    ) -> Iterator[OmniRequestOutput]:
        """Submit a request (on first ``next``) and yield its outputs.

        ``inputs`` is what the pipeline takes: a mapping of arrays for a graph chain (None:
        the example inputs), text for a speech pipeline, text or ``{"text": ..., <sampling
        options>}`` for a language-model pipeline, whose outputs stream the text as it is
        generated (:attr:`OmniRequestOutput.text`).
        """
        yield from self.session.submit(inputs, request_id=request_id)

    def run(self, inputs: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run one request to the end and return its final outputs."""
        return self.session.run(inputs)

    def cancel(self, request_id: str) -> bool:
        return self.session.cancel(request_id)

    def metrics(self) -> dict[str, Any]:
        """The session's metrics as JSON (``session.metrics()`` is the typed value)."""
        return self.session.metrics().to_json()

    def close(self) -> None:
        self.session.close()

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
        self.session = PipelineSession(
            pipeline,
            ledger=ledger,
            events=events,
            topology=topology,
            selection=selection,
            timeouts=timeouts,
        )

    @classmethod
    def from_yaml(cls, path: str | Path, **options: Any) -> AsyncOmni:
        return cls(Path(path), **options)

    async def start(self) -> ExecutionPlan:
        """Load every stage without blocking the caller's event loop."""
        return await asyncio.get_running_loop().run_in_executor(None, self.session.load)

    @property
    def execution_plan(self) -> ExecutionPlan:
        return self.session.execution_plan

    async def generate(
        self, inputs: Any = None, *, request_id: str | None = None
    ) -> AsyncIterator[OmniRequestOutput]:
        handle = self.session.submit(inputs, request_id=request_id)
        async for output in handle:
            yield output

    async def run(self, inputs: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        final: dict[str, np.ndarray] = {}
        async for output in self.generate(inputs):
            if output.finished:
                final = output.kept_outputs()
        return final

    async def cancel(self, request_id: str) -> bool:
        return await asyncio.get_running_loop().run_in_executor(
            None, self.session.cancel, request_id
        )

    def metrics(self) -> dict[str, Any]:
        return self.session.metrics().to_json()

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.session.close)

    async def __aenter__(self) -> AsyncOmni:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
