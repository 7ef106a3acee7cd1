"""The soak: 1,000 requests across the add, MLP-chain and speech demos, about 30% cancelled.

Requests run one after another against long-lived pipelines. A request picked for
cancellation is cancelled at a random point: right after submission, after a random part
of its expected duration, or once its (first) output was delivered but not yet
acknowledged. A pipeline whose worker was retired by a cancel is closed and recreated,
as a user would. Every completed request is checked (the add and chain outputs exactly,
speech for finite, non-empty audio); nothing may fail except by cancellation.

At checkpoints the only child processes are the live pipelines' workers and no shared
memory is held between requests; at the end nothing is left at all, and the controller's
resident memory grew by less than ``RSS_GROWTH_LIMIT``.

``OMNI_SOAK_REQUESTS`` changes the count (``benchmarks/reliability.py`` passes it).
"""

from __future__ import annotations

import os
import random
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from runtime.adapters.voice_export import ensure_voice_bundles
from runtime.api import Omni
from runtime.engine.orchestrator import Request
from runtime.engine.outputs import END, OmniRequestOutput
from runtime.errors import RequestCancelled
from tests.helpers.engine import engine_of
from tests.reliability.support import Census, live_children, record, shm_segments

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3 * 3600)]

REPO_ROOT = Path(__file__).resolve().parents[2]
REQUESTS = int(os.environ.get("OMNI_SOAK_REQUESTS") or 1000)
CANCEL_FRACTION = 0.3
SEED = 20260922
#: Share of requests per demo: speech requests take seconds, the graph demos milliseconds.
MIX = {"add": 0.45, "chain": 0.45, "speech": 0.10}
TEXTS = ("Hello.", "Yes, of course.", "The soak goes on.", "One, two, three.")
CHAIN_VARIANTS = 8
RSS_GROWTH_LIMIT = 32 << 20
CHECK_EVERY = 50
RESULT_TIMEOUT_S = 120.0


@dataclass
class Demo:
    """One long-lived pipeline of the soak and what its requests should return."""

    name: str
    pipeline: Path
    options: dict[str, Any]
    omni: Omni | None = None
    workers: int = 0
    recreated: int = 0
    durations: list[float] = field(default_factory=list)
    expected: dict[int, np.ndarray] = field(default_factory=dict)

    def open(self) -> Omni:
        if self.omni is None:
            self.omni = Omni(self.pipeline, **self.options)
            self.workers = len(engine_of(self.omni).clients)
        return self.omni

    def retired(self) -> bool:
        return self.omni is not None and not all(
            client.usable for client in engine_of(self.omni).clients
        )

    def close(self) -> None:
        if self.omni is not None:
            self.omni.close()
            self.omni = None
            self.workers = 0

    def typical_s(self) -> float:
        return statistics.median(self.durations[-50:]) if self.durations else 0.05


def _inputs(demo: Demo, rng: random.Random, omni: Omni) -> tuple[Any, int]:
    if demo.name == "add":
        a = np.asarray(rng.random(), np.float32) * np.ones((1, 1024), np.float32)
        b = np.arange(1024, dtype=np.float32).reshape(1, 1024)
        return {"a": a, "b": b}, 0
    if demo.name == "chain":
        variant = rng.randrange(CHAIN_VARIANTS)
        x = omni.example_inputs()["x"] + np.float32(variant) / 8
        return {"x": x}, variant
    return rng.choice(TEXTS), 0


@dataclass
class Outcome:
    status: str
    outputs: list[OmniRequestOutput] = field(default_factory=list)
    error: BaseException | None = None


def _consume(request: Request, hold_final: threading.Event | None, outcome: Outcome) -> None:
    """Drain one request's stream, acknowledging outputs; hold the final one until told."""
    try:
        while True:
            item = request.stream.next_future().result(RESULT_TIMEOUT_S)
            if item is END:
                outcome.status = "completed"
                return
            if isinstance(item, BaseException):
                outcome.status = "cancelled" if isinstance(item, RequestCancelled) else "failed"
                outcome.error = item
                return
            assert isinstance(item, OmniRequestOutput)
            outcome.outputs.append(item)
            if (item.finished or item.index == 0) and hold_final is not None:
                hold_final.wait(RESULT_TIMEOUT_S)
            item.release_stage_buffers()
    except BaseException as exc:
        outcome.status, outcome.error = "failed", exc


def _check(demo: Demo, request_input: Any, variant: int, outcome: Outcome) -> None:
    final = outcome.outputs[-1]
    assert final.finished
    if demo.name == "add":
        np.testing.assert_array_equal(final.outputs["sum"], request_input["a"] + request_input["b"])
    elif demo.name == "chain":
        y = final.outputs["y"]
        expected = demo.expected.setdefault(variant, y)
        np.testing.assert_array_equal(y, expected)
    else:
        audio = np.concatenate([output.outputs["pcm"] for output in outcome.outputs])
        assert audio.size > 0
        assert np.isfinite(audio).all()


