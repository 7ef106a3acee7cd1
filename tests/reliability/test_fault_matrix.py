"""The fault matrix: every fault injected for real, against real workers and real files.

Each case states the typed error a user sees, a recovery bound, and what state the
pipeline is left in: ``usable`` (it serves on), ``retired`` (the stage refuses further
work with :class:`StageRetired` until the pipeline is recreated), ``refused`` (it never
started, everything unwound) or ``closed``. Recovery time runs from the moment the fault
is injected to the moment the pipeline serves again, or, for a retired or refused one, to
the typed error with every process, segment and reservation gone. After each case
nothing may be left: no child process, shared-memory segment, file descriptor, file in the
test's own ``TMPDIR`` or reservation; and the pipeline (recreated where it was retired)
must serve a request again.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime.api import Omni
from runtime.artifacts import sha256_file
from runtime.audio import (
    AudioDeviceError,
    AudioPlayer,
    PlayerState,
    open_stream_count,
    rescan_output_devices,
)
from runtime.backends.graph import GraphTimeouts
from runtime.contracts import RequestKey
from runtime.contracts.messages import AckMessage
from runtime.devices import load_topology
from runtime.engine.stage_runtime import StageStartError
from runtime.errors import (
    AdmissionRefused,
    PlacementRefused,
    RequestCancelled,
    StageRetired,
    VerificationError,
    WorkerDied,
)
from runtime.events import Event, EventBus, StageStarting, WorkerRetired
from runtime.host import set_child_subreaper
from runtime.ledger import ResourceLedger
from runtime.transport.channel import ProtocolError
from runtime.transport.shm import DEFAULT_MAX_BYTES, ShmLimitExceeded, ShmProducer, new_prefix
from tests.helpers.engine import engine_of
from tests.reliability import transforms
from tests.reliability.support import Census, record, temp_files
from tests.runtime.engine.support import (
    CPU,
    ENDLESS_STEPS,
    MISBEHAVING_WORKER,
    StageSpec,
    child_pids,
    controller_segments,
    on_loop,
    process_gone,
    shm_entries,
    wait_busy,
    wait_until,
    write_pipeline,
)
from tests.workers.support import loop_reference

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
FAULT_WORKER = HERE / "fault_worker.py"
CONTROLLER_CHILD = HERE / "controller_child.py"

TIMEOUTS = GraphTimeouts()
#: A cancelled active call, or a hung one, is gone within the retirement deadline.
CANCEL_BOUND_S = TIMEOUTS.cancel_retire_s + 1.0
#: A worker that broke the protocol or died is retired within the retirement deadline.
RETIRE_BOUND_S = TIMEOUTS.retire_s + 1.0
#: A refusal that needs no process (bad manifest, overcommit) comes at once.
REFUSAL_BOUND_S = 2.0
#: A start that failed in the worker is unwound within this.
START_BOUND_S = 5.0
#: Steps of the loop graph that take a noticeable fraction of a second.
SHORT_STEPS = 60


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a scenario ended in: the error the user saw, the state, and whether it served after."""

    error: BaseException | None
    state: str
    usable_after: bool


@dataclass
class FaultRun:
    """One scenario's materials and clock."""

    tmp_path: Path
    tmpdir: Path
    demo_root: Path
    loop_manifest: Path
    options: dict[str, Any]
    injected_at: float | None = None
    recovered_at: float | None = None

    def inject(self) -> None:
        self.injected_at = time.monotonic()

    def recovered(self, at: float | None = None) -> None:
        self.recovered_at = time.monotonic() if at is None else at

    @property
    def recovery_s(self) -> float | None:
        if self.injected_at is None or self.recovered_at is None:
            return None
        return max(0.0, self.recovered_at - self.injected_at)

    # Materials.

    @property
    def add_manifest(self) -> Path:
        return self.demo_root / "bundles" / "add" / "manifest.json"

    @property
    def add_pipeline(self) -> Path:
        return self.demo_root / "pipelines" / "add.yaml"

    def loop_pipeline(self, name: str = "loop", *, max_queued: int | None = None) -> Path:
        return write_pipeline(
            self.tmp_path / f"{name}.yaml",
            StageSpec(self.loop_manifest, max_io="4MiB"),
            name=name,
            max_queued=max_queued,
        )

    def loop_inputs(self, steps: int) -> dict[str, np.ndarray]:
        with np.load(self.loop_manifest.parent / "inputs.npz", allow_pickle=False) as archive:
            return {"x": archive["x"], "n": np.array(steps, np.int64)}

    def worker_pipeline(self, name: str, worker: Path, **env: str) -> Path:
        return write_pipeline(
            self.tmp_path / f"{name}.yaml",
            StageSpec(self.add_manifest, worker=str(worker), env=env),
            name=name,
        )

    def bundle_copy(self) -> Path:
        """A private copy of the add bundle; returns its manifest."""
        target = self.tmp_path / "bundle"
        shutil.copytree(self.add_manifest.parent, target)
        return target / "manifest.json"

    # Checks.

    def serves_add(self) -> bool:
        """A fresh add pipeline computes the right sum."""
        with Omni(self.add_pipeline, **self.options) as omni:
            example = omni.example_inputs()
            np.testing.assert_array_equal(omni.run()["sum"], example["a"] + example["b"])
        return True

    def serves_loop(self, pipeline: Path | None = None) -> bool:
        """A fresh loop pipeline computes the right result."""
        inputs = self.loop_inputs(2)
        with Omni(pipeline or self.loop_pipeline("again"), **self.options) as omni:
            result = omni.run(inputs)
        np.testing.assert_allclose(result["y"], loop_reference(inputs["x"], 2), atol=1e-5)
        return True


