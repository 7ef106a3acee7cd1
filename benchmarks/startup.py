"""Plan start-up: the two-stage demo chain started to ready vs the same sessions in one process.

The measurement is ``Omni`` start-up of ``assets/pipelines/mlp-chain.yaml`` from this
running controller: verify both bundles, reserve the plan, spawn two workers (each a fresh
Python that imports NumPy and ONNX Runtime), load, warm up and pass the placement gate.
The baseline is a fresh process that imports ONNX Runtime and creates and warms the same
two sessions with the worker's own code (:mod:`benchmarks.one_process`), timed from spawn
to ready: what a one-process program pays to have those sessions.

Details add two more views: the sessions alone in an already-warm process (no import), and
a fresh controller process started to ready (:mod:`benchmarks.pipeline_process`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

from benchmarks import graphs
from benchmarks.base import Benchmark, BenchOptions
from benchmarks.child import event, run_child
from benchmarks.figures import Comparator, FigureSpec, Goal, Subject
from benchmarks.stats import Samples, rounded
from runtime.api import Omni
from runtime.config import load_pipeline
from runtime.devices import DeviceSelection

if TYPE_CHECKING:
    from benchmarks.figures import Figure

STARTUP: Final = FigureSpec(
    key="startup.two_stage",
    name="Plan start-up, two-stage chain to ready",
    unit="s",
    goal=Goal("ratio <= 1.5", Comparator.AT_MOST, 1.5, Subject.RATIO),
)
BASELINE_LABEL: Final = "one fresh process: import ONNX Runtime, create and warm both sessions"
CHILD_TIMEOUT_S: Final = 120.0


def measure(options: BenchOptions) -> list[Figure]:
    pipeline = graphs.demo_pipeline("mlp-chain")
    config = load_pipeline(pipeline)
    manifests = [str(stage.backend.manifest) for stage in config.stages]
    starts, fresh, sessions_only, cold_controller = [], [], [], []
    loads: list[float] = []
    for _ in range(options.count(5, 2)):
        started = time.perf_counter()
        with Omni(config, selection=DeviceSelection()) as omni:
            starts.append(time.perf_counter() - started)
            for stage in omni.execution_plan.stages:
                # A graph stage reports both once it is loaded.
                loads.append(float(stage.load_s or 0.0) + float(stage.warmup_s or 0.0))
        baseline = event(
            run_child("benchmarks.one_process", manifests, timeout_s=CHILD_TIMEOUT_S), "ready"
        )
        fresh.append(baseline.at_s)
        sessions_only.append(float(baseline.document["sessions_s"]))
        controller = event(
            run_child("benchmarks.pipeline_process", [str(pipeline)], timeout_s=CHILD_TIMEOUT_S),
            "ready",
        )
        cold_controller.append(controller.at_s)
    start = Samples(tuple(starts))
    one_process = Samples(tuple(fresh))
    warm = Samples(tuple(sessions_only))
    cold = Samples(tuple(cold_controller))
    details = {
        "iterations": start.count,
        "start_max_s": rounded(max(starts)),
        "worker_load_and_warmup_p50_s": rounded(Samples(tuple(loads)).p50),
        "sessions_in_warm_process_s": rounded(warm.p50),
        "ratio_vs_sessions_in_warm_process": rounded(start.p50 / warm.p50),
        "fresh_controller_to_ready_s": rounded(cold.p50),
        "ratio_fresh_controller_vs_fresh_process": rounded(cold.p50 / one_process.p50),
    }
    note = ""
    if STARTUP.goal.check(start.p50, one_process.p50) is False:
        note = (
            "Each worker is a fresh interpreter that imports NumPy and ONNX Runtime before it "
            f"can load; the load and warm-up themselves take {details['worker_load_and_warmup_p50_s']}"
            " s per stage. On a machine with fewer free cores than stages the two workers' "
            "imports run one after the other instead of side by side."
        )
    return [STARTUP.measured(start.p50, one_process.p50, BASELINE_LABEL, details, note)]


BENCHMARK: Final = Benchmark("startup", (STARTUP,), measure)
