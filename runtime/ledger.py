"""The resource ledger: atomic, multi-constraint reservations for whole plans.

Capacities are pre-load ceilings per memory constraint (``machine:ram``,
``machine:vram:<id>``, ``wsl:quota``): the machine's, declared once and never rewritten
by a plan, not sampled from the OS. A plan's own declared capacities are *its* ceiling,
checked against its demands only (``reserve_plan(..., ceiling=...)``), so pipelines
with different ceilings share one ledger. A plan reserves every stage's demands at once:
either all of them fit in every constraint or nothing is charged and
:class:`~runtime.errors.AdmissionRefused` names the constraint, what the plan needs,
what is free, which stages asked and which plans hold the rest.

A reservation whose release cannot be confirmed (for example a worker tree whose
identity could not be verified) is *quarantined*: it stays charged, visible with its
reason, until :meth:`ResourceLedger.resolve_quarantine` frees it.

One lock guards the arithmetic; change events are queued under that lock and
delivered after it is released, in the order the changes happened.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from runtime.errors import AdmissionRefused, UsageError

__all__ = [
    "BudgetExplanation",
    "ConstraintBudget",
    "ConstraintState",
    "EventKind",
    "LedgerEvent",
    "LedgerSnapshot",
    "PlanReservation",
    "QuarantineRecord",
    "ReservationStateError",
    "ResourceLedger",
    "StageReservation",
    "UnknownReservation",
    "explain_budget",
    "format_bytes",
    "outstanding_reservations",
]

_logger = logging.getLogger(__name__)

EventKind = Literal["reserved", "released", "quarantined", "resolved", "capacity"]

_BYTE_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_bytes(n: int) -> str:
    """A byte count in binary units: ``512 B``, ``1.5 KiB``, ``512.0 MiB``, ``-1.0 GiB``."""
    sign = "-" if n < 0 else ""
    value = abs(n)
    if value < 1024:
        return f"{sign}{value} B"
    scaled = float(value)
    for unit in _BYTE_UNITS:
        scaled /= 1024
        # Move up a unit when rounding would print "1024.0".
        if round(scaled, 1) < 1024 or unit == _BYTE_UNITS[-1]:
            break
    return f"{sign}{scaled:.1f} {unit}"


class UnknownReservation(UsageError, KeyError):
    """A reservation id this ledger never issued."""

    def __init__(self, reservation_id: str, ledger: str) -> None:
        super().__init__(f"ledger {ledger}: unknown reservation {reservation_id!r}")
        self.reservation_id = reservation_id

    def __str__(self) -> str:
        # KeyError would quote the message; keep it readable.
        return str(self.args[0])


class ReservationStateError(UsageError):
    """The reservation exists but is in the wrong state for the call.

    For example releasing a quarantined reservation (resolve it instead), or resolving
    one that is not quarantined.
    """

    def __init__(self, message: str, *, reservation_id: str, state: str) -> None:
        super().__init__(message)
        self.reservation_id = reservation_id
        self.state = state


# ---------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class StageReservation:
    """What one stage of one plan holds: bytes per constraint."""

    id: str
    plan_id: str
    owner: str
    stage: str
    amounts: Mapping[str, int]

    def __hash__(self) -> int:
        return hash(self.id)

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "plan_id": self.plan_id,
            "owner": self.owner,
            "stage": self.stage,
            "amounts": dict(self.amounts),
        }


@dataclass(frozen=True, slots=True)
class PlanReservation:
    """Every stage reservation of one admitted plan."""

    plan_id: str
    owner: str
    stages: Mapping[str, StageReservation]

    def total(self) -> dict[str, int]:
        """The plan's demand summed over its stages, per constraint."""
        totals: dict[str, int] = {}
        for reservation in self.stages.values():
            for constraint, amount in reservation.amounts.items():
                totals[constraint] = totals.get(constraint, 0) + amount
        return totals

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(reservation.id for reservation in self.stages.values())


@dataclass(frozen=True, slots=True)
class QuarantineRecord:
    """A reservation kept charged because its release could not be confirmed."""

    reservation: StageReservation
    reason: str
    since: float  # time.monotonic() when it was quarantined

    def to_json(self) -> dict[str, object]:
        return {**self.reservation.to_json(), "reason": self.reason, "since": self.since}


