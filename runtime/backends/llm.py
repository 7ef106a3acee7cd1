"""What the language-model clients share: their delta streams and their admission rule.

Two backends serve a ``native.vllm.v1`` stage, both :class:`~runtime.backends.base.LlmClient`:
:class:`~runtime.backends.vllm_client.VllmStageClient` (vLLM in a worker process) and
``RemoteLlmStageClient`` (an OpenAI-compatible server). Both stream each request's
:class:`~runtime.backends.base.Delta` values through a :class:`RequestDeltaStream` and admit
requests with :func:`check_admission`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Generic, Protocol, Self, TypeVar

from runtime.errors import ResourceUnavailable

if TYPE_CHECKING:
    from collections.abc import Collection

    from runtime.backends.base import Delta
    from runtime.contracts import RequestKey


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
