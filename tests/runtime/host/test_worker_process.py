"""Worker processes: real children spawned, drained and retired within their deadlines."""

from __future__ import annotations

import gc
import json
import logging
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import psutil
import pytest

from runtime.errors import ExecutionError
from runtime.host.identity import ProcessIdentity
from runtime.host.launch import LaunchSpec, worker_environment
from runtime.host.process import (
    STDERR_TAIL_LINES,
    RetireOutcome,
    WorkerProcess,
    WorkerStartError,
    retire_tree,
    set_child_subreaper,
    spawn_worker,
)
from runtime.host.wslpaths import is_wsl

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uses POSIX signals")

PROJECT_ROOT = Path(__file__).resolve().parents[3]
# Slack for process start-up and scheduling on a loaded machine, on top of a stated deadline.
SLACK_S = 1.0

IGNORE_TERM = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"


@pytest.fixture
def subreaper() -> Iterator[None]:
    """Adopt orphaned grandchildren here, so they are reaped even where init does not reap."""
    assert set_child_subreaper(True)
    yield
    set_child_subreaper(False)


def _spawn(code: str, name: str = "test", extra: dict[str, str] | None = None) -> WorkerProcess:
    env = worker_environment(extra or {}, generation=1, project_root=PROJECT_ROOT)
    spec = LaunchSpec(argv=(sys.executable, "-c", code), env=env, cwd=None, os_domain="posix")
    return spawn_worker(spec, name)


def _read_line(stream: IO[bytes], timeout_s: float = 10.0) -> str:
    """One line from a raw pipe, failing the test instead of hanging."""
    data = b""
    until = time.monotonic() + timeout_s
    while not data.endswith(b"\n"):
        remaining = until - time.monotonic()
        assert remaining > 0, f"no line within {timeout_s} s (got {data!r})"
        ready, _, _ = select.select([stream], [], [], remaining)
        if ready:
            byte = stream.read(1)
            assert byte, f"stream closed before a full line (got {data!r})"
            data += byte
    return data.decode().strip()


def _gone(pid: int) -> bool:
    return not psutil.pid_exists(pid)


def _wait_until(predicate: object, timeout_s: float = 5.0) -> bool:
    assert callable(predicate)
    until = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > until:
            return False
        time.sleep(0.01)
    return True


# ----------------------------------------------------------------------------- spawning


def test_spawned_worker_sees_only_its_explicit_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNI_EDGE_NOT_FOR_WORKERS", "secret")
    code = "import json, os, sys; json.dump(dict(os.environ), sys.stdout); sys.stdout.flush()"
    with _spawn(code, extra={"ROUTE_ONLY": "1"}) as worker:
        seen = json.loads(worker.stdout.read())
        assert worker.wait_exit(10) == 0
    assert "OMNI_EDGE_NOT_FOR_WORKERS" not in seen
    assert seen["ROUTE_ONLY"] == "1"
    assert seen["OMNI_EDGE_WORKER_GENERATION"] == "1"
    assert seen["PYTHONPATH"] == str(PROJECT_ROOT)


def test_identity_is_taken_at_spawn_and_child_has_its_own_session() -> None:
    with _spawn("import sys; sys.stdin.read()") as worker:
        assert worker.identity == ProcessIdentity.of(worker.pid)
        assert worker.identity.matches()
        assert os.getsid(worker.pid) == worker.pid
        assert os.getpgid(worker.pid) == worker.pid
        assert worker.poll() is None
        assert worker.returncode is None
    assert not worker.identity.matches()


def test_stdin_and_stdout_are_raw_pipes() -> None:
    code = "import sys\nfor line in sys.stdin:\n    print(line.strip().upper(), flush=True)\n"
    with _spawn(code) as worker:
        worker.stdin.write(b"ping\n")
        assert _read_line(worker.stdout) == "PING"
        outcome = worker.retire(5.0)
    assert outcome.graceful


