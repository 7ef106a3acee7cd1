"""Each pipeline's capacities are its own in the studio: the ledger takes the loaded
pipeline's ceilings (not the smallest seen so far), and the "Fits" badge agrees with Run,
counting what stays quarantined in the studio's ledger.

The speech demo, chat-speak and the add demo in one window (the case users met) are in
``test_studio_chat.py``, which needs vLLM; these use graph pipelines only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.models import BudgetRow, PlanView, RunState
from app.presenters import with_quarantine
from runtime.ledger import ResourceLedger
from tests.app.support import open_pipeline, wait_state

if TYPE_CHECKING:
    from collections.abc import Callable

GiB = 1 << 30
MiB = 1 << 20
RAM = "machine:ram"


def roomy_add(demo_root: Path, folder: Path) -> Path:
    """The add demo with a 6 GiB ceiling and a 3 GiB demand: more than add.yaml's 2 GiB."""
    text = (demo_root / "pipelines" / "add.yaml").read_text(encoding="utf-8")
    text = text.replace('"machine:ram": 2GiB', '"machine:ram": 6GiB')
    text = text.replace('"machine:ram": 128MiB', '"machine:ram": 3GiB')
    text = text.replace(
        "../bundles/add/manifest.json", str(demo_root / "bundles" / "add" / "manifest.json")
    )
    path = folder / "roomy-add.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def run(qtbot: Any, window: Any) -> Any:
    with qtbot.waitSignal(window.bridge.run_finished, timeout=60_000) as finished:
        window.run_action.trigger()
    wait_state(qtbot, window, RunState.LOADED, RunState.READY)
    return finished.args[0]


def test_a_pipeline_opened_after_a_smaller_one_gets_its_own_capacity(
    make_window: Callable[..., Any], qtbot: Any, demo_root: Path, tmp_path: Path
) -> None:
    window = make_window()
    open_pipeline(qtbot, window, demo_root / "pipelines" / "add.yaml")
    assert run(qtbot, window).status == "completed"
    assert window.bridge.ledger_snapshot().row(RAM).capacity == 2 * GiB

    info = open_pipeline(qtbot, window, roomy_add(demo_root, tmp_path))
    assert info.plan.admitted
    assert window.run_pane.fit_chip.text() == "Fits"
    outcome = run(qtbot, window)
    assert outcome.status == "completed", outcome.message
    assert window.bridge.ledger_snapshot().row(RAM).capacity == 6 * GiB

    # And back: the smaller pipeline's ceiling is its own again.
    open_pipeline(qtbot, window, demo_root / "pipelines" / "add.yaml")
    assert run(qtbot, window).status == "completed"
    assert window.bridge.ledger_snapshot().row(RAM).capacity == 2 * GiB


def test_the_badge_counts_what_is_quarantined_and_agrees_with_run(
    make_window: Callable[..., Any], qtbot: Any, demo_root: Path
) -> None:
    window = make_window()
    add = demo_root / "pipelines" / "add.yaml"
    open_pipeline(qtbot, window, add)
    assert window.run_pane.fit_chip.text() == "Fits"
    # A worker of an earlier run that could not be confirmed gone holds most of the memory.
    ledger = window.bridge.ledger
    ledger.declare_capacities({RAM: 2 * GiB})
    held = ledger.reserve_plan("earlier", {"stage-0": {RAM: 2 * GiB - 64 * MiB}})
    with qtbot.waitSignal(window.bridge.plan_changed, timeout=30_000) as replanned:
        ledger.quarantine(held.stages["stage-0"].id, "not confirmed gone")
    plan = replanned.args[0]
    assert not plan.admitted
    assert "1.9 GiB of its 2.0 GiB is quarantined" in plan.refusals[-1]
    (row,) = plan.budget
    assert (row.in_use, row.fits) == (2 * GiB - 64 * MiB, False)
    assert window.run_pane.fit_chip.text() == "Refused"
    outcome = run(qtbot, window)
    assert outcome.status == "failed"
    assert "admission refused: machine:ram needs 128.0 MiB" in outcome.message

    with qtbot.waitSignal(window.bridge.plan_changed, timeout=30_000) as replanned:
        ledger.resolve_quarantine(held.stages["stage-0"].id)
    assert replanned.args[0].admitted
    assert window.run_pane.fit_chip.text() == "Fits"
    assert run(qtbot, window).status == "completed"


def test_with_quarantine_counts_only_what_is_quarantined_on_the_plans_constraints() -> None:
    view = PlanView(
        admitted=True,
        topology="discovered",
        stages=(),
        budget=(BudgetRow(RAM, True, 2 * GiB, 0, GiB, GiB, True, {"stage-0": GiB}),),
        refusals=(),
        warnings=(),
    )
    ledger = ResourceLedger({RAM: 4 * GiB, "wsl:quota": 4 * GiB}, name="studio-like")
    kept = ledger.reserve_plan("loaded", {"a": {RAM: 3 * GiB}})
    # Reserved (the loaded pipeline's own) does not count, and nothing is quarantined.
    assert with_quarantine(view, ledger.snapshot()) == view
    lost = ledger.reserve_plan("earlier", {"b": {RAM: GiB // 2, "wsl:quota": 3 * GiB}})
    ledger.quarantine(lost.stages["b"].id, "not confirmed gone")
    still_fits = with_quarantine(view, ledger.snapshot())
    assert still_fits.admitted
    assert still_fits.budget[0].in_use == GiB // 2
    assert still_fits.budget[0].headroom == GiB // 2
    ledger.release_plan(kept)
    more = ledger.reserve_plan("later", {"c": {RAM: GiB}})
    ledger.quarantine(more.stages["c"].id, "not confirmed gone")
    refused = with_quarantine(view, ledger.snapshot())
    assert not refused.admitted
    assert (refused.budget[0].in_use, refused.budget[0].fits) == (3 * GiB // 2, False)
    assert refused.refusals == (
        "machine:ram: 1.5 GiB of its 2.0 GiB is quarantined (a worker not confirmed gone), "
        "so the plan's 1.0 GiB does not fit until it is freed",
    )
    for plan in (lost, more):
        for stage in plan.stages.values():
            ledger.resolve_quarantine(stage.id)
    assert ledger.snapshot().is_empty
