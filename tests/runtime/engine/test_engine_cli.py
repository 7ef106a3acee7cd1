"""``omni-edge run`` as a user runs it: a real subprocess, real workers, real exit codes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import numpy as np
import psutil

from tests.runtime.engine.support import (
    CPU,
    ENDLESS_STEPS,
    StageSpec,
    process_gone,
    shm_entries,
    wait_busy,
    wait_until,
    write_pipeline,
)

if TYPE_CHECKING:
    from pathlib import Path

CLI_TIMEOUT_S = 120.0


def _command(*args: str) -> list[str]:
    """The installed ``omni-edge`` script when there is one, else the same entry point by module."""
    script = os.path.join(os.path.dirname(sys.executable), "omni-edge")
    if os.path.isfile(script):
        return [script, *args]
    return [sys.executable, "-m", "runtime.cli", *args]


def _environment(tmp_path: Path) -> dict[str, str]:
    # The user's saved device selection must not decide the outcome.
    return dict(os.environ, OMNI_EDGE_CONFIG_DIR=str(tmp_path / "config"))


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _command(*args),
        capture_output=True,
        text=True,
        env=_environment(tmp_path),
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def test_run_writes_the_exact_sum_and_a_cpu_only_plan(demo_root: Path, tmp_path: Path) -> None:
    with np.load(demo_root / "bundles" / "add" / "inputs.npz") as archive:
        expected = archive["a"] + archive["b"]
    reference = tmp_path / "reference.npz"
    np.savez(reference, sum=expected)
    out = tmp_path / "out"
    result = _run(
        tmp_path,
        "run",
        str(demo_root / "pipelines" / "add.yaml"),
        "--out",
        str(out),
        "--expect",
        str(reference),
        "--atol",
        "0",
        "--rtol",
        "0",
    )
    assert result.returncode == 0, result.stderr
    assert "matches --expect" in result.stdout
    with np.load(out / "outputs.npz") as archive:
        np.testing.assert_array_equal(archive["sum"], expected)
    plan = json.loads((out / "execution_plan.json").read_text())
    (stage,) = plan["stages"]
    assert stage["placement"]["counts"] == {CPU: stage["placement"]["total_nodes"]}
    assert stage["placement"]["fraction_on_target"] == 1.0
    assert stage["route"]["allowed_providers"] == [CPU]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["stages"]["stage-0"]["calls"] == 1
    assert process_gone(stage["worker"]["pid"])


def test_an_expect_mismatch_exits_4(demo_root: Path, tmp_path: Path) -> None:
    with np.load(demo_root / "bundles" / "add" / "inputs.npz") as archive:
        wrong = archive["a"] + archive["b"] + np.float32(1.0)
    reference = tmp_path / "wrong.npz"
    np.savez(reference, sum=wrong)
    result = _run(
        tmp_path, "run", str(demo_root / "pipelines" / "add.yaml"), "--expect", str(reference)
    )
    assert result.returncode == 4, result.stderr
    assert "MISMATCH with --expect" in result.stdout
    assert "sum: max abs error 1" in result.stdout


def test_inputs_in_an_archive_zipfile_cannot_read_exit_2_naming_the_file(
    demo_root: Path, tmp_path: Path
) -> None:
    """An encrypted entry (zipfile raises RuntimeError, not BadZipFile) is a usage error."""
    inputs = tmp_path / "locked.npz"
    np.savez(inputs, a=np.zeros((1, 1024), np.float32), b=np.zeros((1, 1024), np.float32))
    data = bytearray(inputs.read_bytes())
    for signature, flag_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        start = data.index(signature)
        data[start + flag_at] |= 0x1  # "encrypted"
    inputs.write_bytes(bytes(data))
    result = _run(
        tmp_path, "run", str(demo_root / "pipelines" / "add.yaml"), "--inputs", str(inputs)
    )
    assert result.returncode == 2, result.stderr
    assert f"--inputs {inputs}: not a readable .npz" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_tampered_bundle_exits_3_before_any_worker(demo_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "tampered"
    shutil.copytree(demo_root / "bundles", root / "bundles")
    shutil.copytree(demo_root / "pipelines", root / "pipelines")
    graph = root / "bundles" / "add" / "add.onnx"
    data = bytearray(graph.read_bytes())
    data[-1] ^= 0xFF
    graph.write_bytes(bytes(data))
    result = _run(tmp_path, "run", str(root / "pipelines" / "add.yaml"))
    assert result.returncode == 3, result.stderr
    assert "add.onnx" in result.stderr


def test_ctrl_c_during_a_long_call_exits_130_and_leaves_nothing(
    loop_manifest: Path, tmp_path: Path
) -> None:
    pipeline = write_pipeline(tmp_path / "loop.yaml", StageSpec(loop_manifest, max_io="4MiB"))
    with np.load(loop_manifest.parent / "inputs.npz") as archive:
        x = archive["x"]
    inputs = tmp_path / "endless.npz"
    np.savez(inputs, x=x, n=np.array(ENDLESS_STEPS, np.int64))
    cli = subprocess.Popen(
        _command("run", str(pipeline), "--inputs", str(inputs)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_environment(tmp_path),
    )
    try:
        parent = psutil.Process(cli.pid)
        worker = wait_until(lambda: parent.children(), "the CLI to start its worker", 60.0)[0]
        # Past loading (under a second here), the only work left is the endless call.
        wait_until(lambda: time.time() - worker.create_time() > 2.0, "the worker to load", 30.0)
        wait_busy(worker.pid)
        cli.send_signal(signal.SIGINT)
        _, stderr = cli.communicate(timeout=30)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.communicate()
    assert cli.returncode == 130, stderr
    assert "interrupted" in stderr
    assert "Traceback" not in stderr
    assert process_gone(worker.pid)
    assert not shm_entries(f"oe-{cli.pid}-")
