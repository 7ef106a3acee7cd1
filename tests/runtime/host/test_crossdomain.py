"""Routes into the other OS domain, on Linux.

The real ``WindowsFromWsl`` and ``WslFromWindows`` are checked with recorded Windows samples
(paths, PowerShell and ``/proc`` output, the commands they run). A graph stage then runs end
to end behind ``LauncherDomain``, the seam's stand-in for the other domain's launcher: a real
worker process started by a launcher process, so the controller must take the worker's
identity from its hello, confirm it through the seam, and end the worker's tree before the
launcher's.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import psutil
import pytest

from runtime.artifacts import verify_bundle
from runtime.backends.graph import GraphStageClient, GraphStageSpec, GraphTimeouts
from runtime.backends.worker_client import worker_launch_spec
from runtime.config import RouteConfig
from runtime.contracts import RequestKey
from runtime.host import ProcessIdentity, RouteError
from runtime.host.crossdomain import (
    WindowsFromWsl,
    WslFromWindows,
    crossing_environment,
    end_announced_tree,
    other_domain_for,
    parse_powershell_start,
    parse_proc_start,
)
from runtime.host.launch import GENERATION_VARIABLE
from runtime.host.locks import DeviceLockTimeout, device_init_lock, device_lock_path
from runtime.ledger import ResourceLedger
from runtime.transport.handshake import HandshakeError
from tests.helpers.onnx_graphs import make_bundle

if TYPE_CHECKING:
    from collections.abc import Sequence

LAUNCHER = Path(__file__).with_name("domain_launcher.py")
MiB = 1 << 20

#: ``(Get-Process -Id 7312).StartTime.ToUniversalTime().ToString('o')`` on Windows 11.
POWERSHELL_START = "2026-12-03T06:40:11.1234567Z\r\n"
STARTED = datetime.datetime(2026, 12, 3, 6, 40, 11, tzinfo=datetime.UTC).timestamp() + 0.1234567


# -- the real implementations, with recorded Windows samples ---------------------------------


def test_from_wsl_paths_and_commands_are_windows_ones() -> None:
    windows = WindowsFromWsl("Ubuntu-24.04")
    assert windows.worker_domain == "windows"
    assert (
        windows.path("/home/ada/bundles/add/manifest.json")
        == "\\\\wsl.localhost\\Ubuntu-24.04\\home\\ada\\bundles\\add\\manifest.json"
    )
    assert windows.path("/mnt/d/bundles/add/manifest.json") == "D:\\bundles\\add\\manifest.json"
    assert windows.command("C:\\Python311\\python.exe", ["-m", "workers.ort_worker"]) == [
        "/mnt/c/Python311/python.exe",
        "-m",
        "workers.ort_worker",
    ]


def test_from_windows_paths_and_commands_are_wsl_ones() -> None:
    wsl = WslFromWindows("Ubuntu")
    assert wsl.worker_domain == "posix"
    assert wsl.path("C:\\Users\\ada\\bundles\\manifest.json") == (
        "/mnt/c/Users/ada/bundles/manifest.json"
    )
    assert wsl.path("\\\\wsl.localhost\\Ubuntu\\home\\ada\\m.json") == "/home/ada/m.json"
    assert wsl.command("/home/ada/.venv/bin/python", ["-m", "workers.ort_worker"]) == [
        "wsl.exe",
        "-d",
        "Ubuntu",
        "--",
        "/home/ada/.venv/bin/python",
        "-m",
        "workers.ort_worker",
    ]


@dataclass
class RecordedTools:
    """The other domain's tools answering from recorded output; records every command."""

    answers: dict[str, tuple[int, str]]
    commands: list[list[str]] = field(default_factory=list)

    def __call__(self, argv: Sequence[str]) -> tuple[int, str]:
        self.commands.append(list(argv))
        for needle, answer in self.answers.items():
            if needle in " ".join(argv):
                return answer
        return 1, ""


