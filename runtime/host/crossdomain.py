"""Routes whose worker runs in the other OS domain: a Windows worker from a WSL controller,
a WSL worker from a native Windows controller.

Everything the controller needs from the other side goes through one small seam,
:class:`OtherDomain`:

* ``path``: a controller path as the worker sees it (``/home/u/b/manifest.json`` ->
  ``\\\\wsl.localhost\\<distro>\\home\\u\\b\\manifest.json``; ``C:\\b`` -> ``/mnt/c/b``);
* ``command``: the argv that starts the worker's interpreter there (through WSL interop, or
  ``wsl.exe -d <distro> --``); the process the controller starts is then a *launcher*, not
  the worker, whose pid and creation time come from its ``hello``;
* ``process_start``: the creation time the other domain reports for a pid (None when it
  shows no such process): the identity check of the announced worker and of its retirement;
* ``end_tree``: ask the other domain to end a process tree (``taskkill /T``, ``kill``).

:class:`WindowsFromWsl` and :class:`WslFromWindows` are the real ones; they run the other
domain's tools through a ``run`` callable, which tests give recorded Windows output.
The worker's environment crosses the boundary only as ``WSLENV`` lists it
(:func:`crossing_environment`). Retirement ends the worker's native tree first, confirmed
by its identity, and only then the launcher (:func:`end_announced_tree`).
"""

from __future__ import annotations

import datetime
import ntpath
import subprocess
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Protocol

from runtime.host.wslpaths import (
    DEFAULT_MOUNT_ROOT,
    windows_command_from_wsl,
    windows_to_wsl_path,
    wsl_command_from_windows,
    wsl_to_windows_path,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from runtime.host.identity import ProcessIdentity

__all__ = [
    "CROSS_DOMAIN_TOLERANCE_S",
    "PATH_VARIABLES",
    "OtherDomain",
    "RemoteRetirement",
    "WindowsFromWsl",
    "WslFromWindows",
    "crossing_environment",
    "end_announced_tree",
    "identity_confirmed",
    "is_absolute_in",
    "other_domain_for",
    "parse_powershell_start",
    "parse_proc_start",
]

#: Creation times read in two domains differ by their clocks' resolution (Windows reports
#: 100 ns ticks, psutil on Windows milliseconds, Linux clock ticks of 10 ms).
CROSS_DOMAIN_TOLERANCE_S: Final = 0.02
#: Worker variables holding paths: ``WSLENV`` marks them ``/p`` so WSL translates them.
PATH_VARIABLES: Final = frozenset({"PYTHONPATH", "TMPDIR", "OMNI_EDGE_PRIVATE_TMPDIR"})
#: Variables each domain sets for its own processes: they never cross.
_DOMAIN_OWN: Final = frozenset(
    {
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "XDG_RUNTIME_DIR",
        "SYSTEMROOT",
        "TEMP",
        "TMP",
        "USERPROFILE",
        "LOCALAPPDATA",
        "WSLENV",
    }
)
#: The variable naming a WSL distro: WSL sets it inside; a Windows controller's route names it.
DISTRO_VARIABLE: Final = "WSL_DISTRO_NAME"
_COMMAND_TIMEOUT_S: Final = 15.0
_POLL_S: Final = 0.05


def _run_command(argv: Sequence[str]) -> tuple[int, str]:
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, str(exc)
    return done.returncode, done.stdout


class OtherDomain(Protocol):
    """The OS domain on the other side of a route (see the module's docstring)."""

    @property
    def worker_domain(self) -> str:
        """The route ``os_domain`` of workers started there."""

    def path(self, path: str) -> str:
        """A controller path as the worker sees it; ValueError naming the path otherwise."""

    def command(self, interpreter: str, args: Sequence[str]) -> list[str]:
        """The argv, run by the controller, that starts ``interpreter args`` there."""

    def process_start(self, pid: int) -> float | None:
        """The creation time (seconds since the epoch) of ``pid`` there, None if none."""

    def end_tree(self, pid: int, *, force: bool) -> None:
        """Ask the other domain to end ``pid`` and its descendants."""


def parse_powershell_start(text: str) -> float | None:
    """The epoch seconds of ``(Get-Process).StartTime.ToUniversalTime().ToString('o')``
    output (``2026-12-03T06:40:11.1234567Z``), None when it holds no such time."""
    line = text.strip().splitlines()[-1].strip() if text.strip() else ""
    if not line.endswith("Z"):
        return None
    stamp, _, fraction = line[:-1].partition(".")
    try:
        moment = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.UTC)
    except ValueError:
        return None
    seconds = moment.timestamp()
    if fraction:
        if not fraction.isdigit():
            return None
        seconds += int(fraction) / 10 ** len(fraction)
    return seconds


