"""Waiting for the peer's answer awake: only while answers come within the budget."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from runtime.transport.awake import AwakeWait

POSIX = pytest.mark.skipif(
    sys.platform == "win32", reason="Windows pipes cannot be polled: the wait is off there"
)


@pytest.fixture
def pipe() -> object:
    read_fd, write_fd = os.pipe()
    yield read_fd, write_fd
    os.close(read_fd)
    os.close(write_fd)


def _round(awake: AwakeWait, write_fd: int, read_fd: int, delay_s: float) -> bool:
    """One frame out and its answer back after ``delay_s``; whether the wait caught it."""
    awake.sent()
    writer = threading.Timer(delay_s, os.write, (write_fd, b"x"))
    writer.start()
    caught = awake.wait()
    writer.join()
    os.read(read_fd, 1)
    awake.arrived()
    return caught


@POSIX
def test_it_polls_once_answers_came_within_the_budget(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    awake = AwakeWait(read_fd, 0.5)
    assert awake.enabled
    assert _round(awake, write_fd, read_fd, 0.0) is False, "no gap measured yet: sleep"
    assert awake.likely()
    assert _round(awake, write_fd, read_fd, 0.001) is True
    assert (awake.caught, awake.missed) == (1, 0)


@POSIX
def test_a_slow_answer_stops_the_polling_until_answers_are_quick_again(
    pipe: tuple[int, int],
) -> None:
    read_fd, write_fd = pipe
    awake = AwakeWait(read_fd, 0.02)
    _round(awake, write_fd, read_fd, 0.0)
    assert _round(awake, write_fd, read_fd, 0.1) is False, "polled the whole budget, then slept"
    assert awake.missed == 1
    assert not awake.likely()
    started = time.perf_counter()
    assert _round(awake, write_fd, read_fd, 0.0) is False
    assert time.perf_counter() - started < 0.5
    assert awake.missed == 1, "a slow gap remembered: no polling at all"
    _round(awake, write_fd, read_fd, 0.0)
    assert awake.likely(), "two quick answers: polling again"


@POSIX
def test_without_a_budget_or_a_descriptor_it_never_polls(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    for awake in (AwakeWait(read_fd, 0.0), AwakeWait(None, 0.5)):
        assert not awake.enabled
        awake.sent()
        os.write(write_fd, b"x")
        assert awake.wait() is False
        os.read(read_fd, 1)
        awake.arrived()
        assert not awake.likely()


@pytest.mark.skipif(
    sys.platform != "win32", reason="needs a Windows host (checks the Windows fallback)"
)
def test_on_windows_it_never_polls() -> None:
    awake = AwakeWait(0, 0.5)
    assert not awake.enabled
    assert awake.budget_s == 0.0
    awake.sent()
    assert awake.wait() is False
