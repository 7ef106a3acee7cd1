"""Timing helpers: repeated measurements summarised by medians and tail percentiles."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence


@dataclass(frozen=True, slots=True)
class Samples:
    """Durations in seconds, in the order they were taken."""

    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("samples: at least one value is needed")

    @property
    def count(self) -> int:
        return len(self.values)

    def percentile(self, q: float) -> float:
        return float(np.percentile(np.asarray(self.values), q))

    @property
    def p50(self) -> float:
        return self.percentile(50)

    @property
    def p99(self) -> float:
        return self.percentile(99)

    @property
    def minimum(self) -> float:
        return min(self.values)


def time_calls(call: Callable[[], object], *, warmup: int, iterations: int) -> Samples:
    """Run ``call`` ``warmup`` times untimed, then ``iterations`` times timed one by one."""
    for _ in range(warmup):
        call()
    values = []
    for _ in range(iterations):
        started = time.perf_counter()
        call()
        values.append(time.perf_counter() - started)
    return Samples(tuple(values))


def interleaved(
    calls: Sequence[Callable[[], object]], *, warmup: int, rounds: int, batch: int
) -> list[Samples]:
    """Time several calls in alternating batches, so machine noise lands on all of them alike.

    Each round runs ``batch`` timed calls of each callable in turn; the result has one
    :class:`Samples` per callable with ``rounds * batch`` values.
    """
    for call in calls:
        for _ in range(warmup):
            call()
    values: list[list[float]] = [[] for _ in calls]
    for _ in range(rounds):
        for index, call in enumerate(calls):
            for _ in range(batch):
                started = time.perf_counter()
                call()
                values[index].append(time.perf_counter() - started)
    return [Samples(tuple(series)) for series in values]


def ms(seconds: float) -> float:
    return seconds * 1e3


def rounded(value: float, digits: int = 4) -> float:
    """A value rounded to ``digits`` significant digits, for readable JSON details."""
    if value == 0:
        return 0.0
    return float(f"{value:.{digits}g}")