@dataclass(frozen=True, slots=True)
class ConstraintState:
    """One constraint's capacity and what is charged against it."""

    name: str
    capacity: int
    reserved: int
    quarantined: int

    @property
    def free(self) -> int:
        return self.capacity - self.reserved - self.quarantined

    def to_json(self) -> dict[str, object]:
        return {
            "capacity": self.capacity,
            "reserved": self.reserved,
            "quarantined": self.quarantined,
            "free": self.free,
        }


@dataclass(frozen=True, slots=True)
class LedgerSnapshot:
    """A consistent view of the ledger at one version."""

    constraints: Mapping[str, ConstraintState]
    reservations: tuple[StageReservation, ...]
    quarantined: tuple[QuarantineRecord, ...]
    version: int

    @property
    def is_empty(self) -> bool:
        """True when nothing is reserved or quarantined."""
        return not self.reservations and not self.quarantined

    def to_json(self) -> dict[str, object]:
        return {
            "version": self.version,
            "constraints": {name: state.to_json() for name, state in self.constraints.items()},
            "reservations": [reservation.to_json() for reservation in self.reservations],
            "quarantined": [record.to_json() for record in self.quarantined],
        }


@dataclass(frozen=True, slots=True)
class LedgerEvent:
    """A change to the ledger, with the snapshot right after it."""

    kind: EventKind
    snapshot: LedgerSnapshot
    detail: str


# ---------------------------------------------------------------------------- budgets


@dataclass(frozen=True, slots=True)
class ConstraintBudget:
    """How a plan's demands on one constraint compare with its capacity."""

    constraint: str
    capacity: int
    in_use: int
    demands: Mapping[str, int]  # stage -> amount
    total: int
    headroom: int  # capacity - in_use - total; negative when over
    fits: bool
    declared: bool = True

    def to_json(self) -> dict[str, object]:
        return {
            "constraint": self.constraint,
            "declared": self.declared,
            "capacity": self.capacity,
            "in_use": self.in_use,
            "demands": dict(self.demands),
            "total": self.total,
            "headroom": self.headroom,
            "fits": self.fits,
        }

    def to_text(self) -> str:
        parts = [f"capacity {format_bytes(self.capacity)}" if self.declared else "not declared"]
        if self.in_use:
            parts.append(f"in use {format_bytes(self.in_use)}")
        if self.demands:
            parts.append(
                ", ".join(
                    f"{stage} needs {format_bytes(amount)}"
                    for stage, amount in self.demands.items()
                )
            )
        else:
            parts.append("no stage needs it")
        parts.append(f"total {format_bytes(self.total)}")
        if self.declared:
            parts.append(f"headroom {format_bytes(self.headroom)}")
        verdict = "fits" if self.fits else "does not fit"
        return f"{self.constraint}: {'; '.join(parts)}: {verdict}"


@dataclass(frozen=True, slots=True)
class BudgetExplanation:
    """Per-constraint arithmetic of whether a plan fits, for people and for JSON."""

    constraints: tuple[ConstraintBudget, ...]

    @property
    def fits(self) -> bool:
        return all(budget.fits for budget in self.constraints)

    def to_json(self) -> dict[str, object]:
        return {
            "fits": self.fits,
            "constraints": [budget.to_json() for budget in self.constraints],
        }

    def to_text(self) -> str:
        return "\n".join(budget.to_text() for budget in self.constraints)


def _check_amount(value: object, what: str) -> int:
    # bool is an int subclass, but True bytes is a mistake, not a size.
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what}: expected a whole number of bytes, got {value!r}")
    if value < 0:
        raise ValueError(f"{what}: must be >= 0, got {value}")
    return int(value)


def _parse_capacities(capacities: Mapping[str, int]) -> dict[str, int]:
    if not isinstance(capacities, Mapping):
        raise TypeError(f"capacities: expected a mapping, got {type(capacities).__name__}")
    parsed: dict[str, int] = {}
    for constraint, capacity in capacities.items():
        if not isinstance(constraint, str) or not constraint:
            raise ValueError(f"capacities: bad constraint name {constraint!r}")
        parsed[constraint] = _check_amount(capacity, f"capacity of {constraint}")
    return parsed


