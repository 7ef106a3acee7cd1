"""Run every benchmark and write ``latest.json`` and ``latest.md``.

    python -m benchmarks.suite [--quick] [--runs N] [--out DIR] [--only ID,...] [--update-readme]
    omni-edge bench [--quick] [--runs N] [--out DIR] [--only ID,...] [--update-readme]

Benchmarks run one after another in this process (children where a fresh process is the
point). Every declared figure appears in the results: measured, or *not run* with the reason
(a missing prerequisite, quick mode, ``--only``, or the error that stopped it). Goals are
reported, never asserted: the exit status is 0 whenever the results were written.

With ``--runs N`` the whole suite runs N times in a row and each figure is the median run's
(by the value its goal judges: the ratio, the added time or the measurement), so its
measurement, baseline and ratio stay those of one run; its details list every run's value
(``runs``) and the load average at each run's start is in the machine record.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final

from benchmarks import (
    graph_overhead,
    handoff,
    ledger_ops,
    llm_cold,
    memory,
    serve_concurrency,
    serve_load,
    speech_figures,
    speech_in,
    startup,
    studio_figures,
    vllm_figures,
    voice_chat,
)
from benchmarks.base import Benchmark, BenchOptions, NotRunnable
from benchmarks.figures import Subject
from benchmarks.graphs import PROJECT_ROOT
from benchmarks.machine import load_average, machine_info
from benchmarks.results import (
    Results,
    load_results,
    render_markdown,
    render_summary,
    replace_readme_block,
)
from runtime.errors import OmniError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from benchmarks.figures import Figure

log = logging.getLogger("omni.benchmarks")

DEFAULT_OUT: Final = PROJECT_ROOT / "benchmarks" / "results"
README: Final = PROJECT_ROOT / "README.md"
JSON_NAME: Final = "latest.json"
MARKDOWN_NAME: Final = "latest.md"
#: Benchmarks whose pipelines need the exported speech voice.
NEEDS_VOICE: Final = frozenset(
    {"speech", "speech_in", "studio", "memory", "serve", "serve_speech", "llm_cold", "voice"}
)


def all_benchmarks() -> list[Benchmark]:
    """Every benchmark, in the order the results list them."""
    return [
        graph_overhead.BENCHMARK,
        handoff.BENCHMARK,
        startup.BENCHMARK,
        ledger_ops.BENCHMARK,
        speech_figures.BENCHMARK,
        speech_in.BENCHMARK,
        vllm_figures.BENCHMARK,
        llm_cold.BENCHMARK,
        studio_figures.BENCHMARK,
        serve_load.BENCHMARK,
        serve_concurrency.SPEECH_BENCHMARK,
        serve_concurrency.CHAT_BENCHMARK,
        voice_chat.BENCHMARK,
        memory.benchmark(),
    ]


def prepare_voice(progress: Callable[[str], None]) -> str:
    """Export the speech demo's voice once (as ``make run`` does); what happened, in words."""
    try:
        from runtime.adapters.voice_export import ensure_voice_bundles
    except ImportError as exc:
        return f"the voice export is not available ({exc})"
    try:
        bundles = ensure_voice_bundles(progress=progress)
    except (OmniError, OSError) as exc:
        return f"the voice could not be exported: {exc}"
    return f"ready in {bundles.root}"


def run_benchmark(benchmark: Benchmark, options: BenchOptions) -> list[Figure]:
    """One benchmark's figures, one per declared spec, whatever happens to it."""
    try:
        figures = list(benchmark.run(options))
    except NotRunnable as exc:
        return [spec.not_run(str(exc)) for spec in benchmark.specs]
    except OmniError as exc:
        return [spec.not_run(f"refused: {type(exc).__name__}: {exc}") for spec in benchmark.specs]
    except Exception as exc:  # the suite's loop reports what stopped a benchmark and goes on
        log.exception("benchmark %s failed", benchmark.name)
        reason = f"failed: {type(exc).__name__}: {exc}"
        return [spec.not_run(reason) for spec in benchmark.specs]
    by_key = {figure.key: figure for figure in figures}
    unexpected = sorted(set(by_key) - {spec.key for spec in benchmark.specs})
    if unexpected:
        raise ValueError(f"benchmark {benchmark.name} returned undeclared figures {unexpected}")
    return [
        by_key.get(spec.key) or spec.not_run(f"benchmark {benchmark.name} returned no value")
        for spec in benchmark.specs
    ]


