"""Shared parts of the reliability suite: the session's records and the leak census.

Every fault case, fuzz target and soak run appends one record to :data:`RECORDS`; the
suite's conftest writes them to the file named by ``OMNI_RELIABILITY_RECORDS`` when the
session ends, and ``benchmarks/reliability.py`` turns them into
``benchmarks/results/reliability.json``.

A :class:`Census` is taken before a scenario and compared after it: child processes,
the runtime's shared-memory segments, this process's file descriptors, files under the
scenario's own ``TMPDIR`` and ledger reservations. Cleanup is allowed a grace period
(stderr readers close their pipes on their own threads), after which anything still
there is a leak.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from runtime.ledger import outstanding_reservations
from tests.helpers.shm import session_segments

#: Records of this session: faults, fuzz targets, soak runs, security checks.
RECORDS: list[dict[str, Any]] = []
RECORDS_VARIABLE = "OMNI_RELIABILITY_RECORDS"

SHM_DIR = Path("/dev/shm")
#: Every shared-memory segment the runtime creates starts with this.
SHM_PREFIX = "oe-"
FD_DIR = Path("/proc/self/fd")
#: How long cleanup may take after a scenario ends before a resource counts as leaked.
LEAK_GRACE_S = 5.0


def live_children() -> dict[int, str]:
    """Every live (non-zombie) descendant of this process, with its command line."""
    found: dict[int, str] = {}
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                found[child.pid] = " ".join(child.cmdline()[:4])
        except psutil.Error:
            continue
    return found


def shm_segments() -> set[str]:
    """This session's runtime segments in /dev/shm (see :mod:`tests.helpers.shm`)."""
    return session_segments(SHM_PREFIX)


def open_fds() -> dict[int, str]:
    """This process's descriptors and what each points at."""
    fds: dict[int, str] = {}
    for entry in FD_DIR.iterdir():
        try:
            fds[int(entry.name)] = os.readlink(entry)
        except OSError:
            # The descriptor listing the directory itself is gone by now.
            continue
    return fds


def temp_files(root: Path) -> list[str]:
    """Everything left under ``root``, relative to it."""
    if not root.exists():
        return []
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


@dataclass(frozen=True, slots=True)
class Leaks:
    """What a scenario left behind, by kind (empty tuples: nothing)."""

    processes: tuple[str, ...] = ()
    shm: tuple[str, ...] = ()
    fds: tuple[str, ...] = ()
    temp_files: tuple[str, ...] = ()
    reservations: tuple[str, ...] = ()

    def counts(self) -> dict[str, int]:
        return {
            "processes": len(self.processes),
            "shm": len(self.shm),
            "fds": len(self.fds),
            "temp_files": len(self.temp_files),
            "reservations": len(self.reservations),
        }

    @property
    def total(self) -> int:
        return sum(self.counts().values())

    def describe(self) -> str:
        parts = [
            f"{kind}: {', '.join(items)}"
            for kind, items in (
                ("processes", self.processes),
                ("shared memory", self.shm),
                ("file descriptors", self.fds),
                ("temp files", self.temp_files),
                ("reservations", self.reservations),
            )
            if items
        ]
        return "; ".join(parts) or "nothing"


@dataclass
class Census:
    """Resources held before a scenario, to compare against afterwards."""

    tmpdir: Path
    children: set[int] = field(default_factory=set)
    segments: set[str] = field(default_factory=set)
    fds: dict[int, str] = field(default_factory=dict)
    reservations: int = 0

    @classmethod
    def take(cls, tmpdir: Path) -> Census:
        return cls(
            tmpdir=tmpdir,
            children=set(live_children()),
            segments=shm_segments(),
            fds=open_fds(),
            reservations=len(outstanding_reservations()),
        )

    def _leaks_now(self) -> Leaks:
        children = {pid: line for pid, line in live_children().items() if pid not in self.children}
        fds = open_fds()
        extra = len(fds) - len(self.fds)
        new_fds = sorted(
            f"{fd} -> {target}" for fd, target in fds.items() if self.fds.get(fd) != target
        )
        reservations = outstanding_reservations()
        return Leaks(
            processes=tuple(f"{pid} {line}" for pid, line in sorted(children.items())),
            shm=tuple(sorted(shm_segments() - self.segments)),
            # Descriptors reused for something else are fine; only a higher count leaks.
            fds=tuple(new_fds[: max(0, extra)]) if extra > 0 else (),
            temp_files=tuple(temp_files(self.tmpdir)),
            reservations=tuple(
                f"{name}: {item}" for name, item in reservations[self.reservations :]
            ),
        )

    def leaks(self, grace_s: float = LEAK_GRACE_S) -> Leaks:
        """What is left once cleanup has had ``grace_s`` to finish."""
        deadline = time.monotonic() + grace_s
        while True:
            found = self._leaks_now()
            if not found.total or time.monotonic() > deadline:
                return found
            time.sleep(0.02)


def record(section: str, **fields: Any) -> dict[str, Any]:
    """Append one record of ``section`` (fault, fuzz, soak, security) to the session."""
    entry = {"section": section, **fields}
    RECORDS.append(entry)
    return entry
