"""ResourceLedger: atomic multi-constraint admission, release, quarantine and events."""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import FrozenInstanceError

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from runtime.errors import AdmissionRefused, UsageError
from runtime.ledger import (
    BudgetExplanation,
    LedgerEvent,
    LedgerSnapshot,
    PlanReservation,
    QuarantineRecord,
    ReservationStateError,
    ResourceLedger,
    UnknownReservation,
    explain_budget,
    format_bytes,
    outstanding_reservations,
)

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
RAM = "machine:ram"
WSL = "wsl:quota"
VRAM = "machine:vram:GPU-0"


def assert_within_capacity(snapshot: LedgerSnapshot) -> None:
    for state in snapshot.constraints.values():
        assert state.reserved >= 0, state
        assert state.quarantined >= 0, state
        assert state.reserved + state.quarantined <= state.capacity, state
        assert state.free == state.capacity - state.reserved - state.quarantined


def assert_all_free(ledger: ResourceLedger) -> None:
    snapshot = ledger.snapshot()
    assert snapshot.is_empty
    for state in snapshot.constraints.values():
        assert (state.reserved, state.quarantined, state.free) == (0, 0, state.capacity)


@pytest.fixture
def ledger() -> ResourceLedger:
    return ResourceLedger({RAM: 2 * GiB, WSL: 1 * GiB}, name="test")


