"""Worker processes: spawn from a :class:`LaunchSpec`, drain stderr, retire the whole tree.

A :class:`WorkerProcess` owns one child started in its own session (POSIX) or process
group (Windows), so the child and everything it starts can be found and stopped
together. Retirement is bounded and idempotent:

1. verify the pid still names the process that was started (pid + creation time); if not,
   nothing is signalled and the outcome is *unverified*;
2. collect the tree (descendants, plus the members of the worker's process group);
3. close stdin -- the shutdown sentinel -- and wait a share of the deadline for a clean exit;
4. terminate the tree and wait; kill the survivors and wait;
5. confirm every member gone, reap the worker, join the stderr reader.

A tree that could not be verified or confirmed gone must keep its reservation quarantined;
:attr:`RetireOutcome.quarantine_reason` says why.

On Linux the worker is not reaped until retirement ends (exit codes are read with
``waitid(WNOWAIT)``), so its pid, and its process-group id, cannot be reused while it is
being retired.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Final

import psutil

from runtime.errors import ExecutionError
from runtime.host.identity import ProcessIdentity
from runtime.host.wslpaths import current_os_domain, is_wsl

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from runtime.host.launch import LaunchSpec

__all__ = [
    "STDERR_TAIL_LINES",
    "RetireOutcome",
    "WorkerProcess",
    "WorkerStartError",
    "handles_of",
    "retire_tree",
    "set_child_subreaper",
    "spawn_worker",
    "wait_processes_gone",
    "watch_until_gone",
]

_log = logging.getLogger("omni.host.process")

#: How many stderr lines a worker keeps for showing a crash to the user.
STDERR_TAIL_LINES: Final = 200
#: Longer stderr lines are split, so a worker cannot make the reader buffer without bound.
STDERR_LINE_LIMIT: Final = 8192
#: Level at which worker stderr lines are logged.
STDERR_LOG_LEVEL: Final = logging.INFO

# Shares of the retirement deadline: the sentinel's grace period ends at GRACE_SHARE; the
# terminate phase ends at TERM_SHARE (TERM_SHARE_NO_SENTINEL when there is no sentinel);
# the kill phase has the rest.
GRACE_SHARE: Final = 0.5
TERM_SHARE: Final = 0.8
TERM_SHARE_NO_SENTINEL: Final = 0.6

_POLL_S = 0.01
_REFRESH_EVERY = 10
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_PR_SET_CHILD_SUBREAPER = 36


class WorkerStartError(ExecutionError):
    """A worker process could not be started. Names the program and the OS error."""

    def __init__(self, message: str, *, argv0: str, os_error: OSError | None = None) -> None:
        super().__init__(message)
        self.argv0 = argv0
        self.os_error = os_error


@dataclass(frozen=True, slots=True)
class RetireOutcome:
    """What retiring a process tree achieved.

    ``terminated`` and ``killed`` list the pids that were signalled in each phase;
    ``survivors`` the members still alive when the deadline passed. ``pid`` is the tree's
    root and ``detail`` explains an unverified tree.
    """

    confirmed_gone: bool
    verified: bool
    graceful: bool
    terminated: tuple[int, ...]
    killed: tuple[int, ...]
    survivors: tuple[int, ...]
    elapsed_s: float
    pid: int = 0
    detail: str = ""
    #: The survivors by identity (pid + creation time), so they can be watched until gone.
    survivor_identities: tuple[ProcessIdentity, ...] = ()
    #: Each survivor's OS state when the deadline passed (``running``, ``disk-sleep``...).
    survivor_states: tuple[str, ...] = ()

    @property
    def quarantine_reason(self) -> str | None:
        """None when the tree is verified and confirmed gone; otherwise why its reservation stays."""
        if self.verified and self.confirmed_gone:
            return None
        if not self.verified:
            return (
                f"the process tree of pid {self.pid} could not be verified ({self.detail}); "
                "nothing was signalled, so its reservation must stay quarantined until the "
                "process is confirmed gone"
            )
        if len(self.survivor_states) == len(self.survivors):
            pids = ", ".join(
                f"{pid} ({state})"
                for pid, state in zip(self.survivors, self.survivor_states, strict=True)
            )
        else:
            pids = ", ".join(str(pid) for pid in self.survivors)
        return (
            f"process(es) {pids} of the tree of pid {self.pid} were still alive "
            f"{self.elapsed_s:.1f} s into retirement, after being killed; the reservation "
            "must stay quarantined until they are gone"
        )


def set_child_subreaper(enabled: bool = True) -> bool:
    """Make this process adopt orphaned descendants (Linux); returns whether it applied.

    Without it, a worker's child orphaned by the worker's exit is re-parented to init,
    which reaps it; where init does not reap (some containers) it stays a zombie. As a
    subreaper, the controller adopts such orphans and retirement reaps them.
    """
    if sys.platform != "linux":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, int(enabled), 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(error)}")
    return True


def wait_processes_gone(
    processes: Iterable[psutil.Process], deadline_s: float, *, poll_s: float = 0.05
) -> list[psutil.Process]:
    """Wait up to ``deadline_s`` for ``processes`` to be gone; return those still alive.

    A zombie counts as gone. A multi-threaded process whose main thread exited shows as a
    zombie while its other threads still run, and cannot be reaped yet; one adopted by this
    process (a child subreaper) is reaped here once it can be.
    """
    until = time.monotonic() + deadline_s
    pending = list(processes)
    me = os.getpid()
    while True:
        alive = []
        for process in pending:
            try:
                if not process.is_running():
                    continue
                if process.ppid() == me and sys.platform != "win32":
                    if os.waitpid(process.pid, os.WNOHANG)[0] == process.pid:
                        continue
                    alive.append(process)
                elif process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
            except (psutil.NoSuchProcess, ChildProcessError):
                continue
            except psutil.AccessDenied:
                alive.append(process)
        if not alive or time.monotonic() >= until:
            return alive
        pending = alive
        time.sleep(min(poll_s, max(0.0, until - time.monotonic())))


def handles_of(identities: Iterable[ProcessIdentity]) -> list[psutil.Process]:
    """psutil handles of the identities still naming their process (reused pids dropped)."""
    handles = []
    for identity in identities:
        try:
            handle = identity.process()
        except PermissionError:
            # Cannot tell; keep watching the pid as it is.
            handle = psutil.Process(identity.pid)
        if handle is not None:
            handles.append(handle)
    return handles


def watch_until_gone(
    name: str,
    identities: Iterable[ProcessIdentity],
    deadline_s: float,
    on_gone: Callable[[float], None],
) -> threading.Thread:
    """Call ``on_gone(seconds)`` from a daemon thread once every process is gone.

    For the survivors of a retirement: a killed process can take a while to exit (a large
    address space to tear down, a thread in uninterruptible I/O). Past ``deadline_s`` the
    watch ends with a warning and ``on_gone`` is never called.
    """
    deadline = _check_deadline(deadline_s)
    targets = handles_of(identities)
    start = time.monotonic()

    def watch() -> None:
        left = wait_processes_gone(targets, deadline, poll_s=0.2)
        if left:
            _log.warning(
                "%s: process(es) %s still alive %.0f s after being killed; their reservation "
                "stays quarantined",
                name,
                ", ".join(str(proc.pid) for proc in left),
                deadline,
            )
            return
        on_gone(time.monotonic() - start)

    thread = threading.Thread(target=watch, name=f"omni-watch-{name}", daemon=True)
    thread.start()
    return thread


def _peek_exit(popen: subprocess.Popen[bytes]) -> int | None:
    """The child's exit code if it has exited, without reaping it where the OS allows."""
    if popen.returncode is not None:
        return popen.returncode
    if sys.platform != "linux":
        return popen.poll()
    try:
        result = os.waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        # Reaped elsewhere; Popen records what it can.
        return popen.poll()
    if result is None:
        return None
    if result.si_code == os.CLD_EXITED:
        return result.si_status
    return -result.si_status


