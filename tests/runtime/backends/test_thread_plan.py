"""The thread plan: waiting awake between calls only where a core is left for it, and pools
that spin within their runs only where no other pool may run at the same time."""

from __future__ import annotations

from pathlib import Path

from runtime.backends.threads import SPIN_WAIT_US, plan_threads
from runtime.config.loader import load_pipeline

PIPELINES = Path(__file__).resolve().parents[3] / "assets" / "pipelines"


def test_a_lone_graph_stage_waits_awake_on_two_cores_or_more() -> None:
    config = load_pipeline(PIPELINES / "add.yaml")
    for cores, expected in ((1, 0), (2, SPIN_WAIT_US), (8, SPIN_WAIT_US)):
        plans = plan_threads(config, cores)
        assert {plan.spin_wait_us for plan in plans.values()} == {expected}
        assert ("awake" in next(iter(plans.values())).reason) is bool(expected)
        assert all(plan.to_json()["spin_wait_us"] == expected for plan in plans.values())


def test_graph_stages_taking_turns_never_wait_awake() -> None:
    """One stage's worker polling would take a core from the next stage's pool."""
    plans = plan_threads(load_pipeline(PIPELINES / "mlp-chain.yaml"), 8)
    assert len(plans) == 2
    assert {plan.spin_wait_us for plan in plans.values()} == {0}


def test_graph_stages_beside_a_language_model_never_wait_awake() -> None:
    config = load_pipeline(PIPELINES / "chat-speak.yaml")
    plans = plan_threads(config, 8)
    assert plans, "chat-speak has graph stages"
    assert {plan.spin_wait_us for plan in plans.values()} == {0}


def test_pools_that_take_turns_spin_within_their_runs() -> None:
    for name, count in (("add.yaml", 1), ("mlp-chain.yaml", 2)):
        plans = plan_threads(load_pipeline(PIPELINES / name), 2)
        assert len(plans) == count
        assert all(plan.allow_spinning for plan in plans.values()), name
        assert all("spinning within each run only" in plan.reason for plan in plans.values())


def test_pools_that_may_run_at_the_same_time_never_spin() -> None:
    config = load_pipeline(PIPELINES / "mlp-chain.yaml")
    names = [stage.name for stage in config.stages]
    plans = plan_threads(config, 8, concurrent=names)
    assert all(plan.overlaps for plan in plans.values())
    assert not any(plan.allow_spinning for plan in plans.values())
    beside_a_language_model = plan_threads(load_pipeline(PIPELINES / "chat-speak.yaml"), 8)
    assert not any(plan.allow_spinning for plan in beside_a_language_model.values())


def test_a_solo_stage_beside_a_language_model_gets_every_core() -> None:
    config = load_pipeline(PIPELINES / "chat-speak.yaml")
    acoustic, decoder = (stage.name for stage in config.stages[1:])
    plans = plan_threads(config, 2, solo=[acoustic])
    assert plans[acoustic].intra_op_threads == 2
    assert not plans[acoustic].allow_spinning
    assert "the other stages wait" in plans[acoustic].reason
    # The others still share the cores with the language model.
    assert plans[decoder].intra_op_threads == 1
    assert plan_threads(config, 2)[acoustic].intra_op_threads == 1