def run_suite(
    *,
    quick: bool,
    only: frozenset[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Results:
    """Run the suite (or the ``only`` benchmarks; the others are reported as not selected)."""
    say = progress or (lambda _line: None)
    benchmarks = all_benchmarks()
    started_at = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()
    machine = machine_info(PROJECT_ROOT)
    began = time.perf_counter()
    figures: list[Figure] = []
    selected = [b for b in benchmarks if only is None or b.name in only]
    voice = ""
    if any(b.name in NEEDS_VOICE for b in selected if not (quick and b.quick_skip)):
        voice = prepare_voice(say)
    with tempfile.TemporaryDirectory(prefix="omni-bench-") as workdir:
        for benchmark in benchmarks:
            if benchmark not in selected:
                reason = f"not selected (--only {','.join(sorted(only or ()))})"
                figures += [spec.not_run(reason) for spec in benchmark.specs]
                continue
            if quick and benchmark.quick_skip:
                figures += [spec.not_run(benchmark.quick_skip) for spec in benchmark.specs]
                continue
            say(f"{benchmark.name} ...")
            folder = Path(workdir) / benchmark.name
            folder.mkdir()
            clock = time.perf_counter()
            measured = run_benchmark(benchmark, BenchOptions(quick=quick, workdir=folder))
            figures += measured
            say(f"{benchmark.name}: {time.perf_counter() - clock:.1f} s")
    machine["load_average_at_end"] = load_average()
    machine["voice"] = voice or "not needed"
    return Results(
        mode="quick" if quick else "full",
        started_at=started_at,
        duration_s=round(time.perf_counter() - began, 1),
        machine=machine,
        figures=tuple(figures),
    )


def _judged(figure: Figure) -> float | None:
    """The value a figure's goal looks at (its ratio when the goal judges none)."""
    if figure.measurement is None:
        return None
    subject = figure.goal.subject
    if subject is Subject.MEASUREMENT and figure.goal.comparator is not None:
        return figure.measurement
    if subject is Subject.ADDED and figure.baseline is not None:
        return figure.measurement - figure.baseline
    return figure.ratio if figure.ratio is not None else figure.measurement


def median_results(runs: Sequence[Results]) -> Results:
    """One results document from several runs of the suite: each figure the median run's.

    A figure measured in some runs only takes the median of those; one measured in none
    keeps the first run's reason."""
    if len(runs) == 1:
        return runs[0]
    figures: list[Figure] = []
    for index, first in enumerate(runs[0].figures):
        versions = [run.figures[index] for run in runs]
        measured = [
            (value, position, figure)
            for position, figure in enumerate(versions)
            if (value := _judged(figure)) is not None
        ]
        if not measured:
            figures.append(first)
            continue
        ordered = sorted(measured, key=lambda item: (item[0], item[1]))
        _, position, chosen = ordered[(len(ordered) - 1) // 2]
        details = dict(chosen.details)
        details["runs"] = [
            None if (value := _judged(figure)) is None else round(value, 6) for figure in versions
        ]
        details["median_of_runs"] = len(measured)
        details["median_run"] = position + 1
        figures.append(dataclasses.replace(chosen, details=details))
    machine = dict(runs[-1].machine)
    machine["load_average_at_start"] = runs[0].machine.get("load_average_at_start")
    machine["load_average_at_each_start"] = [
        run.machine.get("load_average_at_start") for run in runs
    ]
    machine["runs"] = len(runs)
    return Results(
        mode=runs[0].mode,
        started_at=runs[0].started_at,
        duration_s=round(sum(run.duration_s for run in runs), 1),
        machine=machine,
        figures=tuple(figures),
    )


def _write(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def write_results(results: Results, out: Path) -> tuple[Path, Path]:
    """Write ``latest.json`` and ``latest.md`` into ``out``; read the JSON back as a check."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    json_path = out / JSON_NAME
    markdown_path = out / MARKDOWN_NAME
    _write(json_path, json.dumps(results.to_json(), indent=2) + "\n")
    _write(markdown_path, render_markdown(results))
    load_results(json_path)
    return json_path, markdown_path


def update_readme(results: Results, readme: Path = README) -> None:
    """Replace the README's results block (between the bench markers) with these results."""
    text = readme.read_text(encoding="utf-8")
    _write(readme, replace_readme_block(text, render_summary(results)))


def parse_only(value: str | None) -> frozenset[str] | None:
    if value is None:
        return None
    names = frozenset(part.strip() for part in value.split(",") if part.strip())
    known = {benchmark.name for benchmark in all_benchmarks()}
    unknown = sorted(names - known)
    if not names or unknown:
        raise ValueError(
            f"--only {value!r}: unknown benchmark(s) {unknown}; accepted: {', '.join(sorted(known))}"
        )
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The suite's options (shared with ``omni-edge bench``)."""
    parser.add_argument(
        "--quick", action="store_true", help="fewer iterations, no vLLM (the CI mode, < 3 min)"
    )
    parser.add_argument(
        "--out", metavar="DIR", help=f"where latest.json and latest.md go (default {DEFAULT_OUT})"
    )
    parser.add_argument(
        "--only", metavar="ID[,ID...]", help="run only these benchmarks (others: not run)"
    )
    parser.add_argument(
        "--runs",
        type=_positive,
        default=1,
        metavar="N",
        help="run the suite N times and keep each figure's median run (default 1)",
    )
    parser.add_argument(
        "--update-readme",
        action="store_true",
        help="rewrite README.md's results table (between the bench markers)",
    )


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= 20:
        raise argparse.ArgumentTypeError(f"{value!r}; accepted: a whole number from 1 to 20")
    return number


def main_with(args: argparse.Namespace, *, log: Callable[[str], None]) -> int:
    """Run the suite from parsed arguments; returns the exit status (2: bad usage)."""
    try:
        only = parse_only(args.only)
    except ValueError as exc:
        log(str(exc))
        return 2
    if not 1 <= args.runs <= 20:
        log(f"--runs {args.runs}; accepted: a whole number from 1 to 20")
        return 2
    runs: list[Results] = []
    for number in range(1, args.runs + 1):
        if args.runs > 1:
            log(f"run {number} of {args.runs}")
        runs.append(run_suite(quick=args.quick, only=only, progress=log))
    results = median_results(runs)
    json_path, markdown_path = write_results(results, Path(args.out) if args.out else DEFAULT_OUT)
    if args.update_readme:
        update_readme(results)
        log(f"updated {README}")
    print(markdown_path.read_text(encoding="utf-8"))
    print(f"wrote {json_path} and {markdown_path}")
    return 0


def _log(line: str) -> None:
    print(f"bench: {line}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.suite", description=__doc__)
    add_arguments(parser)
    return main_with(parser.parse_args(argv), log=_log)


if __name__ == "__main__":
    sys.exit(main())
