"""``plan``: everything that can be checked before anything loads.

A plan validates the pipeline file, verifies every stage's bundle and explains the
memory budget per constraint. It starts no process and reserves nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .artifacts import BundleReport, inspect_bundle
from .config import PipelineConfig, load_pipeline
from .ledger import BudgetExplanation, explain_budget, format_bytes


@dataclass(frozen=True, slots=True)
class StagePlan:
    """One stage as the plan sees it."""

    name: str
    backend: str
    route: dict[str, Any]
    demands: dict[str, int]
    bundle: BundleReport | None

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.name,
            "backend": self.backend,
            "route": self.route,
            "demands": self.demands,
            "bundle": None if self.bundle is None else self.bundle.to_json(),
        }


@dataclass(frozen=True, slots=True)
class PipelinePlan:
    """The outcome of ``plan``: admitted only when every check passed."""

    config: PipelineConfig
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
            "admitted": self.admitted,
            "refusals": list(self.refusals),
            "warnings": list(self.warnings),
            "stages": [stage.to_json() for stage in self.stages],
            "budget": self.budget.to_json(),
        }

    def to_text(self) -> str:
        lines = [f"pipeline {self.config.pipeline} ({self.config.source})"]
        for stage in self.stages:
            route = stage.route
            bundle = stage.bundle
            status = "no bundle" if bundle is None else ("verified" if bundle.ok else "REFUSED")
            lines.append(
                f"  {stage.name}: {stage.backend} via route {route.get('name')} "
                f"({route.get('ep')}, {route.get('os_domain')}); bundle {status}"
            )
        lines.append("memory budget (declared pre-load ceilings):")
        lines.extend(f"  {line}" for line in self.budget.to_text().splitlines())
        lines.extend(f"warning: {warning}" for warning in self.warnings)
        lines.extend(f"refused: {refusal}" for refusal in self.refusals)
        lines.append("admitted: nothing was loaded" if self.admitted else "REFUSED")
        return "\n".join(lines)


def _route_json(config: PipelineConfig, index: int) -> dict[str, Any]:
    route = config.stages[index].backend.route
    return {
        "name": route.name,
        "interpreter": route.interpreter,
        "worker": route.worker,
        "ep": route.ep,
        "os_domain": route.os_domain,
        "max_io_bytes": route.max_io_bytes,
        "min_fraction_on_target": route.min_fraction_on_target,
        "allowed_providers": list(route.allowed_providers),
    }


def plan_pipeline(path: str | Path) -> PipelinePlan:
    """Validate, verify and explain a pipeline. Raises ConfigError for invalid files."""
    config = load_pipeline(path)
    stages: list[StagePlan] = []
    refusals: list[str] = []
    for index, stage in enumerate(config.stages):
        report = inspect_bundle(stage.backend.manifest)
        if not report.ok:
            refusals.extend(f"{stage.name}: {error}" for error in report.errors)
        stages.append(
            StagePlan(
                name=stage.name,
                backend=stage.backend.name,
                route=_route_json(config, index),
                demands=dict(stage.resource_budget.demands),
                bundle=report,
            )
        )
    budget = explain_budget(config.capacities, config.demands_by_stage())
    for constraint in budget.constraints:
        if not constraint.fits:
            askers = ", ".join(constraint.demands)
            refusals.append(
                f"admission: {constraint.constraint} needs {format_bytes(constraint.total)} "
                f"for {askers} but its declared capacity is {format_bytes(constraint.capacity)} "
                f"(short by {format_bytes(-constraint.headroom)})"
            )
    return PipelinePlan(
        config=config,
        stages=tuple(stages),
        budget=budget,
        refusals=tuple(refusals),
    )
