"""What the engine needs from a stage backend: the client protocols and their values.

Every stage client is a :class:`StageClient` (start, record, close, ``usable``). A graph
stage's client is also a :class:`GraphClient`: one call and one retained result at a time,
freed by ``acknowledge`` or ``cancel``. A language-model stage's client is also an
:class:`LlmClient`: up to ``max_num_seqs`` requests at once, each streaming :class:`Delta`
values, ended early by ``abort``. The engine holds clients only through these protocols;
which class serves a stage is decided when the stage is made (its route).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

from runtime.errors import StageRetired
from runtime.records import ReservationRecord, StageDetail, StageRecord, WorkerRecord

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence

    import numpy as np

    from runtime.contracts import RequestKey
    from runtime.contracts.llm_messages import SamplingSpec
    from runtime.contracts.messages import TensorSpec
    from runtime.errors import OmniError
    from runtime.ledger import StageReservation

#: The stage records live in :mod:`runtime.records`; they are named here for the backends.
__all__ = [
    "CallResult",
    "Delta",
    "GraphClient",
    "LlmClient",
    "ReservationRecord",
    "StageClient",
    "StageDetail",
    "StageRecord",
    "WorkerRecord",
    "check_usable",
    "reservation_record",
]


@dataclass(frozen=True, slots=True)
class CallResult:
    """One completed stage call.

    ``outputs`` are read-only arrays over the worker's buffers, valid until the stage's slot
    is acknowledged; whoever keeps them longer copies them. ``copied_bytes`` counts the
    tensor bytes copied for this call on both sides of the pipe.
    """

    key: RequestKey
    outputs: Mapping[str, np.ndarray]
    run_s: float
    round_trip_s: float
    bytes_in: int
    bytes_out: int
    copied_bytes: int = 0

    @property
    def transfer_s(self) -> float:
        """Time spent outside the model: framing, pipes, shared memory and copies."""
        return max(0.0, self.round_trip_s - self.run_s)


@dataclass(frozen=True, slots=True)
class Delta:
    """New output of one request: the text and token ids added since the previous delta.

    ``index`` counts the request's deltas from 0; ``received_at`` is ``time.monotonic()``
    when the controller read it. The last delta has ``finished`` true and a
    ``finish_reason`` (``stop`` or ``length``); an aborted request raises
    :class:`~runtime.errors.RequestCancelled` instead of ending with a delta.
    """

    key: RequestKey
    text: str
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
    index: int
    received_at: float
    #: The prompt's length in tokens, on the last delta where the engine reports it.
    prompt_tokens: int | None = None


def reservation_record(reservation: StageReservation | None) -> ReservationRecord | None:
    """The record of a stage's reservation (None once it is settled)."""
    if reservation is None:
        return None
    return ReservationRecord(reservation.id, MappingProxyType(dict(reservation.amounts)))


def check_usable(
    name: str, failure: OmniError | None, *, running: bool, recreate: str = "pipeline"
) -> None:
    """Raise :class:`StageRetired` unless the stage takes work: it has not failed, it was
    started and not closed. ``recreate`` names what the user recreates to use it again."""
    if failure is not None:
        raise StageRetired(
            f"{name} is unusable ({failure}); recreate the {recreate} to use it again"
        )
    if not running:
        raise StageRetired(f"{name} is not running")


class StageClient(Protocol):
    """The engine's handle on one stage, whatever serves it."""

    @property
    def name(self) -> str: ...

    @property
    def usable(self) -> bool:
        """False once the stage failed, was retired or closed; recreate it to use it again."""
        ...

    @property
    def failure(self) -> OmniError | None:
        """What made the stage unusable, if anything did."""
        ...

    async def start(self) -> StageRecord:
        """Start the stage (load, warm up, check); the record says what was started."""
        ...

    def record(self) -> StageRecord:
        """The stage's entry of ``execution_plan``, as it is now."""
        ...

    async def close(self) -> None:
        """Stop the stage and settle its reservation. Idempotent."""
        ...


class GraphClient(StageClient, Protocol):
    """A graph stage: one in-flight call and one retained result.

    A call occupies the slot until its result is acknowledged (delivery does not free it);
    cancelling fences the request at once, and cancelling an *active* call retires the
    stage (it then raises :class:`StageRetired` until the pipeline is recreated).
    """

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """The fixed input bucket (names, dtypes, shapes)."""
        ...

    @property
    def outputs(self) -> tuple[TensorSpec, ...]: ...

    async def call(
        self,
        key: RequestKey,
        inputs: Mapping[str, np.ndarray],
        *,
        on_sent: Callable[[], None] | None = None,
        retain: Collection[str] = (),
    ) -> CallResult:
        """Run one call; raises ResourceUnavailable when the slot is taken.

        ``on_sent`` runs once the inputs were taken (the caller may let go of them). The
        result's arrays are read-only and valid until :meth:`acknowledge` or :meth:`cancel`.
        Inputs named in ``retain`` are kept between calls of the request: passing the same
        array object again costs no copy (freed when the request ends or is cancelled, or
        when another array is passed under that name).
        """
        ...

    @property
    def direct_calls(self) -> bool:
        """Whether :meth:`call_direct` may be used now."""
        ...

    def call_direct(
        self,
        key: RequestKey,
        inputs: Mapping[str, np.ndarray],
        *,
        on_sent: Callable[[], None] | None = None,
        retain: Collection[str] = (),
    ) -> CallResult:
        """:meth:`call` from a thread other than the loop's, blocking it until the result
        (only where :attr:`direct_calls` says so)."""
        ...

    def acknowledge(self, key: RequestKey) -> bool:
        """Free the slot held by ``key``'s retained result; a stale key is ignored (False)."""
        ...

    async def cancel(self, key: RequestKey) -> None:
        """Fence ``key``: drop a retained result, or retire the stage of an active call."""
        ...

    def example_inputs(self) -> dict[str, np.ndarray]:
        """The bundle's example inputs (the fixed bucket)."""
        ...


class LlmClient(StageClient, Protocol):
    """A language-model stage: up to ``max_num_seqs`` requests at once, text streamed.

    The delta that says ``finished`` frees the request's slot; :meth:`abort` frees it early.
    """

    @property
    def max_num_seqs(self) -> int:
        """How many requests may be in flight at once."""
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
