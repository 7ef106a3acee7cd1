"""CPU threads by plan: how many intra-op threads each graph stage's session gets, and
whether they spin.

The cores are those this process may run on (its CPU affinity, which a device selection
or the user's ``taskset`` narrows). They are split between the stages that can run at the
same time: in a pipeline that runs one request at a time, its graph stages run one after
another, so each may use every core; a pipeline with a language-model stage runs several
requests at once, so its graph stages and its language model share the cores. ONNX
Runtime's idle threads spin only where one pool has the cores to itself; where two pools
(or a pool and a language model) take turns on the same cores, a spinning pool would burn
the time the other one needs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runtime.config import GraphBackendConfig, LlmBackendConfig

if TYPE_CHECKING:
    from runtime.config import PipelineConfig


@dataclass(frozen=True, slots=True)
class ThreadPlan:
    """One graph stage's ONNX Runtime threads, and why."""

    intra_op_threads: int
    allow_spinning: bool
    cores: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "intra_op_threads": self.intra_op_threads,
            "allow_spinning": self.allow_spinning,
            "cores": self.cores,
            "reason": self.reason,
        }


def usable_cores() -> int:
    """The cores this process may run on."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return max(1, len(affinity(0)))
    return max(1, os.cpu_count() or 1)


def plan_threads(config: PipelineConfig, cores: int | None = None) -> dict[str, ThreadPlan]:
    """The thread plan of every graph stage of ``config``, by stage name."""
    cores = usable_cores() if cores is None else max(1, cores)
    graph = [s for s in config.stages if isinstance(s.backend, GraphBackendConfig)]
    language = [s for s in config.stages if isinstance(s.backend, LlmBackendConfig)]
    if not language:
        # One request at a time: the stages run one after another.
        alone = len(graph) == 1
        reason = (
            "the only graph stage: every core, spinning allowed"
            if alone
            else f"{len(graph)} graph stages run one after another: every core each, "
            "no spinning (their pools take turns on the same cores)"
        )
        return {s.name: ThreadPlan(cores, alone, cores, reason) for s in graph}
    together = len(graph) + len(language)
    share = max(1, cores // together)
    reason = (
        f"{together} stages may run at once (requests overlap with the language model): "
        f"{share} of {cores} cores each, no spinning"
    )
    return {s.name: ThreadPlan(share, False, cores, reason) for s in graph}
