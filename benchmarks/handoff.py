"""Large tensor handoff: 8 MiB from one stage's worker to the next through shared memory.

A two-stage pipeline built for the purpose: stage 0 tiles x [1, 1024] into ``big`` float32
[1, 2097152] (8 MiB), stage 1 reduces it to one number. ``big`` stays in the first worker's
arena, where the controller reads it in place, and is copied once into the second worker's
input slot of the controller's arena before the first stage is acknowledged. The
handoff time of a request is the two stages' transfer time from the engine's own metrics
(each call's round trip minus the worker's run time); bandwidth = 8 MiB / that time.
The baseline is a NumPy copy of the same 8 MiB in this process (``array.copy()``).

The same chain with a 4 KiB tensor (inline, no shared memory) runs in the same benchmark, so
the fixed per-call cost can be told apart from the per-byte cost.

The chain figures time whole requests (``Omni.run`` of ``y = 2x`` twice) at 64 KiB, 1 MiB and
8 MiB against the same two sessions called one after the other in this process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import numpy as np

from benchmarks import graphs
from benchmarks.base import Benchmark, BenchOptions
from benchmarks.baseline import in_process_session
from benchmarks.figures import REPORT_ONLY, Comparator, FigureSpec, Goal, Subject
from benchmarks.stats import Samples, interleaved, ms, rounded, time_calls
from runtime.api import Omni
from runtime.devices import DeviceSelection

if TYPE_CHECKING:
    from collections.abc import Mapping

    from benchmarks.figures import Detail, Figure

HANDOFF: Final = FigureSpec(
    key="handoff.8mib",
    name="Tensor handoff between stages, 8 MiB via shared memory",
    unit="GiB/s",
    goal=Goal("ratio >= 0.5", Comparator.AT_LEAST, 0.5, Subject.RATIO),
)
BASELINE_LABEL: Final = "NumPy copy of the same 8 MiB in one process"
GiB: Final = float(1 << 30)
SMALL_ELEMENTS: Final = graphs.HANDOFF_SEED_WIDTH


def pass_big(outputs: Mapping[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """The chain's handoff transform: stage 0's ``big`` is stage 1's input (the engine copies)."""
    return {"tensors": {"big": outputs["big"]}}


def _chain_transfers(
    options: BenchOptions, elements: int, requests: int
) -> tuple[Samples, Samples]:
    """Per-request transfer time of stage 0 (worker -> controller) and stage 1 (-> worker)."""
    folder = options.workdir / f"chain-{elements}"
    first, first_inputs = graphs.fan_out_model(elements)
    second, second_inputs = graphs.reduce_model(elements)
    io_bytes = elements * 4 + (1 << 20)
    pipeline = graphs.write_pipeline(
        folder / "chain.yaml",
        f"bench_handoff_{elements}",
        [
            graphs.StageSpec(graphs.write_bundle(folder, "fan-out", first, first_inputs), io_bytes),
            graphs.StageSpec(
                graphs.write_bundle(folder, "reduce", second, second_inputs),
                io_bytes,
                handoff=f"{__name__}:pass_big",
            ),
        ],
    )
    with Omni.from_yaml(pipeline, selection=DeviceSelection()) as omni:
        for _ in range(options.count(5, 2)):
            omni.run(first_inputs)
        completed = len(omni.metrics()["requests"])
        for _ in range(requests):
            result = omni.run(first_inputs)
            if float(result["peak"][0, 0]) != 1.0:
                raise AssertionError(f"the handoff chain computed {result['peak']}, expected 1.0")
        stages = [request["stages"] for request in omni.metrics()["requests"][completed:]]
    return (
        Samples(tuple(float(pair[0]["transfer_s"]) for pair in stages)),
        Samples(tuple(float(pair[1]["transfer_s"]) for pair in stages)),
    )


