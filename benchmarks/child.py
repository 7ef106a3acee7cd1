"""Run a benchmark child process (``python -m benchmarks.X``) and read its JSON lines.

Children measure what must start from a fresh process: cold start-up and peak memory. A
child prints one JSON object per line; the parent stamps each with the seconds since the
spawn. A child that meets a runtime refusal prints ``{"event": "error", "message": ...}``
and exits 2; the parent turns that into :class:`~benchmarks.base.NotRunnable`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from benchmarks.base import NotRunnable
from benchmarks.graphs import PROJECT_ROOT

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

#: Lines of a failed child's stderr quoted in the error.
STDERR_TAIL = 8
EXIT_REFUSED = 2


class ChildFailed(RuntimeError):
    """A child exited with an error or ran past its deadline; the message quotes its stderr."""


@dataclass(frozen=True, slots=True)
class ChildLine:
    at_s: float
    document: dict[str, Any]


def child_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment, with the checkout first on ``PYTHONPATH`` (the suite's own modules)."""
    env = {**os.environ, **(extra or {})}
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(PROJECT_ROOT) + (os.pathsep + existing if existing else "")
    return env


def run_child(
    module: str,
    args: Sequence[str],
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
) -> list[ChildLine]:
    """Run ``python -m module args`` to the end; its JSON lines, stamped from the spawn."""
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as stderr:
        started = time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=subprocess.PIPE,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            text=True,
            cwd=PROJECT_ROOT,
            env=child_environment(env),
        )
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            process.kill()

        watchdog = threading.Timer(timeout_s, expire)
        watchdog.start()
        lines: list[ChildLine] = []
        try:
            assert process.stdout is not None
            for raw in process.stdout:
                at = time.perf_counter() - started
                text = raw.strip()
                if text.startswith("{"):
                    lines.append(ChildLine(at, json.loads(text)))
            code = process.wait()
        finally:
            watchdog.cancel()
            if process.poll() is None:
                process.kill()
                process.wait()
        stderr.seek(0)
        tail = " | ".join(stderr.read().strip().splitlines()[-STDERR_TAIL:])
    errors = [line.document for line in lines if line.document.get("event") == "error"]
    if code == EXIT_REFUSED and errors:
        raise NotRunnable(str(errors[-1].get("message")))
    if expired.is_set():
        raise ChildFailed(f"{module} ran past {timeout_s:.0f} s and was killed; stderr: {tail}")
    if code != 0:
        raise ChildFailed(f"{module} exited with code {code}; stderr: {tail}")
    return lines


def event(lines: Sequence[ChildLine], name: str) -> ChildLine:
    """The child's line with ``"event": name`` (ChildFailed when it printed none)."""
    for line in lines:
        if line.document.get("event") == name:
            return line
    raise ChildFailed(f"the child printed no {name!r} line")
