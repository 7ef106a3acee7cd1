"""The engine's view of a started stage: its client, and how requests share it.

A :class:`GraphStage` keeps the graph backend's rule of one call and one retained result;
requests that run at once (a pipeline with a language-model stage admits several) wait
for it in turn on its lock instead of being refused. A :class:`LlmStage` takes up to its
client's ``max_num_seqs`` requests at once, each with the stage's sampling defaults.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeAlias

from runtime.backends.vllm_client import VllmStageClient

if TYPE_CHECKING:
    from runtime.backends.base import StageRecord
    from runtime.backends.graph import GraphStageClient
    from runtime.backends.llm import LlmStageClient
    from runtime.config import LlmBackendConfig, StageConfig
    from runtime.contracts import RequestKey
    from runtime.contracts.llm_messages import SamplingSpec

__all__ = ["GRAPH", "LLM", "GraphStage", "LlmStage", "StageHandle"]

GRAPH: Final = "graph"
LLM: Final = "llm"


class GraphStage:
    """A started ``external.graph.v1`` stage; ``lock`` is held from a call until its slot is free."""

    kind: ClassVar[str] = GRAPH

    def __init__(self, config: StageConfig, client: GraphStageClient) -> None:
        self.config = config
        self.client = client
        self.lock = asyncio.Lock()

    @property
    def name(self) -> str:
        return self.config.name

    async def cancel(self, key: RequestKey) -> None:
        """Drop ``key``'s retained result, or retire the worker of its active call."""
        await self.client.cancel(key)

    async def close(self) -> None:
        await self.client.close()

    def record(self) -> dict[str, Any]:
        return self.client.record().to_json()


class LlmStage:
    """A ``native.vllm.v1`` stage; requests start from ``sampling`` (the pipeline's defaults)."""

    kind: ClassVar[str] = LLM

    def __init__(
        self, config: StageConfig, backend: LlmBackendConfig, client: LlmStageClient
    ) -> None:
        self.config = config
        self.backend = backend
        self.client = client
        self._started: StageRecord | None = None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def sampling(self) -> SamplingSpec:
        return self.backend.sampling

    @property
    def max_num_seqs(self) -> int:
        return self.client.max_num_seqs

    async def start(self) -> StageRecord:
        self._started = await self.client.start()
        return self._started

    async def cancel(self, key: RequestKey) -> None:
        """Abort ``key``'s request inside the engine (nothing when it is not in flight)."""
        await self.client.abort(key)

    async def close(self) -> None:
        await self.client.close()

    def record(self) -> dict[str, Any]:
        """The stage's entry of ``execution_plan`` (live for a vLLM worker)."""
        if isinstance(self.client, VllmStageClient):
            return self.client.record().to_json()
        if self._started is None:
            return {"stage": self.name, "backend": self.backend.name, "started": False}
        return self._started.to_json()


#: A started stage of either kind.
StageHandle: TypeAlias = GraphStage | LlmStage