@dataclass(frozen=True, slots=True)
class Fault:
    """One row of the matrix."""

    id: str
    description: str
    bound_s: float
    expected_error: type[BaseException] | None
    #: The states the pipeline may be left in (more than one where timing decides).
    states: tuple[str, ...]
    scenario: Callable[[FaultRun], Outcome]


FAULTS: dict[str, Fault] = {}


def fault(
    id: str,
    description: str,
    *,
    bound_s: float,
    error: type[BaseException] | None,
    state: str | tuple[str, ...],
) -> Callable[[Callable[[FaultRun], Outcome]], Callable[[FaultRun], Outcome]]:
    def register(scenario: Callable[[FaultRun], Outcome]) -> Callable[[FaultRun], Outcome]:
        states = (state,) if isinstance(state, str) else state
        FAULTS[id] = Fault(id, description, bound_s, error, states, scenario)
        return scenario

    return register


def retired_events(events: EventBus) -> list[WorkerRetired]:
    seen: list[WorkerRetired] = []
    events.subscribe(lambda event: seen.append(event) if isinstance(event, WorkerRetired) else None)
    return seen


def gone_and_settled(pid: int, ledger: ResourceLedger) -> bool:
    return process_gone(pid) and ledger.snapshot().is_empty and not controller_segments()


# -- workers killed --------------------------------------------------------------------


def _kill_while_starting(run: FaultRun, fault_name: str, where: str) -> Outcome:
    marker = run.tmp_path / "stopped"
    pipeline = run.worker_pipeline(
        fault_name, FAULT_WORKER, FAULT=fault_name, FAULT_MARKER=str(marker)
    )
    ledger = ResourceLedger(name=fault_name)
    errors: list[tuple[BaseException, float]] = []

    def start() -> None:
        try:
            Omni(pipeline, ledger=ledger, **run.options).close()
        except BaseException as exc:
            errors.append((exc, time.monotonic()))

    starter = threading.Thread(target=start, name="start-under-fault")
    starter.start()
    text = wait_until(
        lambda: marker.exists() and marker.read_text(), f"the worker to stop in {where}", 60
    )
    pid_text, stopped_in = text.split()
    assert stopped_in == where
    pid = int(pid_text)
    run.inject()
    os.kill(pid, signal.SIGKILL)
    starter.join(30)
    assert not starter.is_alive(), "the start did not give up after its worker was killed"
    ((error, failed_at),) = errors
    run.recovered(failed_at)
    assert isinstance(error, StageStartError), error
    assert isinstance(error.cause, WorkerDied)
    assert f"pid {pid}" in str(error)
    assert f"exit code {-signal.SIGKILL}" in str(error)
    assert process_gone(pid)
    assert ledger.snapshot().is_empty
    return Outcome(error, "refused", run.serves_add())


@fault(
    "kill-during-load",
    "worker SIGKILLed while it reads the bundle",
    bound_s=START_BOUND_S,
    error=StageStartError,
    state="refused",
)
def kill_during_load(run: FaultRun) -> Outcome:
    return _kill_while_starting(run, "pause-load", "load")


@fault(
    "kill-during-warmup",
    "worker SIGKILLed between session creation and warm-up",
    bound_s=START_BOUND_S,
    error=StageStartError,
    state="refused",
)
def kill_during_warmup(run: FaultRun) -> Outcome:
    return _kill_while_starting(run, "pause-warmup", "warmup")


@fault(
    "kill-during-call",
    "worker SIGKILLed while it computes a call",
    bound_s=RETIRE_BOUND_S,
    error=WorkerDied,
    state="retired",
)
def kill_during_call(run: FaultRun) -> Outcome:
    ledger = ResourceLedger(name="kill-call")
    with Omni(run.loop_pipeline(), ledger=ledger, **run.options) as omni:
        (client,) = engine_of(omni).clients
        pid = client.pid
        assert pid is not None
        request = engine_of(omni).submit(run.loop_inputs(ENDLESS_STEPS))
        pending = request.stream.next_future()
        wait_busy(pid)
        run.inject()
        os.kill(pid, signal.SIGKILL)
        error = pending.result(10)
        wait_until(lambda: gone_and_settled(pid, ledger), "the dead worker to be settled")
        run.recovered()
        assert isinstance(error, WorkerDied), error
        assert f"pid {pid}" in str(error)
        with pytest.raises(StageRetired, match=f"worker pid {pid}"):
            omni.run(run.loop_inputs(1))
    return Outcome(error, "retired", run.serves_loop())


@fault(
    "kill-while-idle",
    "worker SIGKILLed while no call runs",
    bound_s=RETIRE_BOUND_S,
    error=StageRetired,
    state="retired",
)
def kill_while_idle(run: FaultRun) -> Outcome:
    ledger = ResourceLedger(name="kill-idle")
    with Omni(run.add_pipeline, ledger=ledger, **run.options) as omni:
        (client,) = engine_of(omni).clients
        pid = client.pid
        assert pid is not None
        run.inject()
        os.kill(pid, signal.SIGKILL)
        wait_until(
            lambda: client.failure is not None and gone_and_settled(pid, ledger),
            "the idle worker's death to be noticed and settled",
        )
        run.recovered()
        assert isinstance(client.failure, WorkerDied)
        with pytest.raises(StageRetired, match=f"worker pid {pid}") as caught:
            omni.run()
    return Outcome(caught.value, "retired", run.serves_add())


