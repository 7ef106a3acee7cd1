"""The engine's view of a started stage: its client, and how requests share it.

A :class:`GraphStage` keeps the graph backend's rule of one call and one retained result;
requests that run at once (a pipeline with a language-model stage admits several) wait
for it in turn on its lock instead of being refused. A :class:`LlmStage` takes up to its
client's ``max_num_seqs`` requests at once, each with the stage's sampling defaults.
Both hold their client through the protocols of :mod:`runtime.backends.base`, whichever
class serves the stage.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, ClassVar, Final, TypeAlias

from runtime.chat import ChatTemplate

if TYPE_CHECKING:
    from pathlib import Path

    from runtime.backends.base import GraphClient, LlmClient, StageRecord
    from runtime.config import LlmBackendConfig, StageConfig
    from runtime.contracts import RequestKey
    from runtime.contracts.llm_messages import SamplingSpec

__all__ = ["GRAPH", "LLM", "GraphStage", "LlmStage", "StageHandle"]

GRAPH: Final = "graph"
LLM: Final = "llm"


class GraphStage:
    """A started ``external.graph.v1`` stage; ``lock`` is held from a call until its slot is free."""

    kind: ClassVar[str] = GRAPH

    def __init__(self, config: StageConfig, route_name: str, client: GraphClient) -> None:
        self.config = config
        self.route_name = route_name
        self.client = client
        self.lock = asyncio.Lock()

    @property
    def name(self) -> str:
        return self.config.name

    async def start(self) -> StageRecord:
        return await self.client.start()

    async def cancel(self, key: RequestKey) -> None:
        """Drop ``key``'s retained result, or retire the stage of its active call."""
        await self.client.cancel(key)

    async def close(self) -> None:
        await self.client.close()

    def record(self) -> StageRecord:
        return self.client.record()


class LlmStage:
    """A ``native.vllm.v1`` stage; requests start from ``sampling`` (the pipeline's defaults)."""

    kind: ClassVar[str] = LLM

    def __init__(
        self,
        config: StageConfig,
        backend: LlmBackendConfig,
        client: LlmClient,
        model_dir: Path | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.client = client
        #: The local model's folder (None for a remote route): where its chat template is.
        self.model_dir = model_dir
        self._chat_template: ChatTemplate | None = None

    @property
    def chat_template(self) -> ChatTemplate:
        """How a conversation becomes this model's prompt: its folder's chat template, or
        the plain ``role: content`` form for a model without one (and a remote route)."""
        if self._chat_template is None:
            self._chat_template = ChatTemplate.from_model_dir(self.model_dir)
        return self._chat_template

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def route_name(self) -> str:
        return self.backend.route_name

    @property
    def sampling(self) -> SamplingSpec:
        return self.backend.sampling

    @property
    def max_num_seqs(self) -> int:
        return self.client.max_num_seqs

    async def start(self) -> StageRecord:
        return await self.client.start()

    async def cancel(self, key: RequestKey) -> None:
        """Abort ``key``'s request inside the engine (nothing when it is not in flight)."""
        await self.client.abort(key)

    async def close(self) -> None:
        await self.client.close()

    def record(self) -> StageRecord:
        """The stage's entry of ``execution_plan``, as it is now."""
        return self.client.record()


#: A started stage of either kind.
StageHandle: TypeAlias = GraphStage | LlmStage