def test_the_windows_start_time_and_tree_end_go_through_powershell_and_taskkill() -> None:
    tools = RecordedTools({"Get-Process -Id 7312": (0, POWERSHELL_START)})
    windows = WindowsFromWsl("Ubuntu", run=tools)
    assert windows.process_start(7312) == pytest.approx(STARTED, abs=1e-6)
    assert windows.process_start(7313) is None
    windows.end_tree(7312, force=False)
    windows.end_tree(7312, force=True)
    assert tools.commands[-2:] == [
        ["taskkill.exe", "/PID", "7312", "/T"],
        ["taskkill.exe", "/PID", "7312", "/T", "/F"],
    ]


def test_recorded_start_times_parse_and_garbage_does_not() -> None:
    assert parse_powershell_start(POWERSHELL_START) == pytest.approx(STARTED, abs=1e-6)
    assert (
        parse_powershell_start("Get-Process : Cannot find a process with the process identifier 5.")
        is None
    )
    assert parse_powershell_start("") is None


def _local_tools(argv: Sequence[str]) -> tuple[int, str]:
    """``wsl.exe -d NAME -- command...`` run here: this Linux stands in for the distro."""
    assert list(argv[:4]) == ["wsl.exe", "-d", "Ubuntu", "--"], argv
    done = subprocess.run(list(argv[4:]), capture_output=True, text=True, check=False)
    return done.returncode, done.stdout


def test_a_wsl_start_time_matches_what_psutil_reads_for_the_same_process() -> None:
    wsl = WslFromWindows("Ubuntu", run=_local_tools)
    own = ProcessIdentity.current()
    start = wsl.process_start(own.pid)
    assert start is not None
    assert abs(start - own.create_time) < 0.02
    assert parse_proc_start("100\n1 (x) S\n") is None
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        wsl.end_tree(sleeper.pid, force=False)
        assert sleeper.wait(timeout=10) == -signal.SIGTERM
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_environment_crosses_as_wslenv_lists_it() -> None:
    env = {
        "PATH": "/usr/bin",
        "HOME": "/home/ada",
        "PYTHONPATH": "/home/ada/omni",
        GENERATION_VARIABLE: "7",
        "ORT_DISABLE_TELEMETRY": "1",
    }
    crossing = crossing_environment(env, inherited={"WSLENV": "USERPROFILE/p:PYTHONPATH/l"})
    entries = crossing["WSLENV"].split(":")
    assert entries[0] == "USERPROFILE/p"
    assert "PYTHONPATH/p" in entries
    assert "PYTHONPATH/l" not in entries
    assert GENERATION_VARIABLE in entries
    assert "ORT_DISABLE_TELEMETRY" in entries
    assert not {"PATH", "HOME"} & {entry.split("/")[0] for entry in entries}
    assert {key: crossing[key] for key in env} == env


def test_which_domain_a_route_runs_in() -> None:
    assert (
        other_domain_for("posix", controller_domain="posix", wsl=True, environ={}, route_env={})
        is None
    )
    # Outside WSL there is no Windows domain: starting the worker refuses the route.
    assert (
        other_domain_for("windows", controller_domain="posix", wsl=False, environ={}, route_env={})
        is None
    )
    found = other_domain_for(
        "windows",
        controller_domain="posix",
        wsl=True,
        environ={"WSL_DISTRO_NAME": "Ubuntu"},
        route_env={},
    )
    assert found == WindowsFromWsl("Ubuntu")
    with pytest.raises(ValueError, match="needs the distro name in WSL_DISTRO_NAME"):
        other_domain_for("windows", controller_domain="posix", wsl=True, environ={}, route_env={})
    assert other_domain_for(
        "posix",
        controller_domain="windows",
        wsl=False,
        environ={},
        route_env={"WSL_DISTRO_NAME": "Debian"},
    ) == WslFromWindows("Debian")
    with pytest.raises(ValueError, match=r"set env: \{WSL_DISTRO_NAME: <name>\} in the route"):
        other_domain_for("posix", controller_domain="windows", wsl=False, environ={}, route_env={})


def _windows_route(interpreter: str) -> RouteConfig:
    return RouteConfig(
        "windows-cpu", interpreter, "ort", "cpu", "windows", MiB, env={"OMP_NUM_THREADS": "2"}
    )


