"""Fixtures for the transport tests: pipe pairs, a real echo worker, and a strict leak check."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from runtime.transport.channel import FramedChannel
from runtime.transport.shm import SHM_DIR, process_retained
from runtime.transport.stdio import start_log_pump

REPO_ROOT = Path(__file__).resolve().parents[3]
ECHO_WORKER = Path(__file__).with_name("echo_worker.py")


def shm_names(prefix: str = "") -> set[str]:
    return {name for name in os.listdir(SHM_DIR) if name.startswith(prefix)}


def _live_children() -> list[psutil.Process]:
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
        except psutil.NoSuchProcess:
            continue
    return alive


@pytest.fixture(autouse=True)
def no_transport_residue() -> Iterator[None]:
    """Every transport test leaves no segment, no retained buffer and no child process."""
    mine = f"oe-test-{os.getpid()}-"
    before = shm_names(mine)
    yield
    deadline = time.monotonic() + 2.0
    while _live_children() and time.monotonic() < deadline:
        time.sleep(0.02)
    children = _live_children()
    for child in children:
        child.kill()
    new_segments = shm_names(mine) - before
    for name in new_segments:
        (SHM_DIR / name).unlink(missing_ok=True)
    retained = process_retained()
    assert not children, f"child processes left running: {[c.pid for c in children]}"
    assert not new_segments, f"segments left in {SHM_DIR}: {sorted(new_segments)}"
    assert retained == (0, 0), f"shared memory still accounted as retained: {retained}"


@pytest.fixture
def shm_prefix() -> str:
    return f"oe-test-{os.getpid()}-{secrets.token_hex(4)}-"


@pytest.fixture
def channel_pair() -> Iterator[Callable[..., tuple[FramedChannel, FramedChannel]]]:
    """Make two channels joined by real pipes: (left, right)."""
    made: list[FramedChannel] = []

    def make(
        left: dict[str, Any] | None = None, right: dict[str, Any] | None = None, **both: Any
    ) -> tuple[FramedChannel, FramedChannel]:
        left_to_right = os.pipe()
        right_to_left = os.pipe()
        left_channel = FramedChannel(
            os.fdopen(right_to_left[0], "rb"),
            os.fdopen(left_to_right[1], "wb"),
            name="left",
            **{**both, **(left or {})},
        )
        right_channel = FramedChannel(
            os.fdopen(left_to_right[0], "rb"),
            os.fdopen(right_to_left[1], "wb"),
            name="right",
            **{**both, **(right or {})},
        )
        made.extend((left_channel, right_channel))
        return left_channel, right_channel

    yield make
    for channel in made:
        channel.close()


@dataclass
class EchoWorker:
    process: subprocess.Popen[bytes]
    channel: FramedChannel
    prefix: str | None
    log: list[str] = field(default_factory=list)
    log_thread: threading.Thread | None = None


@pytest.fixture
def echo_worker() -> Iterator[Callable[..., EchoWorker]]:
    """Start the echo worker as a real child process; kill and reap it on teardown."""
    started: list[EchoWorker] = []

    def start(
        generation: int = 1, prefix: str | None = None, threshold: int = 0, **options: Any
    ) -> EchoWorker:
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        process = subprocess.Popen(
            [sys.executable, str(ECHO_WORKER), str(generation), prefix or "-", str(threshold)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        assert process.stdin
        assert process.stdout
        assert process.stderr
        channel = FramedChannel(
            process.stdout,
            process.stdin,
            name="controller",
            shm_threshold=threshold,
            shm_prefix=prefix,
            same_domain=prefix is not None,
            **options,
        )
        worker = EchoWorker(process, channel, prefix)
        worker.log_thread = start_log_pump(process.stderr, worker.log.append, name="echo")
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.process.poll() is None:
            worker.process.kill()
        worker.process.wait(timeout=10)
        worker.channel.close()
        if worker.log_thread is not None:
            worker.log_thread.join(timeout=10)