# -- hung, noisy and broken workers ----------------------------------------------------


def _ignores_sigterm(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


@fault(
    "hung-call",
    "a non-preemptible call that never returns (ignores cancel, stdin and SIGTERM)",
    bound_s=CANCEL_BOUND_S,
    error=RequestCancelled,
    state="retired",
)
def hung_call(run: FaultRun) -> Outcome:
    pipeline = run.worker_pipeline("stubborn", MISBEHAVING_WORKER, MISBEHAVE="stubborn")
    ledger = ResourceLedger(name="stubborn")
    events = EventBus()
    retired = retired_events(events)
    with Omni(pipeline, ledger=ledger, events=events, **run.options) as omni:
        (client,) = engine_of(omni).clients
        pid = client.pid
        assert pid is not None
        request = engine_of(omni).submit()
        pending = request.stream.next_future()
        wait_until(lambda: _ignores_sigterm(pid), "the worker to hang in its call")
        run.inject()
        assert omni.cancel(request.request_id)
        wait_until(lambda: gone_and_settled(pid, ledger), "the hung worker to be killed")
        run.recovered()
        error = pending.result(10)
        assert isinstance(error, RequestCancelled)
        assert [(event.pid, event.confirmed_gone) for event in retired] == [(pid, True)]
        with pytest.raises(StageRetired):
            omni.run()
    return Outcome(error, "retired", run.serves_add())


class _Lines(logging.Handler):
    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def _log_lines(name: str, level: int = logging.INFO) -> Iterator[_Lines]:
    """Collect what logger ``name`` (and its children) log at ``level`` and above."""
    logger = logging.getLogger(name)
    handler = _Lines(level)
    previous = logger.level
    logger.setLevel(level)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


@fault(
    "stdout-noise",
    "worker prints noise on its standard output while loading and before every call",
    bound_s=START_BOUND_S,
    error=None,
    state="usable",
)
def stdout_noise(run: FaultRun) -> Outcome:
    from tests.reliability.fault_worker import NOISE

    pipeline = run.worker_pipeline("noise", FAULT_WORKER, FAULT="stdout-noise")
    with _log_lines("omni.worker") as log, Omni(pipeline, **run.options) as omni:
        (client,) = engine_of(omni).clients
        pid = client.pid
        example = omni.example_inputs()
        run.inject()
        for _ in range(3):
            np.testing.assert_array_equal(omni.run()["sum"], example["a"] + example["b"])
        run.recovered()
        assert client.usable
        assert client.pid == pid
        # The noise went to the worker's log (3 lines at load and per call), not into the frames.
        wait_until(
            lambda: sum(NOISE in line for line in log.lines) >= 3 * 4, "the noise in the log"
        )
    return Outcome(None, "usable", True)


def _protocol_fault(run: FaultRun, name: str, worker: Path, code: str, **env: str) -> Outcome:
    pipeline = run.worker_pipeline(name, worker, **env)
    ledger = ResourceLedger(name=name)
    with Omni(pipeline, ledger=ledger, **run.options) as omni:
        (client,) = engine_of(omni).clients
        pid = client.pid
        assert pid is not None
        run.inject()
        request = engine_of(omni).submit()
        error = request.stream.next_future().result(15)
        wait_until(lambda: gone_and_settled(pid, ledger), "the broken worker to be retired")
        run.recovered()
        assert isinstance(error, ProtocolError), error
        assert error.code == code
        assert "stage-0" in str(error)
        assert not client.usable
        with pytest.raises(StageRetired, match=code):
            omni.run()
    return Outcome(error, "retired", run.serves_add())


@fault(
    "garbage-frame",
    "worker writes bytes that are no frame in place of its result",
    bound_s=RETIRE_BOUND_S,
    error=ProtocolError,
    state="retired",
)
def garbage_frame(run: FaultRun) -> Outcome:
    return _protocol_fault(
        run, "garbage", MISBEHAVING_WORKER, "bad_magic", MISBEHAVE="garbage-result"
    )


@fault(
    "garbage-before-hello",
    "worker writes bytes that are no frame in place of its handshake",
    bound_s=START_BOUND_S,
    error=StageStartError,
    state="refused",
)
def garbage_before_hello(run: FaultRun) -> Outcome:
    pipeline = run.worker_pipeline("garbage-hello", MISBEHAVING_WORKER, MISBEHAVE="garbage-hello")
    ledger = ResourceLedger(name="garbage-hello")
    run.inject()
    with pytest.raises(StageStartError) as caught:
        Omni(pipeline, ledger=ledger, timeouts=GraphTimeouts(shutdown_s=30.0), **run.options)
    run.recovered()
    assert isinstance(caught.value.cause, ProtocolError)
    assert caught.value.cause.code == "bad_magic"
    assert ledger.snapshot().is_empty
    return Outcome(caught.value, "refused", run.serves_add())


@fault(
    "oversize-frame",
    "worker answers with a frame whose prefix declares a 1 TiB payload",
    bound_s=RETIRE_BOUND_S,
    error=ProtocolError,
    state="retired",
)
def oversize_frame(run: FaultRun) -> Outcome:
    return _protocol_fault(
        run, "oversize", FAULT_WORKER, "frame_too_large", FAULT="oversize-result"
    )


@fault(
    "malformed-frame",
    "worker answers with a frame whose header is not JSON",
    bound_s=RETIRE_BOUND_S,
    error=ProtocolError,
    state="retired",
)
def malformed_frame(run: FaultRun) -> Outcome:
    return _protocol_fault(
        run, "malformed", FAULT_WORKER, "bad_header_json", FAULT="malformed-result"
    )


# -- bundles -----------------------------------------------------------------------------


def _tamper_between_verification_and_load(
    run: FaultRun, tamper: Callable[[Path], None], restore: Callable[[Path], None], code: str
) -> Outcome:
    manifest = run.bundle_copy()
    graph = manifest.parent / json.loads(manifest.read_text())["metadata"]["graph_file"]
    pipeline = write_pipeline(run.tmp_path / "tampered.yaml", StageSpec(manifest))
    events = EventBus()

    def on_event(event: Event) -> None:
        # Published after the controller verified the bundle, before the worker loads it.
        if isinstance(event, StageStarting):
            run.inject()
            tamper(graph)

    events.subscribe(on_event)
    ledger = ResourceLedger(name="tampered")
    with pytest.raises(StageStartError) as caught:
        Omni(pipeline, ledger=ledger, events=events, **run.options)
    run.recovered()
    cause = caught.value.cause
    assert isinstance(cause, VerificationError), cause
    assert cause.code == code
    assert graph.name in str(cause)
    assert ledger.snapshot().is_empty
    restore(graph)
    with Omni(pipeline, **run.options) as omni:
        example = omni.example_inputs()
        np.testing.assert_array_equal(omni.run()["sum"], example["a"] + example["b"])
    return Outcome(caught.value, "refused", True)


@fault(
    "bundle-modified-after-verification",
    "the graph file changes between the controller's verification and the worker's load",
    bound_s=START_BOUND_S,
    error=StageStartError,
    state="refused",
)
def bundle_modified(run: FaultRun) -> Outcome:
    original: dict[str, bytes] = {}

    def tamper(graph: Path) -> None:
        original["bytes"] = graph.read_bytes()
        graph.write_bytes(original["bytes"] + b"\x00")

    def restore(graph: Path) -> None:
        graph.write_bytes(original["bytes"])

    return _tamper_between_verification_and_load(run, tamper, restore, "hash_mismatch")


@fault(
    "bundle-symlinked-after-verification",
    "the graph file is swapped for a symlink leaving the bundle after verification",
    bound_s=START_BOUND_S,
    error=StageStartError,
    state="refused",
)
def bundle_symlinked(run: FaultRun) -> Outcome:
    outside = run.tmp_path / "outside"
    outside.mkdir()

    def tamper(graph: Path) -> None:
        graph.rename(outside / graph.name)
        graph.symlink_to(outside / graph.name)

    def restore(graph: Path) -> None:
        graph.unlink()
        (outside / graph.name).rename(graph)

    return _tamper_between_verification_and_load(run, tamper, restore, "symlink_escape")


def _manifest_refused(run: FaultRun, entry: Callable[[Path, Path], str], code: str) -> Outcome:
    manifest = run.bundle_copy()
    outside = run.tmp_path / "outside.bin"
    outside.write_bytes(b"a file outside the bundle")
    document = json.loads(manifest.read_text())
    document["files"][entry(manifest.parent, outside)] = sha256_file(outside)
    manifest.write_text(json.dumps(document, indent=2))
    pipeline = write_pipeline(run.tmp_path / "escape.yaml", StageSpec(manifest))
    ledger = ResourceLedger(name="escape")
    children = child_pids()
    run.inject()
    with pytest.raises(VerificationError) as caught:
        Omni(pipeline, ledger=ledger, **run.options)
    run.recovered()
    assert caught.value.code == code
    assert child_pids() == children
    assert ledger.snapshot().is_empty
    return Outcome(caught.value, "refused", run.serves_add())


@fault(
    "manifest-traversal",
    "the manifest lists '../outside.bin'",
    bound_s=REFUSAL_BOUND_S,
    error=VerificationError,
    state="refused",
)
def manifest_traversal(run: FaultRun) -> Outcome:
    return _manifest_refused(run, lambda bundle, outside: "../" + outside.name, "path_traversal")


@fault(
    "manifest-absolute-path",
    "the manifest lists an absolute path",
    bound_s=REFUSAL_BOUND_S,
    error=VerificationError,
    state="refused",
)
def manifest_absolute(run: FaultRun) -> Outcome:
    return _manifest_refused(run, lambda bundle, outside: str(outside), "absolute_path")


@fault(
    "manifest-symlink-escape",
    "the manifest lists a symlink that leads outside the bundle",
    bound_s=REFUSAL_BOUND_S,
    error=VerificationError,
    state="refused",
)
def manifest_symlink(run: FaultRun) -> Outcome:
    def link(bundle: Path, outside: Path) -> str:
        (bundle / "extra.bin").symlink_to(outside)
        return "extra.bin"

    return _manifest_refused(run, link, "symlink_escape")


# -- placement and admission -------------------------------------------------------------


@fault(
    "missing-provider",
    "the route's execution provider is absent from this ONNX Runtime",
    bound_s=START_BOUND_S,
    error=StageStartError,
    state="refused",
)
def missing_provider(run: FaultRun) -> Outcome:
    pipeline = write_pipeline(
        run.tmp_path / "cuda.yaml",
        StageSpec(run.add_manifest, ep="cuda", allowed=("CUDAExecutionProvider", CPU)),
    )
    # A machine described with a CUDA GPU its WSL reaches passes the device check; the worker
    # has no CUDA.
    described = load_topology(REPO_ROOT / "assets" / "topologies" / "cpu-dgpu-wsl.yaml")
    ledger = ResourceLedger(name="cuda")
    run.inject()
    with pytest.raises(StageStartError) as caught:
        Omni(pipeline, ledger=ledger, topology=described, selection=None)
    run.recovered()
    assert isinstance(caught.value.cause, PlacementRefused)
    assert "CUDAExecutionProvider" in str(caught.value)
    assert ledger.snapshot().is_empty
    return Outcome(caught.value, "refused", run.serves_add())


@fault(
    "overcommitted-plan",
    "a second pipeline asks a shared pool for more memory than is free",
    bound_s=REFUSAL_BOUND_S,
    error=AdmissionRefused,
    state="refused",
)
def overcommitted_plan(run: FaultRun) -> Outcome:
    first = write_pipeline(
        run.tmp_path / "first.yaml",
        StageSpec(run.add_manifest, capacity="1GiB", demand="768MiB"),
        name="first",
    )
    second = write_pipeline(
        run.tmp_path / "second.yaml",
        StageSpec(run.add_manifest, capacity="1GiB", demand="512MiB"),
        name="second",
    )
    # The machine's memory, set small: each pipeline's 1 GiB ceiling is its own.
    ledger = ResourceLedger({"machine:ram": 1 << 30}, name="shared")
    with Omni(first, ledger=ledger, **run.options) as running:
        children = child_pids()
        run.inject()
        with pytest.raises(AdmissionRefused) as caught:
            Omni(second, ledger=ledger, **run.options)
        run.recovered()
        assert caught.value.constraint == "machine:ram"
        assert caught.value.free == 256 << 20
        assert child_pids() == children
        (held,) = ledger.snapshot().reservations
        assert held.owner == "first"
        example = running.example_inputs()
        np.testing.assert_array_equal(running.run()["sum"], example["a"] + example["b"])
    assert ledger.snapshot().is_empty
    return Outcome(caught.value, "refused", True)


# -- acknowledgements and cancellation ---------------------------------------------------


@fault(
    "stale-acknowledgement",
    "duplicate, stale and unknown acknowledgements in both directions and from the API",
    bound_s=START_BOUND_S,
    error=None,
    state="usable",
)
def stale_acknowledgement(run: FaultRun) -> Outcome:
    pipeline = write_pipeline(
        run.tmp_path / "stale.yaml",
        StageSpec(
            run.loop_manifest, worker=str(FAULT_WORKER), max_io="4MiB", env={"FAULT": "stale-acks"}
        ),
    )
    inputs = run.loop_inputs(1)
    expected = loop_reference(inputs["x"], 1)
    with (
        _log_lines("omni.backends.graph", logging.DEBUG) as log,
        Omni(pipeline, **run.options) as omni,
    ):
        (client,) = engine_of(omni).clients
        channel = client._channel
        assert channel is not None
        run.inject()
        # The worker acknowledges every 1 MiB input twice, repeats old ones, invents one.
        for _ in range(3):
            np.testing.assert_allclose(omni.run(inputs)["y"], expected, atol=1e-5)
        # Per call: the duplicate, the unknown owner and (after the first) the previous one.
        wait_until(
            lambda: sum("stale acknowledgement" in line for line in log.lines) >= 8,
            "the controller to ignore the stale acknowledgements",
        )
        # The controller repeats its acknowledgement of the worker's last 1 MiB result.
        owner = f"ort-{client.generation}"
        for message in (AckMessage(owner, 3), AckMessage(owner, 1), AckMessage("nobody", 7)):
            on_loop(engine_of(omni), lambda m=message: channel.send_message(m, owner=client.name))
        # The API: an output released after its request ended, and a stale key.
        first = omni.generate(inputs)
        old = next(first)
        for _ in first:
            pass
        second = omni.generate(inputs)
        current = next(second)
        old.release_stage_buffers()
        stale_key = old.request_id
        assert client.slot is not None
        assert client.slot.request_id == current.request_id
        assert not on_loop(engine_of(omni), lambda: client.acknowledge(RequestKey(stale_key)))
        assert client.slot.request_id == current.request_id
        np.testing.assert_allclose(current.outputs["y"], expected, atol=1e-5)
        second.close()
        np.testing.assert_allclose(omni.run(inputs)["y"], expected, atol=1e-5)
        run.recovered()
        assert client.usable
        assert channel.retained_count == 0
        # The worker frees each result's arena slot once our acknowledgement reaches it: the
        # next results reuse the slots, and no result ever needs a segment of its own.
        arenas = controller_segments()
        assert len(arenas) == 2, arenas
        for _ in range(5):
            np.testing.assert_allclose(omni.run(inputs)["y"], expected, atol=1e-5)
        assert controller_segments() == arenas
    wait_until(lambda: not controller_segments(), "the arenas removed with the pipeline")
    return Outcome(None, "usable", True)


@fault(
    "double-cancel-active",
    "two cancels of one active call, at the same time, then a third after it ended",
    bound_s=CANCEL_BOUND_S,
    error=RequestCancelled,
    state="retired",
)
def double_cancel_active(run: FaultRun) -> Outcome:
    ledger = ResourceLedger(name="double-cancel")
    events = EventBus()
    retired = retired_events(events)
    with Omni(run.loop_pipeline(), ledger=ledger, events=events, **run.options) as omni:
        (client,) = engine_of(omni).clients
        pid = client.pid
        assert pid is not None
        request = engine_of(omni).submit(run.loop_inputs(ENDLESS_STEPS))
        pending = request.stream.next_future()
        wait_busy(pid)
        barrier = threading.Barrier(2)
        answers: list[bool] = []

        def cancel() -> None:
            barrier.wait()
            answers.append(omni.cancel(request.request_id))

        cancellers = [threading.Thread(target=cancel) for _ in range(2)]
        run.inject()
        for thread in cancellers:
            thread.start()
        for thread in cancellers:
            thread.join(10)
        wait_until(lambda: gone_and_settled(pid, ledger), "the cancelled worker to be retired")
        run.recovered()
        error = pending.result(10)
        assert isinstance(error, RequestCancelled)
        assert True in answers
        assert not omni.cancel(request.request_id)
        assert [(event.pid, event.confirmed_gone) for event in retired] == [(pid, True)]
        with pytest.raises(StageRetired):
            omni.run(run.loop_inputs(1))
    return Outcome(error, "retired", run.serves_loop())


@fault(
    "double-cancel-retained",
    "two cancels of a request whose result is delivered but not yet acknowledged",
    bound_s=REFUSAL_BOUND_S,
    error=None,
    state="usable",
)
def double_cancel_retained(run: FaultRun) -> Outcome:
    events = EventBus()
    retired = retired_events(events)
    with Omni(run.add_pipeline, events=events, **run.options) as omni:
        (client,) = engine_of(omni).clients
        pid = client.pid
        generator = omni.generate()
        output = next(generator)
        assert client.slot is not None
        run.inject()
        answers = [omni.cancel(output.request_id), omni.cancel(output.request_id)]
        generator.close()
        example = omni.example_inputs()
        np.testing.assert_array_equal(omni.run()["sum"], example["a"] + example["b"])
        run.recovered()
        assert answers[0]
        # The final output's acknowledgement reaches the loop just after run() returns.
        wait_until(lambda: client.slot is None, "the slot freed by the acknowledgement", 5.0)
        assert client.usable
        assert client.pid == pid
        assert not retired
    return Outcome(None, "usable", True)


@fault(
    "cancel-before-first-output",
    "cancel issued right after submission, before any output exists",
    bound_s=CANCEL_BOUND_S,
    error=RequestCancelled,
    # Usable when the cancel is seen before the call starts; retired when the call had begun.
    state=("usable", "retired"),
)
def cancel_before_first_output(run: FaultRun) -> Outcome:
    ledger = ResourceLedger(name="early-cancel")
    events = EventBus()
    retired = retired_events(events)
    pipeline = run.loop_pipeline()
    with Omni(pipeline, ledger=ledger, events=events, **run.options) as omni:
        (client,) = engine_of(omni).clients
        pid = client.pid
        assert pid is not None
        request = engine_of(omni).submit(run.loop_inputs(ENDLESS_STEPS))
        run.inject()
        assert omni.cancel(request.request_id)
        first = request.stream.next_future().result(10)
        # No output preceded the cancellation, and nothing follows it.
        assert isinstance(first, RequestCancelled), first
        assert request.stream.closed
        if retired:
            wait_until(lambda: gone_and_settled(pid, ledger), "the cancelled worker to be retired")
            run.recovered()
            assert [(event.pid, event.confirmed_gone) for event in retired] == [(pid, True)]
            return Outcome(first, "retired", run.serves_loop())
        inputs = run.loop_inputs(2)
        result = omni.run(inputs)
        run.recovered()
        np.testing.assert_allclose(result["y"], loop_reference(inputs["x"], 2), atol=1e-5)
        assert client.pid == pid
        return Outcome(first, "usable", True)


@fault(
    "cancel-queued-before-first-output",
    "cancel of a queued request before it started, while another request runs",
    bound_s=REFUSAL_BOUND_S,
    error=RequestCancelled,
    state="usable",
)
def cancel_queued(run: FaultRun) -> Outcome:
    pipeline = run.loop_pipeline("queued", max_queued=1)
    inputs = run.loop_inputs(SHORT_STEPS)
    with Omni(pipeline, **run.options) as omni:
        (client,) = engine_of(omni).clients
        pid = client.pid
        running = engine_of(omni).submit(inputs)
        queued = engine_of(omni).submit(inputs)
        run.inject()
        assert omni.cancel(queued.request_id)
        error = queued.stream.next_future().result(10)
        run.recovered()
        assert isinstance(error, RequestCancelled)
        output = running.stream.next_future().result(30)
        output.release_stage_buffers()
        np.testing.assert_allclose(
            output.outputs["y"], loop_reference(inputs["x"], SHORT_STEPS), atol=1e-4
        )
        assert client.pid == pid
        assert client.usable
    return Outcome(error, "usable", run.serves_loop(pipeline))


@fault(
    "cancel-during-handoff",
    "cancel while the handoff between the two MLP stages runs",
    bound_s=transforms.HANDOFF_S + REFUSAL_BOUND_S,
    error=RequestCancelled,
    state="usable",
)
def cancel_during_handoff(run: FaultRun) -> Outcome:
    text = (run.demo_root / "pipelines" / "mlp-chain.yaml").read_text()
    text = text.replace("../bundles/", f"{run.demo_root}/bundles/").replace(
        "runtime.adapters.tensor:mlp_handoff", "tests.reliability.transforms:slow_handoff"
    )
    pipeline = run.tmp_path / "chain.yaml"
    pipeline.write_text(text)
    events = EventBus()
    retired = retired_events(events)
    with Omni(pipeline, events=events, **run.options) as omni:
        expected = omni.run()["y"]
        transforms.HANDOFF_STARTED.clear()
        request = engine_of(omni).submit()
        assert transforms.HANDOFF_STARTED.wait(10)
        run.inject()
        assert omni.cancel(request.request_id)
        error = request.stream.next_future().result(10)
        run.recovered()
        assert isinstance(error, RequestCancelled), error
        # No stage call was running, so no worker was retired.
        assert not retired
        assert all(client.usable for client in engine_of(omni).clients)
        np.testing.assert_array_equal(omni.run()["y"], expected)
    return Outcome(error, "usable", True)


# -- shutdown ----------------------------------------------------------------------------


@fault(
    "shutdown-during-call",
    "the pipeline is closed while a call computes",
    bound_s=CANCEL_BOUND_S,
    error=RequestCancelled,
    state="closed",
)
def shutdown_during_call(run: FaultRun) -> Outcome:
    ledger = ResourceLedger(name="shutdown")
    omni = Omni(run.loop_pipeline(), ledger=ledger, **run.options)
    try:
        (client,) = engine_of(omni).clients
        pid = client.pid
        assert pid is not None
        request = engine_of(omni).submit(run.loop_inputs(ENDLESS_STEPS))
        pending = request.stream.next_future()
        wait_busy(pid)
        run.inject()
    finally:
        omni.close()
    run.recovered()
    error = pending.result(1)
    assert isinstance(error, RequestCancelled)
    assert "closed" in str(error)
    assert process_gone(pid)
    assert ledger.snapshot().is_empty
    return Outcome(error, "closed", run.serves_loop())


@fault(
    "shutdown-during-hung-call",
    "the pipeline is closed while its worker hangs in a call",
    bound_s=CANCEL_BOUND_S,
    error=RequestCancelled,
    state="closed",
)
def shutdown_during_hung_call(run: FaultRun) -> Outcome:
    pipeline = run.worker_pipeline("stubborn", MISBEHAVING_WORKER, MISBEHAVE="stubborn")
    ledger = ResourceLedger(name="stubborn-close")
    omni = Omni(pipeline, ledger=ledger, **run.options)
    try:
        (client,) = engine_of(omni).clients
        pid = client.pid
        assert pid is not None
        request = engine_of(omni).submit()
        pending = request.stream.next_future()
        wait_until(lambda: _ignores_sigterm(pid), "the worker to hang in its call")
        run.inject()
    finally:
        omni.close()
    run.recovered()
    error = pending.result(1)
    assert isinstance(error, RequestCancelled)
    assert process_gone(pid)
    assert ledger.snapshot().is_empty
    return Outcome(error, "closed", run.serves_add())


@fault(
    "controller-killed-during-call",
    "the controller process is SIGKILLed while its worker computes",
    bound_s=RETIRE_BOUND_S,
    error=None,
    state="closed",
)
def controller_killed(run: FaultRun) -> Outcome:
    pipeline = run.loop_pipeline("orphaned")
    inputs = run.loop_manifest.parent / "inputs.npz"
    # The controller's own temporary folder: its worker's private folder is made inside it.
    controller_tmp = run.tmp_path / "controller-tmp"
    controller_tmp.mkdir()
    # As a subreaper this process adopts the orphaned worker, so it can watch and reap it.
    set_child_subreaper(True)
    try:
        with (run.tmp_path / "controller.log").open("wb") as log:
            child = subprocess.Popen(
                [sys.executable, str(CONTROLLER_CHILD), str(pipeline), str(inputs)],
                stdout=subprocess.PIPE,
                stderr=log,
                cwd=REPO_ROOT,
                env={**os.environ, "TMPDIR": str(controller_tmp)},
            )
            try:
                assert child.stdout is not None
                report = json.loads(child.stdout.readline() or "{}")
            finally:
                run.inject()
                child.kill()
                child.wait(10)
                if child.stdout is not None:
                    child.stdout.close()
        assert "worker_pid" in report, (run.tmp_path / "controller.log").read_text()
        worker = int(report["worker_pid"])

        def worker_gone() -> bool:
            try:
                os.waitpid(worker, os.WNOHANG)
            except ChildProcessError:
                pass
            return process_gone(worker)

        wait_until(worker_gone, "the orphaned worker to exit", RETIRE_BOUND_S + 5)
        run.recovered()
    finally:
        set_child_subreaper(False)
    # The worker released its own segments; the controller's inputs were already released.
    assert not shm_entries(f"oe-{report['controller_pid']}-")
    # The worker removed its private folder. ONNX Runtime's session file (.ses), written when
    # the controller imported it, is the library's own and is reused by every later import.
    assert set(temp_files(controller_tmp)) <= {".ses"}, temp_files(controller_tmp)
    return Outcome(None, "closed", run.serves_loop())


# -- shared memory and audio -------------------------------------------------------------


@fault(
    "shm-limit-exceeded",
    "a call's 1 MiB input would exceed the process's 64 MiB shared-memory limit",
    bound_s=REFUSAL_BOUND_S,
    error=ShmLimitExceeded,
    state="usable",
)
def shm_limit_exceeded(run: FaultRun) -> Outcome:
    inputs = run.loop_inputs(1)
    expected = loop_reference(inputs["x"], 1)
    with Omni(run.loop_pipeline(), **run.options) as omni:
        (client,) = engine_of(omni).clients
        hog = ShmProducer("hog", new_prefix(os.getpid(), 0))
        try:
            hog.put(bytes(DEFAULT_MAX_BYTES - (512 << 10)))
            run.inject()
            with pytest.raises(ShmLimitExceeded) as caught:
                omni.run(inputs)
        finally:
            hog.close()
        np.testing.assert_allclose(omni.run(inputs)["y"], expected, atol=1e-5)
        run.recovered()
        assert caught.value.limit == "bytes"
        assert client.usable
        # run() returns once its copy is taken; the loop frees the slot right after.
        wait_until(lambda: client.slot is None, "the acknowledged slot to be freed", 2.0)
    return Outcome(caught.value, "usable", True)


FAILING_ASOUNDRC = """\
pcm.!default { type null }
pcm.omni_full { type file slave.pcm null file "/dev/full" format "raw" }
"""


@contextmanager
def _alsa_devices(root: Path) -> Iterator[None]:
    """ALSA's default PCM is a null device; ``omni_full`` fails once its first write lands."""
    config = root / "xdg"
    (config / "alsa").mkdir(parents=True)
    (config / "alsa" / "asoundrc").write_text(FAILING_ASOUNDRC)
    home = root / "home"
    home.mkdir()
    values = {
        "XDG_CONFIG_HOME": str(config),
        "HOME": str(home),
        "JACK_DEFAULT_SERVER": f"omni-absent-{os.getpid()}",
    }
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        rescan_output_devices()
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        rescan_output_devices()


def _tone(seconds: float, rate: int = 22050) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)


