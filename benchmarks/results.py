"""The results document: figures plus the machine and run they came from; JSON and Markdown.

``latest.json`` is the record; ``latest.md`` and the README block are rendered from it.
:func:`load_results` parses a document back and checks that it is well formed: every
figure has a measurement with a baseline and ratio, or a not-run reason.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from benchmarks.figures import Figure, FigureFormatError, Status, Subject

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from pathlib import Path

SCHEMA: Final = 1
README_START: Final = "<!-- bench:start -->"
README_END: Final = "<!-- bench:end -->"


@dataclass(frozen=True, slots=True)
class Results:
    """One run of the suite."""

    mode: str
    started_at: str
    duration_s: float
    machine: Mapping[str, Any]
    figures: tuple[Figure, ...]
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def figure(self, key: str) -> Figure:
        for figure in self.figures:
            if figure.key == key:
                return figure
        raise KeyError(key)

    def count(self, status: Status) -> int:
        return sum(1 for figure in self.figures if figure.status is status)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "mode": self.mode,
            "started_at": self.started_at,
            "duration_s": self.duration_s,
            "machine": dict(self.machine),
            "summary": {status.value: self.count(status) for status in Status},
            "figures": [figure.to_json() for figure in self.figures],
            "limits": [
                {"key": figure.key, "note": figure.note}
                for figure in self.figures
                if figure.status is Status.FAIL
            ],
        }

    @classmethod
    def from_json(cls, document: object) -> Results:
        if not isinstance(document, dict):
            raise FigureFormatError("results: expected an object")
        if document.get("schema") != SCHEMA:
            raise FigureFormatError(
                f"results.schema: expected {SCHEMA}, got {document.get('schema')!r}"
            )
        mode = document.get("mode")
        if mode not in ("quick", "full"):
            raise FigureFormatError(f"results.mode: expected 'quick' or 'full', got {mode!r}")
        raw_figures = document.get("figures")
        if not isinstance(raw_figures, list) or not raw_figures:
            raise FigureFormatError("results.figures: expected a non-empty list")
        figures = tuple(Figure.from_json(item) for item in raw_figures)
        keys = [figure.key for figure in figures]
        if len(set(keys)) != len(keys):
            raise FigureFormatError(f"results.figures: repeated keys in {keys}")
        for figure in figures:
            _check_complete(figure)
        machine = document.get("machine")
        if not isinstance(machine, dict):
            raise FigureFormatError("results.machine: expected an object")
        for name in (
            "cpu",
            "logical_cores",
            "load_average_at_start",
            "load_average_at_end",
            "packages",
        ):
            if name not in machine:
                raise FigureFormatError(f"results.machine.{name}: missing")
        duration = document.get("duration_s")
        if not isinstance(duration, int | float) or not math.isfinite(duration):
            raise FigureFormatError(f"results.duration_s: expected a number, got {duration!r}")
        started = document.get("started_at")
        if not isinstance(started, str):
            raise FigureFormatError("results.started_at: expected a string")
        return cls(mode, started, float(duration), machine, figures)


def _check_complete(figure: Figure) -> None:
    """A measured figure has its baseline, ratio and goal verdict (the baseline is optional
    for an absolute goal on the measurement); a skipped one its reason."""
    where = f"figure {figure.key}"
    if figure.status is Status.NOT_RUN:
        if not figure.reason.strip():
            raise FigureFormatError(f"{where}: not run without a reason")
        return
    # A goal on the measurement itself (at most 800 ms, none missed) may stand without one.
    absolute = figure.goal.comparator is not None and figure.goal.subject is Subject.MEASUREMENT
    if not absolute and (
        figure.baseline is None or figure.ratio is None or not figure.baseline_label
    ):
        raise FigureFormatError(f"{where}: measured without a baseline, its label and a ratio")
    if figure.status is Status.FAIL and not figure.note.strip():
        raise FigureFormatError(f"{where}: a missed goal needs a note saying what limits it")


def load_results(path: Path) -> Results:
    """Read and check a ``latest.json``."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise FigureFormatError(f"{path}: not JSON ({exc})") from None
    return Results.from_json(document)


# -- Markdown ---------------------------------------------------------------------------


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        text = f"{value:,.0f}"
    elif abs(value) >= 100:
        text = f"{value:.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    elif abs(value) >= 0.1:
        text = f"{value:.2f}"
    else:
        text = f"{value:.3g}"
    return f"{text} {unit}"


