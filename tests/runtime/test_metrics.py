"""A session's metrics: typed values summed per stage, whose JSON keeps the keys it always had."""

from __future__ import annotations

from runtime.metrics import (
    GenerationMetrics,
    RequestMetrics,
    SessionMetrics,
    StageCallMetrics,
    StageTotals,
)


def _call(stage: str, run_s: float, **fields: object) -> StageCallMetrics:
    return StageCallMetrics(stage, 0.5, run_s, 0.25, 10, 20, **fields)  # type: ignore[arg-type]


def test_the_totals_sum_each_stages_calls_over_the_requests() -> None:
    generation = GenerationMetrics(4, "stop", 0.1, 1.0, 2.0, prompt="user: hi")
    first = RequestMetrics("r-1", "completed", (_call("a", 1.0), _call("b", 2.0)))
    second = RequestMetrics("r-2", "cancelled", (_call("a", 3.0, generation=generation),))
    metrics = SessionMetrics.of("demo", [first, second])
    assert metrics.requests == (first, second)
    assert metrics.stages["a"] == StageTotals(2, 1.0, 4.0, 0.5, 20, 40)
    assert metrics.stages["b"] == StageTotals(1, 0.5, 2.0, 0.25, 10, 20)
    assert second.prompts == {"a": "user: hi"}


def test_the_json_is_the_document_scripts_and_metrics_json_read() -> None:
    request = RequestMetrics("r-1", "completed", (_call("a", 1.0, copied_bytes=0),))
    document = SessionMetrics.of("demo", [request]).to_json()
    assert document == {
        "pipeline": "demo",
        "requests": [
            {
                "request_id": "r-1",
                "status": "completed",
                "stages": [
                    {
                        "stage": "a",
                        "queue_s": 0.5,
                        "run_s": 1.0,
                        "transfer_s": 0.25,
                        "bytes_in": 10,
                        "bytes_out": 20,
                        "copied_bytes": 0,
                    }
                ],
                "prompts": {},
            }
        ],
        "stages": {
            "a": {
                "calls": 1,
                "queue_s": 0.5,
                "run_s": 1.0,
                "transfer_s": 0.25,
                "bytes_in": 10,
                "bytes_out": 20,
            }
        },
    }
    assert SessionMetrics("empty").to_json() == {"pipeline": "empty", "requests": [], "stages": {}}
