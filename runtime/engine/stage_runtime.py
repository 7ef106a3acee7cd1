"""StageRuntime: resolve -> reserve -> start -> warm up -> gate -> clients, or unwind everything.

Nothing loads before the whole plan is reserved in the ledger, and any failure retires
every started worker and settles every reservation (released, or quarantined when a
worker could not be confirmed gone) before the error reaches the caller.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import TYPE_CHECKING, Any

from runtime.artifacts import verify_bundle
from runtime.backends.graph import BACKEND_NAME, GraphStageClient, GraphTimeouts
from runtime.devices import (
    DeviceSelection,
    Topology,
    check_route_device,
    discover_topology,
    load_selection,
)
from runtime.engine.events import EventBus, StageReady, StageStarting
from runtime.errors import OmniError

if TYPE_CHECKING:
    from runtime.artifacts import VerifiedBundle
    from runtime.config import PipelineConfig
    from runtime.ledger import PlanReservation, ResourceLedger

log = logging.getLogger("omni.engine.runtime")

_generations = itertools.count(1)


def next_generation() -> int:
    """A process-wide unique worker generation."""
    return next(_generations)


class StageStartError(OmniError):
    """A stage failed to start; everything was unwound. Keeps the cause's exit code."""

    def __init__(self, stage: str, cause: OmniError) -> None:
        super().__init__(f"{stage} failed to start: {cause}")
        self.stage = stage
        self.cause = cause
        self.exit_code = cause.exit_code


class StageRuntime:
    """Owns the clients of one pipeline and the plan reservation behind them."""

    def __init__(
        self,
        config: PipelineConfig,
        *,
        ledger: ResourceLedger,
        events: EventBus,
        topology: Topology | None = None,
        selection: DeviceSelection | None = None,
        timeouts: GraphTimeouts | None = None,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.events = events
        self.topology = topology
        self.selection = selection
        self.timeouts = timeouts
        self.clients: list[GraphStageClient] = []
        self._plan: PlanReservation | None = None

    def _resolve(self) -> list[VerifiedBundle]:
        """Every check that needs no process: bundles, devices and routes."""
        topology = self.topology if self.topology is not None else discover_topology()
        selection = self.selection if self.selection is not None else load_selection()
        bundles = []
        for stage in self.config.stages:
            if stage.backend.name != BACKEND_NAME:
                raise OmniError(f"{stage.name}: backend {stage.backend.name} is not available")
            route = stage.backend.route
            check_route_device(
                topology,
                selection,
                ep=route.ep,
                target_provider=route.target_provider,
                stage=stage.name,
            )
            bundles.append(verify_bundle(stage.backend.manifest))
        return bundles

    async def start(self) -> list[GraphStageClient]:
        """Start every stage; on failure unwind and raise :class:`StageStartError`."""
        bundles = self._resolve()
        self.ledger.declare_capacities(self.config.capacities)
        self._plan = self.ledger.reserve_plan(self.config.pipeline, self.config.demands_by_stage())
        try:
            for stage, bundle in zip(self.config.stages, bundles, strict=True):
                self.clients.append(
                    GraphStageClient(
                        stage,
                        bundle=bundle,
                        ledger=self.ledger,
                        reservation=self._plan.stages[stage.name],
                        generation=next_generation(),
                        events=self.events,
                        timeouts=self.timeouts,
                    )
                )
            for client in self.clients:
                self.events.publish(StageStarting(stage=client.name, route=client.route.name))
            results = await asyncio.gather(
                *(client.start() for client in self.clients), return_exceptions=True
            )
            for client, result in zip(self.clients, results, strict=True):
                if isinstance(result, BaseException):
                    if isinstance(result, OmniError):
                        raise StageStartError(client.name, result) from result
                    raise result
                self.events.publish(StageReady(stage=client.name, record=result.to_json()))
        except BaseException:
            await self.close()
            raise
        return self.clients

    async def close(self) -> None:
        """Retire every worker and settle every reservation. Idempotent."""
        clients, self.clients = self.clients, []
        await asyncio.gather(*(client.close() for client in clients), return_exceptions=True)
        plan, self._plan = self._plan, None
        if plan is not None:
            # Stages whose client never took its reservation over still hold it here.
            for reservation in plan.stages.values():
                if reservation.id in {r.id for r in self.ledger.snapshot().reservations}:
                    self.ledger.release(reservation.id)

    def execution_plan(self) -> dict[str, Any]:
        """The resolved plan: manifest identity, worker generation, route, reservations, placement."""
        return {
            "pipeline": self.config.pipeline,
            "label": "B",
            "label_meaning": "backend execution of the listed graphs, not complete-model (P)",
            "source": None if self.config.source is None else str(self.config.source),
            "stages": [client.record().to_json() for client in self.clients],
        }
