"""The record every benchmark returns: a :class:`Figure` with its baseline, ratio and goal.

A figure is either measured (``measurement`` and ``baseline`` from the same run, ``ratio``
= measurement / baseline) or *not run*, with the reason (a missing prerequisite, or the
error that stopped it). Records round-trip through JSON: :meth:`Figure.from_json` checks a
document's shape and is what the tests use to prove a results file is well formed.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections.abc import Mapping

#: Values a figure's ``details`` may hold (JSON scalars, or lists of them).
Detail = str | int | float | bool | None | Sequence[str | int | float | bool | None]


class FigureFormatError(ValueError):
    """A results document does not have the shape of a figure; the message names the field."""


class Comparator(enum.Enum):
    """How a goal compares its subject with the threshold."""

    AT_MOST = "<="
    AT_LEAST = ">="

    def holds(self, value: float, threshold: float) -> bool:
        return value <= threshold if self is Comparator.AT_MOST else value >= threshold


class Subject(enum.Enum):
    """Which value of a figure a goal constrains."""

    MEASUREMENT = "measurement"
    RATIO = "ratio"
    #: ``measurement - baseline``: the latency a path adds to its baseline.
    ADDED = "added"


class Status(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    #: Measured, with no goal to meet (reported for information).
    REPORTED = "reported"
    NOT_RUN = "not run"


@dataclass(frozen=True, slots=True)
class Goal:
    """``text`` as a person reads it; ``comparator``/``threshold``/``subject`` as checked.

    A goal without a comparator is "report only": the figure is measured, never judged.
    """

    text: str
    comparator: Comparator | None = None
    threshold: float | None = None
    subject: Subject = Subject.MEASUREMENT

    def __post_init__(self) -> None:
        if (self.comparator is None) != (self.threshold is None):
            raise ValueError(f"goal {self.text!r}: comparator and threshold go together")

    def check(self, measurement: float, baseline: float | None) -> bool | None:
        """Whether the goal is met; None when it has no comparator or lacks its value."""
        if self.comparator is None or self.threshold is None:
            return None
        value = _subject_value(self.subject, measurement, baseline)
        return None if value is None else self.comparator.holds(value, self.threshold)

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "comparator": None if self.comparator is None else self.comparator.value,
            "threshold": self.threshold,
            "subject": self.subject.value,
        }

    @classmethod
    def from_json(cls, document: object, where: str) -> Goal:
        data = _mapping(document, where)
        comparator = data.get("comparator")
        subject = data.get("subject")
        try:
            return cls(
                text=_string(data, "text", where),
                comparator=None if comparator is None else Comparator(comparator),
                threshold=_number(data, "threshold", where, optional=True),
                subject=Subject(subject),
            )
        except ValueError as exc:
            raise FigureFormatError(f"{where}: {exc}") from None


def _subject_value(subject: Subject, measurement: float, baseline: float | None) -> float | None:
    if subject is Subject.MEASUREMENT:
        return measurement
    if baseline is None:
        return None
    if subject is Subject.ADDED:
        return measurement - baseline
    return ratio_of(measurement, baseline)


def ratio_of(measurement: float, baseline: float | None) -> float | None:
    """``measurement / baseline``, or None when there is no usable baseline."""
    if baseline is None or baseline == 0 or not math.isfinite(baseline):
        return None
    return measurement / baseline


REPORT_ONLY: Final = "reported (no goal set)"


@dataclass(frozen=True, slots=True)
class Figure:
    """One benchmark figure: the measurement, its same-run baseline, the ratio and the goal.

    ``key`` is stable across runs (``graph.tiny_add``); ``name`` is what the table shows.
    ``details`` carries the distribution behind the headline (p50, p99, iterations, ...);
    ``note`` says what limits a missed goal or qualifies the number; ``reason`` says why a
    figure was not run.
    """

    key: str
    name: str
    unit: str
    goal: Goal
    measurement: float | None = None
    baseline: float | None = None
    baseline_label: str = ""
    details: Mapping[str, Detail] = field(default_factory=lambda: MappingProxyType({}))
    note: str = ""
    reason: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "details", MappingProxyType(dict(self.details)))
        if self.measurement is None and not self.reason:
            raise ValueError(f"figure {self.key}: a figure without a measurement needs a reason")
        if self.measurement is not None and not math.isfinite(self.measurement):
            raise ValueError(f"figure {self.key}: measurement {self.measurement} is not finite")

    @classmethod
    def not_run(cls, key: str, name: str, unit: str, goal: Goal, reason: str) -> Figure:
        """A figure that could not be measured on this machine, and why."""
        return cls(key=key, name=name, unit=unit, goal=goal, reason=reason)

    @property
    def ratio(self) -> float | None:
        return None if self.measurement is None else ratio_of(self.measurement, self.baseline)

    @property
    def passed(self) -> bool | None:
        """True/False against the goal; None when not run or when the goal is report-only."""
        if self.measurement is None:
            return None
        return self.goal.check(self.measurement, self.baseline)

    @property
    def status(self) -> Status:
        if self.measurement is None:
            return Status.NOT_RUN
        passed = self.passed
        if passed is None:
            return Status.REPORTED
        return Status.PASS if passed else Status.FAIL

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "name": self.name,
            "unit": self.unit,
            "measurement": self.measurement,
            "baseline": self.baseline,
            "baseline_label": self.baseline_label,
            "ratio": self.ratio,
            "goal": self.goal.to_json(),
            "passed": self.passed,
            "status": self.status.value,
            "details": dict(self.details),
            "note": self.note,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, document: object) -> Figure:
        """Parse one figure of a results file, checking that its derived fields agree."""
        data = _mapping(document, "figure")
        key = _string(data, "key", "figure")
        where = f"figure {key}"
        details = _mapping(data.get("details"), f"{where}.details")
        figure = cls(
            key=key,
            name=_string(data, "name", where),
            unit=_string(data, "unit", where),
            goal=Goal.from_json(data.get("goal"), f"{where}.goal"),
            measurement=_number(data, "measurement", where, optional=True),
            baseline=_number(data, "baseline", where, optional=True),
            baseline_label=_string(data, "baseline_label", where),
            details={
                str(name): _detail(value, f"{where}.details.{name}")
                for name, value in details.items()
            },
            note=_string(data, "note", where),
            reason=_string(data, "reason", where),
        )
        for name, expected in (
            ("ratio", figure.ratio),
            ("passed", figure.passed),
            ("status", figure.status.value),
        ):
            if data.get(name) != expected and not _close(data.get(name), expected):
                raise FigureFormatError(
                    f"{where}: {name} is {data.get(name)!r} but the figure's values give "
                    f"{expected!r}"
                )
        return figure


def _close(left: object, right: object) -> bool:
    return (
        isinstance(left, float)
        and isinstance(right, float)
        and math.isclose(left, right, rel_tol=1e-9)
    )


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise FigureFormatError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _string(data: Mapping[str, Any], name: str, where: str) -> str:
    value = data.get(name)
    if not isinstance(value, str):
        raise FigureFormatError(f"{where}.{name}: expected a string, got {value!r}")
    return value


def _number(
    data: Mapping[str, Any], name: str, where: str, *, optional: bool = False
) -> float | None:
    if name not in data:
        raise FigureFormatError(f"{where}.{name}: missing")
    value = data[name]
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise FigureFormatError(f"{where}.{name}: expected a finite number, got {value!r}")
    return float(value)


def _detail(value: object, where: str) -> Detail:
    scalars = (str, int, float, bool)
    if value is None or isinstance(value, scalars):
        return value
    if isinstance(value, list) and all(item is None or isinstance(item, scalars) for item in value):
        return list(value)
    raise FigureFormatError(f"{where}: expected a JSON scalar or a list of scalars, got {value!r}")


@dataclass(frozen=True, slots=True)
class FigureSpec:
    """What a benchmark promises to report, known before it runs (so a failure still shows)."""

    key: str
    name: str
    unit: str
    goal: Goal

    def measured(
        self,
        measurement: float,
        baseline: float | None,
        baseline_label: str,
        details: Mapping[str, Detail],
        note: str = "",
    ) -> Figure:
        return Figure(
            key=self.key,
            name=self.name,
            unit=self.unit,
            goal=self.goal,
            measurement=measurement,
            baseline=baseline,
            baseline_label=baseline_label,
            details=details,
            note=note,
        )

    def not_run(self, reason: str) -> Figure:
        return Figure.not_run(self.key, self.name, self.unit, self.goal, reason)