def test_stderr_lines_reach_the_logger_and_the_tail(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="omni.worker.talker")
    total = STDERR_TAIL_LINES + 50
    code = (
        "import sys\n"
        f"for i in range({total}):\n"
        "    sys.stderr.write(f'line {i}\\n')\n"
        "sys.stderr.write('no newline at the end')\n"
        "sys.stdin.read()\n"
    )
    with _spawn(code, name="talker") as worker:
        assert _wait_until(lambda: worker.stderr_tail()[-1:] == (f"line {total - 1}",))
        worker.retire(5.0)
        tail = worker.stderr_tail()
    # A last line without a newline is delivered when the stream ends.
    assert tail[-1] == "no newline at the end"
    assert len(tail) == STDERR_TAIL_LINES
    assert tail[0] == f"line {total - STDERR_TAIL_LINES + 1}"
    assert tail[-2] == f"line {total - 1}"
    logged = [r.getMessage() for r in caplog.records if r.name == "omni.worker.talker"]
    assert logged[0] == "line 0"
    assert len(logged) == total + 1


def test_a_crash_message_is_kept_for_the_user() -> None:
    with _spawn("raise RuntimeError('model file is corrupt')") as worker:
        assert worker.wait_exit(10) == 1
        outcome = worker.retire(5.0)
    assert outcome.confirmed_gone
    assert any("RuntimeError: model file is corrupt" in line for line in worker.stderr_tail())


def test_an_exited_worker_is_not_reaped_before_retirement() -> None:
    with _spawn("import sys; sys.exit(3)") as worker:
        assert worker.wait_exit(10) == 3
        # Still our zombie: its pid cannot be reused while the owner has not retired it.
        assert psutil.Process(worker.pid).status() == psutil.STATUS_ZOMBIE
        assert worker.poll() == 3
        outcome = worker.retire(5.0)
    assert outcome.confirmed_gone
    assert outcome.verified
    assert outcome.graceful
    assert _gone(worker.pid)


@pytest.mark.parametrize(
    ("argv0", "reason"),
    [
        ("/nonexistent/bin/python", "No such file or directory"),
        ("no-such-interpreter-on-path", "No such file or directory"),
    ],
)
def test_spawn_failure_names_the_program_and_the_os_error(argv0: str, reason: str) -> None:
    spec = LaunchSpec(
        argv=(argv0, "-c", "pass"), env={"PATH": "/usr/bin"}, cwd=None, os_domain="posix"
    )
    with pytest.raises(WorkerStartError) as caught:
        spawn_worker(spec, "broken")
    assert isinstance(caught.value, ExecutionError)
    assert caught.value.argv0 == argv0
    assert argv0 in str(caught.value)
    assert reason in str(caught.value)
    assert "'broken'" in str(caught.value)
    assert isinstance(caught.value.os_error, OSError)


def test_spawn_failure_of_a_file_that_is_not_executable(tmp_path: Path) -> None:
    program = tmp_path / "python"
    program.write_text("", encoding="utf-8")
    program.chmod(0o644)
    spec = LaunchSpec(argv=(str(program),), env={}, cwd=None, os_domain="posix")
    with pytest.raises(WorkerStartError, match="Permission denied") as caught:
        spawn_worker(spec, "noexec")
    assert str(program) in str(caught.value)


