"""What every benchmark module provides to the suite, and the options it runs with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from benchmarks.figures import Figure, FigureSpec


class NotRunnable(Exception):
    """A prerequisite is missing on this machine; the message says which and how to get it."""


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """``quick`` trades precision for time (the CI mode); ``workdir`` is private and temporary."""

    quick: bool
    workdir: Path

    def count(self, full: int, quick: int) -> int:
        """An iteration count for this mode."""
        return quick if self.quick else full


@dataclass(frozen=True, slots=True)
class Benchmark:
    """A module's figures (declared up front) and the function that measures them.

    ``name`` is the short id that ``--only`` selects (``graph``, ``ledger``, ...).

    ``run`` returns one :class:`Figure` per spec; it raises :class:`NotRunnable` when a
    prerequisite is missing, and the suite then reports every spec as not run.
    """

    name: str
    specs: tuple[FigureSpec, ...]
    run: Callable[[BenchOptions], Sequence[Figure]]
    #: Why quick mode leaves this benchmark out (reported as the figures' reason); "" runs it.
    quick_skip: str = ""