@fault(
    "audio-device-fails-mid-stream",
    "the output device fails (its writes hit /dev/full) while a stream plays",
    bound_s=REFUSAL_BOUND_S,
    error=AudioDeviceError,
    state="usable",
)
def audio_device_fails(run: FaultRun) -> Outcome:
    with _alsa_devices(run.tmp_path / "alsa"):
        player = AudioPlayer("omni_full", sample_rate_in=22050)
        player.start()
        run.inject()

        def feed_until_the_device_fails() -> None:
            for _ in range(200):
                player.feed(_tone(0.2))
                time.sleep(0.01)

        with pytest.raises(AudioDeviceError, match="ended unexpectedly") as caught:
            feed_until_the_device_fails()
        assert player.wait(2.0)
        run.recovered()
        assert player.state is PlayerState.FAILED
        assert open_stream_count() == 0
        healthy = AudioPlayer(sample_rate_in=22050)
        healthy.start()
        healthy.feed(_tone(0.3))
        healthy.end_of_stream()
        assert healthy.wait(5.0)
        assert healthy.state is PlayerState.FINISHED
        assert open_stream_count() == 0
    return Outcome(caught.value, "usable", True)


# -- the matrix --------------------------------------------------------------------------


@pytest.fixture
def fault_run(
    tmp_path: Path,
    private_tmpdir: Path,
    demo_root: Path,
    loop_manifest: Path,
    options: dict[str, Any],
) -> FaultRun:
    return FaultRun(tmp_path, private_tmpdir, demo_root, loop_manifest, options)


