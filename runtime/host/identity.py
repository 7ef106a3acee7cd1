"""Process identity: a pid plus the process's creation time.

A pid alone is not an identity: once a process is reaped its number can be given to an
unrelated process. Pairing it with the creation time the OS records lets the host check,
before it signals anything, that the pid still names the process it started.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

__all__ = ["CREATE_TIME_TOLERANCE_S", "ProcessIdentity"]

#: Creation times are compared with this slack: the OS stores them in ticks and the
#: float conversion may differ in the last digits between readers.
CREATE_TIME_TOLERANCE_S = 1e-3

_WIRE_KEYS = frozenset({"pid", "create_time"})


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """One process: its pid and its creation time (seconds since the epoch, as psutil reports)."""

    pid: int
    create_time: float

    def __post_init__(self) -> None:
        if isinstance(self.pid, bool) or not isinstance(self.pid, int) or self.pid <= 0:
            raise ValueError(f"process identity: pid must be a positive integer, got {self.pid!r}")
        if (
            isinstance(self.create_time, bool)
            or not isinstance(self.create_time, int | float)
            or not math.isfinite(self.create_time)
            or self.create_time < 0
        ):
            raise ValueError(
                "process identity: create_time must be a finite, non-negative number of "
                f"seconds, got {self.create_time!r}"
            )

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity:
        """The identity of the live process ``pid``.

        Raises :class:`ProcessLookupError` when there is no such process and
        :class:`PermissionError` when the OS will not reveal its creation time.
        """
        try:
            create_time = psutil.Process(pid).create_time()
        except psutil.NoSuchProcess as exc:
            raise ProcessLookupError(f"no process with pid {pid}") from exc
        except psutil.AccessDenied as exc:
            raise PermissionError(f"not allowed to read the creation time of pid {pid}") from exc
        return cls(pid=pid, create_time=float(create_time))

    @classmethod
    def current(cls) -> ProcessIdentity:
        """The identity of this process."""
        return cls.of(os.getpid())

    def same_as(self, other: ProcessIdentity) -> bool:
        """True when ``other`` names the same process (same pid, creation times within tolerance)."""
        return (
            self.pid == other.pid
            and abs(self.create_time - other.create_time) <= CREATE_TIME_TOLERANCE_S
        )

    def process(self) -> psutil.Process | None:
        """The psutil handle of this process, zombies included; None if the pid is gone or reused.

        Raises :class:`PermissionError` when the OS will not reveal the creation time, so the
        caller cannot tell either way.
        """
        try:
            handle = psutil.Process(self.pid)
            create_time = handle.create_time()
        except psutil.NoSuchProcess:
            return None
        except psutil.AccessDenied as exc:
            raise PermissionError(
                f"not allowed to read the creation time of pid {self.pid}"
            ) from exc
        if abs(create_time - self.create_time) > CREATE_TIME_TOLERANCE_S:
            return None
        return handle

    def matches(self) -> bool:
        """True when this pid is alive, is not a zombie and has the recorded creation time."""
        try:
            handle = self.process()
            return handle is not None and handle.status() != psutil.STATUS_ZOMBIE
        except (PermissionError, psutil.Error):
            return False

    def to_wire(self) -> dict[str, object]:
        """A JSON-ready mapping (for the worker's handshake announcement)."""
        return {"pid": self.pid, "create_time": self.create_time}

    @classmethod
    def from_wire(cls, data: Mapping[str, object]) -> ProcessIdentity:
        """Parse :meth:`to_wire` output; a clear :class:`ValueError` names a bad or unknown field."""
        if not isinstance(data, Mapping):
            raise ValueError(
                f"process identity: expected a mapping with 'pid' and 'create_time', got "
                f"{type(data).__name__}"
            )
        unknown = sorted(str(key) for key in data if key not in _WIRE_KEYS)
        if unknown:
            raise ValueError(
                f"process identity: unknown field(s) {', '.join(unknown)}; "
                "accepted fields are 'pid' and 'create_time'"
            )
        missing = sorted(key for key in _WIRE_KEYS if key not in data)
        if missing:
            raise ValueError(f"process identity: missing field(s) {', '.join(missing)}")
        pid = data["pid"]
        create_time = data["create_time"]
        if isinstance(pid, bool) or not isinstance(pid, int):
            raise ValueError(f"process identity: field 'pid' must be an integer, got {pid!r}")
        if isinstance(create_time, bool) or not isinstance(create_time, int | float):
            raise ValueError(
                f"process identity: field 'create_time' must be a number, got {create_time!r}"
            )
        return cls(pid=pid, create_time=float(create_time))