def _result_cell(figure: Figure) -> str:
    status = figure.status
    if status is Status.FAIL:
        return "**missed**"
    if status is Status.PASS:
        return "met"
    if status is Status.REPORTED:
        return "reported"
    return "not run"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_table(figures: Sequence[Figure]) -> list[str]:
    lines = [
        "| figure | measurement | baseline | ratio | goal | result |",
        "|---|---:|---:|---:|---|---|",
    ]
    for figure in figures:
        ratio = figure.ratio
        lines.append(
            "| "
            + " | ".join(
                [
                    _escape(figure.name),
                    format_value(figure.measurement, figure.unit),
                    format_value(figure.baseline, figure.unit),
                    "-" if ratio is None else f"{ratio:.3g}x",
                    _escape(figure.goal.text),
                    _result_cell(figure),
                ]
            )
            + " |"
        )
    return lines


def _bullets(pairs: Iterable[tuple[str, str]]) -> list[str]:
    return [f"- **{_escape(name)}**: {_escape(text)}" for name, text in pairs]


def _machine_line(results: Results) -> str:
    machine = results.machine
    packages = machine.get("packages", {})
    versions = ", ".join(f"{name} {version}" for name, version in packages.items() if version)
    start = machine.get("load_average_at_start")
    end = machine.get("load_average_at_end")
    runs = machine.get("runs")
    if isinstance(runs, int) and runs > 1:
        starts = "; ".join(str(value) for value in machine.get("load_average_at_each_start", []))
        return (
            f"{results.mode} runs from {results.started_at}: each figure is the median of {runs} "
            f"runs ({results.duration_s:.0f} s in all) on {machine.get('cpu')}, "
            f"{machine.get('logical_cores')} logical cores; load average at each run's start "
            f"{starts}, {end} at the end; Python {machine.get('python')}, {versions}; "
            f"revision {machine.get('revision')}."
        )
    return (
        f"{results.mode} run of {results.started_at} ({results.duration_s:.0f} s) on "
        f"{machine.get('cpu')}, {machine.get('logical_cores')} logical cores; load average "
        f"{start} at start, {end} at end; Python {machine.get('python')}, {versions}; "
        f"revision {machine.get('revision')}."
    )


def render_summary(results: Results) -> list[str]:
    """The table, the notes on missed goals and the not-run reasons (the README block)."""
    lines = [_machine_line(results), "", *render_table(results.figures)]
    missed = [(f.name, f.note) for f in results.figures if f.status is Status.FAIL]
    if missed:
        lines += ["", "Where a goal is missed, what limits it:", "", *_bullets(missed)]
    skipped = [(f.name, f.reason) for f in results.figures if f.status is Status.NOT_RUN]
    if skipped:
        lines += ["", "Not run, and why:", "", *_bullets(skipped)]
    return lines


def _detail_text(value: object) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(str(item) for item in value) + "]"
    return str(value)


def render_markdown(results: Results) -> str:
    """``latest.md``: the summary, then each figure's baseline, details and notes."""
    lines = ["# Benchmark results", "", *render_summary(results), "", "## Figures", ""]
    for figure in results.figures:
        lines.append(f"### {figure.name} (`{figure.key}`)")
        lines.append("")
        if figure.status is Status.NOT_RUN:
            lines += [f"Not run: {figure.reason}", ""]
            continue
        lines.append(f"- baseline: {figure.baseline_label}")
        lines.append(f"- goal: {figure.goal.text} -> {_result_cell(figure)}")
        for name, value in figure.details.items():
            lines.append(f"- {name}: {_detail_text(value)}")
        if figure.note:
            lines.append(f"- note: {figure.note}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def replace_readme_block(readme: str, block: Sequence[str]) -> str:
    """``readme`` with the text between the bench markers replaced by ``block``."""
    start = readme.find(README_START)
    end = readme.find(README_END)
    if start < 0 or end < start:
        raise ValueError(
            f"README has no {README_START} ... {README_END} block; add both markers where the "
            "latest results belong"
        )
    head = readme[: start + len(README_START)]
    return head + "\n" + "\n".join(block) + "\n" + readme[end:]
