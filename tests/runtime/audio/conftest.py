"""Audio test devices: an ALSA null device per test, and a JACK dummy server per test.

PortAudio fixes its device list when it starts, so the ALSA fixtures point alsa-lib at the
test's own configuration (``$XDG_CONFIG_HOME/alsa/asoundrc``, which alsa-lib 1.2.8 reads
besides ``~/.asoundrc``) and restart PortAudio. JACK scenarios run in a child process
(``jack_playback_child.py``): libjack maps JACK's registry once per process, so a test
process could not follow one server going away and the next one coming up.

Starting PortAudio probes JACK, and libjack creates its metadata database folder
``/dev/shm/jack_db-<uid>`` even when no server runs; a clean JACK server exit leaves its
``jack-shm-registry``. Those two belong to libjack and jackd, not to the player; the
fixtures remove them only when the test created them, and every other new entry in
/dev/shm still fails the test through the repository's residue guard.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from runtime.audio import open_stream_count, rescan_output_devices

SHM = Path("/dev/shm")
REPO = Path(__file__).resolve().parents[3]
CHILD = Path(__file__).with_name("jack_playback_child.py")
LIBJACK_METADATA = SHM / f"jack_db-{os.getuid()}"
JACK_REGISTRY = SHM / "jack-shm-registry"
JACK_RATE = 48000
JACK_PERIOD = 512

NULL_ASOUNDRC = """\
pcm.!default { type null }
pcm.omni_speaker_left { type null hint { show on description "Omni speaker left" } }
pcm.omni_speaker_right { type null hint { show on description "Omni speaker right" } }
"""


def _other_jack_servers(exclude: int | None = None) -> list[int]:
    pids = []
    for process in psutil.process_iter(["pid", "name"]):
        if process.info["name"] in ("jackd", "jackdbus") and process.info["pid"] != exclude:
            pids.append(process.info["pid"])
    return pids


@pytest.fixture(autouse=True)
def libjack_leftovers() -> Iterator[None]:
    """Remove libjack's metadata folder and jackd's registry when this test created them."""
    had_metadata = LIBJACK_METADATA.exists()
    had_registry = JACK_REGISTRY.exists()
    yield
    if _other_jack_servers():
        return
    if not had_metadata and LIBJACK_METADATA.is_dir():
        shutil.rmtree(LIBJACK_METADATA, ignore_errors=True)
    if not had_registry:
        JACK_REGISTRY.unlink(missing_ok=True)


class _Environment:
    """Set environment variables for a test and restore them exactly afterwards."""

    def __init__(self, values: dict[str, str]) -> None:
        self._values = values
        self._saved: dict[str, str | None] = {}

    def __enter__(self) -> None:
        for key, value in self._values.items():
            self._saved[key] = os.environ.get(key)
            os.environ[key] = value

    def __exit__(self, *_: object) -> None:
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _no_jack_server() -> str:
    return f"omni-absent-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def thread_baseline() -> Iterator[None]:
    """The test must end with no more Python threads, nor OS threads, than it began with.

    OS threads cover PortAudio's audio threads, which Python's ``threading`` does not see.
    """
    process = psutil.Process()
    before = set(threading.enumerate())
    os_threads = process.num_threads()
    yield
    deadline = time.monotonic() + 2.0
    while (
        set(threading.enumerate()) - before or process.num_threads() > os_threads
    ) and time.monotonic() < deadline:
        time.sleep(0.01)
    left = set(threading.enumerate()) - before
    assert not left, f"threads left running: {left}"
    assert process.num_threads() <= os_threads, (
        f"{process.num_threads() - os_threads} OS thread(s) left running (PortAudio or JACK)"
    )


@pytest.fixture
def alsa_null(tmp_path: Path) -> Iterator[Path]:
    """ALSA's default (and two named) PCMs are null devices: a working, unpaced output."""
    config = tmp_path / "xdg"
    (config / "alsa").mkdir(parents=True)
    (config / "alsa" / "asoundrc").write_text(NULL_ASOUNDRC)
    home = tmp_path / "home"
    home.mkdir()
    values = {
        "XDG_CONFIG_HOME": str(config),
        "HOME": str(home),
        "JACK_DEFAULT_SERVER": _no_jack_server(),
    }
    with _Environment(values):
        rescan_output_devices()
        yield config
        assert open_stream_count() == 0, "a test left a playback stream open"
    rescan_output_devices()


@pytest.fixture
def no_audio_devices(tmp_path: Path) -> Iterator[None]:
    """No ALSA configuration and no JACK server: PortAudio sees no sound hardware here."""
    config = tmp_path / "xdg"
    config.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    values = {
        "XDG_CONFIG_HOME": str(config),
        "HOME": str(home),
        "JACK_DEFAULT_SERVER": _no_jack_server(),
    }
    with _Environment(values):
        if rescan_output_devices():
            pytest.skip("this machine has audio output hardware, so 'no device' cannot occur")
        yield
    rescan_output_devices()


@dataclass(frozen=True, slots=True)
class JackServer:
    """A running JACK dummy server and how to run a playback scenario against it."""

    name: str
    pid: int
    rate: int
    period: int
    environment: dict[str, str]

    def run_scenario(
        self, scenario: str, timeout_s: float = 40.0, *, child: Path = CHILD
    ) -> dict[str, Any]:
        """Run ``child SCENARIO`` (``jack_playback_child.py`` unless named) in a fresh
        process; return its JSON."""
        completed = subprocess.run(
            [sys.executable, str(child), scenario],
            env={**os.environ, **self.environment, "PYTHONPATH": str(REPO)},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        assert completed.returncode == 0, (
            f"scenario {scenario!r} exited with {completed.returncode}:\n{completed.stderr}"
        )
        result: dict[str, Any] = json.loads(completed.stdout)
        return result


def _stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


@pytest.fixture
def jack_server(tmp_path: Path) -> Iterator[JackServer]:
    """A JACK dummy server at 48 kHz that this test starts, uses alone, and stops."""
    jackd = shutil.which("jackd")
    jack_wait = shutil.which("jack_wait")
    if jackd is None or jack_wait is None:
        pytest.skip("JACK is not installed: install the Debian package jackd2")
    name = f"omni-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    home = tmp_path / "home"
    home.mkdir()
    environment = {
        "JACK_DEFAULT_SERVER": name,
        "JACK_NO_AUDIO_RESERVATION": "1",
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg-empty"),
    }
    log_path = tmp_path / "jackd.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                jackd,
                "-n",
                name,
                "--no-realtime",
                "-d",
                "dummy",
                "-r",
                str(JACK_RATE),
                "-p",
                str(JACK_PERIOD),
            ],
            env={**os.environ, **environment},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        ready = subprocess.run(
            [jack_wait, "--wait", "--timeout", "10", "--server", name],
            env={**os.environ, **environment},
            capture_output=True,
            timeout=15,
            check=False,
        )
        if ready.returncode != 0 or process.poll() is not None:
            raise RuntimeError(f"jackd did not come up: {log_path.read_text(errors='replace')}")
        yield JackServer(
            name=name,
            pid=process.pid,
            rate=JACK_RATE,
            period=JACK_PERIOD,
            environment=environment,
        )
    finally:
        _stop_process(process)
    assert process.returncode == 0, f"jackd exited with {process.returncode}"
    leftovers = sorted(entry.name for entry in SHM.iterdir() if name in entry.name)
    assert not leftovers, f"the JACK server left shared memory behind: {leftovers}"