def test_the_launch_path_maps_a_windows_route_from_wsl() -> None:
    spec = worker_launch_spec(
        _windows_route("C:\\Python311\\python.exe"),
        generation=4,
        extra_env={},
        other=WindowsFromWsl("Ubuntu"),
    )
    assert spec.os_domain == "windows"
    assert spec.argv == ("/mnt/c/Python311/python.exe", "-m", "workers.ort_worker")
    crossing = spec.env["WSLENV"].split(":")
    assert {"PYTHONPATH/p", GENERATION_VARIABLE, "OMP_NUM_THREADS"} <= set(crossing)
    assert spec.env[GENERATION_VARIABLE] == "4"


def test_a_route_into_windows_needs_a_windows_interpreter_path() -> None:
    with pytest.raises(RouteError, match=r"must be the absolute path of a Python there") as caught:
        worker_launch_spec(
            _windows_route("bundled"), generation=1, extra_env={}, other=WindowsFromWsl("U")
        )
    assert caught.value.key == "interpreter"


@dataclass
class FakeTree:
    """A worker tree in the other domain that ends ``ends_after`` calls of end_tree later."""

    identity: ProcessIdentity
    ends_after: int
    calls: list[tuple[int, bool]] = field(default_factory=list)

    @property
    def worker_domain(self) -> str:
        return "windows"

    def path(self, path: str) -> str:
        return path

    def command(self, interpreter: str, args: Sequence[str]) -> list[str]:
        return [interpreter, *args]

    def process_start(self, pid: int) -> float | None:
        alive = pid == self.identity.pid and len(self.calls) < self.ends_after
        return self.identity.create_time if alive else None

    def end_tree(self, pid: int, *, force: bool) -> None:
        self.calls.append((pid, force))


def test_an_announced_tree_is_ended_politely_then_forcibly_and_confirmed_gone() -> None:
    identity = ProcessIdentity(7312, 1796366411.123)
    polite = FakeTree(identity, ends_after=1)
    assert end_announced_tree(polite, identity, deadline_s=1.0).confirmed_gone
    assert polite.calls == [(7312, False)]
    stubborn = FakeTree(identity, ends_after=2)
    ended = end_announced_tree(stubborn, identity, deadline_s=0.4)
    assert ended.confirmed_gone
    assert ended.forced
    assert stubborn.calls == [(7312, False), (7312, True)]
    immortal = FakeTree(identity, ends_after=99)
    kept = end_announced_tree(immortal, identity, deadline_s=0.3)
    assert not kept.confirmed_gone
    assert "windows worker pid 7312 was still running" in kept.detail
    # A pid that now names another process is not touched.
    other = FakeTree(ProcessIdentity(7312, 5.0), ends_after=99)
    assert end_announced_tree(other, identity, deadline_s=0.3).confirmed_gone
    assert other.calls == []


# -- a graph stage behind the stand-in launcher ----------------------------------------------


@dataclass
class LauncherDomain:
    """The seam's stand-in for the other domain: a launcher process starts the real worker;
    identities and tree ends go through psutil. Records what the controller asked of it."""

    shift_s: float = 0.0
    paths: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    launcher_alive_at_end: list[bool] = field(default_factory=list)

    @property
    def worker_domain(self) -> str:
        return "posix"

    def path(self, path: str) -> str:
        self.paths.append(path)
        return path

    def command(self, interpreter: str, args: Sequence[str]) -> list[str]:
        return [sys.executable, str(LAUNCHER), interpreter, *args]

    def process_start(self, pid: int) -> float | None:
        try:
            return psutil.Process(pid).create_time() + self.shift_s
        except psutil.NoSuchProcess:
            return None

    def end_tree(self, pid: int, *, force: bool) -> None:
        self.events.append(f"end_tree {pid} force={force}")
        process = psutil.Process(pid)
        self.launcher_alive_at_end.append(psutil.Process(process.ppid()).is_running())
        process.send_signal(signal.SIGKILL if force else signal.SIGTERM)