def _reap_adopted(proc: psutil.Process) -> None:
    """Reap a dead tree member this process adopted as a subreaper."""
    if sys.platform == "win32":
        return
    try:
        if proc.ppid() != os.getpid():
            return
        os.waitpid(proc.pid, os.WNOHANG)
    except (psutil.Error, ChildProcessError):
        return


def _group_members(pgid: int) -> list[psutil.Process]:
    """Every process whose process group is ``pgid`` (POSIX)."""
    if sys.platform == "win32":
        return []
    members = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) != pgid:
                continue
            proc = psutil.Process(pid)
            # Checked again after the handle exists, so a reused pid is not picked up.
            if os.getpgid(pid) == pgid:
                members.append(proc)
        except (OSError, psutil.Error):
            continue
    return members


class _Tree:
    """The members of one process tree, found and signalled with pid-reuse checks."""

    def __init__(self, root: psutil.Process, *, group: int | None, killpg: bool) -> None:
        self.root = root
        self.group = group
        self.killpg = killpg
        self.members: dict[int, psutil.Process] = {root.pid: root}

    def refresh(self) -> None:
        found: list[psutil.Process] = []
        try:
            found.extend(self.root.children(recursive=True))
        except psutil.Error:
            pass
        if self.group is not None:
            found.extend(_group_members(self.group))
        for proc in found:
            if proc.pid not in self.members and proc.pid != os.getpid():
                self.members[proc.pid] = proc

    def gone(self, proc: psutil.Process) -> bool:
        try:
            if not proc.is_running():
                return True
            if proc.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            return True
        except psutil.AccessDenied:
            return False
        # The root is reaped by its owner (our Popen, or its own parent), never here.
        if proc.pid != self.root.pid:
            _reap_adopted(proc)
        return True

    def alive(self) -> list[psutil.Process]:
        return [proc for proc in self.members.values() if not self.gone(proc)]

    def signal(self, *, kill: bool) -> tuple[int, ...]:
        targets = self.alive()
        sent: set[int] = set()
        if self.killpg and self.group is not None and sys.platform != "win32":
            # One call reaches group members started after the last refresh too.
            try:
                os.killpg(self.group, signal.SIGKILL if kill else signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in targets:
            try:
                if kill:
                    proc.kill()
                else:
                    proc.terminate()
                sent.add(proc.pid)
            except psutil.NoSuchProcess:
                continue
            except psutil.AccessDenied:
                _log.warning(
                    "not allowed to signal pid %d of the tree of pid %d", proc.pid, self.root.pid
                )
        return tuple(sorted(sent))

    def wait_gone(self, until: float) -> bool:
        """Wait until every member is gone (re-collecting the tree now and then), or ``until``.

        Polls rather than using ``psutil.wait_procs``, which would reap the worker with
        ``waitpid`` and leave its Popen without the real exit code.
        """
        polls = 0
        while True:
            if not self.alive():
                self.refresh()
                if not self.alive():
                    return True
            if time.monotonic() >= until:
                return False
            polls += 1
            if polls % _REFRESH_EVERY == 0:
                self.refresh()
            time.sleep(min(_POLL_S, max(0.0, until - time.monotonic())))


def _check_deadline(deadline_s: float) -> float:
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, int | float):
        raise ValueError(f"retirement deadline must be a number of seconds, got {deadline_s!r}")
    if not math.isfinite(deadline_s) or deadline_s <= 0:
        raise ValueError(
            f"retirement deadline must be a positive number of seconds, got {deadline_s!r}"
        )
    return float(deadline_s)


