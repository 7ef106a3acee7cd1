"""StageRuntime: resolve -> reserve -> start -> warm up -> gate -> clients, or unwind everything.

Nothing loads before the whole plan is reserved in the ledger, and any failure retires
every started worker and settles every reservation (released, or quarantined when a
worker could not be confirmed gone) before the error reaches the caller.

Graph stages (``external.graph.v1``) and language-model stages (``native.vllm.v1``) are
resolved, reserved and started the same way; a language-model stage runs vLLM in a worker
(:class:`~runtime.backends.vllm_client.VllmStageClient`) or talks to a remote server
(``RemoteLlmStageClient``, imported only when a pipeline names a remote route).
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from runtime.admission import (
    REMOTE_LLM_MODULE,
    GraphPlacement,
    LocalLlmPlacement,
    Placement,
    RemoteLlmPlacement,
    Resolution,
    floor_refusal,
    resolve,
)
from runtime.backends.graph import GraphStageClient, GraphStageSpec, GraphTimeouts
from runtime.backends.inprocess import INPROCESS_WORKER, InProcessGraphClient
from runtime.backends.threads import plan_threads
from runtime.backends.vllm_client import (
    VllmRoute,
    VllmStageClient,
    VllmStageSpec,
    VllmTimeouts,
    pinning_env,
)
from runtime.config import (
    SMOLLM2_MODEL,
    TINY_MODEL,
    GraphBackendConfig,
    LlmBackendConfig,
    LlmRouteConfig,
    RemoteLlmRoute,
)
from runtime.devices import (
    DeviceSelection,
    Topology,
    discover_topology,
    free_shortfalls,
    load_selection,
    observed_free,
)
from runtime.engine.stages import LLM, GraphStage, LlmStage, StageHandle
from runtime.errors import ExecutionError, OmniError, UsageError
from runtime.events import EventBus, StageFailed, StageReady, StageStarting
from runtime.ledger import format_bytes
from runtime.models.marker import ModelBuildError
from runtime.models.smollm2 import ensure_smollm2_model
from runtime.models.tiny_llm import ensure_tiny_model
from runtime.records import ExecutionPlan

if TYPE_CHECKING:
    from collections.abc import Collection

    from runtime.backends.base import GraphClient, LlmClient, StageClient, StageRecord
    from runtime.config import PipelineConfig, StageConfig
    from runtime.ledger import PlanReservation, ResourceLedger, StageReservation

log = logging.getLogger("omni.engine.runtime")

__all__ = ["REMOTE_LLM_MODULE", "StageRuntime", "StageStartError", "next_generation"]

_generations = itertools.count(1)


def next_generation() -> int:
    """A process-wide unique worker generation."""
    return next(_generations)


def load_slots() -> int:
    """How many stages load at once: the cores this process may run on, at least two (a
    language-model stage and one other)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    return max(2, cores)


def _machine_capacities(topology: Topology) -> dict[str, int]:
    """The memory constraints a machine states a capacity for: what its ledger holds."""
    return {name: info.capacity for name, info in topology.constraints.items() if info.capacity}


class StageStartError(OmniError):
    """A stage failed to start; everything was unwound. Keeps the cause's exit code."""

    def __init__(self, stage: str, cause: OmniError) -> None:
        super().__init__(f"{stage} failed to start: {cause}")
        self.stage = stage
        self.cause = cause
        self.exit_code = cause.exit_code