def _parse_demands(
    demands_by_stage: Mapping[str, Mapping[str, int]],
) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """Copy and check stage -> constraint -> bytes; also return the totals per constraint."""
    # Exact-type checks first: this runs on every reservation and ABC checks are slow.
    if type(demands_by_stage) is not dict and not isinstance(demands_by_stage, Mapping):
        raise TypeError(
            f"demands: expected a mapping of stage -> demands, got {type(demands_by_stage).__name__}"
        )
    parsed: dict[str, dict[str, int]] = {}
    totals: dict[str, int] = {}
    for stage, demands in demands_by_stage.items():
        if not isinstance(stage, str) or not stage:
            raise ValueError(f"demands: bad stage name {stage!r}")
        if type(demands) is not dict and not isinstance(demands, Mapping):
            raise TypeError(
                f"demands of stage {stage}: expected a mapping of constraint -> bytes, "
                f"got {type(demands).__name__}"
            )
        stage_demands = dict(demands)
        for constraint, amount in stage_demands.items():
            if not isinstance(constraint, str) or not constraint:
                raise ValueError(f"demands of stage {stage}: bad constraint name {constraint!r}")
            if type(amount) is not int or amount < 0:
                amount = stage_demands[constraint] = _check_amount(
                    amount, f"demand of stage {stage} on {constraint}"
                )
            totals[constraint] = totals.get(constraint, 0) + amount
        parsed[stage] = stage_demands
    return parsed, totals


def _askers(demands: Mapping[str, Mapping[str, int]], constraint: str) -> tuple[str, ...]:
    """The stages that ask for a positive amount of ``constraint`` (or name it at all)."""
    positive = tuple(s for s, d in demands.items() if d.get(constraint, 0) > 0)
    return positive or tuple(s for s, d in demands.items() if constraint in d)


def _check_ceiling(
    owner: str,
    ceiling: Mapping[str, int],
    demands: Mapping[str, Mapping[str, int]],
    totals: Mapping[str, int],
) -> None:
    """Refuse a plan whose demands exceed its own declared capacities (or name one it does
    not declare), whatever the shared ledger has free."""
    for constraint, need in totals.items():
        limit = ceiling.get(constraint)
        if limit is not None and need <= limit:
            continue
        stages = _askers(demands, constraint)
        asked = f"{constraint} needs {format_bytes(need)} for {', '.join(stages)}"
        if limit is None:
            declared = ", ".join(ceiling) or "none"
            detail = f"{owner} does not declare it as a capacity (declared: {declared})"
        else:
            detail = (
                f"{owner}'s own declared capacity is {format_bytes(limit)} "
                f"(short by {format_bytes(need - limit)})"
            )
        raise AdmissionRefused(
            f"admission refused: {asked} but {detail}",
            constraint=constraint,
            needed=need,
            free=limit or 0,
            stages=stages,
        )


def _explain(
    capacities: Mapping[str, int],
    demands: Mapping[str, Mapping[str, int]],
    in_use: Mapping[str, int],
) -> BudgetExplanation:
    names = list(capacities)
    for stage_demands in demands.values():
        names.extend(c for c in stage_demands if c not in capacities and c not in names)
    budgets = []
    for name in names:
        asked = {s: d[name] for s, d in demands.items() if name in d}
        total = sum(asked.values())
        declared = name in capacities
        capacity = capacities.get(name, 0)
        used = in_use.get(name, 0)
        headroom = capacity - used - total
        budgets.append(
            ConstraintBudget(
                constraint=name,
                capacity=capacity,
                in_use=used,
                demands=MappingProxyType(asked),
                total=total,
                headroom=headroom,
                fits=declared and headroom >= 0,
                declared=declared,
            )
        )
    return BudgetExplanation(tuple(budgets))


