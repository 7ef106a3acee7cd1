"""Ledger operations per second: ``reserve_plan`` and ``release`` on a ``ResourceLedger``.

One operation is one call: a cycle reserves a one-stage plan on ``machine:ram`` and releases
it (two operations), as a graph stage does when it starts and retires. The baseline is the
floor of any thread-safe accounting: a lock, a dict of free amounts and a dict of
reservations, doing the same reserve and release with no validation, ids or events.
Details add a two-stage plan with per-stage releases and a ledger with a subscriber.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import TYPE_CHECKING, Final

from benchmarks.base import Benchmark, BenchOptions
from benchmarks.figures import Comparator, FigureSpec, Goal, Subject
from benchmarks.stats import rounded
from runtime.ledger import LedgerEvent, ResourceLedger

if TYPE_CHECKING:
    from collections.abc import Callable

    from benchmarks.figures import Figure

LEDGER_OPS: Final = FigureSpec(
    key="ledger.ops",
    name="Ledger reserve/release operations",
    unit="ops/s",
    goal=Goal(">= 100,000 ops/s", Comparator.AT_LEAST, 100_000.0, Subject.MEASUREMENT),
)
BASELINE_LABEL: Final = "lock + dict reserve/release with no checks (the floor)"
CONSTRAINT: Final = "machine:ram"
CAPACITY: Final = 64 << 30
DEMAND: Final = 256 << 20


class FloorLedger:
    """The least a thread-safe reserve/release can do: what the baseline measures."""

    def __init__(self, capacity: int) -> None:
        self._lock = threading.Lock()
        self._free = {CONSTRAINT: capacity}
        self._reserved: dict[int, int] = {}
        self._ids = itertools.count()

    def reserve(self, amount: int) -> int:
        with self._lock:
            if self._free[CONSTRAINT] < amount:
                raise ValueError("does not fit")
            self._free[CONSTRAINT] -= amount
            reservation = next(self._ids)
            self._reserved[reservation] = amount
            return reservation

    def release(self, reservation: int) -> None:
        with self._lock:
            self._free[CONSTRAINT] += self._reserved.pop(reservation)


def _ops_per_second(
    cycle: Callable[[], None], cycles: int, ops_per_cycle: int, rounds: int
) -> float:
    """The median over ``rounds`` of operations per second across ``cycles`` cycles."""
    rates = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(cycles):
            cycle()
        rates.append(cycles * ops_per_cycle / (time.perf_counter() - started))
    rates.sort()
    return rates[len(rates) // 2]


def _one_stage(ledger: ResourceLedger) -> Callable[[], None]:
    demands = {"stage-0": {CONSTRAINT: DEMAND}}

    def cycle() -> None:
        plan = ledger.reserve_plan("bench", demands)
        ledger.release(plan.stages["stage-0"].id)

    return cycle


def _two_stage(ledger: ResourceLedger) -> Callable[[], None]:
    demands = {"stage-0": {CONSTRAINT: DEMAND}, "stage-1": {CONSTRAINT: DEMAND}}

    def cycle() -> None:
        plan = ledger.reserve_plan("bench", demands)
        for reservation in plan.stages.values():
            ledger.release(reservation.id)

    return cycle


def measure(options: BenchOptions) -> list[Figure]:
    cycles = options.count(50_000, 10_000)
    rounds = options.count(5, 3)
    ledger = ResourceLedger({CONSTRAINT: CAPACITY}, name="bench")
    measured = _ops_per_second(_one_stage(ledger), cycles, 2, rounds)
    floor = FloorLedger(CAPACITY)

    def floor_cycle() -> None:
        floor.release(floor.reserve(DEMAND))

    baseline = _ops_per_second(floor_cycle, cycles, 2, rounds)
    two_stage = _ops_per_second(_two_stage(ledger), cycles // 2, 3, rounds)
    observed: list[LedgerEvent] = []
    watched = ResourceLedger({CONSTRAINT: CAPACITY}, name="bench-watched")
    unsubscribe = watched.subscribe(
        lambda change: observed.append(change) if len(observed) < 1 else None
    )
    try:
        with_subscriber = _ops_per_second(_one_stage(watched), cycles // 2, 2, rounds)
    finally:
        unsubscribe()
    if not ledger.snapshot().is_empty or not watched.snapshot().is_empty:
        raise AssertionError("the ledger benchmark left reservations behind")
    details = {
        "cycles_per_round": cycles,
        "rounds": rounds,
        "two_stage_plan_ops_s": rounded(two_stage),
        "with_subscriber_ops_s": rounded(with_subscriber),
    }
    note = ""
    if LEDGER_OPS.goal.check(measured, baseline) is False:
        note = (
            "Each operation validates the demands, builds immutable reservation records and "
            "ids under the lock; the floor shows what the interpreter allows on this machine."
        )
    return [LEDGER_OPS.measured(measured, baseline, BASELINE_LABEL, details, note)]


BENCHMARK: Final = Benchmark("ledger", (LEDGER_OPS,), measure)