# ---------------------------------------------------------------------------- format_bytes


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (512, "512 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (1024 * 1024 - 1, "1.0 MiB"),
        (512 * MiB, "512.0 MiB"),
        (2 * GiB, "2.0 GiB"),
        (3 * GiB // 2, "1.5 GiB"),
        (-512 * MiB, "-512.0 MiB"),
        (1 << 70, "1024.0 EiB"),
    ],
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


@given(st.integers(min_value=0, max_value=1 << 62))
def test_format_bytes_never_prints_1024_of_a_unit_below_the_largest(n: int) -> None:
    number, unit = format_bytes(n).split(" ")
    assert unit in {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
    assert float(number) < 1024


# ---------------------------------------------------------------------------- reserve


def test_reserve_plan_charges_every_stage(ledger: ResourceLedger) -> None:
    plan = ledger.reserve_plan(
        "pipeline-a",
        {"stage-0": {RAM: 512 * MiB, WSL: 256 * MiB}, "stage-1": {RAM: 1 * GiB}},
    )
    assert plan.owner == "pipeline-a"
    assert list(plan.stages) == ["stage-0", "stage-1"]
    stage0 = plan.stages["stage-0"]
    assert stage0.id == f"{plan.plan_id}/stage-0"
    assert (stage0.plan_id, stage0.owner, stage0.stage) == (plan.plan_id, "pipeline-a", "stage-0")
    assert dict(stage0.amounts) == {RAM: 512 * MiB, WSL: 256 * MiB}
    assert plan.total() == {RAM: 1536 * MiB, WSL: 256 * MiB}
    assert plan.ids == (f"{plan.plan_id}/stage-0", f"{plan.plan_id}/stage-1")

    snapshot = ledger.snapshot()
    assert snapshot.constraints[RAM].reserved == 1536 * MiB
    assert snapshot.constraints[RAM].free == 512 * MiB
    assert snapshot.constraints[WSL].reserved == 256 * MiB
    assert {r.id for r in snapshot.reservations} == set(plan.ids)
    assert not snapshot.is_empty
    ledger.release_plan(plan)
    assert_all_free(ledger)


def test_reservations_are_immutable_copies(ledger: ResourceLedger) -> None:
    demands = {"stage-0": {RAM: 1 * MiB}}
    plan = ledger.reserve_plan("p", demands)
    demands["stage-0"][RAM] = 1 * GiB
    reservation = plan.stages["stage-0"]
    assert reservation.amounts[RAM] == 1 * MiB
    with pytest.raises(TypeError):
        reservation.amounts[RAM] = 5  # type: ignore[index]
    with pytest.raises(FrozenInstanceError):
        reservation.owner = "someone else"  # type: ignore[misc]
    assert hash(reservation) == hash(reservation.id)
    ledger.release_plan(plan)
    assert ledger.snapshot().constraints[RAM].reserved == 0


def test_plan_ids_are_unique_within_and_across_ledgers(ledger: ResourceLedger) -> None:
    other = ResourceLedger({RAM: GiB}, name="other")
    plans = [ledger.reserve_plan("p", {"s": {RAM: 1}}) for _ in range(50)]
    foreign = other.reserve_plan("p", {"s": {RAM: 1}})
    ids = {plan.plan_id for plan in plans}
    assert len(ids) == 50
    assert foreign.plan_id not in ids
    for plan in plans:
        ledger.release_plan(plan)
    other.release_plan(foreign)
    assert_all_free(ledger)
    assert_all_free(other)


def test_stage_with_no_demands_is_reserved_and_released(ledger: ResourceLedger) -> None:
    plan = ledger.reserve_plan("p", {"tokenizer": {}, "model": {RAM: GiB}})
    assert dict(plan.stages["tokenizer"].amounts) == {}
    assert len(ledger.snapshot().reservations) == 2
    ledger.release_plan(plan)
    assert_all_free(ledger)


def test_overcommit_across_two_stages_is_refused_naming_the_constraint(
    ledger: ResourceLedger,
) -> None:
    demands = {"stage-0": {RAM: 1536 * MiB}, "stage-1": {RAM: 1 * GiB}}
    # Each stage fits alone; only together do they exceed the 2 GiB ceiling.
    assert ledger.check_plan({"stage-0": demands["stage-0"]}).fits
    assert ledger.check_plan({"stage-1": demands["stage-1"]}).fits
    before = ledger.snapshot()

    with pytest.raises(AdmissionRefused) as caught:
        ledger.reserve_plan("pipeline-a", demands)

    error = caught.value
    assert str(error) == (
        "admission refused: machine:ram needs 2.5 GiB for stage-0, stage-1 "
        "but only 2.0 GiB is free of 2.0 GiB"
    )
    assert error.constraint == RAM
    assert error.needed == 2560 * MiB
    assert error.free == 2 * GiB
    assert error.stages == ("stage-0", "stage-1")
    assert error.exit_code == 3
    after = ledger.snapshot()
    assert after.is_empty
    assert after.version == before.version
    assert_all_free(ledger)


def test_refusal_on_a_later_constraint_charges_nothing_on_earlier_ones(
    ledger: ResourceLedger,
) -> None:
    with pytest.raises(AdmissionRefused) as caught:
        ledger.reserve_plan(
            "p", {"stage-0": {RAM: 1 * GiB, WSL: 600 * MiB}, "stage-1": {WSL: 600 * MiB}}
        )
    assert caught.value.constraint == WSL
    assert caught.value.stages == ("stage-0", "stage-1")
    assert_all_free(ledger)


def test_refusal_names_only_the_stages_that_asked(ledger: ResourceLedger) -> None:
    held = ledger.reserve_plan("first", {"a": {WSL: 768 * MiB}})
    with pytest.raises(AdmissionRefused) as caught:
        ledger.reserve_plan("second", {"x": {RAM: 1 * MiB}, "y": {WSL: 512 * MiB, RAM: 0}})
    assert caught.value.stages == ("y",)
    assert caught.value.free == 256 * MiB
    assert str(caught.value) == (
        "admission refused: wsl:quota needs 512.0 MiB for y but only 256.0 MiB is free of "
        "1.0 GiB; held by first (768.0 MiB)"
    )
    ledger.release_plan(held)
    assert_all_free(ledger)


def test_exact_fit_is_admitted(ledger: ResourceLedger) -> None:
    plan = ledger.reserve_plan("p", {"a": {RAM: 1 * GiB}, "b": {RAM: 1 * GiB}})
    assert ledger.snapshot().constraints[RAM].free == 0
    with pytest.raises(AdmissionRefused):
        ledger.reserve_plan("q", {"c": {RAM: 1}})
    ledger.release_plan(plan)
    assert_all_free(ledger)


def test_undeclared_constraint_is_refused(ledger: ResourceLedger) -> None:
    with pytest.raises(AdmissionRefused) as caught:
        ledger.reserve_plan("p", {"stage-0": {RAM: 1 * MiB, VRAM: 4 * GiB}})
    error = caught.value
    assert error.constraint == VRAM
    assert error.needed == 4 * GiB
    assert error.free == 0
    assert error.stages == ("stage-0",)
    assert str(error) == (
        "admission refused: machine:vram:GPU-0 needs 4.0 GiB for stage-0 but it is not a "
        "declared constraint (declared: machine:ram, wsl:quota)"
    )
    assert_all_free(ledger)


def test_empty_ledger_refuses_any_constraint() -> None:
    ledger = ResourceLedger()
    with pytest.raises(AdmissionRefused, match=r"\(declared: none\)"):
        ledger.reserve_plan("p", {"s": {RAM: 0}})
    assert ledger.snapshot().constraints == {}


@pytest.mark.parametrize(
    ("owner", "demands", "error", "match"),
    [
        ("p", {"s": {RAM: -1}}, ValueError, r"demand of stage s on machine:ram: must be >= 0"),
        ("p", {"s": {RAM: 1.5}}, TypeError, r"stage s on machine:ram: expected a whole number"),
        ("p", {"s": {RAM: True}}, TypeError, r"expected a whole number of bytes, got True"),
        ("p", {"s": {RAM: "1GiB"}}, TypeError, r"got '1GiB'"),
        ("p", {"s": [RAM]}, TypeError, r"demands of stage s: expected a mapping"),
        ("p", [("s", {RAM: 1})], TypeError, r"demands: expected a mapping of stage"),
        ("p", {"": {RAM: 1}}, ValueError, r"bad stage name ''"),
        ("p", {"s": {"": 1}}, ValueError, r"demands of stage s: bad constraint name ''"),
        ("p", {}, ValueError, r"at least one stage"),
        ("", {"s": {RAM: 1}}, ValueError, r"owner: expected a non-empty string"),
    ],
)
def test_malformed_demands_are_rejected_before_anything_is_charged(
    ledger: ResourceLedger, owner: str, demands: object, error: type[Exception], match: str
) -> None:
    before = ledger.snapshot()
    with pytest.raises(error, match=match):
        ledger.reserve_plan(owner, demands)  # type: ignore[arg-type]
    assert ledger.snapshot() == before


def test_int_subclass_amounts_are_stored_as_plain_ints(ledger: ResourceLedger) -> None:
    class Bytes(int):
        pass

    plan = ledger.reserve_plan("p", {"s": {RAM: Bytes(10)}})
    assert type(plan.stages["s"].amounts[RAM]) is int
    ledger.release_plan(plan)
    assert_all_free(ledger)


# ---------------------------------------------------------------------------- release


def test_release_is_idempotent(ledger: ResourceLedger) -> None:
    plan = ledger.reserve_plan("p", {"a": {RAM: GiB}, "b": {RAM: 512 * MiB}})
    a_id = plan.stages["a"].id
    assert ledger.release(a_id) is True
    assert ledger.snapshot().constraints[RAM].reserved == 512 * MiB
    version = ledger.snapshot().version
    assert ledger.release(a_id) is False
    assert ledger.snapshot().version == version
    assert ledger.snapshot().constraints[RAM].reserved == 512 * MiB
    assert ledger.release(plan.stages["b"].id) is True
    assert_all_free(ledger)


@pytest.mark.parametrize("bad_id", ["nonsense", "", "deadbeef-0/stage", "/stage"])
def test_release_of_an_unknown_id_raises(ledger: ResourceLedger, bad_id: str) -> None:
    with pytest.raises(UnknownReservation) as caught:
        ledger.release(bad_id)
    assert isinstance(caught.value, KeyError)
    assert isinstance(caught.value, UsageError)
    assert caught.value.reservation_id == bad_id
    assert str(caught.value) == f"ledger test: unknown reservation {bad_id!r}"


def test_release_of_a_plan_number_not_yet_issued_raises(ledger: ResourceLedger) -> None:
    plan = ledger.reserve_plan("p", {"s": {RAM: 1}})
    prefix, _, number = plan.plan_id.rpartition("-")
    for forged in (f"{prefix}-{int(number) + 1}/s", f"{prefix}-\u00b2/s", f"{prefix}-x/s"):
        with pytest.raises(UnknownReservation):
            ledger.release(forged)
    ledger.release_plan(plan)


def test_release_of_another_ledgers_reservation_raises(ledger: ResourceLedger) -> None:
    other = ResourceLedger({RAM: GiB}, name="other")
    plan = other.reserve_plan("p", {"s": {RAM: 1}})
    with pytest.raises(UnknownReservation):
        ledger.release(plan.stages["s"].id)
    with pytest.raises(UnknownReservation):
        ledger.release_plan(plan)
    assert other.snapshot().constraints[RAM].reserved == 1
    other.release_plan(plan)
    assert_all_free(other)


def test_release_plan_is_idempotent_and_one_change(ledger: ResourceLedger) -> None:
    plan = ledger.reserve_plan("p", {"a": {RAM: GiB}, "b": {RAM: GiB, WSL: GiB}})
    version = ledger.snapshot().version
    ledger.release_plan(plan)
    assert ledger.snapshot().version == version + 1
    ledger.release_plan(plan)
    assert ledger.snapshot().version == version + 1
    assert_all_free(ledger)


def test_release_plan_after_a_single_stage_release(ledger: ResourceLedger) -> None:
    plan = ledger.reserve_plan("p", {"a": {RAM: GiB}, "b": {RAM: GiB}})
    assert ledger.release(plan.stages["a"].id)
    ledger.release_plan(plan)
    assert_all_free(ledger)


# ---------------------------------------------------------------------------- quarantine


def test_quarantine_keeps_the_charge_visible_with_its_reason(ledger: ResourceLedger) -> None:
    plan = ledger.reserve_plan("p", {"a": {RAM: GiB, WSL: 512 * MiB}, "b": {RAM: 512 * MiB}})
    a_id = plan.stages["a"].id
    start = time.monotonic()
    ledger.quarantine(a_id, "worker tree identity unverified")
    end = time.monotonic()

    snapshot = ledger.snapshot()
    ram = snapshot.constraints[RAM]
    assert (ram.reserved, ram.quarantined, ram.free) == (512 * MiB, GiB, 512 * MiB)
    assert snapshot.constraints[WSL].quarantined == 512 * MiB
    assert [r.id for r in snapshot.reservations] == [plan.stages["b"].id]
    (record,) = snapshot.quarantined
    assert isinstance(record, QuarantineRecord)
    assert record.reservation == plan.stages["a"]
    assert record.reason == "worker tree identity unverified"
    assert start <= record.since <= end
    assert not snapshot.is_empty

    # The quarantined bytes still count against admission.
    with pytest.raises(AdmissionRefused) as caught:
        ledger.reserve_plan("q", {"c": {RAM: 1 * GiB}})
    assert caught.value.free == 512 * MiB

    # Releasing the plan frees the other stage but leaves the quarantined one charged.
    ledger.release_plan(plan)
    snapshot = ledger.snapshot()
    assert snapshot.reservations == ()
    assert snapshot.constraints[RAM].quarantined == GiB
    assert not snapshot.is_empty

    ledger.resolve_quarantine(a_id)
    assert_all_free(ledger)


def test_release_of_a_quarantined_reservation_is_an_error(ledger: ResourceLedger) -> None:
    plan = ledger.reserve_plan("p", {"a": {RAM: GiB}})
    a_id = plan.stages["a"].id
    ledger.quarantine(a_id, "unverified")
    with pytest.raises(ReservationStateError, match=r"is quarantined \(unverified\); resolve") as c:
        ledger.release(a_id)
    assert c.value.state == "quarantined"
    assert c.value.reservation_id == a_id
    assert ledger.snapshot().constraints[RAM].quarantined == GiB
    ledger.resolve_quarantine(a_id)
    assert_all_free(ledger)


def test_quarantine_error_paths(ledger: ResourceLedger) -> None:
    plan = ledger.reserve_plan("p", {"a": {RAM: GiB}, "b": {RAM: 1}})
    a_id, b_id = plan.stages["a"].id, plan.stages["b"].id
    with pytest.raises(ValueError, match="a reason is required"):
        ledger.quarantine(a_id, "  ")
    with pytest.raises(UnknownReservation):
        ledger.quarantine("nonsense", "why")
    ledger.quarantine(a_id, "first")
    with pytest.raises(ReservationStateError, match=r"already quarantined \(first\)") as caught:
        ledger.quarantine(a_id, "second")
    assert caught.value.state == "quarantined"
    assert ledger.snapshot().quarantined[0].reason == "first"
    assert ledger.release(b_id)
    with pytest.raises(ReservationStateError, match="already released") as caught:
        ledger.quarantine(b_id, "late")
    assert caught.value.state == "released"
    ledger.resolve_quarantine(a_id)
    assert_all_free(ledger)


def test_resolve_error_paths(ledger: ResourceLedger) -> None:
    plan = ledger.reserve_plan("p", {"a": {RAM: GiB}})
    a_id = plan.stages["a"].id
    with pytest.raises(ReservationStateError, match="not quarantined; release it") as caught:
        ledger.resolve_quarantine(a_id)
    assert caught.value.state == "reserved"
    with pytest.raises(UnknownReservation):
        ledger.resolve_quarantine("nonsense")
    ledger.quarantine(a_id, "unverified")
    ledger.resolve_quarantine(a_id)
    with pytest.raises(ReservationStateError, match="already freed") as caught:
        ledger.resolve_quarantine(a_id)
    assert caught.value.state == "released"
    assert ledger.release(a_id) is False
    assert_all_free(ledger)


# ---------------------------------------------------------------------------- capacities


def test_declare_capacities_adds_new_constraints_and_never_rewrites_one() -> None:
    ledger = ResourceLedger({RAM: 2 * GiB})
    events: list[LedgerEvent] = []
    ledger.subscribe(events.append)
    assert ledger.declare_capacities({RAM: 4 * GiB, WSL: GiB}) == {RAM: 2 * GiB, WSL: GiB}
    assert ledger.declare_capacities({RAM: GiB, WSL: 8 * GiB}) == {RAM: 2 * GiB, WSL: GiB}
    constraints = ledger.snapshot().constraints
    assert {name: state.capacity for name, state in constraints.items()} == {
        RAM: 2 * GiB,
        WSL: GiB,
    }
    assert [event.detail for event in events] == ["wsl:quota 1.0 GiB"]


def test_a_second_plans_ceiling_neither_lowers_nor_raises_the_first_ones() -> None:
    """The machine's capacity is the ledger's; each plan's declared capacities are its own
    ceiling: a plan declaring 2 GiB loads beside one that holds 3.9 GiB under its 6 GiB."""
    ledger = ResourceLedger({RAM: 16 * GiB}, name="machine")
    first = ledger.reserve_plan(
        "chat-speak", {"llm": {RAM: 3 * GiB}, "voice": {RAM: 896 * MiB}}, ceiling={RAM: 6 * GiB}
    )
    second = ledger.reserve_plan("speak", {"voice": {RAM: 896 * MiB}}, ceiling={RAM: 2 * GiB})
    third = ledger.reserve_plan("big", {"s": {RAM: 8 * GiB}}, ceiling={RAM: 12 * GiB})
    state = ledger.snapshot().constraints[RAM]
    assert state.capacity == 16 * GiB
    assert state.reserved == 3 * GiB + 2 * 896 * MiB + 8 * GiB
    # The smaller ceiling still binds its own plan, whatever the machine has free.
    with pytest.raises(AdmissionRefused) as caught:
        ledger.reserve_plan("speak-more", {"voice": {RAM: 3 * GiB}}, ceiling={RAM: 2 * GiB})
    assert str(caught.value) == (
        "admission refused: machine:ram needs 3.0 GiB for voice but speak-more's own declared "
        "capacity is 2.0 GiB (short by 1.0 GiB)"
    )
    assert (caught.value.constraint, caught.value.needed, caught.value.free) == (
        RAM,
        3 * GiB,
        2 * GiB,
    )
    with pytest.raises(
        AdmissionRefused, match=r"does not declare it as a capacity \(declared: machine:ram\)"
    ):
        ledger.reserve_plan("odd", {"s": {WSL: MiB}}, ceiling={RAM: GiB})
    assert ledger.snapshot().constraints[RAM].capacity == 16 * GiB
    for plan in (first, second, third):
        ledger.release_plan(plan)
    assert_all_free(ledger)


def test_a_refusal_names_the_plans_holding_the_memory_and_their_amounts() -> None:
    ledger = ResourceLedger({RAM: 6 * GiB}, name="small")
    chat_speak = ledger.reserve_plan(
        "chat-speak", {"llm": {RAM: 3 * GiB}, "voice": {RAM: 896 * MiB}}, ceiling={RAM: 6 * GiB}
    )
    speak = ledger.reserve_plan("speak", {"voice": {RAM: 896 * MiB}})
    lost = ledger.reserve_plan("demo_add", {"add": {RAM: 128 * MiB}})
    ledger.quarantine(lost.stages["add"].id, "not confirmed gone")
    before = ledger.snapshot()
    with pytest.raises(AdmissionRefused) as caught:
        ledger.reserve_plan("chat", {"llm": {RAM: 3 * GiB}}, ceiling={RAM: 6 * GiB})
    assert str(caught.value) == (
        "admission refused: machine:ram needs 3.0 GiB for llm but only 1.1 GiB is free of "
        "6.0 GiB; held by chat-speak (3.9 GiB), speak (896.0 MiB), "
        "demo_add (quarantined) (128.0 MiB)"
    )
    assert caught.value.holders == (
        ("chat-speak", 3 * GiB + 896 * MiB),
        ("speak", 896 * MiB),
        ("demo_add (quarantined)", 128 * MiB),
    )
    assert caught.value.stages == ("llm",)
    assert ledger.snapshot() == before  # nothing charged
    ledger.resolve_quarantine(lost.stages["add"].id)
    ledger.release_plan(chat_speak)
    ledger.release_plan(speak)
    # An empty ledger's refusal names no holder.
    with pytest.raises(AdmissionRefused) as empty:
        ledger.reserve_plan("huge", {"s": {RAM: 7 * GiB}})
    assert "held by" not in str(empty.value)
    assert empty.value.holders == ()
    assert_all_free(ledger)


def test_replace_capacities_raises_lowers_and_drops_what_is_free() -> None:
    ledger = ResourceLedger(name="machine-changes")
    events: list[LedgerEvent] = []
    ledger.subscribe(events.append)
    assert ledger.declare_capacities({RAM: 2 * GiB, WSL: GiB}) == {RAM: 2 * GiB, WSL: GiB}
    # Another machine (the studio's topology source): RAM raised (declare_capacities would keep
    # 2 GiB), WSL dropped since nothing is charged against it.
    assert ledger.replace_capacities({RAM: 6 * GiB}) == {RAM: 6 * GiB}
    assert {name: s.capacity for name, s in ledger.snapshot().constraints.items()} == {RAM: 6 * GiB}
    assert events[-1].kind == "capacity"
    assert events[-1].detail == "wsl:quota dropped, machine:ram 6.0 GiB"
    plan = ledger.reserve_plan("chat", {"llm": {RAM: 4 * GiB}})
    assert ledger.snapshot().constraints[RAM].free == 2 * GiB
    ledger.release_plan(plan)
    assert ledger.replace_capacities({RAM: GiB}) == {RAM: GiB}
    assert ledger.snapshot().constraints[RAM].free == GiB
    version = ledger.snapshot().version
    ledger.replace_capacities({RAM: GiB})  # no change, no event, same version
    assert ledger.snapshot().version == version
    assert_all_free(ledger)


def test_replace_capacities_keeps_what_is_charged() -> None:
    ledger = ResourceLedger({RAM: 2 * GiB, WSL: 2 * GiB})
    plan = ledger.reserve_plan("p", {"s": {RAM: GiB, WSL: GiB}})
    ledger.quarantine(plan.stages["s"].id, "unverified")
    before = ledger.snapshot()
    with pytest.raises(AdmissionRefused, match=r"cannot set machine:ram to 512.0 MiB") as caught:
        ledger.replace_capacities({RAM: 512 * MiB})
    assert (caught.value.constraint, caught.value.needed) == (RAM, GiB)
    assert ledger.snapshot() == before
    # WSL is not named but still charged: it stays, with its capacity; RAM counts the charge.
    ledger.replace_capacities({RAM: 4 * GiB})
    constraints = ledger.snapshot().constraints
    assert {name: s.capacity for name, s in constraints.items()} == {RAM: 4 * GiB, WSL: 2 * GiB}
    assert constraints[RAM].free == 3 * GiB
    assert constraints[WSL].quarantined == GiB
    ledger.resolve_quarantine(plan.stages["s"].id)
    ledger.replace_capacities({RAM: 4 * GiB})
    assert list(ledger.snapshot().constraints) == [RAM]
    assert_all_free(ledger)


@pytest.mark.parametrize(
    ("capacities", "error", "match"),
    [
        ({RAM: -1}, ValueError, r"capacity of machine:ram: must be >= 0, got -1"),
        ({RAM: 1.0}, TypeError, r"capacity of machine:ram: expected a whole number"),
        ({"": 1}, ValueError, r"bad constraint name ''"),
        ([(RAM, 1)], TypeError, r"capacities: expected a mapping"),
    ],
)
def test_bad_capacities_are_rejected(
    capacities: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        ResourceLedger(capacities)  # type: ignore[arg-type]
    ledger = ResourceLedger({WSL: GiB})
    with pytest.raises(error, match=match):
        ledger.declare_capacities(capacities)  # type: ignore[arg-type]
    assert list(ledger.snapshot().constraints) == [WSL]


def test_new_ledger_starts_at_version_zero() -> None:
    ledger = ResourceLedger({RAM: GiB}, name="fresh")
    assert ledger.name == "fresh"
    assert ledger.snapshot().version == 0
    assert "fresh" in repr(ledger)


# ---------------------------------------------------------------------------- snapshots


def test_snapshot_to_json(ledger: ResourceLedger) -> None:
    plan = ledger.reserve_plan("p", {"a": {RAM: GiB}, "b": {WSL: MiB}})
    ledger.quarantine(plan.stages["b"].id, "unverified")
    data = ledger.snapshot().to_json()
    assert data["version"] == 2
    assert data["constraints"] == {
        RAM: {"capacity": 2 * GiB, "reserved": GiB, "quarantined": 0, "free": GiB},
        WSL: {"capacity": GiB, "reserved": 0, "quarantined": MiB, "free": GiB - MiB},
    }
    assert data["reservations"] == [
        {
            "id": plan.stages["a"].id,
            "plan_id": plan.plan_id,
            "owner": "p",
            "stage": "a",
            "amounts": {RAM: GiB},
        }
    ]
    assert isinstance(data["quarantined"], list)
    (quarantined,) = data["quarantined"]
    assert quarantined["id"] == plan.stages["b"].id
    assert quarantined["reason"] == "unverified"
    assert isinstance(quarantined["since"], float)
    ledger.release_plan(plan)
    ledger.resolve_quarantine(plan.stages["b"].id)
    assert_all_free(ledger)


def test_snapshot_is_a_frozen_view(ledger: ResourceLedger) -> None:
    snapshot = ledger.snapshot()
    plan = ledger.reserve_plan("p", {"a": {RAM: GiB}})
    assert snapshot.constraints[RAM].reserved == 0
    assert snapshot.version + 1 == ledger.snapshot().version
    with pytest.raises(TypeError):
        snapshot.constraints[RAM] = snapshot.constraints[WSL]  # type: ignore[index]
    ledger.release_plan(plan)


def test_outstanding_reservations_lists_every_live_ledger() -> None:
    first = ResourceLedger({RAM: GiB}, name="outstanding-first")
    second = ResourceLedger({RAM: GiB}, name="outstanding-second")
    a = first.reserve_plan("p", {"s": {RAM: 1}})
    b = second.reserve_plan("p", {"s": {RAM: 2}, "t": {RAM: 3}})
    second.quarantine(b.stages["t"].id, "unverified")

    mine = [(name, item) for name, item in outstanding_reservations() if "outstanding" in name]
    assert ("outstanding-first", a.stages["s"]) in mine
    assert ("outstanding-second", b.stages["s"]) in mine
    records = [item for _, item in mine if isinstance(item, QuarantineRecord)]
    assert [record.reservation for record in records] == [b.stages["t"]]
    assert len(mine) == 3

    first.release_plan(a)
    second.release_plan(b)
    second.resolve_quarantine(b.stages["t"].id)
    assert not [name for name, _ in outstanding_reservations() if "outstanding" in name]


# ---------------------------------------------------------------------------- events


def test_events_follow_every_change_in_order(ledger: ResourceLedger) -> None:
    events: list[LedgerEvent] = []
    unsubscribe = ledger.subscribe(events.append)
    plan = ledger.reserve_plan("pipe", {"a": {RAM: GiB}, "b": {RAM: MiB}})
    ledger.quarantine(plan.stages["a"].id, "unverified")
    ledger.release(plan.stages["b"].id)
    ledger.release(plan.stages["b"].id)  # no change, no event
    ledger.resolve_quarantine(plan.stages["a"].id)
    ledger.declare_capacities({VRAM: GiB})
    ledger.declare_capacities({VRAM: 2 * GiB})  # no change, no event

    assert [event.kind for event in events] == [
        "reserved",
        "quarantined",
        "released",
        "resolved",
        "capacity",
    ]
    assert events[0].detail == f"{plan.plan_id} for pipe: a, b"
    assert events[1].detail == f"{plan.stages['a'].id}: unverified"
    assert events[2].detail == plan.stages["b"].id
    assert events[4].detail == f"{VRAM} 1.0 GiB"
    versions = [event.snapshot.version for event in events]
    assert versions == sorted(versions)
    assert len(set(versions)) == len(versions)
    assert events[0].snapshot.constraints[RAM].reserved == GiB + MiB
    assert events[1].snapshot.constraints[RAM].quarantined == GiB
    assert events[3].snapshot.is_empty
    assert events[-1].snapshot == ledger.snapshot()

    unsubscribe()
    unsubscribe()
    again = ledger.reserve_plan("pipe", {"a": {RAM: 1}})
    ledger.release_plan(again)
    assert len(events) == 5


def test_release_plan_sends_one_event(ledger: ResourceLedger) -> None:
    plan = ledger.reserve_plan("p", {"a": {RAM: 1}, "b": {RAM: 2}})
    events: list[LedgerEvent] = []
    unsubscribe = ledger.subscribe(events.append)
    ledger.release_plan(plan)
    ledger.release_plan(plan)
    unsubscribe()
    assert [(e.kind, e.detail) for e in events] == [
        ("released", f"{plan.stages['a'].id}, {plan.stages['b'].id}")
    ]


def test_a_raising_subscriber_is_logged_and_does_not_break_the_ledger(
    ledger: ResourceLedger, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(event: LedgerEvent) -> None:
        raise RuntimeError("subscriber bug")

    seen: list[str] = []
    unsubscribe_broken = ledger.subscribe(broken)
    unsubscribe_seen = ledger.subscribe(lambda event: seen.append(event.kind))
    with caplog.at_level(logging.ERROR, logger="runtime.ledger"):
        plan = ledger.reserve_plan("p", {"a": {RAM: GiB}})
        ledger.release_plan(plan)
    unsubscribe_broken()
    unsubscribe_seen()

    assert seen == ["reserved", "released"]
    failures = [r for r in caplog.records if "failed on a" in r.getMessage()]
    assert len(failures) == 2
    assert failures[0].exc_info is not None
    assert "subscriber bug" in str(failures[0].exc_info[1])
    assert "ledger test" in failures[0].getMessage()
    assert_all_free(ledger)


def test_subscribers_run_outside_the_lock_and_may_call_the_ledger(
    ledger: ResourceLedger,
) -> None:
    calls: list[tuple[str, str]] = []

    def react(event: LedgerEvent) -> None:
        # A subscriber that reads and changes the ledger; under the lock this would deadlock.
        calls.append(("enter", event.kind))
        ledger.snapshot()
        if event.kind == "reserved":
            for reservation in event.snapshot.reservations:
                ledger.release(reservation.id)
        calls.append(("exit", event.kind))

    unsubscribe = ledger.subscribe(react)
    # Daemon threads: a deadlock fails the test instead of hanging the run.
    worker = threading.Thread(
        target=ledger.reserve_plan, args=("p", {"a": {RAM: GiB}}), daemon=True
    )
    worker.start()
    worker.join(timeout=10)
    unsubscribe()
    assert not worker.is_alive()
    # The nested change is delivered after the outer one finishes, not inside it.
    assert calls == [
        ("enter", "reserved"),
        ("exit", "reserved"),
        ("enter", "released"),
        ("exit", "released"),
    ]
    assert_all_free(ledger)


def test_events_from_another_thread_wait_for_the_one_being_delivered(
    ledger: ResourceLedger,
) -> None:
    first = ledger.reserve_plan("first", {"a": {RAM: 1}})
    delivered: list[str] = []
    inside = threading.Event()
    may_finish = threading.Event()

    def slow(event: LedgerEvent) -> None:
        if event.kind == "reserved":
            inside.set()
            may_finish.wait(timeout=10)
        delivered.append(event.kind)

    unsubscribe = ledger.subscribe(slow)
    results: list[PlanReservation] = []
    worker = threading.Thread(
        target=lambda: results.append(ledger.reserve_plan("second", {"b": {RAM: 2}})),
        daemon=True,
    )
    worker.start()
    assert inside.wait(timeout=10)
    # This thread's change happens while the worker is still delivering an older event:
    # it must neither deliver ahead of it nor wait for it.
    assert ledger.release(first.stages["a"].id)
    assert delivered == []
    may_finish.set()
    worker.join(timeout=10)
    unsubscribe()
    assert not worker.is_alive()
    assert delivered == ["reserved", "released"]
    (second,) = results
    ledger.release_plan(second)
    assert_all_free(ledger)


# ---------------------------------------------------------------------------- budgets


def test_explain_budget_text_in_plain_words() -> None:
    explanation = explain_budget(
        {RAM: 2 * GiB}, {"stage-0": {RAM: 512 * MiB}, "stage-1": {RAM: 1 * GiB}}
    )
    assert explanation.fits
    assert explanation.to_text() == (
        "machine:ram: capacity 2.0 GiB; stage-0 needs 512.0 MiB, stage-1 needs 1.0 GiB; "
        "total 1.5 GiB; headroom 512.0 MiB: fits"
    )


def test_explain_budget_over_capacity_in_use_and_undeclared() -> None:
    explanation = explain_budget(
        {RAM: 2 * GiB, WSL: GiB},
        {"stage-0": {RAM: GiB, VRAM: MiB}, "stage-1": {RAM: GiB}},
        in_use={RAM: 512 * MiB},
    )
    assert not explanation.fits
    ram, wsl, vram = explanation.constraints
    assert (ram.constraint, ram.in_use, ram.total, ram.headroom, ram.fits) == (
        RAM,
        512 * MiB,
        2 * GiB,
        -512 * MiB,
        False,
    )
    assert dict(ram.demands) == {"stage-0": GiB, "stage-1": GiB}
    assert (wsl.total, wsl.fits, dict(wsl.demands)) == (0, True, {})
    assert (vram.declared, vram.capacity, vram.fits) == (False, 0, False)
    assert explanation.to_text().splitlines() == [
        "machine:ram: capacity 2.0 GiB; in use 512.0 MiB; stage-0 needs 1.0 GiB, "
        "stage-1 needs 1.0 GiB; total 2.0 GiB; headroom -512.0 MiB: does not fit",
        "wsl:quota: capacity 1.0 GiB; no stage needs it; total 0 B; headroom 1.0 GiB: fits",
        "machine:vram:GPU-0: not declared; stage-0 needs 1.0 MiB; total 1.0 MiB: does not fit",
    ]
    data = explanation.to_json()
    assert data["fits"] is False
    assert data["constraints"][0] == {  # type: ignore[index]
        "constraint": RAM,
        "declared": True,
        "capacity": 2 * GiB,
        "in_use": 512 * MiB,
        "demands": {"stage-0": GiB, "stage-1": GiB},
        "total": 2 * GiB,
        "headroom": -512 * MiB,
        "fits": False,
    }


def test_explain_budget_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="in_use of machine:ram: must be >= 0"):
        explain_budget({RAM: GiB}, {"s": {RAM: 1}}, in_use={RAM: -1})
    with pytest.raises(ValueError, match="demand of stage s on machine:ram"):
        explain_budget({RAM: GiB}, {"s": {RAM: -1}})
    with pytest.raises(TypeError, match="capacity of machine:ram"):
        explain_budget({RAM: "1 GiB"}, {"s": {RAM: 1}})  # type: ignore[dict-item]


def test_check_plan_counts_reserved_and_quarantined_and_changes_nothing(
    ledger: ResourceLedger,
) -> None:
    plan = ledger.reserve_plan("p", {"a": {RAM: 512 * MiB}, "b": {RAM: 512 * MiB}})
    ledger.quarantine(plan.stages["b"].id, "unverified")
    before = ledger.snapshot()
    explanation = ledger.check_plan({"x": {RAM: GiB}, "y": {RAM: 1}})
    assert isinstance(explanation, BudgetExplanation)
    ram = explanation.constraints[0]
    assert (ram.in_use, ram.total, ram.headroom, ram.fits) == (GiB, GiB + 1, -1, False)
    assert ledger.check_plan({"x": {RAM: GiB}}).fits
    assert ledger.snapshot() == before
    ledger.release_plan(plan)
    ledger.resolve_quarantine(plan.stages["b"].id)
    assert_all_free(ledger)


DEMAND = st.dictionaries(
    st.sampled_from([RAM, WSL, VRAM]), st.integers(min_value=0, max_value=3 * GiB), max_size=3
)
PLAN = st.dictionaries(st.sampled_from(["s0", "s1", "s2"]), DEMAND, min_size=1, max_size=3)


@settings(max_examples=150, deadline=None)
@given(held=PLAN, plan=PLAN)
def test_check_plan_predicts_reserve_plan(
    held: dict[str, dict[str, int]], plan: dict[str, dict[str, int]]
) -> None:
    ledger = ResourceLedger({RAM: 4 * GiB, WSL: 2 * GiB})
    existing = None
    if ledger.check_plan(held).fits:
        existing = ledger.reserve_plan("held", held)
    explanation = ledger.check_plan(plan)
    if explanation.fits:
        ledger.release_plan(ledger.reserve_plan("new", plan))
    else:
        with pytest.raises(AdmissionRefused) as caught:
            ledger.reserve_plan("new", plan)
        failing = {b.constraint for b in explanation.constraints if not b.fits}
        assert caught.value.constraint in failing
        assert caught.value.stages
        assert caught.value.constraint in str(caught.value)
    assert_within_capacity(ledger.snapshot())
    if existing is not None:
        ledger.release_plan(existing)
    assert_all_free(ledger)


# ---------------------------------------------------------------------------- threads


def test_concurrent_reserve_release_never_overcommits() -> None:
    capacities = {RAM: 1000, WSL: 400}
    ledger = ResourceLedger(capacities, name="threads")
    violations: list[str] = []
    versions: list[int] = []

    def watch(event: LedgerEvent) -> None:
        versions.append(event.snapshot.version)
        for state in event.snapshot.constraints.values():
            if state.reserved + state.quarantined > state.capacity:
                violations.append(f"event {event.snapshot.version}: {state}")

    unsubscribe = ledger.subscribe(watch)
    # Held amounts tracked outside the ledger: added after admission, removed before
    # release, so they can only undercount what the ledger holds.
    held = dict.fromkeys(capacities, 0)
    held_lock = threading.Lock()
    errors: list[BaseException] = []
    admitted = [0]

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(300):
                plan_demands = {
                    f"stage-{i}": {RAM: rng.randint(0, 300), WSL: rng.randint(0, 120)}
                    for i in range(rng.randint(1, 3))
                }
                try:
                    plan = ledger.reserve_plan(f"owner-{seed}", plan_demands)
                except AdmissionRefused:
                    continue
                total = plan.total()
                with held_lock:
                    admitted[0] += 1
                    for name, amount in total.items():
                        held[name] += amount
                        if held[name] > capacities[name]:
                            violations.append(f"held {name} {held[name]}")
                first = next(iter(plan.stages.values())).id
                quarantine = rng.random() < 0.2
                if quarantine:
                    ledger.quarantine(first, "identity unverified")
                with held_lock:
                    for name, amount in total.items():
                        held[name] -= amount
                ledger.release_plan(plan)
                if quarantine:
                    ledger.resolve_quarantine(first)
        except BaseException as exc:
            errors.append(exc)

    def monitor(stop: threading.Event) -> None:
        while not stop.is_set():
            snapshot = ledger.snapshot()
            for state in snapshot.constraints.values():
                if not 0 <= state.reserved + state.quarantined <= state.capacity:
                    violations.append(f"snapshot {snapshot.version}: {state}")

    stop = threading.Event()
    watcher = threading.Thread(target=monitor, args=(stop,), daemon=True)
    watcher.start()
    threads = [threading.Thread(target=work, args=(seed,), daemon=True) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    stop.set()
    watcher.join(timeout=10)
    unsubscribe()

    assert not any(thread.is_alive() for thread in [*threads, watcher])
    assert errors == []
    assert violations == []
    assert admitted[0] > 100
    assert versions == sorted(versions)
    assert len(set(versions)) == len(versions)
    assert versions[-1] == ledger.snapshot().version
    assert_all_free(ledger)


# ---------------------------------------------------------------------------- state machine

STATE_CONSTRAINTS = (RAM, WSL, VRAM)


class LedgerMachine(RuleBasedStateMachine):
    """Random reserve/release/quarantine/resolve/declare sequences against a plain model."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = ResourceLedger(name="stateful")
        self.capacity: dict[str, int] = {}
        self.live: dict[str, dict[str, int]] = {}
        self.quarantined: dict[str, dict[str, int]] = {}
        self.released: set[str] = set()
        self.plans: list[PlanReservation] = []
        self.events: list[LedgerEvent] = []
        self.unsubscribe = self.ledger.subscribe(self.events.append)

    def charged(self, constraint: str) -> int:
        return sum(a.get(constraint, 0) for a in (*self.live.values(), *self.quarantined.values()))

    @initialize(
        capacities=st.dictionaries(
            st.sampled_from(STATE_CONSTRAINTS), st.integers(0, 1000), min_size=1
        )
    )
    def declare_initial(self, capacities: dict[str, int]) -> None:
        assert self.ledger.declare_capacities(capacities) == capacities
        self.capacity.update(capacities)

    @rule(capacities=st.dictionaries(st.sampled_from(STATE_CONSTRAINTS), st.integers(0, 1000)))
    def declare(self, capacities: dict[str, int]) -> None:
        # A declared constraint keeps its capacity; only new ones are added.
        effective = self.ledger.declare_capacities(capacities)
        for name, value in capacities.items():
            self.capacity.setdefault(name, value)
            assert effective[name] == self.capacity[name]

    @rule(
        owner=st.sampled_from(["a", "b"]),
        plan=st.dictionaries(
            st.sampled_from(["s0", "s1", "s2"]),
            st.dictionaries(st.sampled_from(STATE_CONSTRAINTS), st.integers(0, 600), max_size=3),
            min_size=1,
            max_size=3,
        ),
    )
    def reserve(self, owner: str, plan: dict[str, dict[str, int]]) -> None:
        totals: dict[str, int] = {}
        for demands in plan.values():
            for name, amount in demands.items():
                totals[name] = totals.get(name, 0) + amount
        failing = {
            name
            for name, need in totals.items()
            if name not in self.capacity or need > self.capacity[name] - self.charged(name)
        }
        version = self.ledger.snapshot().version
        if failing:
            with pytest.raises(AdmissionRefused) as caught:
                self.ledger.reserve_plan(owner, plan)
            assert caught.value.constraint in failing
            assert caught.value.constraint in str(caught.value)
            assert set(caught.value.stages) <= set(plan)
            assert self.ledger.snapshot().version == version
            return
        reservation = self.ledger.reserve_plan(owner, plan)
        assert reservation.total() == totals
        for stage, stage_reservation in reservation.stages.items():
            assert dict(stage_reservation.amounts) == plan[stage]
            self.live[stage_reservation.id] = plan[stage]
        self.plans.append(reservation)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        reservation_id = data.draw(st.sampled_from(sorted(self.live)))
        assert self.ledger.release(reservation_id) is True
        del self.live[reservation_id]
        self.released.add(reservation_id)

    @precondition(lambda self: bool(self.released))
    @rule(data=st.data())
    def release_again(self, data: st.DataObject) -> None:
        assert self.ledger.release(data.draw(st.sampled_from(sorted(self.released)))) is False

    @precondition(lambda self: bool(self.plans))
    @rule(data=st.data())
    def release_plan(self, data: st.DataObject) -> None:
        plan = data.draw(st.sampled_from(self.plans))
        self.ledger.release_plan(plan)
        for reservation_id in plan.ids:
            if reservation_id in self.live:
                del self.live[reservation_id]
                self.released.add(reservation_id)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data(), reason=st.sampled_from(["unverified tree", "launcher stuck"]))
    def quarantine(self, data: st.DataObject, reason: str) -> None:
        reservation_id = data.draw(st.sampled_from(sorted(self.live)))
        self.ledger.quarantine(reservation_id, reason)
        self.quarantined[reservation_id] = self.live.pop(reservation_id)
        records = {r.reservation.id: r for r in self.ledger.snapshot().quarantined}
        assert records[reservation_id].reason == reason

    @precondition(lambda self: bool(self.quarantined))
    @rule(data=st.data())
    def release_quarantined_is_refused(self, data: st.DataObject) -> None:
        with pytest.raises(ReservationStateError):
            self.ledger.release(data.draw(st.sampled_from(sorted(self.quarantined))))

    @precondition(lambda self: bool(self.quarantined))
    @rule(data=st.data())
    def resolve(self, data: st.DataObject) -> None:
        reservation_id = data.draw(st.sampled_from(sorted(self.quarantined)))
        self.ledger.resolve_quarantine(reservation_id)
        del self.quarantined[reservation_id]
        self.released.add(reservation_id)

    @invariant()
    def never_overcommitted(self) -> None:
        assert_within_capacity(self.ledger.snapshot())

    @invariant()
    def snapshot_matches_model(self) -> None:
        snapshot = self.ledger.snapshot()
        assert {r.id: dict(r.amounts) for r in snapshot.reservations} == self.live
        assert {q.reservation.id: dict(q.reservation.amounts) for q in snapshot.quarantined} == (
            self.quarantined
        )
        for name, capacity in self.capacity.items():
            state = snapshot.constraints[name]
            assert state.capacity == capacity
            assert state.reserved == sum(a.get(name, 0) for a in self.live.values())
            assert state.quarantined == sum(a.get(name, 0) for a in self.quarantined.values())
        assert set(snapshot.constraints) == set(self.capacity)
        assert snapshot.is_empty == (not self.live and not self.quarantined)

    @invariant()
    def events_are_in_order(self) -> None:
        versions = [event.snapshot.version for event in self.events]
        assert versions == sorted(versions)
        if self.events:
            assert self.events[-1].snapshot == self.ledger.snapshot()

    def teardown(self) -> None:
        for reservation_id in list(self.live):
            assert self.ledger.release(reservation_id) is True
        for reservation_id in list(self.quarantined):
            self.ledger.resolve_quarantine(reservation_id)
        self.unsubscribe()
        snapshot = self.ledger.snapshot()
        assert snapshot.is_empty
        for state in snapshot.constraints.values():
            assert (state.reserved, state.quarantined, state.free) == (0, 0, state.capacity)


LedgerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestLedgerMachine = LedgerMachine.TestCase


@settings(max_examples=60, deadline=None)
@given(
    operations=st.lists(
        st.tuples(
            st.sampled_from(["reserve", "release", "quarantine", "resolve"]),
            st.integers(0, 400),
            st.integers(0, 400),
            st.integers(0, 1 << 16),
        ),
        max_size=60,
    )
)
def test_random_sequences_never_overcommit_and_return_to_zero(
    operations: list[tuple[str, int, int, int]],
) -> None:
    ledger = ResourceLedger({RAM: 1000, WSL: 500}, name="sequence")
    live: list[str] = []
    held: list[str] = []
    for kind, ram, wsl, pick in operations:
        if kind == "reserve":
            demands = {"a": {RAM: ram}, "b": {RAM: ram // 2, WSL: wsl}}
            if ram + ram // 2 <= ledger.snapshot().constraints[RAM].free and (
                wsl <= ledger.snapshot().constraints[WSL].free
            ):
                live.extend(ledger.reserve_plan("o", demands).ids)
            else:
                with pytest.raises(AdmissionRefused) as caught:
                    ledger.reserve_plan("o", demands)
                assert caught.value.constraint in (RAM, WSL)
        elif kind == "release" and live:
            assert ledger.release(live.pop(pick % len(live)))
        elif kind == "quarantine" and live:
            reservation_id = live.pop(pick % len(live))
            ledger.quarantine(reservation_id, "unverified")
            held.append(reservation_id)
        elif kind == "resolve" and held:
            ledger.resolve_quarantine(held.pop(pick % len(held)))
        assert_within_capacity(ledger.snapshot())
    for reservation_id in live:
        assert ledger.release(reservation_id)
    for reservation_id in held:
        ledger.resolve_quarantine(reservation_id)
    assert_all_free(ledger)