def explain_budget(
    capacities: Mapping[str, int],
    demands_by_stage: Mapping[str, Mapping[str, int]],
    *,
    in_use: Mapping[str, int] | None = None,
) -> BudgetExplanation:
    """Explain, per constraint, whether the stages' demands fit the capacities.

    Constraints appear in the order of ``capacities``, then any demanded but undeclared
    constraint (which never fits). ``in_use`` is what is already charged elsewhere.
    """
    parsed_in_use: dict[str, int] = {}
    for constraint, amount in (in_use or {}).items():
        parsed_in_use[constraint] = _check_amount(amount, f"in_use of {constraint}")
    demands, _totals = _parse_demands(demands_by_stage)
    return _explain(_parse_capacities(capacities), demands, parsed_in_use)


# ---------------------------------------------------------------------------- ledger

_LEDGERS: weakref.WeakSet[ResourceLedger] = weakref.WeakSet()
_LEDGERS_LOCK = threading.Lock()


def outstanding_reservations() -> list[tuple[str, StageReservation | QuarantineRecord]]:
    """Everything still charged in any live ledger, as ``(ledger name, item)`` pairs."""
    with _LEDGERS_LOCK:
        ledgers = list(_LEDGERS)
    outstanding: list[tuple[str, StageReservation | QuarantineRecord]] = []
    for ledger in ledgers:
        snapshot = ledger.snapshot()
        outstanding.extend((ledger.name, reservation) for reservation in snapshot.reservations)
        outstanding.extend((ledger.name, record) for record in snapshot.quarantined)
    return outstanding


Subscriber = Callable[[LedgerEvent], None]