def parse_proc_start(text: str) -> float | None:
    """The epoch seconds of a Linux process from ``getconf CLK_TCK``, ``/proc/<pid>/stat``
    and the ``btime`` line of ``/proc/stat`` (in that order), as psutil computes them."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) != 3 or not lines[0].strip().isdigit() or not lines[2].startswith("btime "):
        return None
    ticks = int(lines[0])
    fields = lines[1].rpartition(")")[2].split()
    try:
        return float(fields[19]) / ticks + float(lines[2].split()[1])
    except (IndexError, ValueError, ZeroDivisionError):
        return None


@dataclass(frozen=True, slots=True)
class WindowsFromWsl:
    """A WSL controller's Windows workers: WSL interop starts ``.exe`` files directly."""

    distro: str
    mount_root: str = DEFAULT_MOUNT_ROOT
    run: Callable[[Sequence[str]], tuple[int, str]] = field(default=_run_command, repr=False)

    @property
    def worker_domain(self) -> str:
        return "windows"

    def path(self, path: str) -> str:
        return wsl_to_windows_path(path, distro=self.distro, mount_root=self.mount_root)

    def command(self, interpreter: str, args: Sequence[str]) -> list[str]:
        return windows_command_from_wsl(interpreter, args, mount_root=self.mount_root)

    def process_start(self, pid: int) -> float | None:
        script = (
            f"(Get-Process -Id {int(pid)} -ErrorAction Stop).StartTime"
            ".ToUniversalTime().ToString('o')"
        )
        status, out = self.run(
            ["powershell.exe", "-NoProfile", "-NonInteractive", "-Command", script]
        )
        return parse_powershell_start(out) if status == 0 else None

    def end_tree(self, pid: int, *, force: bool) -> None:
        self.run(["taskkill.exe", "/PID", str(int(pid)), "/T", *(("/F",) if force else ())])


@dataclass(frozen=True, slots=True)
class WslFromWindows:
    """A native Windows controller's WSL workers, started through ``wsl.exe -d <distro> --``."""

    distro: str
    mount_root: str = DEFAULT_MOUNT_ROOT
    run: Callable[[Sequence[str]], tuple[int, str]] = field(default=_run_command, repr=False)

    @property
    def worker_domain(self) -> str:
        return "posix"

    def path(self, path: str) -> str:
        return windows_to_wsl_path(path, distro=self.distro, mount_root=self.mount_root)

    def command(self, interpreter: str, args: Sequence[str]) -> list[str]:
        return wsl_command_from_windows(self.distro, interpreter, args, mount_root=self.mount_root)

    def process_start(self, pid: int) -> float | None:
        script = f"getconf CLK_TCK; cat /proc/{int(pid)}/stat; grep '^btime ' /proc/stat"
        status, out = self.run(["wsl.exe", "-d", self.distro, "--", "sh", "-c", script])
        return parse_proc_start(out) if status == 0 else None

    def end_tree(self, pid: int, *, force: bool) -> None:
        signal = "-KILL" if force else "-TERM"
        # The worker leads its own process group in WSL: the group is its tree.
        script = f"kill {signal} -- -{int(pid)} 2>/dev/null || kill {signal} {int(pid)}"
        self.run(["wsl.exe", "-d", self.distro, "--", "sh", "-c", script])


