"""The vLLM benchmark: its figures from an interleaved run, and the run itself on real engines."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from benchmarks import vllm_figures
from benchmarks.figures import Status
from benchmarks.vllm_figures import Run, Side, Timing
from runtime.envs import EnvInfo
from tests.runtime.vllm.conftest import tiny_model, vllm_env


def _side(ttft_s: float, total_s: float, tokens: int = 8) -> Side:
    timings = [Timing(ttft_s, total_s, tokens), Timing(ttft_s * 2, total_s * 2, tokens)]
    return Side.of(1.0, timings, tokens)


def test_a_request_short_of_its_tokens_is_an_error() -> None:
    with pytest.raises(AssertionError, match=r"should generate 8 tokens .*\[8, 7\]"):
        Side.of(1.0, [Timing(0.01, 0.1, 8), Timing(0.01, 0.1, 7)], 8)


def test_figures_compare_the_two_sides_and_say_they_were_interleaved() -> None:
    # Ours: first token 13 ms, 80 tokens/s at p50; direct: 10 ms, 100 tokens/s.
    run = Run(worker=_side(0.010, 0.075), direct=_side(0.008, 0.060), requests=2, version="x")
    ttft, rate = vllm_figures.figures_of(run, 8)
    assert ttft.key == "vllm.ttft"
    assert ttft.ratio == pytest.approx(1.25)
    assert ttft.status is Status.FAIL  # the goal is ratio <= 1.2
    assert "adds 3.0 ms at p50 to the 12.0 ms" in ttft.note
    assert "event loop" in ttft.note
    assert "reader thread hands frames to it" in ttft.note  # only on Windows
    assert rate.key == "vllm.tokens_per_s"
    assert rate.ratio == pytest.approx(0.8)
    assert rate.status is Status.FAIL
    assert "alternated (2 requests each)" in rate.note
    for figure in (ttft, rate):
        assert figure.details["worker_requests"] == 2
        assert figure.details["direct_requests"] == 2
        assert figure.details["interleaved"] is True

    met = vllm_figures.figures_of(
        Run(worker=_side(0.009, 0.060), direct=_side(0.008, 0.060), requests=2, version="x"), 8
    )
    assert [figure.status for figure in met] == [Status.PASS, Status.PASS]
    assert [figure.note for figure in met] == ["", ""]


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_both_engines_take_turns_on_the_same_requests(
    tmp_path: Path, vllm_env: EnvInfo, tiny_model: Path
) -> None:
    # The environment and the model come from the vLLM tests' fixtures (made once, reused).
    run = asyncio.run(vllm_figures._interleaved(vllm_env.python, tiny_model, 2, 8, tmp_path))
    for side in (run.worker, run.direct):
        assert side.ttft.count == 2
        assert side.tokens == 16
        assert all(0 < ttft for ttft in side.ttft.values)
        assert side.load_s > 0
    assert run.version


__all__ = ["tiny_model", "vllm_env"]
