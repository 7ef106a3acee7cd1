"""``omni-edge bench --quick``: both result files written, every figure present and well formed.

The full quick suite runs in a child process (``slow``: about two minutes on two cores);
the fast tests run the command in this process with ``--only``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.figures import Status, Subject
from benchmarks.results import load_results
from benchmarks.suite import all_benchmarks
from runtime.cli import main

#: What quick mode promises (it runs in CI).
QUICK_LIMIT_S = 180.0
#: Figures that need nothing beyond this checkout, so quick mode must measure them.
SELF_CONTAINED = (
    "graph.tiny_add",
    "graph.matmul_1ms",
    "graph.matmul_vs_floor",
    "handoff.8mib",
    "startup.two_stage",
    "ledger.ops",
    "memory.add",
    "memory.mlp_chain",
)


def _bench(out: Path, *options: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", "bench", "--quick", "--out", str(out), *options],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        cwd=out.parent,
    )


def _declared() -> list[str]:
    return [spec.key for benchmark in all_benchmarks() for spec in benchmark.specs]


def _check_files(out: Path) -> None:
    results = load_results(out / "latest.json")
    assert [figure.key for figure in results.figures] == _declared()
    markdown = (out / "latest.md").read_text(encoding="utf-8")
    for figure in results.figures:
        assert f"| {figure.name} |" in markdown
        if figure.status is Status.NOT_RUN:
            assert figure.reason in markdown
        elif figure.goal.comparator is not None and figure.goal.subject is Subject.MEASUREMENT:
            # A goal on the measurement alone (no 429 answers) needs no baseline.
            assert figure.status in (Status.PASS, Status.FAIL)
            assert figure.baseline is None or figure.ratio is not None
        else:
            assert figure.baseline is not None
            assert figure.ratio is not None
            assert figure.baseline_label
        if figure.status is Status.FAIL:
            assert figure.note in markdown


def test_bench_quick_only_ledger_writes_every_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "results"
    assert main(["bench", "--quick", "--out", str(out), "--only", "ledger"]) == 0
    assert f"wrote {out / 'latest.json'} and {out / 'latest.md'}" in capsys.readouterr().out
    _check_files(out)
    results = load_results(out / "latest.json")
    assert results.mode == "quick"
    ledger = results.figure("ledger.ops")
    assert ledger.measurement is not None
    assert ledger.measurement > 0
    assert ledger.baseline is not None
    assert isinstance(ledger.passed, bool)
    assert ledger.goal.threshold == 100_000.0
    others = [figure for figure in results.figures if figure.key != "ledger.ops"]
    assert all(figure.reason == "not selected (--only ledger)" for figure in others)
    assert results.machine["load_average_at_start"] is not None


def test_bench_refuses_an_unknown_benchmark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--out", str(tmp_path / "results"), "--only", "gpu"]) == 2
    assert "unknown benchmark(s) ['gpu']" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_quick_measures_every_figure_it_can(tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = _bench(out, timeout_s=540)
    assert done.returncode == 0, done.stderr
    _check_files(out)
    results = load_results(out / "latest.json")
    assert results.duration_s < QUICK_LIMIT_S
    for key in SELF_CONTAINED:
        figure = results.figure(key)
        assert figure.status is not Status.NOT_RUN, f"{key}: {figure.reason}"
    for key in ("vllm.ttft", "vllm.tokens_per_s"):
        assert "quick mode" in results.figure(key).reason
    # Beside each graph figure, the two-process floor measured in the same run: a worker
    # costs something, and the copies cost something more.
    for key in ("graph.tiny_add", "graph.matmul_1ms"):
        details = results.figure(key).details
        assert isinstance(details["floor_ratio"], float), details
        assert details["floor_ratio"] > 1.0
        assert details["floor_without_copies_p50_ms"] > 0
        assert details["floor_in_process_p50_ms"] > 0
    # The MatMul's goal is set against that floor, with its copies, of the same run.
    against = results.figure("graph.matmul_vs_floor")
    assert against.baseline == results.figure("graph.matmul_1ms").details["floor_p50_ms"]
    assert against.measurement == results.figure("graph.matmul_1ms").details["pipeline_p50_ms"]
