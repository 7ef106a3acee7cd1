"""What the engine needs from a language-model stage backend: the ``LlmStageClient`` protocol.

Two backends serve a ``native.vllm.v1`` stage: :class:`~runtime.backends.vllm_client.VllmStageClient`
(vLLM in a worker process) and ``RemoteLlmStageClient`` (an OpenAI-compatible server). Unlike a
graph client, which holds one call and one retained result, a language-model client takes up
to ``max_num_seqs`` requests at once and streams each one's text as
:class:`~runtime.backends.vllm_client.Delta` values; the delta that says ``finished`` frees the
request's slot, and :meth:`LlmStageClient.abort` frees it early.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from runtime.backends.base import StageRecord
    from runtime.backends.vllm_client import Delta
    from runtime.contracts import RequestKey
    from runtime.contracts.llm_messages import SamplingSpec


class LlmStageClient(Protocol):
    """The engine's handle on one language-model stage."""

    @property
    def usable(self) -> bool:
        """False once the stage failed or was closed; recreate the pipeline to use it again."""
        ...

    @property
    def max_num_seqs(self) -> int:
        """How many requests may be in flight at once."""
        ...

    async def start(self) -> StageRecord:
        """Start the stage (a worker and its engine, or a checked connection)."""
        ...

    async def generate(
        self, key: RequestKey, prompt: str | Sequence[int], sampling: SamplingSpec, /
    ) -> AsyncIterator[Delta]:
        """Start ``key``'s request; its deltas end with one that says ``finished``.

        Raises ResourceUnavailable when ``max_num_seqs`` requests are in flight. An aborted
        request's iterator raises RequestCancelled.
        """
        ...

    async def abort(self, key: RequestKey, /) -> bool:
        """Abort ``key``'s request and wait until its slot is free; False if it was not in flight."""
        ...

    async def close(self) -> None:
        """Stop the stage and settle its reservation. Idempotent."""
        ...
