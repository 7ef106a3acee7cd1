"""Capacities belong to the machine in the studio: its ledger holds the machine's memory,
each pipeline's capacities are its own ceiling, pipelines opened in turn stay loaded together
as far as that memory allows (a load that does not fit unloads the warm ones first, and what
the Serve switch holds is named in the refusal), and the "Fits" badge agrees with Run,
counting what stays quarantined in the studio's ledger.

The four bundled demos in one window (two of them vLLM) are in ``test_studio_chat.py``;
these use graph pipelines only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from app.models import BudgetRow, PlanView, RunState
from app.presenters import with_quarantine
from app.settings import StudioSettings
from runtime.devices import discover_topology, save_topology
from runtime.ledger import ResourceLedger
from tests.app.support import open_pipeline, wait_state

if TYPE_CHECKING:
    from collections.abc import Callable

GiB = 1 << 30
MiB = 1 << 20
RAM = "machine:ram"


def add_variant(demo_root: Path, folder: Path, name: str, capacity: str, demand: str) -> Path:
    """The add demo as pipeline ``name`` with its own ceiling and demand."""
    text = (demo_root / "pipelines" / "add.yaml").read_text(encoding="utf-8")
    text = text.replace("pipeline: demo_add", f"pipeline: {name}")
    text = text.replace('"machine:ram": 2GiB', f'"machine:ram": {capacity}')
    text = text.replace('"machine:ram": 128MiB', f'"machine:ram": {demand}')
    text = text.replace(
        "../bundles/add/manifest.json", str(demo_root / "bundles" / "add" / "manifest.json")
    )
    path = folder / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def machine_file(folder: Path, ram: str) -> Path:
    """This machine as a topology file stating ``ram`` of memory (all of it free)."""
    path = save_topology(discover_topology(), folder / "machine.yaml")
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    document["memory"][RAM] = {"capacity": ram, "observed_free": ram}
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def on_machine(make_window: Callable[..., Any], tmp_path: Path, ram: str) -> Any:
    settings = StudioSettings(tmp_path / "config" / "studio.ini")
    settings.topology_file = machine_file(tmp_path, ram)
    return make_window(settings=settings)


def run(qtbot: Any, window: Any) -> Any:
    with qtbot.waitSignal(window.bridge.run_finished, timeout=60_000) as finished:
        window.run_action.trigger()
    wait_state(qtbot, window, RunState.LOADED, RunState.READY)
    return finished.args[0]


def owners(window: Any) -> list[str]:
    return sorted({r.owner for r in window.bridge.ledger.snapshot().reservations})


def test_pipelines_opened_in_turn_stay_loaded_together_under_the_machines_memory(
    make_window: Callable[..., Any], qtbot: Any, demo_root: Path, tmp_path: Path
) -> None:
    window = on_machine(make_window, tmp_path, "8GiB")
    open_pipeline(qtbot, window, demo_root / "pipelines" / "add.yaml")
    assert run(qtbot, window).status == "completed"
    assert window.bridge.ledger_snapshot().row(RAM).capacity == 8 * GiB

    # A larger ceiling (6 GiB) than add's 2 GiB: it loads beside add, and neither ceiling
    # changes the machine's 8 GiB.
    info = open_pipeline(qtbot, window, add_variant(demo_root, tmp_path, "roomy", "6GiB", "3GiB"))
    assert info.plan.admitted
    assert window.bridge.state is RunState.READY
    assert window.run_pane.fit_chip.text() == "Fits"
    outcome = run(qtbot, window)
    assert outcome.status == "completed", outcome.message
    assert owners(window) == ["demo_add", "roomy"]
    row = window.bridge.ledger_snapshot().row(RAM)
    assert (row.capacity, row.reserved) == (8 * GiB, 3 * GiB + 128 * MiB)

    # Reopened, add is still loaded: it runs at once.
    open_pipeline(qtbot, window, demo_root / "pipelines" / "add.yaml")
    assert window.bridge.state is RunState.LOADED
    assert run(qtbot, window).status == "completed"
    assert owners(window) == ["demo_add", "roomy"]

    # Unload lets go of every loaded pipeline.
    window.bridge.unload()
    wait_state(qtbot, window, RunState.READY)
    assert window.bridge.ledger.snapshot().is_empty


def test_a_load_that_does_not_fit_unloads_the_warm_pipelines_first(
    make_window: Callable[..., Any], qtbot: Any, demo_root: Path, tmp_path: Path
) -> None:
    window = on_machine(make_window, tmp_path, "1GiB")
    open_pipeline(qtbot, window, demo_root / "pipelines" / "add.yaml")
    assert run(qtbot, window).status == "completed"
    big = add_variant(demo_root, tmp_path, "big", "2GiB", "960MiB")
    open_pipeline(qtbot, window, big)
    lines: list[str] = []
    window.bridge.log_line.connect(lambda line: lines.append(line.text))
    outcome = run(qtbot, window)
    assert outcome.status == "completed", outcome.message
    assert owners(window) == ["big"]
    assert any(line.startswith("unloading demo_add to make room for big") for line in lines)


def test_what_the_serve_switch_holds_is_named_when_a_load_does_not_fit(
    make_window: Callable[..., Any], qtbot: Any, demo_root: Path, tmp_path: Path
) -> None:
    window = on_machine(make_window, tmp_path, "1GiB")
    bridge = window.bridge
    open_pipeline(qtbot, window, add_variant(demo_root, tmp_path, "served", "2GiB", "256MiB"))
    bridge.serve_port = 0
    with qtbot.waitSignal(
        bridge.serve_changed, timeout=120_000, check_params_cb=lambda v: v.state == "serving"
    ):
        assert bridge.start_serving()
    # The server reserves in the studio's ledger: the machine's memory, counted once.
    assert owners(window) == ["served"]
    open_pipeline(qtbot, window, add_variant(demo_root, tmp_path, "big", "2GiB", "960MiB"))
    outcome = run(qtbot, window)
    assert outcome.status == "failed"
    assert outcome.message == (
        "admission refused: machine:ram needs 960.0 MiB for stage-0 but only 768.0 MiB is free "
        "of 1.0 GiB; held by served (256.0 MiB)"
    )
    with qtbot.waitSignal(
        bridge.serve_changed, timeout=60_000, check_params_cb=lambda v: v.state == "stopped"
    ):
        assert bridge.stop_serving()
    assert bridge.ledger.snapshot().is_empty
    assert run(qtbot, window).status == "completed"


def test_the_badge_counts_what_is_quarantined_and_agrees_with_run(
    make_window: Callable[..., Any], qtbot: Any, demo_root: Path, tmp_path: Path
) -> None:
    window = on_machine(make_window, tmp_path, "2GiB")
    add = demo_root / "pipelines" / "add.yaml"
    open_pipeline(qtbot, window, add)
    assert window.run_pane.fit_chip.text() == "Fits"
    # Opening it loaded its stages; unloaded, the run below loads them again.
    wait_state(qtbot, window, RunState.LOADED)
    assert window.bridge.unload()
    wait_state(qtbot, window, RunState.READY)
    # A worker of an earlier run that could not be confirmed gone holds most of the memory.
    ledger = window.bridge.ledger
    assert ledger.snapshot().constraints[RAM].capacity == 2 * GiB  # the machine's
    held = ledger.reserve_plan("earlier", {"stage-0": {RAM: 2 * GiB - 64 * MiB}})
    with qtbot.waitSignal(window.bridge.plan_changed, timeout=30_000) as replanned:
        ledger.quarantine(held.stages["stage-0"].id, "not confirmed gone")
    plan = replanned.args[0]
    assert not plan.admitted
    assert "1.9 GiB of the machine's 2.0 GiB is quarantined" in plan.refusals[-1]
    (row,) = plan.budget
    assert (row.in_use, row.fits) == (2 * GiB - 64 * MiB, False)
    assert window.run_pane.fit_chip.text() == "Refused"
    outcome = run(qtbot, window)
    assert outcome.status == "failed"
    assert "admission refused: machine:ram needs 128.0 MiB" in outcome.message
    assert "held by earlier (quarantined) (1.9 GiB)" in outcome.message

    with qtbot.waitSignal(window.bridge.plan_changed, timeout=30_000) as replanned:
        ledger.resolve_quarantine(held.stages["stage-0"].id)
    assert replanned.args[0].admitted
    assert window.run_pane.fit_chip.text() == "Fits"
    assert run(qtbot, window).status == "completed"


def test_with_quarantine_counts_what_is_quarantined_against_the_machine() -> None:
    view = PlanView(
        admitted=True,
        topology="discovered",
        stages=(),
        budget=(BudgetRow(RAM, True, 2 * GiB, 0, GiB, GiB, True, {"stage-0": GiB}),),
        refusals=(),
        warnings=(),
    )
    ledger = ResourceLedger({RAM: 6 * GiB, "wsl:quota": 4 * GiB}, name="studio-like")
    kept = ledger.reserve_plan("loaded", {"a": {RAM: 3 * GiB}})
    # Reserved (pipelines the studio can unload) does not count, and nothing is quarantined.
    assert with_quarantine(view, ledger.snapshot()) == view
    lost = ledger.reserve_plan("earlier", {"b": {RAM: 2 * GiB, "wsl:quota": 3 * GiB}})
    ledger.quarantine(lost.stages["b"].id, "not confirmed gone")
    still_fits = with_quarantine(view, ledger.snapshot())
    assert still_fits.admitted
    assert still_fits.budget[0].in_use == 2 * GiB
    assert still_fits.budget[0].headroom == GiB  # the ceiling's: 2 GiB less the plan's 1 GiB
    ledger.release_plan(kept)
    more = ledger.reserve_plan("later", {"c": {RAM: 3 * GiB + GiB // 2}})
    ledger.quarantine(more.stages["c"].id, "not confirmed gone")
    refused = with_quarantine(view, ledger.snapshot())
    assert not refused.admitted
    assert (refused.budget[0].in_use, refused.budget[0].fits) == (11 * GiB // 2, False)
    assert refused.budget[0].headroom == -GiB // 2
    assert refused.refusals == (
        "machine:ram: 5.5 GiB of the machine's 6.0 GiB is quarantined (a worker not confirmed "
        "gone), so the plan's 1.0 GiB does not fit until it is freed",
    )
    for plan in (lost, more):
        for stage in plan.stages.values():
            ledger.resolve_quarantine(stage.id)
    assert ledger.snapshot().is_empty
