"""Settling a retired stage's reservation, with real processes as the survivors."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest

from runtime.backends.retirement import settle_reservation
from runtime.host import ProcessIdentity, RetireOutcome, wait_processes_gone, watch_until_gone
from runtime.host.process import handles_of
from runtime.ledger import ResourceLedger

if TYPE_CHECKING:
    from collections.abc import Iterator

    from runtime.ledger import StageReservation

GiB = 1 << 30
#: How long a watcher may take to notice its processes are gone (it polls every 0.2 s).
NOTICE_BOUND_S = 5.0


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield child
    child.kill()
    child.wait()


def _reserve(ledger: ResourceLedger) -> StageReservation:
    plan = ledger.reserve_plan("test", {"s": {"machine:ram": GiB}})
    return plan.stages["s"]


def test_a_confirmed_tree_releases_at_once() -> None:
    ledger = ResourceLedger({"machine:ram": 4 * GiB})
    watch = settle_reservation(ledger, _reserve(ledger), None, stage="s")
    assert watch is None
    assert ledger.snapshot().is_empty


def test_an_unverified_tree_stays_quarantined() -> None:
    ledger = ResourceLedger({"machine:ram": 4 * GiB})
    reservation = _reserve(ledger)
    watch = settle_reservation(ledger, reservation, "could not be verified", stage="s")
    assert watch is None
    (record,) = ledger.snapshot().quarantined
    assert record.reason == "could not be verified"
    ledger.resolve_quarantine(reservation.id)


def test_survivors_keep_the_quarantine_until_they_exit(
    sleeper: subprocess.Popen[bytes],
) -> None:
    ledger = ResourceLedger({"machine:ram": 4 * GiB})
    cleaned: list[bool] = []
    watch = settle_reservation(
        ledger,
        _reserve(ledger),
        "process 1 was still alive",
        stage="s",
        survivors=[ProcessIdentity.of(sleeper.pid)],
        cleanup=lambda: cleaned.append(True),
    )
    assert watch is not None
    time.sleep(0.5)
    assert watch.is_alive()
    assert ledger.snapshot().quarantined
    assert ledger.snapshot().constraints["machine:ram"].free == 3 * GiB
    assert not cleaned

    sleeper.kill()
    sleeper.wait()
    watch.join(NOTICE_BOUND_S)
    assert not watch.is_alive()
    assert cleaned == [True]
    assert ledger.snapshot().is_empty
    assert ledger.snapshot().constraints["machine:ram"].free == 4 * GiB


def test_survivors_past_the_watch_stay_quarantined(sleeper: subprocess.Popen[bytes]) -> None:
    ledger = ResourceLedger({"machine:ram": 4 * GiB})
    reservation = _reserve(ledger)
    cleaned: list[bool] = []
    watch = settle_reservation(
        ledger,
        reservation,
        "still alive",
        stage="s",
        survivors=[ProcessIdentity.of(sleeper.pid)],
        cleanup=lambda: cleaned.append(True),
        watch_s=0.3,
    )
    assert watch is not None
    watch.join(NOTICE_BOUND_S)
    assert not watch.is_alive()
    sleeper.kill()
    sleeper.wait()
    time.sleep(0.3)
    assert not cleaned
    (record,) = ledger.snapshot().quarantined
    assert record.reason == "still alive"
    ledger.resolve_quarantine(reservation.id)


def test_a_quarantine_resolved_meanwhile_is_not_settled_twice(
    sleeper: subprocess.Popen[bytes],
) -> None:
    ledger = ResourceLedger({"machine:ram": 4 * GiB})
    reservation = _reserve(ledger)
    watch = settle_reservation(
        ledger,
        reservation,
        "still alive",
        stage="s",
        survivors=[ProcessIdentity.of(sleeper.pid)],
    )
    assert watch is not None
    ledger.resolve_quarantine(reservation.id)
    sleeper.kill()
    sleeper.wait()
    watch.join(NOTICE_BOUND_S)
    assert not watch.is_alive()
    assert ledger.snapshot().constraints["machine:ram"].free == 4 * GiB


def test_a_reused_pid_is_not_watched(sleeper: subprocess.Popen[bytes]) -> None:
    stale = ProcessIdentity(sleeper.pid, ProcessIdentity.of(sleeper.pid).create_time - 100.0)
    assert handles_of([stale]) == []
    called: list[float] = []
    watch = watch_until_gone("s", [stale], 5.0, called.append)
    watch.join(NOTICE_BOUND_S)
    assert len(called) == 1


def test_wait_processes_gone_returns_the_living(sleeper: subprocess.Popen[bytes]) -> None:
    (handle,) = handles_of([ProcessIdentity.of(sleeper.pid)])
    assert wait_processes_gone([handle], 0.2) == [handle]
    sleeper.kill()
    sleeper.wait()
    assert wait_processes_gone([handle], 2.0) == []


def test_watch_deadline_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive number of seconds"):
        watch_until_gone("s", [], 0.0, lambda _: None)


def test_the_quarantine_reason_names_each_survivor_and_its_state() -> None:
    outcome = RetireOutcome(
        confirmed_gone=False,
        verified=True,
        graceful=False,
        terminated=(7, 8),
        killed=(7, 8),
        survivors=(7, 8),
        elapsed_s=10.5,
        pid=6,
        survivor_identities=(ProcessIdentity(7, 1.0), ProcessIdentity(8, 2.0)),
        survivor_states=("disk-sleep", "running"),
    )
    reason = outcome.quarantine_reason
    assert reason is not None
    assert "7 (disk-sleep), 8 (running) of the tree of pid 6" in reason