def test_soak(demo_root: Path, options: dict[str, Any], private_tmpdir: Path) -> None:
    # The speech demo reads the voice from the user data directory, as `make setup` leaves it.
    ensure_voice_bundles("joe")
    census = Census.take(private_tmpdir)
    rng = random.Random(SEED)
    demos = {
        "add": Demo("add", demo_root / "pipelines" / "add.yaml", options),
        "chain": Demo("chain", demo_root / "pipelines" / "mlp-chain.yaml", options),
        "speech": Demo("speech", REPO_ROOT / "assets" / "pipelines" / "speak.yaml", options),
    }
    counts: Counter[str] = Counter()
    points: Counter[str] = Counter()
    failures: list[str] = []
    checkpoints: list[dict[str, Any]] = []
    process = psutil.Process()
    started = time.monotonic()
    rss_start = 0
    rss_peak = 0
    try:
        for number in range(REQUESTS):
            demo = demos[rng.choices(list(MIX), weights=list(MIX.values()))[0]]
            omni = demo.open()
            request_input, variant = _inputs(demo, rng, omni)
            cancel = rng.random() < CANCEL_FRACTION
            point = rng.choice(["at-once", "mid-request", "after-output"]) if cancel else ""
            hold = threading.Event() if cancel else None
            outcome = Outcome("running")
            began = time.monotonic()
            request = engine_of(omni).submit(request_input)
            consumer = threading.Thread(target=_consume, args=(request, hold, outcome))
            consumer.start()
            if cancel:
                assert hold is not None
                if point == "mid-request":
                    time.sleep(rng.uniform(0.0, demo.typical_s()))
                elif point == "after-output":
                    while not outcome.outputs and consumer.is_alive():
                        time.sleep(0.001)
                omni.cancel(request.request_id)
                points[point] += 1
                hold.set()
            consumer.join(RESULT_TIMEOUT_S)
            assert not consumer.is_alive(), f"request {number} ({demo.name}) did not end"
            counts["requests"] += 1
            counts[f"{demo.name}:{outcome.status}"] += 1
            counts[outcome.status] += 1
            if outcome.status == "completed":
                demo.durations.append(time.monotonic() - began)
                try:
                    _check(demo, request_input, variant, outcome)
                except AssertionError as exc:
                    failures.append(f"request {number} ({demo.name}): wrong output: {exc}")
            elif outcome.status == "failed" or (outcome.status == "cancelled" and not cancel):
                failures.append(f"request {number} ({demo.name}): {outcome.error!r}")
            if demo.retired():
                demo.close()
                demo.recreated += 1
            if number == min(REQUESTS - 1, 2 * CHECK_EVERY):
                # Every demo has run a while: the memory baseline.
                rss_start = process.memory_info().rss
            if number % CHECK_EVERY == CHECK_EVERY - 1:
                checkpoints.append(_checkpoint(number + 1, demos, process))
                rss_peak = max(rss_peak, checkpoints[-1]["rss_bytes"])
        rss_end = process.memory_info().rss
    finally:
        for demo in demos.values():
            demo.close()
    leaks = census.leaks()
    entry = record(
        "soak",
        requests=counts["requests"],
        completed=counts["completed"],
        cancelled=counts["cancelled"],
        failed=counts["failed"],
        cancel_points=dict(points),
        per_demo={key: value for key, value in counts.items() if ":" in key},
        recreated={name: demo.recreated for name, demo in demos.items()},
        duration_s=round(time.monotonic() - started, 1),
        rss_start_bytes=rss_start,
        rss_end_bytes=rss_end,
        rss_peak_bytes=rss_peak,
        rss_growth_bytes=rss_end - rss_start,
        rss_mib_at=[[c["requests"], c["rss_bytes"] >> 20] for c in checkpoints],
        leaks=leaks.counts(),
        checkpoint_problems=[c for c in checkpoints if c["problems"]],
        failures=failures[:20],
        passed=False,
    )
    print({key: value for key, value in entry.items() if key != "checkpoint_problems"})
    assert not failures, failures[:5]
    assert not [c for c in checkpoints if c["problems"]]
    assert counts["requests"] == REQUESTS
    assert abs(counts["cancelled"] / REQUESTS - CANCEL_FRACTION) < 0.1
    assert not leaks.total, leaks.describe()
    assert rss_end - rss_start < RSS_GROWTH_LIMIT
    entry["passed"] = True


def _held(segments: set[str], demos: dict[str, Demo]) -> list[str]:
    """Segments held between requests besides the live stages' arenas (each stage keeps its
    inputs' arena and its worker's outputs' while it runs; nothing else stays)."""
    arenas: set[str] = set()
    for demo in demos.values():
        if demo.omni is not None:
            for client in engine_of(demo.omni).clients:
                arenas |= getattr(client, "arena_names", frozenset())
    return sorted(segments - arenas)


def _checkpoint(done: int, demos: dict[str, Demo], process: psutil.Process) -> dict[str, Any]:
    """Between requests: only the live pipelines' workers run, and no segment is held
    besides the live stages' arenas."""
    expected = sum(demo.workers for demo in demos.values())
    deadline = time.monotonic() + 5.0
    while True:
        children = live_children()
        held = _held(shm_segments(), demos)
        if (len(children) == expected and not held) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    problems = []
    if len(children) != expected:
        problems.append(f"{len(children)} child processes; {expected} workers are live")
    if held:
        problems.append(f"shared memory held between requests: {held}")
    return {
        "requests": done,
        "rss_bytes": process.memory_info().rss,
        "fds": len(os.listdir("/proc/self/fd")),
        "children": len(children),
        "problems": problems,
    }
