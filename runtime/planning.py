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

from .admission import Refusal, Resolution, resolve
from .config import PipelineConfig, load_pipeline

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from .artifacts import BundleReport
    from .devices import DeviceSelection, Topology
    from .ledger import BudgetExplanation


@dataclass(frozen=True, slots=True)
class StagePlan:
    """One stage as the plan sees it: a graph stage's bundle, or a language-model stage's model."""

    name: str
    backend: str
    route: Mapping[str, Any]
    demands: Mapping[str, int]
    bundle: BundleReport | None
    device: str | None = None
    model: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.name,
            "backend": self.backend,
            "route": dict(self.route),
            "device": self.device,
            "demands": dict(self.demands),
            "bundle": None if self.bundle is None else self.bundle.to_json(),
            "model": self.model,
        }


@dataclass(frozen=True, slots=True)
class PipelinePlan:
    """The outcome of ``plan``: admitted only when every check passed. ``refused`` are the
    typed refusals (loading raises the first one's error), ``refusals`` their lines."""

    config: PipelineConfig
    topology: Topology
    stages: tuple[StagePlan, ...]
    budget: BudgetExplanation
    warnings: tuple[str, ...] = ()
    refused: tuple[Refusal, ...] = field(default=())
    #: The admission this plan reports; loading the same pipeline may reuse its bundles.
    resolution: Resolution | None = field(default=None, compare=False, repr=False)

    @property
    def refusals(self) -> tuple[str, ...]:
        return tuple(refusal.text for refusal in self.refused)

    @property
    def admitted(self) -> bool:
        return not self.refused

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


def plan_pipeline(
    pipeline: str | Path | PipelineConfig,
    *,
    topology: Topology | None = None,
    selection: DeviceSelection | None = None,
    bundles: Mapping[Path, BundleReport] | None = None,
) -> PipelinePlan:
    """Validate, verify and explain a pipeline (its file, or its configuration already read).
    Raises ConfigError for invalid files.

    ``topology`` replaces discovery (to check a plan for another machine); ``selection``
    defaults to the user's saved device selection; ``bundles`` are reports of bundles the
    caller has just checked (not hashed again). The refusals are admission's
    (:func:`runtime.admission.resolve`), every one of them: loading raises the first.
    """
    config = pipeline if isinstance(pipeline, PipelineConfig) else load_pipeline(pipeline)
    resolution = resolve(config, topology, selection, bundles=bundles)
    machine = resolution.machine
    return PipelinePlan(
        config=config,
        topology=machine if machine is not None else _found_machine(),
        stages=tuple(
            StagePlan(
                name=stage.name,
                backend=stage.backend,
                route=stage.route,
                demands=stage.demands,
                bundle=stage.bundle,
                device=stage.device,
                model=stage.model,
            )
            for stage in resolution.stages
        ),
        budget=resolution.budget,
        warnings=resolution.warnings,
        refused=resolution.refusals,
        resolution=resolution,
    )


def _found_machine() -> Topology:
    """The machine a plan names when no stage needed one (remote stages only)."""
    from .devices import discover_topology

    return discover_topology()
