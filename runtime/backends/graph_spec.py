"""What a graph stage is made from: its resolved spec and its client's deadlines.

Both graph clients (a worker process, :mod:`runtime.backends.graph`, or this process,
:mod:`runtime.backends.inprocess`) are made from the same :class:`GraphStageSpec`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from runtime.devices import ep_device_request

if TYPE_CHECKING:
    from runtime.artifacts import VerifiedBundle
    from runtime.backends.threads import ThreadPlan
    from runtime.config import RouteConfig
    from runtime.contracts.devices import DeviceDescriptor
    from runtime.contracts.ep_device import EpDeviceRequest

__all__ = ["GraphStageSpec", "GraphTimeouts"]


@dataclass(frozen=True, slots=True)
class GraphTimeouts:
    """Deadlines of the graph client, in seconds."""

    hello_s: float = 30.0
    load_s: float = 300.0
    retire_s: float = 5.0
    #: Deadline for retiring a worker whose active call was cancelled (the stated bound).
    cancel_retire_s: float = 3.0
    shutdown_s: float = 2.0


@dataclass(frozen=True, slots=True)
class GraphStageSpec:
    """One graph stage as the engine resolved it: its verified bundle and its route.

    ``threads`` is the stage's share of ONNX Runtime threads (None: ONNX Runtime's default).
    Both graph clients (a worker process, or :mod:`runtime.backends.inprocess`) are made from it.
    """

    name: str
    bundle: VerifiedBundle
    route: RouteConfig
    threads: ThreadPlan | None = None
    #: The device admission chose for the stage (None: ONNX Runtime's default device).
    device: DeviceDescriptor | None = None

    def load_device(self) -> EpDeviceRequest | None:
        """What the worker is asked to find among ONNX Runtime's devices."""
        return None if self.device is None else ep_device_request(self.device)
