"""The benchmarks' JACK dummy server: it comes up where clients reach it by name, plays in
real time, and leaves no process or shared memory when it stops."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import psutil
import pytest

from benchmarks.jack import SHM, JackUnavailable, jack_dummy

pytestmark = pytest.mark.audio


def test_the_dummy_server_runs_and_leaves_nothing(tmp_path: Path) -> None:
    if shutil.which("jackd") is None:
        pytest.skip("JACK is not installed: install the Debian package jackd2")
    before = {
        process.pid for process in psutil.process_iter(["name"]) if process.info["name"] == "jackd"
    }
    with jack_dummy(tmp_path) as server:
        listed = subprocess.run(
            ["jack_lsp", "--server", server.name],
            env={**server.environment, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        )
        # The dummy driver's playback ports are there for a client to connect to.
        assert "system:playback_1" in listed.stdout, listed.stderr
        running = {
            process.pid
            for process in psutil.process_iter(["name"])
            if process.info["name"] == "jackd"
        }
        assert running - before
    after = {
        process.pid for process in psutil.process_iter(["name"]) if process.info["name"] == "jackd"
    }
    assert after <= before
    assert not [entry.name for entry in SHM.iterdir() if server.name in entry.name]


def test_a_missing_jackd_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    with pytest.raises(JackUnavailable, match="Debian package jackd2"), jack_dummy(tmp_path):
        pass
