"""A real ``omni-edge serve`` process for the server's tests, and views of what it holds."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import psutil

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

REPO = Path(__file__).resolve().parents[3]
SHM_DIR = Path("/dev/shm")
SERVING = re.compile(r"^serving (http://\S+/v1)")
#: How long loading the pipelines may take on a busy two-core machine.
START_TIMEOUT_S = 120.0
#: How long the server may take to close its pipelines and exit on SIGINT.
STOP_TIMEOUT_S = 60.0
API_KEY = "test-key-0123456789"
KEY_VAR = "OMNI_SERVE_TEST_KEY"


class ServeProcess:
    """``omni-edge serve PIPELINES --port 0`` in a subprocess: its URL, its worker processes
    and shared memory, and a clean stop (SIGINT, then the exit status)."""

    def __init__(
        self,
        pipelines: Sequence[Path],
        *,
        api_key: str | None = API_KEY,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        environment = dict(os.environ)
        environment.update(env or {})
        args = [sys.executable, "-m", "runtime.cli", "serve", *map(str, pipelines), "--port", "0"]
        if api_key is not None:
            environment[KEY_VAR] = api_key
            args += ["--api-key-env", KEY_VAR]
        args += list(extra_args)
        self.api_key = api_key
        self.stderr: deque[str] = deque(maxlen=400)
        self.process = subprocess.Popen(
            args,
            cwd=REPO,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._pump = threading.Thread(target=self._read_stderr, daemon=True)
        self._pump.start()
        self.url = self._wait_url(start_timeout_s)

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr.append(line.rstrip())

    def _wait_url(self, timeout_s: float) -> str:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            match = SERVING.match(line)
            if match:
                return match.group(1)
        self.stop()
        raise AssertionError("omni-edge serve did not start:\n" + "\n".join(self.stderr))

    @property
    def pid(self) -> int:
        return self.process.pid

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, **options: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers(), timeout=60.0, **options)

    def pipelines(self) -> dict[str, dict[str, Any]]:
        """``GET /v1/omni/pipelines`` by pipeline name."""
        with self.client() as client:
            response = client.get("/omni/pipelines")
        response.raise_for_status()
        return {entry["id"]: entry for entry in response.json()["data"]}

    def workers(self) -> set[tuple[int, float]]:
        """The server's live descendants (its worker processes), by pid and start time."""
        found = set()
        for child in psutil.Process(self.pid).children(recursive=True):
            try:
                if child.status() != psutil.STATUS_ZOMBIE:
                    found.add((child.pid, child.create_time()))
            except psutil.Error:
                continue
        return found

    def segments(self) -> set[str]:
        """The server's shared-memory segments (its own and its workers', by the prefix)."""
        prefix = f"oe-{self.pid}-"
        try:
            return {entry.name for entry in SHM_DIR.iterdir() if entry.name.startswith(prefix)}
        except OSError:
            return set()

    def stop(self) -> int:
        """SIGINT, wait for the exit; returns the status (kills after the deadline)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._pump.join(5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode


def wait_until(predicate: Any, what: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)
