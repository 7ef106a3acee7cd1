"""CPU threads by plan: how many intra-op threads each graph stage's session gets, and
whether they spin.

The cores are those this process may run on (its CPU affinity, which a device selection
or the user's ``taskset`` narrows). They are split between the stages that can run at the
same time: in a pipeline that runs one request at a time, its graph stages run one after
another, so each may use every core; a pipeline with a language-model stage runs several
requests at once, so its graph stages and its language model share the cores, except the
stages a program runs while the others wait (``solo``: a conversation's speech recogniser,
on the way from the user's words to the reply), which get every core.

Between calls, a worker whose calls come back to back waits for the next one awake for a
short while (:data:`SPIN_WAIT_US`, polling its input) instead of sleeping: a sleeping
process is woken by the pipe, which on two virtual cores took about 60 us of each call's
round trip. It does so only where the plan leaves a core for it (the pipeline's only graph
stage, at least two cores, no language model beside it: in a chain, one stage's worker
waiting awake would take a core from the next stage's pool) and only while the gaps
between its calls stay shorter than the wait (the worker measures them), so a stage called
now and then never spins.

Where a pool runs alone, its threads spin between the nodes of a run and stop when the run
ends (the worker's session sets ``session.force_spinning_stop``, see
:func:`workers.ort_session.create_placed_session`): sleeping between nodes cost each node a
wake-up (measured on two cores, the voice's pipeline took a real-time factor of 0.0486 with
sleeping pools against 0.0444 with pools spinning within runs, the two interleaved in one
process), while a pool that went on spinning after its run burned the cores the controller
needs to take the result and the next stage needs to start (a 1 ms MatMul through the
worker took 3.95 ms with pools spinning on after each run against 2.34 ms without). Where
two pools (or a pool and a language model) may run at the same time, none spins.

A pipeline of graph stages whose program runs several requests at once (``requests``, a
voice's ``concurrent_requests``) has one request's call of a stage running while another's
calls a different stage: no pool spins, a stage the program says gains nothing from a second
thread (``single_thread``: measured for the voice's acoustic stage, 35.0 ms on two threads
against 35.7 ms on one) gets one, and the others every core, so a call that runs alone keeps
them all (without spinning, which cost one request's calls about 6 %: 182 against 172 ms,
measured directly with ONNX Runtime on a quiet moment of two cores).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from runtime.config import GraphBackendConfig, LlmBackendConfig

if TYPE_CHECKING:
    from collections.abc import Collection

    from runtime.config import PipelineConfig, StageConfig

#: Cores each concurrent graph stage needs to itself before a program may overlap their calls.
MIN_OVERLAP_THREADS: Final = 2
#: How long a worker may wait for its next call awake, when the plan allows it (see above).
SPIN_WAIT_US: Final = 1000


@dataclass(frozen=True, slots=True)
class ThreadPlan:
    """One graph stage's ONNX Runtime threads, and why."""

    intra_op_threads: int
    #: The pool's threads spin between the nodes of a run, and stop when it ends.
    allow_spinning: bool
    cores: int
    reason: str
    #: The stage's calls may run at the same time as another concurrent stage's.
    overlaps: bool = False
    #: How long the stage's worker (and its caller) may wait for the next call or result
    #: awake, in microseconds; 0: they sleep at once.
    spin_wait_us: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "intra_op_threads": self.intra_op_threads,
            "allow_spinning": self.allow_spinning,
            "cores": self.cores,
            "reason": self.reason,
            "overlaps": self.overlaps,
            "spin_wait_us": self.spin_wait_us,
        }


def usable_cores() -> int:
    """The cores this process may run on."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return max(1, len(affinity(0)))
    return max(1, os.cpu_count() or 1)


def plan_threads(
    config: PipelineConfig,
    cores: int | None = None,
    *,
    concurrent: Collection[str] = (),
    solo: Collection[str] = (),
    requests: int = 1,
    single_thread: Collection[str] = (),
) -> dict[str, ThreadPlan]:
    """The thread plan of every graph stage of ``config``, by stage name. ``concurrent``
    names graph stages a program may call at the same time, ``solo`` those it calls while
    the other stages wait; ``requests`` is how many requests a pipeline of graph stages runs
    at once, and ``single_thread`` names the stages whose calls gain nothing from a second
    thread, which get one where requests overlap (see the module)."""
    cores = usable_cores() if cores is None else max(1, cores)
    graph = [s for s in config.stages if isinstance(s.backend, GraphBackendConfig)]
    language = [s for s in config.stages if isinstance(s.backend, LlmBackendConfig)]
    if not language and requests > 1 and len(graph) > 1:
        return _overlapping_requests(graph, cores, requests, single_thread)
    if not language:
        together = [s.name for s in graph if s.name in concurrent]
        if len(together) >= 2 and cores >= MIN_OVERLAP_THREADS * len(together):
            share = cores // len(together)
            reason = (
                f"{', '.join(together)} may run at once: {share} of {cores} cores each, no spinning"
            )
            plans = {name: ThreadPlan(share, False, cores, reason, True) for name in together}
            alone_reason = "runs alone: every core, no spinning (the others' pools share them)"
            for stage in graph:
                plans.setdefault(stage.name, ThreadPlan(cores, False, cores, alone_reason))
            return plans
        # One request at a time: the stages run one after another, each on every core, and
        # the controller takes each result on those same cores: pools spin within a run only.
        reason = (
            "the only graph stage: every core, spinning within each run only (the controller "
            "takes each result on the same cores)"
            if len(graph) == 1
            else f"{len(graph)} graph stages run one after another: every core each, "
            "spinning within each run only (their pools and the controller take turns on the "
            "same cores)"
        )
        if len(together) >= 2:
            reason += (
                f"; {', '.join(together)} could overlap but {cores} cores leave fewer than "
                f"{MIN_OVERLAP_THREADS} each"
            )
        # A lone stage's worker waits awake on a core its pool does not use between calls;
        # one of several would spin while the next stage's pool wants every core.
        spin = SPIN_WAIT_US if cores >= MIN_OVERLAP_THREADS and len(graph) == 1 else 0
        if spin:
            reason += f"; between back-to-back calls the worker waits {spin} us awake"
        return {s.name: ThreadPlan(cores, True, cores, reason, spin_wait_us=spin) for s in graph}
    together_count = len(graph) + len(language)
    share = max(1, cores // together_count)
    reason = (
        f"{together_count} stages may run at once (requests overlap with the language model): "
        f"{share} of {cores} cores each, no spinning"
    )
    alone = "runs while the other stages wait (the program says so): every core, no spinning"
    return {
        s.name: ThreadPlan(cores, False, cores, alone)
        if s.name in solo
        else ThreadPlan(share, False, cores, reason)
        for s in graph
    }


def _overlapping_requests(
    graph: list[StageConfig], cores: int, requests: int, single_thread: Collection[str]
) -> dict[str, ThreadPlan]:
    """Graph stages whose calls of different requests overlap: a stage that gains nothing
    from a second thread gets one, the others every core so that a call running alone keeps
    them all; no pool spins, so the cores go to whichever call runs."""
    plans = {}
    for stage in graph:
        threads = 1 if stage.name in single_thread else cores
        reason = (
            f"{requests} requests may run at once, their calls of different stages overlapping: "
            + (
                "one thread (its calls gain nothing from more), no spinning"
                if threads == 1
                else f"every core ({cores}) for a call that runs alone, no spinning (calls that "
                "overlap share the cores)"
            )
        )
        plans[stage.name] = ThreadPlan(threads, False, cores, reason, overlaps=True)
    return plans
