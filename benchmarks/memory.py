"""Peak memory of each demo: the controller and every worker vs the same sessions in one process.

For each pipeline in ``assets/pipelines`` a fresh controller process
(:mod:`benchmarks.pipeline_process`) loads it, runs a few requests and reads the peak RSS
(``VmHWM``) of itself and of each worker while they are alive. The measurement is their
sum; the baseline is one process holding the same ONNX Runtime sessions, warmed up and run
on their example inputs as often (:mod:`benchmarks.one_process`). No goal is set: the
figure shows what process isolation costs in memory. What a demo names that is made on first
use (a voice, the speech recogniser) is made before it is measured; a demo that takes audio
gets the bundled voice's example sentence, spoken here and handed over as a file, so the
controller's peak holds no voice of its own.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from benchmarks import graphs
from benchmarks.base import Benchmark, BenchOptions, NotRunnable
from benchmarks.child import ChildFailed, event, run_child
from benchmarks.figures import REPORT_ONLY, FigureSpec, Goal
from benchmarks.stats import rounded
from runtime.config import GraphBackendConfig, load_pipeline
from runtime.errors import OmniError
from runtime.pipeline_files import export_missing_voices
from runtime.pipeline_input import AUDIO_INPUT, input_kind

if TYPE_CHECKING:
    from pathlib import Path

    from benchmarks.figures import Detail, Figure

BASELINE_LABEL: Final = "one process holding the same ORT sessions, run as often"
MiB: Final = float(1 << 20)
#: Demo speech and language pipelines load for minutes on a busy machine.
CHILD_TIMEOUT_S: Final = 900.0


#: Demos whose memory figure another benchmark measures: chat-speak's language-model worker
#: tree against vLLM's one-process ``LLM`` (:mod:`benchmarks.llm_cold`); chat is that same
#: worker alone, with no graph session for a one-process baseline to hold.
MEASURED_ELSEWHERE: Final = frozenset({"chat-speak", "chat"})


def demos() -> list[tuple[FigureSpec, Path]]:
    """One figure per bundled demo pipeline, with the pipeline it measures."""
    return [
        (
            FigureSpec(
                key="memory." + path.stem.replace("-", "_"),
                name=f"Peak RSS, demo {path.stem} (controller + workers)",
                unit="MiB",
                goal=Goal(REPORT_ONLY),
            ),
            path,
        )
        for path in sorted(graphs.DEMO_PIPELINES.glob("*.yaml"))
        if path.stem not in MEASURED_ELSEWHERE
    ]


def _peak(value: Any, what: str) -> int:
    if not isinstance(value, int):
        raise NotRunnable(f"the peak RSS of {what} cannot be read on this system")
    return value


def _progress(line: str) -> None:
    print(f"memory: {line}", file=sys.stderr, flush=True)


def _audio_request(workdir: Path) -> list[str]:
    """The transcription adapter's example sentence, spoken by the bundled voice at 16 kHz
    into ``workdir``: the child's ``--audio`` arguments."""
    from runtime.adapters.whisper import EXAMPLE_SENTENCE
    from runtime.adapters.whisper_export import spoken_clip
    from runtime.adapters.whisper_mel import SAMPLE_RATE

    path = workdir / "memory-speech.npy"
    if not path.exists():
        np.save(path, spoken_clip(EXAMPLE_SENTENCE))
    return ["--audio", str(path), "--sample-rate", str(SAMPLE_RATE)]


def measure_demo(spec: FigureSpec, pipeline: Path, requests: int, workdir: Path) -> Figure:
    # A voice or speech recogniser the demo names is made on first use, before it loads.
    export_missing_voices(pipeline, _progress)
    config = load_pipeline(pipeline)
    audio = _audio_request(workdir) if input_kind(config) == AUDIO_INPUT else []
    done = event(
        run_child(
            "benchmarks.pipeline_process",
            [str(pipeline), "--requests", str(requests), *audio],
            timeout_s=CHILD_TIMEOUT_S,
        ),
        "done",
    ).document
    controller = _peak(done["controller_peak_rss_bytes"], "the controller")
    details: dict[str, Detail] = {
        "requests": int(done["requests"]),
        "controller_mib": rounded(controller / MiB),
    }
    total = controller
    for worker in done["workers"]:
        peak = _peak(worker["peak_rss_bytes"], f"worker {worker['stage']}")
        children = [
            _peak(child, "a worker's child") for child in worker["descendants_peak_rss_bytes"]
        ]
        total += peak + sum(children)
        details[f"{worker['stage']}_mib"] = rounded(peak / MiB)
        if children:
            details[f"{worker['stage']}_children_mib"] = [
                rounded(child / MiB) for child in children
            ]
    # The one-process baseline holds the graph sessions; a language model has no such form.
    manifests = [
        str(stage.backend.manifest)
        for stage in config.stages
        if isinstance(stage.backend, GraphBackendConfig)
    ]
    if len(manifests) < len(config.stages):
        details["baseline_without"] = "the language-model stage (vLLM runs only in its worker)"
    baseline = event(
        run_child(
            "benchmarks.one_process",
            [*manifests, "--calls", str(requests)],
            timeout_s=CHILD_TIMEOUT_S,
        ),
        "done",
    ).document
    one_process = _peak(baseline["peak_rss_bytes"], "the one-process baseline")
    if done.get("adapter"):
        details["adapter"] = str(done["adapter"])
    note = (
        f"{len(done['workers']) + 1} processes each hold their own interpreter, NumPy and "
        "ONNX Runtime."
    )
    return spec.measured(total / MiB, one_process / MiB, BASELINE_LABEL, details, note)


def measure(options: BenchOptions) -> list[Figure]:
    """Every demo's figure; a demo that cannot load here is reported as not run, with why."""
    figures = []
    requests = options.count(10, 3)
    for spec, pipeline in demos():
        try:
            figures.append(measure_demo(spec, pipeline, requests, options.workdir))
        except (NotRunnable, OmniError) as exc:
            figures.append(spec.not_run(str(exc)))
        except ChildFailed as exc:
            figures.append(spec.not_run(f"failed: {exc}"))
    return figures


def benchmark() -> Benchmark:
    return Benchmark("memory", tuple(spec for spec, _ in demos()), measure)
