"""The placement report and the gate that refuses a stage running outside its route."""

from __future__ import annotations

import pytest

from runtime.backends.placement import (
    BELOW_MIN_FRACTION,
    OUTSIDE_ALLOWED,
    PROVIDER_ABSENT,
    UNVERIFIED,
    PlacementReport,
    PlacementViolation,
    check_provider_available,
    gate_placement,
)
from runtime.contracts.buffers import DType
from runtime.contracts.messages import ReadyMessage, TensorSpec
from runtime.errors import PlacementRefused

CPU = "CPUExecutionProvider"
NPU = "VitisAIExecutionProvider"
DML = "DmlExecutionProvider"


def _report(counts: dict[str, int], target: str = NPU, total: int | None = None) -> PlacementReport:
    return PlacementReport(
        counts=counts,
        total_nodes=sum(counts.values()) if total is None else total,
        method="assignment_info",
        target_provider=target,
    )


def test_report_fraction_and_json_keep_the_real_split() -> None:
    report = _report({NPU: 30, CPU: 10})
    assert report.fraction_on_target == 0.75
    assert report.to_json() == {
        "counts": {CPU: 10, NPU: 30},
        "total_nodes": 40,
        "unplaced_nodes": 0,
        "method": "assignment_info",
        "target_provider": NPU,
        "fraction_on_target": 0.75,
    }
    assert report.split_text() == f"{CPU} 10/40, {NPU} 30/40"


@pytest.mark.parametrize(
    ("counts", "total", "needle"),
    [
        ({CPU: -1}, 0, "integer >= 0"),
        ({CPU: True}, 1, "integer >= 0"),
        ({"": 1}, 1, "non-empty string"),
        ({CPU: 2}, 1, "at least the sum"),
    ],
)
def test_malformed_reports_are_refused(counts: dict[str, int], total: int, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        PlacementReport(counts, total, "profiling", CPU)


def test_all_nodes_on_an_allowed_target_pass() -> None:
    report = _report({CPU: 12}, target=CPU)
    gate_placement(
        report,
        allowed_providers=[CPU],
        target_provider=CPU,
        min_fraction_on_target=1.0,
        stage="stage-0",
    )


def test_nodes_on_a_provider_outside_allowed_are_refused() -> None:
    report = _report({NPU: 30, CPU: 10})
    with pytest.raises(PlacementViolation) as caught:
        gate_placement(
            report,
            allowed_providers=[NPU],
            target_provider=NPU,
            min_fraction_on_target=0.5,
            stage="stage-1",
        )
    error = caught.value
    assert isinstance(error, PlacementRefused)
    assert error.reason == OUTSIDE_ALLOWED
    assert error.report is report
    assert error.stage == "stage-1"
    message = str(error)
    assert message.startswith("stage stage-1:")
    assert f"{CPU} (10 nodes)" in message
    assert f"[{NPU}]" in message


def test_cpu_is_refused_when_only_the_accelerator_is_allowed() -> None:
    report = _report({DML: 5, CPU: 1}, target=DML)
    with pytest.raises(PlacementViolation, match=r"CPUExecutionProvider \(1 nodes\)") as caught:
        gate_placement(
            report,
            allowed_providers=[DML],
            target_provider=DML,
            min_fraction_on_target=0.5,
            stage="stage-0",
        )
    assert caught.value.reason == OUTSIDE_ALLOWED


def test_a_fraction_below_the_minimum_is_refused_with_the_split() -> None:
    report = _report({NPU: 30, CPU: 10})
    with pytest.raises(PlacementViolation) as caught:
        gate_placement(
            report,
            allowed_providers=[NPU, CPU],
            target_provider=NPU,
            min_fraction_on_target=0.8,
            stage="stage-0",
        )
    assert caught.value.reason == BELOW_MIN_FRACTION
    message = str(caught.value)
    assert "30 of 40 nodes (0.750)" in message
    assert "min_fraction_on_target 0.8" in message
    assert f"{CPU} 10/40, {NPU} 30/40" in message


def test_a_deliberately_partitioned_graph_passes_a_lowered_minimum() -> None:
    report = _report({NPU: 30, CPU: 10})
    gate_placement(
        report,
        allowed_providers=[NPU, CPU],
        target_provider=NPU,
        min_fraction_on_target=0.75,
        stage="stage-0",
    )
    assert report.counts == {CPU: 10, NPU: 30}, "the report keeps the real split"


def test_the_default_minimum_is_all_nodes_on_target() -> None:
    report = _report({NPU: 39, CPU: 1})
    with pytest.raises(PlacementViolation) as caught:
        gate_placement(report, allowed_providers=[NPU, CPU], target_provider=NPU, stage="s")
    assert caught.value.reason == BELOW_MIN_FRACTION


@pytest.mark.parametrize(
    ("counts", "total", "needle"),
    [({}, 0, "reported no nodes"), ({CPU: 3}, 4, "no provider for 1 of 4 nodes")],
)
def test_unverified_placement_is_refused(counts: dict[str, int], total: int, needle: str) -> None:
    report = _report(counts, target=CPU, total=total)
    with pytest.raises(PlacementViolation, match=needle) as caught:
        gate_placement(
            report,
            allowed_providers=[CPU],
            target_provider=CPU,
            min_fraction_on_target=1.0,
            stage="stage-0",
        )
    assert caught.value.reason == UNVERIFIED


@pytest.mark.parametrize("minimum", [0.0, -0.1, 1.5])
def test_a_minimum_outside_zero_to_one_is_a_value_error(minimum: float) -> None:
    with pytest.raises(ValueError, match="outside"):
        gate_placement(
            _report({CPU: 1}, target=CPU),
            allowed_providers=[CPU],
            target_provider=CPU,
            min_fraction_on_target=minimum,
            stage="stage-0",
        )


def test_an_absent_provider_names_the_available_ones() -> None:
    check_provider_available(CPU, [CPU], "stage-0")
    with pytest.raises(PlacementViolation) as caught:
        check_provider_available(DML, ["AzureExecutionProvider", CPU], "stage-2")
    assert caught.value.reason == PROVIDER_ABSENT
    message = str(caught.value)
    assert message.startswith("stage stage-2:")
    assert DML in message
    assert f"available: AzureExecutionProvider, {CPU}" in message


def test_report_from_a_ready_message() -> None:
    ready = ReadyMessage(
        placement={CPU: 3},
        total_nodes=4,
        placement_method="profiling",
        inputs=(TensorSpec("x", DType.FLOAT32, (1, 2)),),
        outputs=(TensorSpec("y", DType.FLOAT32, (1, 2)),),
        load_s=0.1,
        warmup_s=0.01,
        rss_bytes=1,
    )
    report = PlacementReport.from_ready(ready, target_provider=CPU)
    assert (report.total_nodes, report.unplaced_nodes, report.method) == (4, 1, "profiling")
    assert report.fraction_on_target == 0.75