class StageRuntime:
    """Owns the stages of one pipeline and the plan reservation behind them."""

    def __init__(
        self,
        config: PipelineConfig,
        *,
        ledger: ResourceLedger,
        events: EventBus,
        topology: Topology | None = None,
        selection: DeviceSelection | None = None,
        timeouts: GraphTimeouts | None = None,
        llm_timeouts: VllmTimeouts | None = None,
        env_dir: Path | None = None,
        concurrent: Collection[str] = (),
        solo: Collection[str] = (),
        requests: int = 1,
        single_thread: Collection[str] = (),
        resolution: Resolution | None = None,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.events = events
        self.topology = topology
        self.selection = selection
        self.timeouts = timeouts
        self.llm_timeouts = llm_timeouts
        self.env_dir = env_dir
        #: Requests a pipeline of graph stages runs at once (its program declares it).
        self.requests = max(1, requests)
        #: ONNX Runtime threads of each graph stage, split between stages that run at once
        #: (``concurrent``: graph stages the program may call at the same time; ``solo``:
        #: those it calls while the others wait; ``single_thread``: those that gain nothing
        #: from a second thread, given one where requests overlap).
        self.threads = plan_threads(
            config,
            concurrent=concurrent,
            solo=solo,
            requests=self.requests,
            single_thread=single_thread,
        )
        self.stages: list[StageHandle] = []
        #: Each stage's backend client, in stage order.
        self.clients: list[StageClient] = []
        self._plan: PlanReservation | None = None
        #: An earlier admission of this pipeline (``plan``, the studio's description): its
        #: sound bundles whose files are unchanged since are not hashed again (the worker
        #: still checks the bytes it loads against the manifest).
        self._prior = resolution

    # -- resolve (no process, no reservation) ------------------------------------------

    def _machine(self) -> tuple[Topology, DeviceSelection]:
        """The topology and device selection admission checks against (found once)."""
        if self.topology is None:
            self.topology = discover_topology()
        if self.selection is None:
            self.selection = load_selection()
        return self.topology, self.selection

    def resolution(self) -> Resolution:
        """Admission's checks of this pipeline (no process, no reservation), against the
        capacities the ledger holds: what ``plan`` reports, and what loading raises the
        first refusal of."""
        held = {name: state.capacity for name, state in self.ledger.snapshot().constraints.items()}
        prior = self._prior
        found = resolve(
            self.config,
            self.topology,
            self.selection,
            capacities=held,
            env_dir=self.env_dir,
            bundles=None
            if prior is None
            else {
                path: report
                for path, report in prior.bundles.items()
                if report.ok and report.unchanged()
            },
        )
        if found.machine is not None:
            self.topology = found.machine
        if found.selection is not None:
            self.selection = found.selection
        return found

    def _resolve(self) -> list[Placement]:
        """Every stage's placement; raises the first refusal (see :meth:`resolution`)."""
        return list(self.resolution().placements())

    def _declare_machine(self) -> None:
        """Give the ledger the machine's capacity of each constraint this pipeline names and
        the ledger lacks (the pipeline's own ceiling where the machine states none), and warn
        when the pipeline's ceiling exceeds the memory free now, as ``plan`` does."""
        capacities = self.config.capacities
        known = self.ledger.snapshot().constraints
        missing = [name for name in capacities if name not in known]
        if not missing and self.topology is None:
            return  # nothing to declare, and no local stage needed the machine found
        topology, _selection = self._machine()
        stated = _machine_capacities(topology)
        machine = {name: stated.get(name, capacities[name]) for name in missing}
        if machine:
            self.ledger.declare_capacities(machine)
        for shortfall in free_shortfalls(capacities, observed_free(topology)):
            log.warning(
                "%s declares %s as %s, more than the %s free now; loading may fail or swap",
                self.config.pipeline,
                shortfall.constraint,
                format_bytes(shortfall.capacity),
                format_bytes(shortfall.free),
            )

    # -- start -----------------------------------------------------------------------

    async def start(self) -> list[StageHandle]:
        """Start every stage; on failure unwind and raise :class:`StageStartError`."""
        resolution = self.resolution()
        self._declare_machine()
        resolved = resolution.placements()
        self._plan = self.ledger.reserve_plan(
            self.config.pipeline, self.config.demands_by_stage(), ceiling=self.config.capacities
        )
        try:
            for stage, found in zip(self.config.stages, resolved, strict=True):
                handle = await self._make_stage(stage, found, self._plan.stages[stage.name])
                self.stages.append(handle)
                self.clients.append(handle.client)
            results = await self._start_all()
            for handle, result in zip(self.stages, results, strict=True):
                if isinstance(result, BaseException):
                    if isinstance(result, OmniError):
                        raise StageStartError(handle.name, result) from result
                    raise result
        except BaseException:
            await self.close()
            raise
        return self.stages

    async def _start_all(self) -> list[StageRecord | BaseException]:
        """Start every stage, each result (or error) in :attr:`stages`' order.

        Loading a stage is CPU work in its worker (imports, verifying and loading its
        files), so more loads than cores only share the cores: at most
        :func:`load_slots` stages load at once. The local language-model stages go first,
        since theirs are the longest loads (seconds of imports and engine build): on a
        two-core machine chat-speak's model loads beside one speech stage at a time, and
        the speech stages are ready long before it."""
        gate = asyncio.Semaphore(load_slots())
        order = sorted(self.stages, key=lambda handle: handle.kind != LLM)

        async def start(handle: StageHandle) -> StageRecord:
            async with gate:
                # Published as the stage's load begins: one waiting for a slot stays "preparing".
                self.events.publish(StageStarting(stage=handle.name, route=handle.route_name))
                return await self._start_stage(handle)

        started = await asyncio.gather(*(start(handle) for handle in order), return_exceptions=True)
        found = {id(handle): result for handle, result in zip(order, started, strict=True)}
        return [found[id(handle)] for handle in self.stages]

    async def _start_stage(self, handle: StageHandle) -> StageRecord:
        """Start one stage; its ready (or failed) event carries the seconds it took."""
        started = time.monotonic()
        try:
            record = await handle.start()
        except BaseException as exc:
            message = "cancelled" if isinstance(exc, asyncio.CancelledError) else str(exc)
            elapsed = time.monotonic() - started
            self.events.publish(StageFailed(stage=handle.name, message=message, elapsed_s=elapsed))
            raise
        elapsed = time.monotonic() - started
        self.events.publish(StageReady(stage=handle.name, record=record, elapsed_s=elapsed))
        return record

    async def _make_stage(
        self, stage: StageConfig, found: Placement, reservation: StageReservation
    ) -> StageHandle:
        backend = stage.backend
        if isinstance(backend, GraphBackendConfig):
            assert isinstance(found, GraphPlacement)
            spec = GraphStageSpec(
                name=stage.name,
                bundle=found.bundle,
                route=backend.route,
                threads=self.threads.get(stage.name),
                device=found.device,
            )
            return GraphStage(stage, backend.route.name, self._graph_client(spec, reservation))
        if isinstance(found, RemoteLlmPlacement):
            # A remote stage holds no local memory: its reservation stays with this runtime.
            return LlmStage(stage, backend, self._remote_client(stage, backend, found))
        assert isinstance(found, LocalLlmPlacement)
        assert isinstance(backend.route, LlmRouteConfig)
        model_dir = await self._model_dir(stage, backend, found)
        route = backend.route
        llm_spec = VllmStageSpec(
            name=stage.name,
            model_dir=model_dir,
            engine_args=backend.engine_args,
            route=VllmRoute(
                interpreter=route.interpreter,
                os_domain=route.os_domain,
                worker=route.worker,
                env={**route.env, **pinning_env(route.ep, found.device_id)},
                ep=route.ep,
                device_id=found.device_id,
            ),
            demands=stage.resource_budget.demands,
            memory_constraint=found.memory,
        )
        vllm = VllmStageClient(
            llm_spec,
            ledger=self.ledger,
            reservation=reservation,
            generation=next_generation(),
            events=self.events,
            timeouts=self.llm_timeouts,
            env_dir=self.env_dir,
        )
        return LlmStage(stage, backend, vllm, model_dir)

    def _graph_client(self, spec: GraphStageSpec, reservation: StageReservation) -> GraphClient:
        """A worker process serves the stage, or this process for a route's ``worker: inprocess``."""
        client_class: type[GraphStageClient] | type[InProcessGraphClient] = (
            InProcessGraphClient if spec.route.worker == INPROCESS_WORKER else GraphStageClient
        )
        return client_class(
            spec,
            ledger=self.ledger,
            reservation=reservation,
            generation=next_generation(),
            events=self.events,
            timeouts=self.timeouts,
        )

    async def _model_dir(
        self, stage: StageConfig, backend: LlmBackendConfig, found: LocalLlmPlacement
    ) -> Path:
        """The model directory; a built-in model (``tiny``, ``smollm2-135m-instruct``) is made
        by the route's Python when missing, once."""
        if isinstance(backend.model, Path):
            return backend.model
        ensure = ensure_smollm2_model if backend.model == SMOLLM2_MODEL else ensure_tiny_model
        assert backend.model in (TINY_MODEL, SMOLLM2_MODEL)
        loop = asyncio.get_running_loop()
        try:
            model_dir = await loop.run_in_executor(None, ensure, found.python)
        except ModelBuildError as exc:
            raise StageStartError(stage.name, ExecutionError(str(exc))) from exc
        refused = floor_refusal(self.config, stage, backend, model_dir, found.memory)
        if refused is not None:
            raise refused
        return model_dir

    def _remote_client(
        self, stage: StageConfig, backend: LlmBackendConfig, found: RemoteLlmPlacement
    ) -> LlmClient:
        """The remote route's client; its module is imported only for a pipeline that names one."""
        route = backend.route
        assert isinstance(route, RemoteLlmRoute)
        module = importlib.import_module(REMOTE_LLM_MODULE)
        endpoint = module.RemoteEndpoint(
            url=route.url,
            model=route.model,
            api_key=found.api_key,
            connect_timeout_s=route.connect_timeout_s,
            read_timeout_s=route.read_timeout_s,
            max_in_flight=backend.engine_args.max_num_seqs,
        )
        return cast(
            "LlmClient", module.RemoteLlmStageClient(stage.name, endpoint, events=self.events)
        )

    # -- while running -----------------------------------------------------------------

    @property
    def concurrency(self) -> int:
        """Requests the pipeline runs at once: with graph stages only, what its program
        declares (``concurrent_requests``, default 1), else the smallest ``max_num_seqs`` of
        its language-model stages (graph stages take them in turn)."""
        limits = [stage.max_num_seqs for stage in self.stages if isinstance(stage, LlmStage)]
        return min(limits) if limits else self.requests

    def example_inputs(self) -> dict[str, Any]:
        """The first stage's example inputs (the default request of a graph chain)."""
        first = self.stages[0] if self.stages else None
        if not isinstance(first, GraphStage):
            raise UsageError(
                f"pipeline {self.config.pipeline} starts with a language-model stage: it takes "
                "text, and has no example tensors"
            )
        return first.client.example_inputs()

    async def close(self) -> None:
        """Retire every worker and settle every reservation. Idempotent."""
        stages, self.stages, self.clients = self.stages, [], []
        await asyncio.gather(*(stage.close() for stage in stages), return_exceptions=True)
        plan, self._plan = self._plan, None
        if plan is not None:
            # Stages whose client never took its reservation over still hold it here.
            for reservation in plan.stages.values():
                if reservation.id in {r.id for r in self.ledger.snapshot().reservations}:
                    self.ledger.release(reservation.id)

    def execution_plan(self) -> ExecutionPlan:
        """The resolved plan: identity, worker generation, route, reservations, placement."""
        return ExecutionPlan(
            pipeline=self.config.pipeline,
            source=None if self.config.source is None else str(self.config.source),
            stages=tuple(stage.record() for stage in self.stages),
        )