def crossing_environment(env: Mapping[str, str], *, inherited: Mapping[str, str]) -> dict[str, str]:
    """``env`` with ``WSLENV`` naming the worker's own variables, so they reach a process in
    the other domain (paths marked ``/p``, translated by WSL). Variables each domain sets for
    itself (``PATH``, ``HOME``, ``TEMP``...) stay behind; ``inherited`` is the controller's
    environment, whose own ``WSLENV`` entries are kept."""
    crossing = [
        f"{name}/p" if name in PATH_VARIABLES else name
        for name in sorted(env)
        if name not in _DOMAIN_OWN
    ]
    already = [entry for entry in inherited.get("WSLENV", "").split(":") if entry]
    names = {entry.split("/")[0] for entry in crossing}
    kept = [entry for entry in already if entry.split("/")[0] not in names]
    return {**env, "WSLENV": ":".join([*kept, *crossing])}


def is_absolute_in(domain: str, path: str) -> bool:
    """Whether ``path`` is absolute in ``domain`` (``C:\\...`` or a share on Windows)."""
    if domain == "windows":
        return ntpath.isabs(path) and (path[1:2] == ":" or path.startswith(("\\\\", "//")))
    return path.startswith("/")


def identity_confirmed(other: OtherDomain, identity: ProcessIdentity) -> bool:
    """Whether the other domain shows ``identity``'s pid with its creation time."""
    start = other.process_start(identity.pid)
    return start is not None and abs(start - identity.create_time) <= CROSS_DOMAIN_TOLERANCE_S


@dataclass(frozen=True, slots=True)
class RemoteRetirement:
    """How ending a worker's tree in the other domain went."""

    pid: int
    confirmed_gone: bool
    forced: bool
    elapsed_s: float
    detail: str = ""


def end_announced_tree(
    other: OtherDomain, identity: ProcessIdentity, *, deadline_s: float
) -> RemoteRetirement:
    """End the worker tree the other domain runs (its announced identity): politely, then
    forcibly at half the deadline; gone only once the other domain no longer shows that
    pid with that creation time. A pid that now names another process is left alone."""
    started = time.monotonic()
    if not identity_confirmed(other, identity):
        return RemoteRetirement(identity.pid, True, False, time.monotonic() - started)
    other.end_tree(identity.pid, force=False)
    forced = False
    while True:
        elapsed = time.monotonic() - started
        if not identity_confirmed(other, identity):
            return RemoteRetirement(identity.pid, True, forced, elapsed)
        if elapsed >= deadline_s:
            return RemoteRetirement(
                identity.pid,
                False,
                forced,
                elapsed,
                f"the {other.worker_domain} worker pid {identity.pid} was still running "
                f"{elapsed:.1f} s after it was ended",
            )
        if not forced and elapsed >= deadline_s / 2:
            other.end_tree(identity.pid, force=True)
            forced = True
        time.sleep(_POLL_S)


def other_domain_for(
    route_domain: str,
    *,
    controller_domain: str,
    wsl: bool,
    environ: Mapping[str, str],
    route_env: Mapping[str, str],
) -> OtherDomain | None:
    """The other domain a route's worker runs in, or None when it runs in the controller's.

    From WSL, a Windows route runs through interop (the distro is WSL's ``WSL_DISTRO_NAME``);
    from native Windows, a POSIX route runs in the WSL distro the route's ``env`` names in
    ``WSL_DISTRO_NAME``. A POSIX controller outside WSL has no Windows domain: None, and
    starting the worker refuses it. Raises ValueError naming what is missing.
    """
    if route_domain == controller_domain:
        return None
    if controller_domain == "posix":
        if not wsl:
            return None
        distro = environ.get(DISTRO_VARIABLE)
        if not distro:
            raise ValueError(
                f"a Windows route from WSL needs the distro name in {DISTRO_VARIABLE}, which "
                "WSL sets in every process; it is not set here"
            )
        return WindowsFromWsl(distro)
    distro = route_env.get(DISTRO_VARIABLE)
    if not distro:
        raise ValueError(
            f"a posix route from Windows runs in WSL and needs its distro: set "
            f"env: {{{DISTRO_VARIABLE}: <name>}} in the route (a name `wsl.exe --list` shows)"
        )
    return WslFromWindows(distro)