def _client(manifest: Path, other: LauncherDomain) -> tuple[GraphStageClient, ResourceLedger]:
    route = RouteConfig("launched", sys.executable, "ort", "cpu", "posix", MiB)
    spec = GraphStageSpec(name="stage-0", bundle=verify_bundle(manifest), route=route)
    ledger = ResourceLedger(name="crossdomain")
    ledger.declare_capacities({"machine:ram": 1 << 30})
    plan = ledger.reserve_plan("test", {"stage-0": {"machine:ram": 64 * MiB}})
    client = GraphStageClient(
        spec,
        ledger=ledger,
        reservation=plan.stages["stage-0"],
        generation=11,
        timeouts=GraphTimeouts(),
        other_domain=other,
    )
    return client, ledger


def test_a_worker_behind_a_launcher_is_confirmed_by_its_announced_identity(
    tmp_path: Path,
) -> None:
    manifest = make_bundle(tmp_path, kind="add", name="add")
    other = LauncherDomain()
    client, ledger = _client(manifest, other)

    async def scenario() -> tuple[int, int]:
        try:
            record = (await client.start()).to_json()
            launcher = record["worker"]["pid"]
            announced = client.announced_identity
            assert announced is not None
            worker = announced.pid
            inputs = client.example_inputs()
            result = await client.call(RequestKey("r-1"), inputs)
            np.testing.assert_array_equal(result.outputs["c"], inputs["a"] + inputs["b"])
            client.acknowledge(RequestKey("r-1"))
        finally:
            await client.close()
        return launcher, worker

    launcher, worker = asyncio.run(scenario())
    assert launcher != worker
    # The manifest path went through the seam; the worker's tree ended before its launcher.
    assert other.paths == [str(manifest)]
    assert other.events == [f"end_tree {worker} force=False"]
    assert other.launcher_alive_at_end == [True]
    assert not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE
    assert ledger.snapshot().is_empty


def test_an_identity_the_other_domain_does_not_show_is_refused(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path, kind="add", name="add")
    client, ledger = _client(manifest, LauncherDomain(shift_s=5.0))

    async def scenario() -> None:
        with pytest.raises(HandshakeError, match="which the posix domain does not show") as caught:
            await client.start()
        assert caught.value.code == "wrong_pid"
        await client.close()

    asyncio.run(scenario())
    assert ledger.snapshot().is_empty


# -- device-initialisation locks --------------------------------------------------------------


def test_the_device_lock_lives_in_the_host_temp_folder_whatever_the_checkout() -> None:
    windows = device_lock_path(
        "LUID-00000000-0000F2A1", os_domain="windows", environ={"TEMP": "C:\\Users\\ada\\Temp"}
    )
    assert str(windows).endswith("device-LUID-00000000-0000F2A1.lock")
    assert "C:\\Users\\ada\\Temp\\omni-edge\\locks" in str(windows)
    posix = device_lock_path(
        "GPU-1234", os_domain="posix", environ={"XDG_RUNTIME_DIR": "/run/user/7"}
    )
    assert posix == Path(f"/run/user/7/omni-edge-{os.getuid()}/locks/device-GPU-1234.lock")


def test_one_process_at_a_time_initialises_a_device(tmp_path: Path) -> None:
    environ = {"XDG_RUNTIME_DIR": str(tmp_path)}
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from runtime.host.locks import device_init_lock\n"
            f"with device_init_lock('GPU-1234', environ={environ!r}):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(1.0)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(DeviceLockTimeout, match="another process has been initialising"):
            with device_init_lock("GPU-1234", timeout_s=0.2, environ=environ):
                pass
        started = time.monotonic()
        with device_init_lock("GPU-1234", timeout_s=10.0, environ=environ):
            waited = time.monotonic() - started
        assert waited > 0.3
        # Another device is not held up.
        acquired = threading.Event()
        with device_init_lock("GPU-5678", timeout_s=0.2, environ=environ):
            acquired.set()
        assert acquired.is_set()
    finally:
        holder.wait(timeout=10)