def test_spawn_failure_in_a_missing_working_directory(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    spec = LaunchSpec(
        argv=(sys.executable, "-c", "pass"), env={}, cwd=str(missing), os_domain="posix"
    )
    with pytest.raises(WorkerStartError, match=f"cwd {missing}"):
        spawn_worker(spec, "nocwd")


@pytest.mark.skipif(is_wsl(), reason="WSL can run Windows-domain workers")
def test_a_windows_domain_worker_cannot_start_on_plain_linux() -> None:
    spec = LaunchSpec(argv=("/mnt/c/Python311/python.exe",), env={}, cwd=None, os_domain="windows")
    with pytest.raises(WorkerStartError, match="runs in the Windows domain") as caught:
        spawn_worker(spec, "win")
    assert caught.value.argv0 == "/mnt/c/Python311/python.exe"


@pytest.mark.parametrize("name", ["", "a b", "../x", "-x"])
def test_worker_names_are_checked(name: str) -> None:
    spec = LaunchSpec(argv=(sys.executable, "-c", "pass"), env={}, cwd=None, os_domain="posix")
    with pytest.raises(ValueError, match="worker name"):
        spawn_worker(spec, name)


# --------------------------------------------------------------------------- retirement


def test_a_cooperative_worker_exits_on_the_stdin_sentinel() -> None:
    worker = _spawn("import sys; sys.stdin.read(); sys.exit(0)")
    outcome = worker.retire(5.0)
    assert outcome.graceful
    assert outcome.confirmed_gone
    assert outcome.verified
    assert outcome.terminated == ()
    assert outcome.killed == ()
    assert outcome.survivors == ()
    assert outcome.quarantine_reason is None
    assert outcome.elapsed_s < 5.0
    assert worker.returncode == 0
    assert _gone(worker.pid)


def test_a_worker_ignoring_sigterm_is_killed_within_the_deadline() -> None:
    deadline = 1.5
    code = IGNORE_TERM + "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"
    worker = _spawn(code)
    assert _read_line(worker.stdout) == "ready"
    started = time.monotonic()
    outcome = worker.retire(deadline)
    took = time.monotonic() - started
    assert took < deadline + SLACK_S
    assert not outcome.graceful
    assert outcome.terminated == (worker.pid,)
    assert outcome.killed == (worker.pid,)
    assert outcome.confirmed_gone
    assert outcome.quarantine_reason is None
    assert worker.returncode == -9
    assert _gone(worker.pid)


def test_a_worker_that_honours_sigterm_is_not_killed() -> None:
    worker = _spawn("import time\nprint('ready', flush=True)\ntime.sleep(60)\n")
    assert _read_line(worker.stdout) == "ready"
    outcome = worker.retire(2.0)
    assert outcome.terminated == (worker.pid,)
    assert outcome.killed == ()
    assert outcome.confirmed_gone
    assert worker.returncode == -15


GRANDPARENT = (
    IGNORE_TERM + "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', "
    "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.mark.usefixtures("subreaper")
def test_retiring_a_worker_retires_its_whole_tree() -> None:
    deadline = 1.5
    worker = _spawn(GRANDPARENT)
    grandchild = int(_read_line(worker.stdout))
    assert psutil.Process(grandchild).ppid() == worker.pid
    started = time.monotonic()
    outcome = worker.retire(deadline)
    assert time.monotonic() - started < deadline + SLACK_S
    assert outcome.confirmed_gone
    assert set(outcome.killed) == {worker.pid, grandchild}
    # Neither the worker nor the grandchild is left, not even as a zombie.
    assert _gone(worker.pid)
    assert _gone(grandchild)


@pytest.mark.usefixtures("subreaper")
def test_a_grandchild_orphaned_by_a_crash_is_found_through_the_process_group() -> None:
    code = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "sys.exit(1)\n"
    )
    worker = _spawn(code)
    grandchild = int(_read_line(worker.stdout))
    assert worker.wait_exit(10) == 1
    # Orphaned: no longer the worker's descendant, but still in the worker's process group.
    assert psutil.Process(grandchild).ppid() != worker.pid
    assert os.getpgid(grandchild) == worker.pid
    outcome = worker.retire(2.0)
    assert outcome.confirmed_gone
    assert grandchild in outcome.terminated
    assert _gone(worker.pid)
    assert _gone(grandchild)


def test_retire_is_idempotent() -> None:
    worker = _spawn("import sys; sys.stdin.read()")
    first = worker.retire(5.0)
    started = time.monotonic()
    second = worker.retire(5.0)
    assert second is first
    assert time.monotonic() - started < 0.1
    assert worker.outcome is first


def test_a_forgotten_worker_is_retired_when_collected(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="omni.host.process")
    worker = _spawn("import sys; sys.stdin.read()")
    pid = worker.pid
    del worker
    gc.collect()
    assert _gone(pid)
    assert any("was not retired by its owner" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("deadline", [0, -1.0, float("nan"), float("inf")])
def test_retire_refuses_a_meaningless_deadline(deadline: float) -> None:
    with _spawn("import sys; sys.stdin.read()") as worker:
        with pytest.raises(ValueError, match="retirement deadline"):
            worker.retire(deadline)


# ------------------------------------------------------------------ retire by identity


def _plain_child(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)


def test_retire_tree_by_identity_terminates_a_verified_process() -> None:
    child = _plain_child(IGNORE_TERM + "import time; print('ready', flush=True); time.sleep(60)")
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"ready"
        outcome = retire_tree(ProcessIdentity.of(child.pid), 1.0)
        assert outcome.verified
        assert outcome.confirmed_gone
        assert not outcome.graceful
        assert outcome.terminated == (child.pid,)
        assert outcome.killed == (child.pid,)
        assert outcome.elapsed_s < 1.0 + SLACK_S
    finally:
        child.kill()
        child.wait(timeout=10)
        assert child.stdout is not None
        child.stdout.close()
    assert child.returncode == -9


@pytest.mark.usefixtures("subreaper")
def test_retire_tree_by_identity_retires_descendants() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", GRANDPARENT], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        outcome = retire_tree(ProcessIdentity.of(child.pid), 1.5)
        assert outcome.confirmed_gone
        assert set(outcome.killed) == {child.pid, grandchild}
        assert outcome.elapsed_s < 1.5 + SLACK_S
    finally:
        child.kill()
        child.wait(timeout=10)
        assert child.stdout is not None
        child.stdout.close()
    assert _gone(grandchild)


def test_an_identity_mismatch_is_not_signalled_and_stays_quarantined() -> None:
    child = _plain_child("import time; time.sleep(60)")
    try:
        real = ProcessIdentity.of(child.pid)
        impostor = ProcessIdentity(real.pid, real.create_time + 100.0)
        outcome = retire_tree(impostor, 1.0)
        assert not outcome.verified
        assert not outcome.confirmed_gone
        assert outcome.terminated == ()
        assert outcome.killed == ()
        assert child.poll() is None, "a process with another identity was signalled"
        assert real.matches()
        reason = outcome.quarantine_reason
        assert reason is not None
        assert f"pid {child.pid}" in reason
        assert "quarantined" in reason
        assert "now belongs to a process created at" in reason
    finally:
        child.kill()
        child.wait(timeout=10)
        assert child.stdout is not None
        child.stdout.close()


def test_a_tree_that_is_already_gone_cannot_be_verified() -> None:
    child = _plain_child("pass")
    identity = ProcessIdentity.of(child.pid)
    child.wait(timeout=10)
    assert child.stdout is not None
    child.stdout.close()
    outcome = retire_tree(identity, 1.0)
    assert not outcome.verified
    assert outcome.quarantine_reason is not None
    assert "descendants cannot be found" in outcome.quarantine_reason


def test_retire_tree_refuses_the_calling_process() -> None:
    with pytest.raises(ValueError, match="calling process itself"):
        retire_tree(ProcessIdentity.current(), 1.0)


def test_quarantine_reason_names_survivors() -> None:
    outcome = RetireOutcome(
        confirmed_gone=False,
        verified=True,
        graceful=False,
        terminated=(10, 11),
        killed=(11,),
        survivors=(11,),
        elapsed_s=5.0,
        pid=10,
    )
    assert outcome.quarantine_reason is not None
    assert "process(es) 11 of the tree of pid 10" in outcome.quarantine_reason
