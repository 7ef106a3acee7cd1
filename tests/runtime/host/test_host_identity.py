"""ProcessIdentity: pid plus creation time, checked against real processes."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time

import psutil
import pytest

from runtime.host.identity import CREATE_TIME_TOLERANCE_S, ProcessIdentity


def _unused_pid() -> int:
    """A pid that belonged to a process which has exited and been reaped, and is free now."""
    for _ in range(5):
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        child.wait()
        if not psutil.pid_exists(child.pid):
            return child.pid
    raise AssertionError("every reaped pid was reused at once")


def test_current_is_this_process() -> None:
    identity = ProcessIdentity.current()
    assert identity.pid == os.getpid()
    assert identity.create_time == pytest.approx(psutil.Process().create_time())
    assert identity.matches()


def test_of_a_live_child_matches_until_it_exits() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        identity = ProcessIdentity.of(child.pid)
        assert identity.pid == child.pid
        assert identity.matches()
        assert identity.process() is not None
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=10)
    assert not identity.matches()
    assert identity.process() is None


def test_an_unreaped_zombie_does_not_match_but_is_still_found() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = ProcessIdentity.of(child.pid)
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "child did not exit"
            time.sleep(0.01)
        assert not identity.matches()
        handle = identity.process()
        assert handle is not None
        assert handle.pid == child.pid
    finally:
        child.wait(timeout=10)


def test_a_different_create_time_does_not_match() -> None:
    me = ProcessIdentity.current()
    assert not ProcessIdentity(me.pid, me.create_time + 1.0).matches()
    assert ProcessIdentity(me.pid, me.create_time + 1.0).process() is None
    within = ProcessIdentity(me.pid, me.create_time + CREATE_TIME_TOLERANCE_S / 2)
    assert within.matches()


def test_of_a_missing_pid_raises_process_lookup_error() -> None:
    pid = _unused_pid()
    with pytest.raises(ProcessLookupError, match=f"no process with pid {pid}"):
        ProcessIdentity.of(pid)


def test_same_as_compares_pid_and_create_time_with_tolerance() -> None:
    base = ProcessIdentity(100, 1_700_000_000.25)
    assert base.same_as(ProcessIdentity(100, 1_700_000_000.2505))
    assert not base.same_as(ProcessIdentity(100, 1_700_000_000.26))
    assert not base.same_as(ProcessIdentity(101, 1_700_000_000.25))


def test_wire_round_trip_through_json() -> None:
    identity = ProcessIdentity.current()
    decoded = ProcessIdentity.from_wire(json.loads(json.dumps(identity.to_wire())))
    assert decoded == identity
    assert ProcessIdentity.from_wire({"pid": 7, "create_time": 12}) == ProcessIdentity(7, 12.0)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"pid": 1}, "missing field(s) create_time"),
        ({"create_time": 1.0}, "missing field(s) pid"),
        ({"pid": 1, "create_time": 1.0, "ppid": 0}, "unknown field(s) ppid"),
        ({"pid": "12", "create_time": 1.0}, "field 'pid' must be an integer"),
        ({"pid": True, "create_time": 1.0}, "field 'pid' must be an integer"),
        ({"pid": 12, "create_time": "now"}, "field 'create_time' must be a number"),
        ({"pid": 12, "create_time": None}, "field 'create_time' must be a number"),
        ({"pid": 0, "create_time": 1.0}, "pid must be a positive integer"),
        ({"pid": -3, "create_time": 1.0}, "pid must be a positive integer"),
        ({"pid": 3, "create_time": -1.0}, "create_time must be a finite, non-negative"),
        ({"pid": 3, "create_time": math.nan}, "create_time must be a finite, non-negative"),
        ({"pid": 3, "create_time": math.inf}, "create_time must be a finite, non-negative"),
    ],
)
def test_from_wire_refuses_malformed_identities(data: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        ProcessIdentity.from_wire(data)


def test_from_wire_refuses_a_non_mapping() -> None:
    with pytest.raises(ValueError, match="expected a mapping"):
        ProcessIdentity.from_wire([1, 2.0])  # type: ignore[arg-type]


def test_identity_is_a_frozen_value() -> None:
    identity = ProcessIdentity(5, 1.5)
    with pytest.raises(AttributeError):
        identity.pid = 6  # type: ignore[misc]
    assert {identity, ProcessIdentity(5, 1.5)} == {identity}
