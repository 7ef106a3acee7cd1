"""Peak resident memory of a process (``VmHWM`` on Linux, the peak working set on Windows).

Standard library and psutil only: the one-process baseline imports this, and nothing here
may add to what that process holds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import psutil


def peak_rss_bytes(pid: int | None = None) -> int | None:
    """The highest resident set size ``pid`` (default: this process) has had; None if unknown."""
    if sys.platform == "win32":
        process = psutil.Process(pid)
        return int(process.memory_info().peak_wset)
    status = Path("/proc") / ("self" if pid is None else str(pid)) / "status"
    try:
        text = status.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None
