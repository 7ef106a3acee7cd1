"""A JACK dummy server for the benchmarks that play audio: paced like a sound card (its clock
runs in real time), with no sound card. ``jackd2`` from Debian; absent, the caller says so."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterator

RATE: Final = 48000
PERIOD: Final = 512
SHM: Final = Path("/dev/shm")


class JackUnavailable(RuntimeError):
    """jackd is not installed, or did not come up (the message says which)."""


@dataclass(frozen=True, slots=True)
class JackServer:
    name: str
    environment: dict[str, str]


@contextlib.contextmanager
def jack_dummy(folder: Path) -> Iterator[JackServer]:
    """Start a JACK server on the dummy driver (48 kHz, 512-frame periods), yield the
    environment a client needs to reach it, and stop it, removing its shared memory."""
    jackd, jack_wait = shutil.which("jackd"), shutil.which("jack_wait")
    if jackd is None or jack_wait is None:
        raise JackUnavailable("JACK is not installed (Debian package jackd2)")
    name = f"omni-bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    home = folder / "jack-home"
    home.mkdir(parents=True, exist_ok=True)
    environment = {
        "JACK_DEFAULT_SERVER": name,
        "JACK_NO_AUDIO_RESERVATION": "1",
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(folder / "jack-xdg-empty"),
    }
    log_path = folder / "jackd.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [jackd, "-n", name, "--no-realtime", "-d", "dummy", "-r", str(RATE), "-p", str(PERIOD)],
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
            raise JackUnavailable(
                f"jackd did not come up: {log_path.read_text(errors='replace')[-500:]}"
            )
        yield JackServer(name, environment)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        for entry in SHM.iterdir():
            if name in entry.name:
                with contextlib.suppress(OSError):
                    entry.unlink()
