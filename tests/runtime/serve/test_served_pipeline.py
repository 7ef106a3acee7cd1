"""A served pipeline in this process, through its session: what the endpoints read of it, a
request read output by output, a request closed before its end, and a closed pipeline's 503."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import numpy as np
import pytest

from runtime.assets import demo_pipeline
from runtime.errors import UsageError
from runtime.serve import PipelineRegistry
from runtime.serve.errors import ApiError
from runtime.serve.registry import GRAPH, ServedPipeline, Submitted


@pytest.fixture(scope="module")
def registry() -> Iterator[PipelineRegistry]:
    served = PipelineRegistry([demo_pipeline("add")])
    try:
        yield served
    finally:
        served.close()


@pytest.fixture
def add(registry: PipelineRegistry) -> ServedPipeline:
    return registry.get("demo_add")


def _inputs() -> dict[str, np.ndarray]:
    a = np.arange(1024, dtype=np.float32).reshape(1, 1024)
    return {"a": a, "b": a * 2}


async def _outputs(submitted: Submitted) -> list[dict[str, np.ndarray]]:
    kept = []
    try:
        while (output := await submitted.next()) is not None:
            kept.append(output.kept_outputs())
    finally:
        submitted.close()
    return kept


def test_what_the_endpoints_read_of_a_graph_pipeline(add: ServedPipeline) -> None:
    assert add.kind == GRAPH
    assert add.voices == ()
    assert add.max_model_len is None
    assert add.chat_template is None
    with pytest.raises(UsageError, match="pipeline demo_add does not speak"):
        _ = add.sample_rate
    with pytest.raises(UsageError, match="pipeline demo_add does not transcribe"):
        _ = add.max_audio_s
    status = add.status()
    assert (status.state, status.in_flight, status.concurrency) == ("ready", 0, 1)


def test_a_request_is_read_output_by_output_and_counted(add: ServedPipeline) -> None:
    before = add.status().finished["completed"]
    outputs = asyncio.run(_outputs(add.submit(_inputs())))
    assert len(outputs) == 1
    np.testing.assert_array_equal(outputs[0]["sum"], _inputs()["a"] * 3)
    deadline = time.monotonic() + 10.0
    while add.status().finished["completed"] == before and time.monotonic() < deadline:
        time.sleep(0.01)
    status = add.status()
    assert (status.finished["completed"], status.in_flight) == (before + 1, 0)


def test_a_request_closed_before_its_end_is_wound_up(add: ServedPipeline) -> None:
    submitted = add.submit(_inputs())
    submitted.close()
    submitted.close()  # idempotent
    # Closed: nothing more is read, and the pipeline serves the next request.
    assert asyncio.run(submitted.next()) is None
    deadline = time.monotonic() + 30.0
    while add.status().state != "ready" or add.status().in_flight:
        assert time.monotonic() < deadline, add.status()
        time.sleep(0.05)
    outputs = asyncio.run(_outputs(add.submit(_inputs())))
    np.testing.assert_array_equal(outputs[0]["sum"], _inputs()["a"] * 3)


def test_a_closed_pipeline_answers_503_with_retry_after() -> None:
    served = PipelineRegistry([demo_pipeline("add")])
    pipeline = served.get("demo_add")
    served.close()
    with pytest.raises(ApiError) as caught:
        pipeline.submit(_inputs())
    assert caught.value.status == 503
    assert "pipeline demo_add is closed" in str(caught.value)
    assert caught.value.headers["Retry-After"]
    assert pipeline.voices == ()
    assert pipeline.status().state == "closed"