class ResourceLedger:
    """Capacities per constraint and the reservations charged against them.

    Thread-safe. Events go to subscribers outside the lock, in change order, on the
    thread of whichever caller is delivering at the time.
    """

    __slots__ = (
        "__weakref__",
        "_capacity",
        "_dispatching",
        "_free",
        "_lock",
        "_name",
        "_next_plan",
        "_pending",
        "_plan_prefix",
        "_quarantined",
        "_quarantined_total",
        "_reserved",
        "_subscribers",
        "_version",
    )

    def __init__(
        self, capacities: Mapping[str, int] | None = None, *, name: str = "ledger"
    ) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._capacity: dict[str, int] = {}
        # free = capacity - reserved - quarantined, kept directly so admission is one lookup.
        self._free: dict[str, int] = {}
        self._quarantined_total: dict[str, int] = {}
        self._reserved: dict[str, StageReservation] = {}
        self._quarantined: dict[str, QuarantineRecord] = {}
        self._version = 0
        # A random prefix per ledger plus a counter: unique here, unguessable across ledgers,
        # and lets release() tell "already released" from "never issued" without a history.
        self._plan_prefix = secrets.token_hex(4) + "-"
        self._next_plan = 0
        self._subscribers: tuple[tuple[object, Subscriber], ...] = ()
        self._pending: deque[LedgerEvent] = deque()
        self._dispatching = threading.Lock()
        if capacities:
            self._capacity_apply(_parse_capacities(capacities))
            self._version = 0
        with _LEDGERS_LOCK:
            _LEDGERS.add(self)

    @property
    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"ResourceLedger(name={self._name!r}, version={self._version})"

    # ------------------------------------------------------------------ capacities

    def _capacity_apply(self, parsed: Mapping[str, int]) -> tuple[dict[str, int], list[str]]:
        """Add the constraints not declared yet (lock held). Returns effective values and
        changes; a constraint already declared keeps its capacity."""
        effective: dict[str, int] = {}
        changed: list[str] = []
        for constraint, capacity in parsed.items():
            if constraint not in self._capacity:
                self._capacity[constraint] = capacity
                self._free[constraint] = capacity
                self._quarantined_total[constraint] = 0
                changed.append(f"{constraint} {format_bytes(capacity)}")
            effective[constraint] = self._capacity[constraint]
        if changed:
            self._version += 1
        return effective, changed

    def declare_capacities(self, capacities: Mapping[str, int]) -> dict[str, int]:
        """Add the constraints this ledger does not have yet, with these capacities.

        A constraint already declared keeps its capacity, neither lowered nor raised: the
        capacities are the machine's, so a plan loaded later never rewrites a ceiling that
        plans loaded earlier hold. Returns the effective capacity of each named constraint.
        """
        parsed = _parse_capacities(capacities)
        with self._lock:
            effective, changed = self._capacity_apply(parsed)
            if changed and self._subscribers:
                self._queue_locked("capacity", ", ".join(changed))
        self._deliver()
        return effective

    def replace_capacities(self, capacities: Mapping[str, int]) -> dict[str, int]:
        """Make ``capacities`` the ledger's own when the machine itself changes (the studio
        switching to another topology): each named constraint takes exactly its new
        capacity, raised or lowered; a constraint no longer named is dropped when nothing is
        charged against it, and keeps its capacity while something is.

        Lowering a capacity below what is charged is refused, and then nothing changes.
        Returns the effective capacity of each named constraint.
        """
        parsed = _parse_capacities(capacities)
        with self._lock:
            for constraint, capacity in parsed.items():
                current = self._capacity.get(constraint)
                charged = 0 if current is None else current - self._free[constraint]
                if capacity < charged:
                    raise AdmissionRefused(
                        f"admission refused: cannot set {constraint} to "
                        f"{format_bytes(capacity)} while {format_bytes(charged)} is charged",
                        constraint=constraint,
                        needed=charged,
                        free=capacity,
                        holders=self._holders_locked(constraint),
                    )
            changed: list[str] = []
            for constraint in [name for name in self._capacity if name not in parsed]:
                if self._capacity[constraint] == self._free[constraint]:
                    del self._capacity[constraint], self._free[constraint]
                    del self._quarantined_total[constraint]
                    changed.append(f"{constraint} dropped")
            for constraint, capacity in parsed.items():
                current = self._capacity.get(constraint)
                if current == capacity:
                    continue
                if current is None:
                    self._free[constraint] = capacity
                    self._quarantined_total[constraint] = 0
                else:
                    self._free[constraint] += capacity - current
                self._capacity[constraint] = capacity
                changed.append(f"{constraint} {format_bytes(capacity)}")
            if changed:
                self._version += 1
                if self._subscribers:
                    self._queue_locked("capacity", ", ".join(changed))
        self._deliver()
        return dict(parsed)

    # ------------------------------------------------------------------ reserve

    def reserve_plan(
        self,
        owner: str,
        demands_by_stage: Mapping[str, Mapping[str, int]],
        *,
        ceiling: Mapping[str, int] | None = None,
    ) -> PlanReservation:
        """Charge every stage's demands at once, or nothing.

        ``ceiling`` is the plan's own declared capacities: its demands must fit them
        whatever is free. Raises :class:`AdmissionRefused` naming the first constraint that
        exceeds the ceiling, does not fit or is not declared, what the plan needs of it,
        what is free, which stages asked and which plans hold the rest;
        ``ValueError``/``TypeError`` for malformed demands.
        """
        if not isinstance(owner, str) or not owner:
            raise ValueError(f"owner: expected a non-empty string, got {owner!r}")
        demands, totals = _parse_demands(demands_by_stage)
        if not demands:
            raise ValueError("demands: a plan needs at least one stage")
        if ceiling is not None:
            _check_ceiling(owner, _parse_capacities(ceiling), demands, totals)
        with self._lock:
            free = self._free
            for constraint, need in totals.items():
                available = free.get(constraint)
                if available is None or need > available:
                    raise self._refusal(constraint, need, demands)
            for constraint, need in totals.items():
                free[constraint] -= need
            plan_id = f"{self._plan_prefix}{self._next_plan}"
            self._next_plan += 1
            stages_out: dict[str, StageReservation] = {}
            for stage, stage_demands in demands.items():
                reservation = StageReservation(
                    f"{plan_id}/{stage}", plan_id, owner, stage, MappingProxyType(stage_demands)
                )
                self._reserved[reservation.id] = reservation
                stages_out[stage] = reservation
            self._version += 1
            if self._subscribers:
                self._queue_locked("reserved", f"{plan_id} for {owner}: {', '.join(stages_out)}")
        self._deliver()
        return PlanReservation(plan_id, owner, MappingProxyType(stages_out))

    def _refusal(
        self, constraint: str, need: int, demands: Mapping[str, Mapping[str, int]]
    ) -> AdmissionRefused:
        """The error for a plan that does not fit ``constraint`` (lock held)."""
        stages = _askers(demands, constraint)
        asked = f"{constraint} needs {format_bytes(need)} for {', '.join(stages)}"
        capacity = self._capacity.get(constraint)
        if capacity is None:
            declared = ", ".join(self._capacity) or "none"
            message = f"{asked} but it is not a declared constraint (declared: {declared})"
            free = 0
        else:
            free = self._free[constraint]
            message = f"{asked} but only {format_bytes(free)} is free of {format_bytes(capacity)}"
        holders = self._holders_locked(constraint)
        if holders:
            message += "; held by " + ", ".join(
                f"{owner} ({format_bytes(amount)})" for owner, amount in holders
            )
        return AdmissionRefused(
            f"admission refused: {message}",
            constraint=constraint,
            needed=need,
            free=free,
            stages=stages,
            holders=holders,
        )

    def _holders_locked(self, constraint: str) -> tuple[tuple[str, int], ...]:
        """What each owner holds of ``constraint`` (lock held), largest first; what is
        quarantined counts under ``<owner> (quarantined)``."""
        held: dict[str, int] = {}
        for reservation in self._reserved.values():
            amount = reservation.amounts.get(constraint, 0)
            if amount:
                held[reservation.owner] = held.get(reservation.owner, 0) + amount
        for record in self._quarantined.values():
            amount = record.reservation.amounts.get(constraint, 0)
            if amount:
                name = f"{record.reservation.owner} (quarantined)"
                held[name] = held.get(name, 0) + amount
        return tuple(sorted(held.items(), key=lambda item: (-item[1], item[0])))

    def check_plan(self, demands_by_stage: Mapping[str, Mapping[str, int]]) -> BudgetExplanation:
        """Whether a plan would fit now, per constraint, without reserving anything."""
        demands, _totals = _parse_demands(demands_by_stage)
        with self._lock:
            capacities = dict(self._capacity)
            in_use = {name: capacity - self._free[name] for name, capacity in capacities.items()}
        return _explain(capacities, demands, in_use)

    # ------------------------------------------------------------------ release

    def _issued_here(self, reservation_id: str) -> bool:
        """True when the id has this ledger's form and a plan number it already issued."""
        plan_id, sep, stage = reservation_id.partition("/")
        if not sep or not stage or not plan_id.startswith(self._plan_prefix):
            return False
        number = plan_id[len(self._plan_prefix) :]
        return number.isdecimal() and int(number) < self._next_plan

    def release(self, reservation_id: str) -> bool:
        """Free one stage reservation. False if it was already released.

        Raises :class:`UnknownReservation` for an id this ledger never issued and
        :class:`ReservationStateError` for a quarantined one (use resolve_quarantine).
        """
        with self._lock:
            reservation = self._reserved.pop(reservation_id, None)
            if reservation is None:
                record = self._quarantined.get(reservation_id)
                if record is not None:
                    raise ReservationStateError(
                        f"ledger {self._name}: reservation {reservation_id!r} is quarantined "
                        f"({record.reason}); resolve it instead of releasing it",
                        reservation_id=reservation_id,
                        state="quarantined",
                    )
                if self._issued_here(reservation_id):
                    return False
                raise UnknownReservation(reservation_id, self._name)
            free = self._free
            for constraint, amount in reservation.amounts.items():
                free[constraint] += amount
            self._version += 1
            if self._subscribers:
                self._queue_locked("released", reservation_id)
        self._deliver()
        return True

    def release_plan(self, plan: PlanReservation) -> None:
        """Free every stage of a plan that is still reserved, in one change.

        Stages already released are skipped; quarantined stages stay charged until
        they are resolved. A plan this ledger never issued raises
        :class:`UnknownReservation` and changes nothing.
        """
        if not plan.plan_id.startswith(self._plan_prefix):
            raise UnknownReservation(plan.plan_id, self._name)
        released: list[str] = []
        with self._lock:
            reserved = self._reserved
            free = self._free
            for stage_reservation in plan.stages.values():
                reservation = reserved.pop(stage_reservation.id, None)
                if reservation is not None:
                    for constraint, amount in reservation.amounts.items():
                        free[constraint] += amount
                    released.append(reservation.id)
            if released:
                self._version += 1
                if self._subscribers:
                    self._queue_locked("released", ", ".join(released))
        self._deliver()

    # ------------------------------------------------------------------ quarantine

    def quarantine(self, reservation_id: str, reason: str) -> None:
        """Keep a reservation charged because its release is uncertain; record why."""
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError("quarantine: a reason is required")
        with self._lock:
            reservation = self._reserved.pop(reservation_id, None)
            if reservation is None:
                record = self._quarantined.get(reservation_id)
                if record is not None:
                    raise ReservationStateError(
                        f"ledger {self._name}: reservation {reservation_id!r} is already "
                        f"quarantined ({record.reason})",
                        reservation_id=reservation_id,
                        state="quarantined",
                    )
                if self._issued_here(reservation_id):
                    raise ReservationStateError(
                        f"ledger {self._name}: reservation {reservation_id!r} was already "
                        "released; there is nothing to quarantine",
                        reservation_id=reservation_id,
                        state="released",
                    )
                raise UnknownReservation(reservation_id, self._name)
            quarantined_total = self._quarantined_total
            for constraint, amount in reservation.amounts.items():
                quarantined_total[constraint] += amount
            self._quarantined[reservation_id] = QuarantineRecord(
                reservation, reason, time.monotonic()
            )
            self._version += 1
            if self._subscribers:
                self._queue_locked("quarantined", f"{reservation_id}: {reason}")
        self._deliver()

    def resolve_quarantine(self, reservation_id: str) -> None:
        """Free a quarantined reservation once its release has been confirmed."""
        with self._lock:
            record = self._quarantined.pop(reservation_id, None)
            if record is None:
                if reservation_id in self._reserved:
                    state = "reserved"
                    hint = "it is not quarantined; release it instead"
                elif self._issued_here(reservation_id):
                    state = "released"
                    hint = "it was already freed"
                else:
                    raise UnknownReservation(reservation_id, self._name)
                raise ReservationStateError(
                    f"ledger {self._name}: cannot resolve {reservation_id!r}: {hint}",
                    reservation_id=reservation_id,
                    state=state,
                )
            quarantined_total = self._quarantined_total
            free = self._free
            for constraint, amount in record.reservation.amounts.items():
                quarantined_total[constraint] -= amount
                free[constraint] += amount
            self._version += 1
            if self._subscribers:
                self._queue_locked("resolved", reservation_id)
        self._deliver()

    # ------------------------------------------------------------------ views and events

    def _snapshot_locked(self) -> LedgerSnapshot:
        constraints = {}
        for name, capacity in self._capacity.items():
            quarantined = self._quarantined_total[name]
            reserved = capacity - self._free[name] - quarantined
            constraints[name] = ConstraintState(name, capacity, reserved, quarantined)
        return LedgerSnapshot(
            MappingProxyType(constraints),
            tuple(self._reserved.values()),
            tuple(self._quarantined.values()),
            self._version,
        )

    def snapshot(self) -> LedgerSnapshot:
        with self._lock:
            return self._snapshot_locked()

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback`` with every later change; returns an idempotent unsubscribe.

        Callbacks run outside the ledger's lock (they may call the ledger). One that
        raises is logged and the others still run.
        """
        token = object()
        with self._lock:
            self._subscribers = (*self._subscribers, (token, callback))

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = tuple(s for s in self._subscribers if s[0] is not token)

        return unsubscribe

    def _queue_locked(self, kind: EventKind, detail: str) -> None:
        self._pending.append(LedgerEvent(kind, self._snapshot_locked(), detail))

    def _deliver(self) -> None:
        # Whoever holds _dispatching drains the queue for everyone, so delivery keeps
        # change order; the re-check after releasing closes the hand-over race.
        while self._pending:
            if not self._dispatching.acquire(blocking=False):
                return
            try:
                while self._pending:
                    event = self._pending.popleft()
                    for _token, callback in self._subscribers:
                        try:
                            callback(event)
                        except Exception:
                            _logger.exception(
                                "ledger %s: subscriber %r failed on a %s event",
                                self._name,
                                callback,
                                event.kind,
                            )
            finally:
                self._dispatching.release()
