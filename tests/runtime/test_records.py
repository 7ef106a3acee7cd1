"""The stage records and the execution plan: typed values whose JSON is what leaves the program."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass
from pathlib import Path
from typing import Any

import pytest

from runtime.records import (
    BACKEND_LABEL,
    BACKEND_LABEL_MEANING,
    ExecutionPlan,
    ReservationRecord,
    StageRecord,
    WorkerRecord,
)


@dataclass(frozen=True, slots=True)
class _Detail:
    """A stage detail with a worker and a reservation, as a graph stage reports them."""

    worker: WorkerRecord | None
    reservation: ReservationRecord | None = None
    route_name: str = "local-cpu"
    ep: str = "cpu"
    placement: None = None
    load_s: float | None = 0.25
    warmup_s: float | None = None
    worker_rss_bytes: int | None = None
    usable: bool = True
    model_dir: Path | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "worker": None if self.worker is None else self.worker.to_json(),
            "reservation": None if self.reservation is None else self.reservation.to_json(),
            "load_s": self.load_s,
        }


def _plan() -> ExecutionPlan:
    worker = WorkerRecord(pid=41, generation=2, argv=("python", "-m", "workers.ort_worker"))
    in_process = WorkerRecord(pid=7, generation=1, in_process=True)
    reservation = ReservationRecord("r-1", {"machine:ram": 512})
    return ExecutionPlan(
        pipeline="speak",
        source="/pipelines/speak.yaml",
        stages=(
            StageRecord("acoustic", "external.graph.v1", _Detail(worker, reservation)),
            StageRecord("vocoder", "external.graph.v1", _Detail(in_process)),
            StageRecord("llm", "native.vllm.v1", _Detail(None, model_dir=Path("/models/tiny"))),
            StageRecord("scripted", "scripted"),
        ),
    )


def test_the_plans_json_is_the_execution_plan_document() -> None:
    document = _plan().to_json()
    assert list(document) == ["pipeline", "label", "label_meaning", "source", "stages"]
    assert (document["label"], document["label_meaning"]) == (BACKEND_LABEL, BACKEND_LABEL_MEANING)
    assert document["source"] == "/pipelines/speak.yaml"
    acoustic, vocoder, llm, scripted = document["stages"]
    assert acoustic == {
        "stage": "acoustic",
        "backend": "external.graph.v1",
        "worker": {"pid": 41, "generation": 2, "argv": ["python", "-m", "workers.ort_worker"]},
        "reservation": {"id": "r-1", "amounts": {"machine:ram": 512}},
        "load_s": 0.25,
    }
    assert vocoder["worker"] == {"pid": 7, "generation": 1, "argv": [], "in_process": True}
    assert llm["worker"] is None
    assert scripted == {"stage": "scripted", "backend": "scripted"}


def test_a_record_answers_the_common_fields_from_its_detail_or_as_empty() -> None:
    plan = _plan()
    acoustic = plan.stage("acoustic")
    assert acoustic.worker is not None
    assert (acoustic.worker.pid, acoustic.route_name, acoustic.ep) == (41, "local-cpu", "cpu")
    assert acoustic.reservation == ReservationRecord("r-1", {"machine:ram": 512})
    assert acoustic.load_s == 0.25
    assert (acoustic.model_dir, plan.stage("llm").model_dir) == (None, Path("/models/tiny"))
    bare = plan.stage("scripted")
    assert (bare.worker, bare.reservation, bare.placement, bare.model_dir) == (None,) * 4
    assert (bare.route_name, bare.ep, bare.usable) == ("", "", True)


def test_worker_pids_name_the_worker_processes_only() -> None:
    assert _plan().worker_pids == (41,)
    assert ExecutionPlan("empty").worker_pids == ()


def test_an_unknown_stage_is_refused_with_the_stages_there_are() -> None:
    with pytest.raises(
        KeyError, match=r"no stage 'voice' in the plan of speak .*acoustic, vocoder"
    ):
        _plan().stage("voice")
    with pytest.raises(KeyError, match=r"stages: none"):
        ExecutionPlan("empty").stage("voice")


def test_records_are_frozen() -> None:
    plan = _plan()
    with pytest.raises(FrozenInstanceError):
        plan.pipeline = "other"  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        plan.stages[0].stage = "other"  # type: ignore[misc]