def _unverified(identity: ProcessIdentity, start: float, detail: str) -> RetireOutcome:
    return RetireOutcome(
        confirmed_gone=False,
        verified=False,
        graceful=False,
        terminated=(),
        killed=(),
        survivors=(),
        elapsed_s=time.monotonic() - start,
        pid=identity.pid,
        detail=detail,
    )


def _why_unverified(identity: ProcessIdentity) -> str:
    try:
        current = psutil.Process(identity.pid).create_time()
    except psutil.NoSuchProcess:
        return f"no process has pid {identity.pid} any more, so its descendants cannot be found"
    except psutil.AccessDenied:
        return f"not allowed to read the creation time of pid {identity.pid}"
    return (
        f"pid {identity.pid} now belongs to a process created at {current:.3f}, not the one "
        f"created at {identity.create_time:.3f}"
    )


def _retire(
    identity: ProcessIdentity,
    deadline_s: float,
    *,
    popen: subprocess.Popen[bytes] | None,
    own_session: bool,
) -> RetireOutcome:
    """Retire the tree rooted at ``identity``; ``popen`` is our Popen of it, if we started it."""
    start = time.monotonic()
    end = start + deadline_s
    try:
        root = identity.process()
    except PermissionError as exc:
        return _unverified(identity, start, str(exc))
    if root is None:
        return _unverified(identity, start, _why_unverified(identity))
    group: int | None = None
    if sys.platform != "win32":
        try:
            # A group this process belongs to is not a tree we started; leave it alone.
            if os.getpgid(root.pid) == root.pid and os.getpgid(0) != root.pid:
                group = root.pid
        except OSError:
            group = None
    owned = popen is not None and popen.returncode is None
    # Signalling a whole group is safe only while its leader is our unreaped child.
    tree = _Tree(root, group=group, killpg=own_session and owned)
    tree.refresh()

    graceful = False
    if popen is not None:
        if popen.stdin is not None:
            try:
                popen.stdin.close()
            except OSError:
                pass
        graceful = tree.wait_gone(start + GRACE_SHARE * deadline_s)
    terminated: tuple[int, ...] = ()
    killed: tuple[int, ...] = ()
    if not graceful:
        term_end = (
            start + (TERM_SHARE if popen is not None else TERM_SHARE_NO_SENTINEL) * deadline_s
        )
        tree.refresh()
        terminated = tree.signal(kill=False)
        if not tree.wait_gone(term_end):
            tree.refresh()
            killed = tree.signal(kill=True)
            tree.wait_gone(end)
    alive = {proc.pid: proc for proc in tree.alive()}
    if popen is not None and identity.pid not in alive:
        try:
            popen.wait(timeout=max(0.05, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            alive[identity.pid] = root
    survivors = tuple(sorted(alive))
    identities: list[ProcessIdentity] = []
    states: list[str] = []
    for pid in survivors:
        proc = alive[pid]
        try:
            identities.append(ProcessIdentity(pid, float(proc.create_time())))
            states.append(str(proc.status()))
        except psutil.Error:
            states.append("unknown")
    return RetireOutcome(
        confirmed_gone=not survivors,
        verified=True,
        graceful=graceful,
        terminated=terminated,
        killed=killed,
        survivors=survivors,
        elapsed_s=time.monotonic() - start,
        pid=identity.pid,
        survivor_identities=tuple(identities),
        survivor_states=tuple(states) if len(states) == len(survivors) else (),
    )


def retire_tree(identity: ProcessIdentity, deadline_s: float) -> RetireOutcome:
    """Retire a process tree known only by identity: verify, terminate, kill, confirm.

    There is no sentinel to send, so termination starts at once. A pid that is gone or
    now names another process is not signalled (``verified`` False).
    """
    deadline = _check_deadline(deadline_s)
    if identity.pid == os.getpid():
        raise ValueError("retire_tree cannot retire the calling process itself")
    return _retire(identity, deadline, popen=None, own_session=False)


class _State:
    """Everything a worker's retirement needs, kept apart so the finalizer holds no cycle."""

    def __init__(
        self, popen: subprocess.Popen[bytes], name: str, identity: ProcessIdentity
    ) -> None:
        self.popen = popen
        self.name = name
        self.identity = identity
        self.lock = threading.Lock()
        self.tail_lock = threading.Lock()
        self.tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.outcome: RetireOutcome | None = None
        self.reader: threading.Thread | None = None

    def retire(self, deadline_s: float) -> RetireOutcome:
        with self.lock:
            if self.outcome is not None:
                return self.outcome
            outcome = _retire(
                self.identity, deadline_s, popen=self.popen, own_session=sys.platform != "win32"
            )
            self._close_streams(outcome.elapsed_s, deadline_s)
            self.outcome = outcome
        if outcome.quarantine_reason is not None:
            _log.warning("worker %s: %s", self.name, outcome.quarantine_reason)
        return outcome

    def _close_streams(self, elapsed_s: float, deadline_s: float) -> None:
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        reader = self.reader
        if reader is threading.current_thread():
            # Finalized from the reader itself (garbage collection ran there): it cannot join itself.
            return
        if reader is not None:
            reader.join(timeout=max(0.1, deadline_s - elapsed_s))
            if reader.is_alive():
                # Something outside the tree still holds the pipe; the daemon reader keeps it.
                _log.warning("worker %s: stderr is still open after retirement", self.name)
                return
        if self.popen.stderr is not None:
            self.popen.stderr.close()

    def drain_stderr(self) -> None:
        stream = self.popen.stderr
        if stream is None:
            return
        logger = logging.getLogger(f"omni.worker.{self.name}")
        fd = stream.fileno()
        pending = b""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            while len(pending) > STDERR_LINE_LIMIT:
                lines.append(pending[:STDERR_LINE_LIMIT])
                pending = pending[STDERR_LINE_LIMIT:]
            self._emit(logger, lines)
        if pending:
            self._emit(logger, [pending])

    def _emit(self, logger: logging.Logger, lines: Iterable[bytes]) -> None:
        for raw in lines:
            text = raw.decode("utf-8", errors="replace").rstrip("\r")
            with self.tail_lock:
                self.tail.append(text)
            logger.log(STDERR_LOG_LEVEL, "%s", text)


def _retire_abandoned(state: _State) -> None:
    if state.outcome is None:
        _log.warning(
            "worker %s (pid %d) was not retired by its owner; retiring it now",
            state.name,
            state.identity.pid,
        )
    state.retire(5.0)


class WorkerProcess:
    """One worker process and its stdio, owned by exactly one caller.

    Made by :func:`spawn_worker`. ``stdin`` and ``stdout`` are raw (unbuffered) binary
    streams for the frame transport; stderr is drained into the logger
    ``omni.worker.<name>`` and its last lines kept for error reports. :meth:`retire` is
    idempotent; a worker that is never retired is retired when it is garbage-collected or
    at interpreter exit.
    """

    def __init__(
        self, popen: subprocess.Popen[bytes], name: str, identity: ProcessIdentity
    ) -> None:
        if popen.stdin is None or popen.stdout is None or popen.stderr is None:
            raise ValueError("a worker process needs stdin, stdout and stderr pipes")
        self._stdin: IO[bytes] = popen.stdin
        self._stdout: IO[bytes] = popen.stdout
        self._state = _State(popen, name, identity)
        # Registered before the reader starts, so a half-built worker is still retired.
        self._finalizer = weakref.finalize(self, _retire_abandoned, self._state)
        reader = threading.Thread(
            target=self._state.drain_stderr, name=f"omni-worker-{name}-stderr", daemon=True
        )
        self._state.reader = reader
        reader.start()

    @property
    def name(self) -> str:
        return self._state.name

    @property
    def pid(self) -> int:
        return self._state.identity.pid

    @property
    def identity(self) -> ProcessIdentity:
        """The pid and creation time read right after the process started."""
        return self._state.identity

    @property
    def stdin(self) -> IO[bytes]:
        return self._stdin

    @property
    def stdout(self) -> IO[bytes]:
        return self._stdout

    @property
    def returncode(self) -> int | None:
        """The exit code once the process has exited (negative: killed by that signal)."""
        return self.poll()

    def poll(self) -> int | None:
        """The exit code if the process has exited, else None; does not reap it before retirement."""
        return _peek_exit(self._state.popen)

    def wait_exit(self, timeout_s: float) -> int | None:
        """Wait up to ``timeout_s`` for the process to exit; its exit code, or None if still running."""
        until = time.monotonic() + timeout_s
        while True:
            code = self.poll()
            if code is not None or time.monotonic() >= until:
                return code
            time.sleep(_POLL_S)

    def stderr_tail(self) -> tuple[str, ...]:
        """The last stderr lines (at most :data:`STDERR_TAIL_LINES`), oldest first."""
        with self._state.tail_lock:
            return tuple(self._state.tail)

    @property
    def outcome(self) -> RetireOutcome | None:
        """The retirement outcome, once :meth:`retire` has run."""
        return self._state.outcome

    def retire(self, deadline_s: float = 5.0) -> RetireOutcome:
        """Stop the worker and its whole tree within ``deadline_s``; later calls return the same outcome."""
        outcome = self._state.retire(_check_deadline(deadline_s))
        self._finalizer.detach()
        return outcome

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.retire()

    def __repr__(self) -> str:
        state = "retired" if self._state.outcome is not None else "running"
        return f"<WorkerProcess {self.name} pid={self.pid} {state}>"


def _popen(spec: LaunchSpec) -> subprocess.Popen[bytes]:
    if sys.platform == "win32":
        return subprocess.Popen(
            list(spec.argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(spec.env),
            cwd=spec.cwd,
            close_fds=True,
            bufsize=0,
            creationflags=subprocess.CREATE_NEW_PROCESS_GROUP,
        )
    return subprocess.Popen(
        list(spec.argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(spec.env),
        cwd=spec.cwd,
        close_fds=True,
        bufsize=0,
        # Its own session and process group, so the whole tree can be signalled.
        start_new_session=True,
    )


def spawn_worker(spec: LaunchSpec, name: str) -> WorkerProcess:
    """Start a worker from ``spec``; ``name`` labels its logger and thread.

    Raises :class:`WorkerStartError` naming argv[0] and the OS error when it cannot start.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"worker name {name!r} must start with a letter or digit and use letters, digits, "
            "'.', '-' and '_'"
        )
    argv0 = spec.argv[0]
    if spec.os_domain == "windows" and current_os_domain() == "posix" and not is_wsl():
        raise WorkerStartError(
            f"cannot start worker {name!r}: {argv0}: its route runs in the Windows domain, which "
            "is reachable only from native Windows or from WSL",
            argv0=argv0,
        )
    try:
        popen = _popen(spec)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        where = f" (cwd {spec.cwd})" if spec.cwd is not None and exc.filename == spec.cwd else ""
        raise WorkerStartError(
            f"cannot start worker {name!r}: {argv0}: {reason}{where}", argv0=argv0, os_error=exc
        ) from exc
    try:
        identity = ProcessIdentity.of(popen.pid)
    except (ProcessLookupError, PermissionError) as exc:
        popen.kill()
        popen.communicate()
        raise WorkerStartError(
            f"cannot start worker {name!r}: {argv0}: its identity could not be read ({exc})",
            argv0=argv0,
            os_error=exc,
        ) from exc
    return WorkerProcess(popen, name, identity)
