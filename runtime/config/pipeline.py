"""What a validated pipeline is: its stages, their backends and budgets, and its adapter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from runtime.config.graph import GraphBackendConfig
from runtime.config.llm import LlmBackendConfig

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from runtime.config.reader import SourceLocation

#: Every stage backend's configuration; later backends join this union.
BackendConfig: TypeAlias = GraphBackendConfig | LlmBackendConfig


@dataclass(frozen=True, slots=True)
class ResourceBudget:
    """A stage's view of the shared pools: their ceilings and what this stage needs."""

    capacities: Mapping[str, int]
    demands: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class StageConfig:
    stage_id: int
    backend: BackendConfig
    resource_budget: ResourceBudget
    custom_process_input_func: str | None
    engine_input_source: tuple[int, ...]
    final_output: bool
    final_output_type: str | None
    location: SourceLocation

    @property
    def name(self) -> str:
        return f"stage-{self.stage_id}"


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    pipeline: str
    async_chunk: bool
    max_queued: int
    stages: tuple[StageConfig, ...]
    source: Path | None
    description: str | None = None
    adapter: AdapterConfig | None = None

    @property
    def capacities(self) -> Mapping[str, int]:
        """The capacities every stage declares (validation made them identical)."""
        return self.stages[0].resource_budget.capacities

    def demands_by_stage(self) -> dict[str, dict[str, int]]:
        return {stage.name: dict(stage.resource_budget.demands) for stage in self.stages}


@dataclass(frozen=True, slots=True)
class AdapterConfig:
    """The model adapter that drives a request through the stages (``module:Class``)."""

    name: str
    options: Mapping[str, Any]
    line: int
