"""``plan``: everything that can be checked before anything loads.

A plan validates the pipeline file, verifies every graph stage's bundle, names every
language-model stage's model and route, and explains the memory budget per constraint.
It starts no process and reserves nothing. As loading does, it refuses demands above the
pipeline's own declared capacities or above the machine's capacity of a constraint, and
warns where a declared capacity exceeds the memory free now.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .artifacts import BundleReport, inspect_bundle
from .config import LlmBackendConfig, PipelineConfig, RemoteLlmRoute, load_pipeline
from .devices import (
    DeviceSelection,
    Topology,
    check_route_device,
    discover_topology,
    free_shortfalls,
    load_selection,
    observed_free,
    route_domain,
)
from .errors import DeviceExcluded
from .ledger import BudgetExplanation, explain_budget, format_bytes

if TYPE_CHECKING:
    from pathlib import Path


@dataclass(frozen=True, slots=True)
class StagePlan:
    """One stage as the plan sees it: a graph stage's bundle, or a language-model stage's model."""

    name: str
    backend: str
    route: dict[str, Any]
    demands: dict[str, int]
    bundle: BundleReport | None
    device: str | None = None
    model: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.name,
            "backend": self.backend,
            "route": self.route,
            "device": self.device,
            "demands": self.demands,
            "bundle": None if self.bundle is None else self.bundle.to_json(),
            "model": self.model,
        }


@dataclass(frozen=True, slots=True)
class PipelinePlan:
    """The outcome of ``plan``: admitted only when every check passed."""

    config: PipelineConfig
    topology: Topology
    stages: tuple[StagePlan, ...]
    budget: BudgetExplanation
    warnings: tuple[str, ...] = ()
    refusals: tuple[str, ...] = field(default=())

    @property
    def admitted(self) -> bool:
        return not self.refusals

    def to_json(self) -> dict[str, Any]:
        return {
            "pipeline": self.config.pipeline,
            "source": None if self.config.source is None else str(self.config.source),
            "topology": self.topology.source,
            "admitted": self.admitted,
            "refusals": list(self.refusals),
            "warnings": list(self.warnings),
            "stages": [stage.to_json() for stage in self.stages],
            "budget": self.budget.to_json(),
        }

    def to_text(self) -> str:
        lines = [
            f"pipeline {self.config.pipeline} ({self.config.source})",
            f"machine: {self.topology.source}",
        ]
        for stage in self.stages:
            route = stage.route
            bundle = stage.bundle
            if stage.model is not None:
                if route.get("url"):
                    via = f"the server {route.get('url')}"
                else:
                    via = f"route {route.get('name')} ({route.get('interpreter')})"
                lines.append(f"  {stage.name}: {stage.backend} via {via}; model {stage.model}")
                continue
            status = "no bundle" if bundle is None else ("verified" if bundle.ok else "REFUSED")
            lines.append(
                f"  {stage.name}: {stage.backend} via route {route.get('name')} "
                f"({route.get('ep')}, {route.get('os_domain')}) on {stage.device or 'no device'}; "
                f"bundle {status}"
            )
        lines.append(
            "memory budget (the pipeline's declared ceilings; loading also charges the "
            "machine's capacity, shared with every other loaded pipeline):"
        )
        lines.extend(f"  {line}" for line in self.budget.to_text().splitlines())
        lines.extend(f"warning: {warning}" for warning in self.warnings)
        lines.extend(f"refused: {refusal}" for refusal in self.refusals)
        lines.append("admitted: nothing was loaded" if self.admitted else "REFUSED")
        return "\n".join(lines)


def _llm_route_json(backend: LlmBackendConfig) -> dict[str, Any]:
    route = backend.route
    if isinstance(route, RemoteLlmRoute):
        return {
            "name": backend.route_name,
            "url": route.url,
            "model": route.model,
            "api_key_env": route.api_key_env,
            "connect_timeout_s": route.connect_timeout_s,
            "read_timeout_s": route.read_timeout_s,
        }
    return {
        "name": route.name,
        "interpreter": route.interpreter,
        "worker": route.worker,
        "os_domain": route.os_domain,
    }


def _route_json(config: PipelineConfig, index: int) -> dict[str, Any]:
    backend = config.stages[index].backend
    if isinstance(backend, LlmBackendConfig):
        return _llm_route_json(backend)
    return backend.route.to_json()


def plan_pipeline(
    path: str | Path,
    *,
    topology: Topology | None = None,
    selection: DeviceSelection | None = None,
) -> PipelinePlan:
    """Validate, verify and explain a pipeline. Raises ConfigError for invalid files.

    ``topology`` replaces discovery (to check a plan for another machine); ``selection``
    defaults to the user's saved device selection.
    """
    config = load_pipeline(path)
    machine = topology if topology is not None else discover_topology()
    allowed = selection if selection is not None else load_selection()
    stages: list[StagePlan] = []
    refusals: list[str] = []
    warnings: list[str] = []
    for index, stage in enumerate(config.stages):
        backend = stage.backend
        if isinstance(backend, LlmBackendConfig):
            llm_device = None
            llm_route = backend.route
            if not isinstance(llm_route, RemoteLlmRoute):
                # A local engine runs on a device of this machine (its route's ep: cpu or cuda).
                try:
                    found = check_route_device(
                        machine,
                        allowed,
                        ep=llm_route.ep,
                        target_provider=llm_route.target_provider,
                        stage=stage.name,
                        os_domain=llm_route.os_domain,
                        route=llm_route.name,
                    )
                except DeviceExcluded as exc:
                    refusals.append(f"device: {exc}")
                else:
                    llm_device = f"{found.name} ({found.physical_id})"
                    domain = route_domain(machine, llm_route.os_domain)
                    charged = machine.charges(found.physical_id, domain)
                    missing = [c for c in charged if c not in stage.resource_budget.demands]
                    if missing:
                        warnings.append(
                            f"{stage.name} runs its engine on {found.name}, which draws on "
                            f"{', '.join(charged)}, but demands nothing of {', '.join(missing)}"
                        )
            stages.append(
                StagePlan(
                    name=stage.name,
                    backend=backend.name,
                    route=_route_json(config, index),
                    demands=dict(stage.resource_budget.demands),
                    bundle=None,
                    device=llm_device,
                    model=backend.model_label,
                )
            )
            continue
        route = backend.route
        report = inspect_bundle(backend.manifest)
        if not report.ok:
            refusals.extend(f"{stage.name}: {error}" for error in report.errors)
        device_name = None
        try:
            device = check_route_device(
                machine,
                allowed,
                ep=route.ep,
                target_provider=route.target_provider,
                stage=stage.name,
                os_domain=route.os_domain,
                route=route.name,
            )
        except DeviceExcluded as exc:
            refusals.append(f"device: {exc}")
        else:
            device_name = f"{device.name} ({device.physical_id})"
            charged = machine.charges(device.physical_id, route_domain(machine, route.os_domain))
            missing = [c for c in charged if c not in stage.resource_budget.demands]
            if missing:
                warnings.append(
                    f"{stage.name} runs on {device.name}, which draws on {', '.join(charged)}, "
                    f"but demands nothing of {', '.join(missing)}"
                )
        stages.append(
            StagePlan(
                name=stage.name,
                backend=backend.name,
                route=_route_json(config, index),
                demands=dict(stage.resource_budget.demands),
                bundle=report,
                device=device_name,
            )
        )
    for name in config.capacities:
        if name not in machine.constraints:
            warnings.append(f"the pipeline declares {name}, which {machine.source} does not have")
    for shortfall in free_shortfalls(config.capacities, observed_free(machine)):
        warnings.append(
            f"{shortfall.constraint}: the declared capacity {format_bytes(shortfall.capacity)} "
            f"exceeds the {format_bytes(shortfall.free)} free now; loading may fail or swap"
        )
    budget = explain_budget(config.capacities, config.demands_by_stage())
    for constraint in budget.constraints:
        askers = ", ".join(constraint.demands)
        if not constraint.fits:
            refusals.append(
                f"admission: {constraint.constraint} needs {format_bytes(constraint.total)} "
                f"for {askers} but its declared capacity is {format_bytes(constraint.capacity)} "
                f"(short by {format_bytes(-constraint.headroom)})"
            )
            continue
        # Loading charges the machine's capacity, which every loaded pipeline shares.
        info = machine.constraints.get(constraint.constraint)
        if info is not None and info.capacity is not None and constraint.total > info.capacity:
            refusals.append(
                f"admission: {constraint.constraint} needs {format_bytes(constraint.total)} "
                f"for {askers} but the machine ({machine.source}) has "
                f"{format_bytes(info.capacity)}"
            )
    return PipelinePlan(
        config=config,
        topology=machine,
        stages=tuple(stages),
        budget=budget,
        warnings=tuple(warnings),
        refusals=tuple(refusals),
    )
