"""What the numbers were measured on: CPU, cores, memory, load, library versions."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from runtime import __version__

#: Packages whose versions shape the figures (absent ones are reported as absent); vLLM lives
#: in its own environment and its version is in the vLLM figures' details.
VERSIONED_PACKAGES = ("numpy", "onnxruntime", "onnx", "piper-tts", "PySide6-Essentials")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` knows)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, or None where the OS has none."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def source_revision(root: Path) -> str | None:
    """The checkout's commit (with ``-dirty`` when it has changes), when git can tell."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if dirty else head


def machine_info(root: Path) -> dict[str, Any]:
    """A description of this machine and software, taken when the suite starts."""
    memory = psutil.virtual_memory()
    return {
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_bytes": memory.total,
        "available_memory_bytes_at_start": memory.available,
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "omni_edge_studio": __version__,
        "revision": source_revision(root),
        "packages": package_versions(),
        "load_average_at_start": load_average(),
    }
