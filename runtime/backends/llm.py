"""What the engine needs from a language-model stage backend: the ``LlmStageClient`` protocol.

Two backends serve a ``native.vllm.v1`` stage: :class:`~runtime.backends.vllm_client.VllmStageClient`
(vLLM in a worker process) and ``RemoteLlmStageClient`` (an OpenAI-compatible server). Unlike a
graph client, which holds one call and one retained result, a language-model client takes up
to ``max_num_seqs`` requests at once and streams each one's text as
:class:`~runtime.backends.vllm_client.Delta` values; the delta that says ``finished`` frees the
request's slot, and :meth:`LlmStageClient.abort` frees it early. Both clients stream through a
:class:`RequestDeltaStream` and admit requests with :func:`check_admission`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Generic, Protocol, Self, TypeVar

from runtime.errors import ResourceUnavailable

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

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


class _Aborts(Protocol):
    async def abort(self, key: RequestKey, /) -> bool: ...


class _Keyed(Protocol):
    @property
    def key(self) -> RequestKey: ...


ClientT = TypeVar("ClientT", bound=_Aborts)
RequestT = TypeVar("RequestT", bound=_Keyed)


class RequestDeltaStream(AsyncIterator["Delta"], Generic[ClientT, RequestT]):
    """The deltas of one request, in order. Closing it early aborts the request.

    A subclass reads the next delta in :meth:`_next`, and marks the stream ended before it
    raises an error that ends the request.
    """

    def __init__(self, client: ClientT, request: RequestT) -> None:
        self._client = client
        self._request = request
        self._ended = False

    @property
    def key(self) -> RequestKey:
        return self._request.key

    def __aiter__(self) -> Self:
        return self

    @abstractmethod
    async def _next(self) -> Delta:
        """The request's next delta."""

    async def __anext__(self) -> Delta:
        if self._ended:
            raise StopAsyncIteration
        delta = await self._next()
        if delta.finished:
            self._ended = True
        return delta

    async def aclose(self) -> None:
        """Abort the request if it has not finished; idempotent."""
        if not self._ended:
            self._ended = True
            await self._client.abort(self._request.key)


def check_admission(
    name: str, key: RequestKey, in_flight: Collection[str], most: int, limit: str
) -> None:
    """Raise ResourceUnavailable unless ``key``'s request may start next to ``in_flight``.

    ``in_flight`` holds the request ids in flight; ``limit`` names the setting ``most`` is.
    """
    if key.request_id in in_flight:
        raise ResourceUnavailable(
            f"{name}: request {key.request_id} is already in flight; abort it first"
        )
    if len(in_flight) >= most:
        raise ResourceUnavailable(
            f"{name}: {len(in_flight)} requests are in flight, the most "
            f"{limit} = {most} allows; wait for one to finish or abort it"
        )
