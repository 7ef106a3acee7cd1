"""Helpers for the engine tests: pipeline files, waiting, and process/shared-memory views."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import psutil
import yaml

from tests.helpers.shm import session_segments

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from runtime.backends.base import CallResult
    from runtime.backends.graph import GraphStageClient
    from runtime.contracts import RequestKey
    from runtime.engine.orchestrator import Orchestrator

T = TypeVar("T")

CPU = "CPUExecutionProvider"
HERE = Path(__file__).resolve().parent
MISBEHAVING_WORKER = HERE / "misbehaving_worker.py"
PLACEMENT_WORKER = HERE / "placement_worker.py"
SHM_DIR = Path("/dev/shm")
#: A step count no test waits for: only cancellation (or a kill) ends such a call.
ENDLESS_STEPS = 10**12


def loop_inputs(manifest: Path, steps: int) -> dict[str, np.ndarray]:
    """The loop bundle's example ``x`` with ``steps`` loop steps."""
    with np.load(manifest.parent / "inputs.npz", allow_pickle=False) as archive:
        return {"x": archive["x"], "n": np.array(steps, np.int64)}


def loop_request_npz(steps: int) -> bytes:
    """An ``.npz`` request body for the loop pipeline: a fixed ``x`` and ``steps`` steps."""
    from runtime.serve.requests import dump_npz

    rng = np.random.default_rng(0)
    return dump_npz(
        {"x": rng.standard_normal((1024, 256)).astype(np.float32), "n": np.array(steps, np.int64)}
    )


@dataclass(frozen=True, slots=True)
class StageSpec:
    """One graph stage of a test pipeline (written as YAML by :func:`write_pipeline`)."""

    manifest: Path
    worker: str = "ort"
    ep: str = "cpu"
    allowed: tuple[str, ...] = (CPU,)
    min_fraction: float = 1.0
    max_io: str = "64KiB"
    capacity: str = "2GiB"
    demand: str = "128MiB"
    env: Mapping[str, str] = field(default_factory=dict)
    provider_options: Mapping[str, str | int] = field(default_factory=dict)


def write_pipeline(
    path: Path, stage: StageSpec, *, name: str = "engine_test", max_queued: int | None = None
) -> Path:
    """Write a one-stage ``external.graph.v1`` pipeline to ``path`` and return it."""
    route: dict[str, Any] = {
        "name": "test-route",
        "interpreter": "bundled",
        "worker": str(stage.worker),
        "ep": stage.ep,
        "os_domain": "posix",
        "max_io_bytes": stage.max_io,
        "min_fraction_on_target": stage.min_fraction,
        "allowed_providers": list(stage.allowed),
    }
    if stage.env:
        route["env"] = dict(stage.env)
    if stage.provider_options:
        route["provider_options"] = dict(stage.provider_options)
    document: dict[str, Any] = {"pipeline": name, "async_chunk": False}
    if max_queued is not None:
        document["max_queued"] = max_queued
    document["stages"] = [
        {
            "stage_id": 0,
            "backend": {
                "name": "external.graph.v1",
                "manifest": str(stage.manifest),
                "route": route,
            },
            "resource_budget": {
                "capacities": {"machine:ram": stage.capacity},
                "demands": {"machine:ram": stage.demand},
            },
        }
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def wait_until(predicate: Callable[[], T], what: str, timeout_s: float = 10.0) -> T:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


def on_loop(orchestrator: Orchestrator, function: Callable[[], T]) -> T:
    """Run ``function`` on the orchestrator's loop thread (where clients are driven)."""
    loop = orchestrator._loop
    assert loop is not None

    async def call() -> T:
        return function()

    return asyncio.run_coroutine_threadsafe(call(), loop).result(10)


def call_stage(
    orchestrator: Orchestrator,
    client: GraphStageClient,
    key: RequestKey,
    inputs: Mapping[str, np.ndarray],
) -> CallResult:
    """Call one stage directly on the orchestrator's loop and wait for the outcome."""
    loop = orchestrator._loop
    assert loop is not None
    return asyncio.run_coroutine_threadsafe(client.call(key, dict(inputs)), loop).result(10)


def child_pids() -> set[int]:
    """Every live (non-zombie) descendant of this test process."""
    pids = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                pids.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return pids


def process_gone(pid: int) -> bool:
    """True when ``pid`` no longer names a process, not even a zombie."""
    try:
        psutil.Process(pid)
    except psutil.NoSuchProcess:
        return True
    return False


def shm_entries(prefix: str = "oe-") -> set[str]:
    """This session's names in /dev/shm starting with ``prefix`` (every segment this project
    makes starts with ``oe-``; see :mod:`tests.helpers.shm`)."""
    return session_segments(prefix)


def controller_segments() -> set[str]:
    """Segments named for workers of this process (``oe-<pid>-<generation>-...``)."""
    return shm_entries(f"oe-{os.getpid()}-")


def wait_busy(pid: int, *, cpu_s: float = 0.2, timeout_s: float = 20.0) -> None:
    """Wait until ``pid`` has burned ``cpu_s`` of CPU within one second: it is computing."""
    process = psutil.Process(pid)

    def used() -> float:
        times = process.cpu_times()
        return float(times.user + times.system)

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        before = used()
        time.sleep(1.0)
        if used() - before >= cpu_s:
            return
    raise AssertionError(f"pid {pid} did not start computing within {timeout_s} s")