def measure(options: BenchOptions) -> list[Figure]:
    requests = options.count(40, 8)
    nbytes = graphs.HANDOFF_ELEMENTS * 4
    out_hop, in_hop = _chain_transfers(options, graphs.HANDOFF_ELEMENTS, requests)
    small_out, small_in = _chain_transfers(options, SMALL_ELEMENTS, requests)
    handoff = Samples(tuple(a + b for a, b in zip(out_hop.values, in_hop.values, strict=True)))
    fixed = Samples(tuple(a + b for a, b in zip(small_out.values, small_in.values, strict=True)))

    source = np.random.default_rng(3).standard_normal(graphs.HANDOFF_ELEMENTS).astype(np.float32)
    copies = time_calls(source.copy, warmup=5, iterations=options.count(200, 40))
    target = np.empty_like(source)
    into = time_calls(
        lambda: np.copyto(target, source), warmup=5, iterations=options.count(200, 40)
    )

    bandwidth = nbytes / handoff.p50 / GiB
    baseline = nbytes / copies.p50 / GiB
    per_byte_s = max(handoff.p50 - fixed.p50, 1e-9)
    details = {
        "bytes": nbytes,
        "requests": handoff.count,
        "handoff_p50_ms": rounded(ms(handoff.p50)),
        "handoff_p99_ms": rounded(ms(handoff.p99)),
        "worker_to_controller_p50_ms": rounded(ms(out_hop.p50)),
        "controller_to_worker_p50_ms": rounded(ms(in_hop.p50)),
        "same_chain_4kib_p50_ms": rounded(ms(fixed.p50)),
        "bandwidth_without_fixed_cost_gib_s": rounded(nbytes / per_byte_s / GiB),
        "numpy_copy_p50_ms": rounded(ms(copies.p50)),
        "numpy_copyto_preallocated_gib_s": rounded(nbytes / into.p50 / GiB),
    }
    note = ""
    if HANDOFF.goal.check(bandwidth, baseline) is False:
        note = (
            "The handoff copies the bytes once (from the first worker's arena into the second "
            "worker's input slot, both mapped and touched at load) where the baseline copies "
            "once into new memory; the rest is the fixed cost of two calls: the same chain "
            f"with 4 KiB takes {details['same_chain_4kib_p50_ms']} ms."
        )
    return [HANDOFF.measured(bandwidth, baseline, BASELINE_LABEL, details, note)]


def _chain_spec(label: str) -> FigureSpec:
    return FigureSpec(
        key=f"handoff.chain_{label.lower().replace(' ', '')}",
        name=f"Two-stage chain request, {label} tensors (p50)",
        unit="ms",
        goal=Goal(REPORT_ONLY),
    )


#: Tensor sizes of the chain figures: (label, float32 elements).
CHAIN_SIZES: Final = (("64 KiB", 16 * 1024), ("1 MiB", 256 * 1024), ("8 MiB", 2 * 1024 * 1024))
CHAIN_SPECS: Final = tuple(_chain_spec(label) for label, _ in CHAIN_SIZES)
CHAIN_BASELINE: Final = (
    "the same two sessions in one process (stage 0's output fed to stage 1), same session options"
)


def _chain_figure(options: BenchOptions, spec: FigureSpec, elements: int) -> Figure:
    """``Omni.run`` of ``y = 2x`` twice against the same two sessions called in this process."""
    folder = options.workdir / f"scale-chain-{elements}"
    model, inputs = graphs.scale_model(elements)
    nbytes = elements * 4
    stages = [
        graphs.StageSpec(
            graphs.write_bundle(folder, f"scale-{index}", model, inputs),
            2 * nbytes + (1 << 20),
            handoff="benchmarks.graphs:pass_y_as_x" if index else None,
        )
        for index in range(2)
    ]
    pipeline = graphs.write_pipeline(folder / "chain.yaml", f"bench_chain_{elements}", stages)
    with Omni.from_yaml(pipeline, selection=DeviceSelection()) as omni:
        threads = omni.execution_plan.to_json()["stages"][0]["threads"]
        sessions = [
            in_process_session(
                stage.bundle,
                intra_op_threads=int(threads["intra_op_threads"]),
                allow_spinning=bool(threads["allow_spinning"]),
            )
            for stage in stages
        ]

        def in_process() -> object:
            (y,) = sessions[0].run(None, inputs)
            return sessions[1].run(None, {"x": y})

        through, direct = interleaved(
            [lambda: omni.run(inputs), in_process],
            warmup=options.count(10, 3),
            rounds=options.count(8, 3),
            batch=options.count(15, 5),
        )
        copied = [stage["copied_bytes"] for stage in omni.metrics()["requests"][-1]["stages"]]
    details: dict[str, Detail] = {
        "tensor_bytes": nbytes,
        "pipeline_p50_ms": rounded(ms(through.p50)),
        "pipeline_p99_ms": rounded(ms(through.p99)),
        "in_process_p50_ms": rounded(ms(direct.p50)),
        "in_process_p99_ms": rounded(ms(direct.p99)),
        "added_p50_ms": rounded(ms(through.p50 - direct.p50)),
        "copied_bytes_per_stage": copied,
        "requests": through.count,
    }
    return spec.measured(ms(through.p50), ms(direct.p50), CHAIN_BASELINE, details)


def measure_all(options: BenchOptions) -> list[Figure]:
    figures = measure(options)
    for spec, (_, elements) in zip(CHAIN_SPECS, CHAIN_SIZES, strict=True):
        figures.append(_chain_figure(options, spec, elements))
    return figures


BENCHMARK: Final = Benchmark("handoff", (HANDOFF, *CHAIN_SPECS), measure_all)