@pytest.mark.parametrize("case", list(FAULTS.values()), ids=lambda case: case.id)
def test_fault(case: Fault, fault_run: FaultRun) -> None:
    census = Census.take(fault_run.tmpdir)
    entry = record(
        "fault",
        fault=case.id,
        description=case.description,
        passed=False,
        expected_error=None if case.expected_error is None else case.expected_error.__name__,
        error_type=None,
        error=None,
        bound_s=case.bound_s,
        recovery_s=None,
        state=None,
        usable_after=False,
        leaks=None,
    )
    try:
        outcome = case.scenario(fault_run)
        leaks = census.leaks()
    except BaseException as exc:
        entry["failure"] = f"{type(exc).__name__}: {exc}"[:500]
        entry["leaks"] = census.leaks(grace_s=0.5).counts()
        raise
    recovery = fault_run.recovery_s
    entry.update(
        error_type=None if outcome.error is None else type(outcome.error).__name__,
        error=None if outcome.error is None else str(outcome.error)[:300],
        recovery_s=None if recovery is None else round(recovery, 4),
        state=outcome.state,
        usable_after=outcome.usable_after,
        leaks=leaks.counts(),
    )
    assert recovery is not None, "the scenario did not mark injection and recovery"
    print(
        f"{case.id}: {entry['error_type']} recovered in {recovery:.3f} s (bound {case.bound_s} s)"
    )
    if case.expected_error is None:
        assert outcome.error is None, outcome.error
    else:
        assert isinstance(outcome.error, case.expected_error), outcome.error
    assert outcome.state in case.states
    assert recovery <= case.bound_s, f"recovery took {recovery:.3f} s; bound {case.bound_s} s"
    assert outcome.usable_after
    assert not leaks.total, f"left behind: {leaks.describe()}"
    entry["passed"] = True
