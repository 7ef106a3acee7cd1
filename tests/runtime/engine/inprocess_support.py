"""Pipelines whose graph stages run in this process (``worker: inprocess``), for fast tests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from runtime.pipeline_input import TENSOR_INPUT

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from runtime.config import PipelineConfig
    from runtime.engine.program import RequestContext

#: The handoff of the add chain, as a pipeline names it.
DOUBLE_HANDOFF = "tests.runtime.engine.inprocess_support:double_handoff"
#: The adapter that emits one call's outputs ``count`` times.
BURST_PROGRAM = "tests.runtime.engine.inprocess_support:BurstProgram"


def shapeless_handoff(outputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """A broken handoff: no ``tensors``."""
    return {"arrays": dict(outputs)}


class BurstProgram:
    """One call of stage 0, whose outputs go out ``count`` times without waiting; the caller
    acknowledges the last one (so no call is active while the outputs are read)."""

    input_kind = TENSOR_INPUT

    def __init__(self, config: PipelineConfig, options: Mapping[str, Any]) -> None:
        self.count = int(options.get("count", 3))

    def prepare(self, request_input: object) -> None:
        return None

    async def run(self, ctx: RequestContext, prepared: None) -> None:
        result = await ctx.call(0, ctx.example_inputs(0))
        last = self.count - 1
        for index in range(self.count):
            await ctx.emit(
                result.outputs, stage=ctx.stage_name(0), finished=index == last, wait=index == last
            )


def double_handoff(outputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Stage 1 of the add chain adds stage 0's sum to itself: ``2 * (a + b)``."""
    total = outputs["c"]
    return {"tensors": {"a": total, "b": total}}


def write_inprocess_pipeline(
    path: Path,
    manifests: Sequence[Path],
    *,
    max_io: str = "64KiB",
    max_queued: int | None = None,
    name: str = "inprocess_test",
    adapter: Mapping[str, Any] | None = None,
    handoff: str = DOUBLE_HANDOFF,
) -> Path:
    """A chain of graph stages run in this process; stage ``i > 0`` takes the double handoff."""
    document: dict[str, Any] = {"pipeline": name, "async_chunk": False}
    if max_queued is not None:
        document["max_queued"] = max_queued
    stages: list[dict[str, Any]] = []
    for index, manifest in enumerate(manifests):
        stage: dict[str, Any] = {
            "stage_id": index,
            "backend": {
                "name": "external.graph.v1",
                "manifest": str(manifest),
                "route": {
                    "name": "in-this-process",
                    "interpreter": "bundled",
                    "worker": "inprocess",
                    "ep": "cpu",
                    "os_domain": "posix",
                    "max_io_bytes": max_io,
                    "allowed_providers": ["CPUExecutionProvider"],
                },
            },
            "resource_budget": {
                "capacities": {"machine:ram": "2GiB"},
                "demands": {"machine:ram": "64MiB"},
            },
        }
        if index:
            stage["engine_input_source"] = [index - 1]
            stage["custom_process_input_func"] = handoff
        stages.append(stage)
    document["stages"] = stages
    if adapter is not None:
        document["adapter"] = dict(adapter)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path
