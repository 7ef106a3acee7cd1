"""Which shared-memory segments belong to this test session.

Every segment the runtime makes is named ``oe-<controller pid>-<generation>-...``. A segment
is this session's when that pid is this process, one of its descendants, or a process that
is gone (which may have leaked it); a test session running beside this one on the same
machine owns the rest, and a residue check must neither count nor remove those.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

SHM_DIR = Path("/dev/shm")


def owner_pid(name: str) -> int | None:
    """The controller pid a segment's name carries, if it has one."""
    parts = name.split("-")
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None


def session_segments(prefix: str = "oe-") -> set[str]:
    """Names in /dev/shm starting with ``prefix`` that belong to this session."""
    try:
        names = {
            entry.name
            for entry in SHM_DIR.iterdir()
            if entry.name.startswith(prefix) and entry.is_file()
        }
    except OSError:
        return set()
    tree = {os.getpid(), *(child.pid for child in psutil.Process().children(recursive=True))}
    return {
        name
        for name in names
        if (pid := owner_pid(name)) is None or pid in tree or not psutil.pid_exists(pid)
    }
