"""What the engine needs from a stage backend: the ``StageClient`` protocol and its values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Mapping

    import numpy as np

    from runtime.contracts import RequestKey


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A named tensor of one fixed bucket: dtype and exact shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> TensorSpec:
        return cls(str(wire["name"]), str(wire["dtype"]), tuple(int(d) for d in wire["shape"]))


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
class StageRecord:
    """What a started stage reports about itself, for ``execution_plan``."""

    stage: str
    backend: str
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "backend": self.backend, **dict(self.detail)}


class StageClient(Protocol):
    """The engine's handle on one stage.

    A graph client has one in-flight call and one retained result: a call occupies the
    slot until the result is acknowledged (delivery does not free it).
    """

    name: str

    @property
    def usable(self) -> bool:
        """False once the stage was retired (worker died or an active call was cancelled)."""
        ...

    @property
    def inputs(self) -> tuple[TensorSpec, ...]: ...

    async def start(self) -> StageRecord:
        """Start the worker, load, warm up and pass the placement gate."""
        ...

    async def call(self, key: RequestKey, inputs: Mapping[str, np.ndarray]) -> CallResult:
        """Run one call; raises ResourceUnavailable when the slot is taken."""
        ...

    def acknowledge(self, key: RequestKey) -> bool:
        """Free the slot held by ``key``'s retained result; a stale key is ignored."""
        ...

    async def cancel(self, key: RequestKey) -> None:
        """Fence ``key``: drop a retained result, or retire the worker of an active call."""
        ...

    async def close(self) -> None:
        """Retire the worker and settle the stage's reservation. Idempotent."""
        ...

    def example_inputs(self) -> dict[str, np.ndarray]:
        """The bundle's example inputs (the fixed bucket)."""
        ...
