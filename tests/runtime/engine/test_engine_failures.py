"""Failures: protocol garbage, placement refusals, overcommit, and a worker killed mid-call.

Each must surface as a typed error and leave nothing behind: no process, no shared
memory, no reservation.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort
import pytest

from runtime.api import Omni
from runtime.backends.graph import GraphTimeouts
from runtime.backends.placement import BELOW_MIN_FRACTION, OUTSIDE_ALLOWED, PlacementViolation
from runtime.devices import load_topology
from runtime.engine.stage_runtime import StageStartError
from runtime.errors import (
    AdmissionRefused,
    ConfigError,
    DeviceExcluded,
    ExecutionError,
    ModelError,
    PlacementRefused,
    StageRetired,
    WorkerDied,
)
from runtime.events import Event, EventBus, StageStarting
from runtime.ledger import ResourceLedger
from runtime.transport.channel import ProtocolError
from tests.helpers.engine import engine_of
from tests.runtime.engine.support import (
    CPU,
    ENDLESS_STEPS,
    MISBEHAVING_WORKER,
    PLACEMENT_WORKER,
    StageSpec,
    child_pids,
    controller_segments,
    process_gone,
    wait_busy,
    wait_until,
    write_pipeline,
)

if TYPE_CHECKING:
    from pathlib import Path

REPO_ROOT = MISBEHAVING_WORKER.parents[3]
AZURE = "AzureExecutionProvider"


def _assert_nothing_left(ledger: ResourceLedger) -> None:
    assert not child_pids()
    assert not controller_segments()
    assert ledger.snapshot().is_empty


def _add_manifest(demo_root: Path) -> Path:
    return demo_root / "bundles" / "add" / "manifest.json"


def test_garbage_instead_of_hello_fails_the_start_and_unwinds(
    demo_root: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    pipeline = write_pipeline(
        tmp_path / "garbage.yaml",
        StageSpec(
            _add_manifest(demo_root),
            worker=str(MISBEHAVING_WORKER),
            env={"MISBEHAVE": "garbage-hello"},
        ),
    )
    ledger = ResourceLedger(name="garbage-hello")
    # A long goodbye deadline: the unwinding must not wait for a bye nobody can read.
    timeouts = GraphTimeouts(shutdown_s=30.0)
    started = time.monotonic()
    with pytest.raises(StageStartError) as caught:
        Omni(pipeline, ledger=ledger, timeouts=timeouts, **options)
    elapsed = time.monotonic() - started
    cause = caught.value.cause
    assert isinstance(cause, ProtocolError)
    assert isinstance(cause, ExecutionError)
    assert cause.code == "bad_magic"
    assert caught.value.stage == "stage-0"
    assert caught.value.exit_code == cause.exit_code
    _assert_nothing_left(ledger)
    assert elapsed < 10.0, elapsed


@pytest.mark.parametrize(
    ("mode", "code"), [("garbage-result", "bad_magic"), ("wrong-epoch", "wrong_epoch")]
)
def test_garbage_after_ready_fails_the_call_and_retires_the_worker(
    demo_root: Path, tmp_path: Path, options: dict[str, Any], mode: str, code: str
) -> None:
    pipeline = write_pipeline(
        tmp_path / "garbage.yaml",
        StageSpec(
            _add_manifest(demo_root), worker=str(MISBEHAVING_WORKER), env={"MISBEHAVE": mode}
        ),
    )
    ledger = ResourceLedger(name=f"garbage-{mode}")
    with Omni(pipeline, ledger=ledger, **options) as omni:
        (client,) = engine_of(omni).clients
        pid = client.pid
        assert pid is not None
        # The worker loaded the bundle with the real worker code, so the stage started normally.
        assert omni.execution_plan.stages[0].placement.fraction_on_target == 1.0
        request = engine_of(omni).submit()
        error = request.stream.next_future().result(15)
        assert isinstance(error, ProtocolError), error
        assert error.code == code
        assert "stage-0" in str(error)
        assert not client.usable
        wait_until(lambda: process_gone(pid), "the garbage worker to be retired")
        wait_until(lambda: ledger.snapshot().is_empty, "the stage's reservation to be released")
        assert not controller_segments()
        with pytest.raises(StageRetired, match=code):
            omni.run()
    _assert_nothing_left(ledger)


def test_inputs_outside_the_bucket_fail_as_model_errors_and_the_worker_serves_on(
    demo_root: Path, options: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    rng = np.random.default_rng(3)
    good = {name: rng.standard_normal((1, 1024)).astype(np.float32) for name in ("a", "b")}
    cases: list[tuple[dict[str, np.ndarray], str]] = [
        # Refused by the worker against its fixed bucket.
        ({**good, "a": np.zeros((1, 1000), np.float32)}, r"shape \[1, 1000\]"),
        ({**good, "b": np.zeros((1, 1024), np.float64)}, "dtype float64"),
        # Refused by the controller: no such dtype crosses a process boundary.
        ({**good, "a": np.zeros((1, 1024), np.complex64)}, "complex64 cannot cross"),
    ]
    with Omni(demo_root / "pipelines" / "add.yaml", **options) as omni:
        (client,) = engine_of(omni).clients
        pid = client.pid
        for inputs, match in cases:
            with pytest.raises(ModelError, match=match) as caught:
                omni.run(inputs)
            assert "stage-0: bad_input" in str(caught.value)
            assert client.slot is None
            assert client.usable
        np.testing.assert_array_equal(omni.run(good)["sum"], good["a"] + good["b"])
        assert client.pid == pid
    # No call was left waiting for an answer that could never come.
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


def test_a_cpu_route_that_does_not_allow_the_cpu_provider_is_a_config_error(
    demo_root: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    pipeline = write_pipeline(
        tmp_path / "no-cpu.yaml",
        StageSpec(_add_manifest(demo_root), allowed=("CUDAExecutionProvider",)),
    )
    children = child_pids()
    with pytest.raises(ConfigError) as caught:
        Omni(pipeline, **options)
    assert caught.value.file == str(pipeline)
    assert caught.value.key == "stages[0].backend.route.allowed_providers"
    assert "CPUExecutionProvider" in caught.value.detail
    assert child_pids() == children


def test_an_absent_provider_is_refused_naming_the_available_ones(
    demo_root: Path, tmp_path: Path
) -> None:
    pipeline = write_pipeline(
        tmp_path / "cuda.yaml",
        StageSpec(_add_manifest(demo_root), ep="cuda", allowed=("CUDAExecutionProvider", CPU)),
    )
    # A machine described with a CUDA GPU that its WSL reaches gets past the device check;
    # the worker then finds that this ONNX Runtime build has no CUDA provider.
    described = load_topology(REPO_ROOT / "assets" / "topologies" / "cpu-dgpu-wsl.yaml")
    ledger = ResourceLedger(name="cuda")
    with pytest.raises(StageStartError) as caught:
        Omni(pipeline, ledger=ledger, topology=described, selection=None)
    cause = caught.value.cause
    assert isinstance(cause, PlacementRefused)
    assert caught.value.exit_code == 3
    assert "CUDAExecutionProvider" in str(cause)
    assert f"available: {', '.join(ort.get_available_providers())}" in str(cause)
    _assert_nothing_left(ledger)


def test_a_route_to_a_device_this_machine_lacks_is_refused_before_any_process(
    demo_root: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    pipeline = write_pipeline(
        tmp_path / "cuda.yaml",
        StageSpec(_add_manifest(demo_root), ep="cuda", allowed=("CUDAExecutionProvider", CPU)),
    )
    events = EventBus()
    seen: list[Event] = []
    events.subscribe(seen.append)
    ledger = ResourceLedger(name="no-gpu")
    with pytest.raises(DeviceExcluded, match="CUDAExecutionProvider"):
        Omni(pipeline, ledger=ledger, events=events, **options)
    assert not [event for event in seen if isinstance(event, StageStarting)]
    _assert_nothing_left(ledger)


@pytest.mark.parametrize(
    ("allowed", "reason"),
    [((CPU, AZURE), BELOW_MIN_FRACTION), ((CPU,), OUTSIDE_ALLOWED)],
)
def test_the_placement_gate_refuses_a_split_the_route_does_not_allow(
    demo_root: Path, tmp_path: Path, options: dict[str, Any], allowed: tuple[str, ...], reason: str
) -> None:
    manifest = demo_root / "bundles" / "mlp-stage0" / "manifest.json"
    pipeline = write_pipeline(
        tmp_path / "split.yaml",
        StageSpec(
            manifest,
            worker=str(PLACEMENT_WORKER),
            allowed=allowed,
            env={"PLACEMENT_MOVE_TO": AZURE},
        ),
    )
    ledger = ResourceLedger(name="split")
    with pytest.raises(StageStartError) as caught:
        Omni(pipeline, ledger=ledger, **options)
    cause = caught.value.cause
    assert isinstance(cause, PlacementViolation)
    assert cause.reason == reason
    assert cause.report is not None
    assert cause.report.counts[AZURE] == 1
    assert f"{AZURE} 1/{cause.report.total_nodes}" in str(cause)
    assert caught.value.exit_code == 3
    _assert_nothing_left(ledger)


def test_the_placement_gate_admits_a_split_above_the_minimum(
    demo_root: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    manifest = demo_root / "bundles" / "mlp-stage0" / "manifest.json"
    pipeline = write_pipeline(
        tmp_path / "split.yaml",
        StageSpec(
            manifest,
            worker=str(PLACEMENT_WORKER),
            allowed=(CPU, AZURE),
            min_fraction=0.5,
            env={"PLACEMENT_MOVE_TO": AZURE},
        ),
    )
    with Omni(pipeline, **options) as omni:
        placement = omni.execution_plan.stages[0].placement
        assert placement.counts == {CPU: placement.total_nodes - 1, AZURE: 1}
        assert placement.fraction_on_target >= 0.5
        assert omni.run()["h"].shape == (1, 512)


def test_shared_pool_overcommit_is_refused_before_any_process_starts(
    demo_root: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    manifest = _add_manifest(demo_root)
    first = write_pipeline(
        tmp_path / "first.yaml", StageSpec(manifest, capacity="1GiB", demand="768MiB"), name="first"
    )
    second = write_pipeline(
        tmp_path / "second.yaml",
        StageSpec(manifest, capacity="1GiB", demand="512MiB"),
        name="second",
    )
    # The machine's memory, set small: each pipeline's 1 GiB ceiling is its own.
    ledger = ResourceLedger({"machine:ram": 1 << 30}, name="shared")
    events = EventBus()
    seen: list[Event] = []
    events.subscribe(seen.append)
    with Omni(first, ledger=ledger, **options) as running:
        children = child_pids()
        with pytest.raises(AdmissionRefused) as caught:
            Omni(second, ledger=ledger, events=events, **options)
        refusal = caught.value
        assert refusal.constraint == "machine:ram"
        assert refusal.needed == 512 << 20
        assert refusal.free == 256 << 20
        assert refusal.stages == ("stage-0",)
        assert "machine:ram" in str(refusal)
        assert str(refusal).endswith("; held by first (768.0 MiB)")
        assert refusal.holders == (("first", 768 << 20),)
        assert refusal.exit_code == 3
        assert child_pids() == children
        assert not [event for event in seen if isinstance(event, StageStarting)]
        (held,) = ledger.snapshot().reservations
        assert held.owner == "first"
        assert running.run()["sum"].shape == (1, 1024)
    assert ledger.snapshot().is_empty


def test_a_worker_killed_mid_call_is_reported_and_cleaned_up(
    loop_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    pipeline = write_pipeline(tmp_path / "loop.yaml", StageSpec(loop_manifest, max_io="4MiB"))
    with np.load(loop_manifest.parent / "inputs.npz", allow_pickle=False) as archive:
        x = archive["x"]
    ledger = ResourceLedger(name="killed")
    with Omni(pipeline, ledger=ledger, **options) as omni:
        (client,) = engine_of(omni).clients
        pid = client.pid
        assert pid is not None
        request = engine_of(omni).submit({"x": x, "n": np.array(ENDLESS_STEPS, np.int64)})
        pending = request.stream.next_future()
        wait_busy(pid)

        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        error = pending.result(10)
        detected_s = time.monotonic() - killed_at
        print(f"SIGKILL to WorkerDied: {detected_s:.3f} s")
        assert isinstance(error, WorkerDied)
        assert "stage-0" in str(error)
        assert f"pid {pid}" in str(error)
        assert f"exit code {-signal.SIGKILL}" in str(error)

        wait_until(lambda: ledger.snapshot().is_empty, "the dead stage's reservation to be settled")
        assert process_gone(pid), "the killed worker is still a zombie"
        assert not controller_segments()
        assert not client.usable
        with pytest.raises(StageRetired, match=f"worker pid {pid}"):
            omni.run({"x": x, "n": np.array(1, np.int64)})
    _assert_nothing_left(ledger)
