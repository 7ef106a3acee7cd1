"""The pipeline session: what it reports, its handles, streaming input, health, closing."""

from __future__ import annotations

import asyncio
import itertools
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import yaml

from runtime.api import PipelineSession, ProgramOptions, SessionHealth
from runtime.devices import DeviceSelection, discover_topology
from runtime.errors import RequestCancelled, UsageError
from runtime.ledger import ResourceLedger
from tests.helpers.onnx_graphs import example_inputs, make_bundle
from tests.runtime.engine.support import (
    ENDLESS_STEPS,
    StageSpec,
    child_pids,
    controller_segments,
    process_gone,
    wait_busy,
    wait_until,
    write_pipeline,
)
from tests.workers.support import make_loop_bundle

if TYPE_CHECKING:
    from pathlib import Path

    from runtime.api import RequestHandle

N = 1024


@pytest.fixture(scope="module")
def options() -> dict[str, Any]:
    """Engine options independent of the user's saved device selection."""
    return {"topology": discover_topology(), "selection": DeviceSelection()}


@pytest.fixture(scope="module")
def add_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One graph stage adding two float32 vectors of N elements (axis 0 is the stream's)."""
    root = tmp_path_factory.mktemp("add")
    manifest = make_bundle(root, kind="add", n=N)
    return write_pipeline(root / "add.yaml", StageSpec(manifest), name="session_add")


def _final(handle: RequestHandle) -> dict[str, np.ndarray]:
    final: dict[str, np.ndarray] = {}
    for output in handle:
        if output.finished:
            final = output.kept_outputs()
    return final


def _wound_up(session: PipelineSession, count: int) -> None:
    """Wait until ``count`` requests were wound up (a failed one frees its slot after its
    error reached the caller)."""
    wait_until(lambda: len(session.metrics().requests) >= count, f"{count} requests")


def _chunks(inputs: dict[str, np.ndarray], cuts: tuple[int, ...]) -> list[dict[str, np.ndarray]]:
    edges = (0, *cuts, N)
    return [
        {name: value[start:end] for name, value in inputs.items()}
        for start, end in itertools.pairwise(edges)
    ]


def test_a_streaming_request_fed_in_chunks_gives_the_one_shot_result(
    add_pipeline: Path, options: dict[str, Any]
) -> None:
    inputs = example_inputs("add", N)
    ledger = ResourceLedger(name="session")
    session = PipelineSession(add_pipeline, ledger=ledger, **options)
    # Parsed, not loaded: nothing runs yet.
    assert (session.name, session.kind, session.input_kind) == ("session_add", "graph", "tensors")
    assert session.streams_input
    assert not session.loaded
    assert session.health == SessionHealth(False, "pipeline session_add is not loaded")
    with session:
        assert session.loaded
        assert session.usable
        assert session.concurrency == 1
        assert session.options == ProgramOptions(
            kind="graph", input_kind="tensors", streams_input=True
        )
        (pid,) = child_pids()
        one_shot = session.run(inputs)
        np.testing.assert_array_equal(one_shot["c"], inputs["a"] + inputs["b"])

        handle = session.submit(streaming=True)
        assert handle.streaming
        assert not handle.finished
        for chunk in _chunks(inputs, (100, 612)):
            handle.feed(chunk)
        handle.end_input()
        with pytest.raises(UsageError, match="its input has ended"):
            handle.feed(_chunks(inputs, ())[0])
        streamed = _final(handle)
        assert handle.finished
        np.testing.assert_array_equal(streamed["c"], one_shot["c"])

        # The first chunk may come with the submit; a lone chunk is the whole input.
        first, rest = _chunks(inputs, (1,))
        handle = session.submit(first, streaming=True)
        handle.feed(rest)
        handle.end_input()
        np.testing.assert_array_equal(_final(handle)["c"], one_shot["c"])
        assert [r.status for r in session.metrics().requests] == ["completed"] * 3
    assert not session.loaded
    assert process_gone(pid)
    assert ledger.snapshot().is_empty
    session.close()  # idempotent
    with pytest.raises(UsageError, match="not running"):
        session.submit(streaming=True)


def test_async_iteration_of_a_streaming_request(
    add_pipeline: Path, options: dict[str, Any]
) -> None:
    inputs = example_inputs("add", N)

    async def main(session: PipelineSession) -> np.ndarray:
        handle = session.submit(streaming=True)
        for chunk in _chunks(inputs, (512,)):
            handle.feed(chunk)
        handle.end_input()
        finals = [output.kept_outputs()["c"] async for output in handle if output.finished]
        return finals[0]

    with PipelineSession(add_pipeline, **options) as session:
        result = asyncio.run(main(session))
    np.testing.assert_array_equal(result, inputs["a"] + inputs["b"])


def test_cancel_mid_input_ends_the_request_cancelled_and_leaves_nothing_behind(
    add_pipeline: Path, options: dict[str, Any]
) -> None:
    inputs = example_inputs("add", N)
    ledger = ResourceLedger(name="session")
    with PipelineSession(add_pipeline, ledger=ledger, **options) as session:
        (pid,) = child_pids()
        (reservation,) = ledger.snapshot().reservations
        handle = session.submit(streaming=True)
        handle.feed(_chunks(inputs, (300,))[0])
        # The program is waiting for more input; a cancel wakes it and ends the request.
        assert handle.cancel()
        with pytest.raises(RequestCancelled, match="was cancelled"):
            handle.next(10)
        assert handle.finished
        assert handle.next() is None
        with pytest.raises(UsageError, match="has ended"):
            handle.feed(_chunks(inputs, (300,))[1])
        assert not handle.cancel()
        # No call had begun: the worker and its reservation stay, usable for the next one.
        assert session.usable
        assert ledger.snapshot().reservations == (reservation,)
        assert not process_gone(pid)
        np.testing.assert_array_equal(session.run(inputs)["c"], inputs["a"] + inputs["b"])
        assert [r.status for r in session.metrics().requests] == ["cancelled", "completed"]

        # Closing a handle cancels a request still waiting for input.
        handle = session.submit(streaming=True)
        handle.feed(inputs)
        handle.close(wait=True)
        assert handle.finished
        assert handle.next() is None
        assert session.metrics().requests[-1].status == "cancelled"
    assert process_gone(pid)
    assert not controller_segments()
    assert ledger.snapshot().is_empty


def test_input_errors_name_what_is_accepted(
    add_pipeline: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    inputs = example_inputs("add", N)
    with PipelineSession(add_pipeline, **options) as session:
        handle = session.submit(inputs)
        with pytest.raises(UsageError, match="not submitted with streaming=True"):
            handle.feed(inputs)
        with pytest.raises(UsageError, match="not submitted with streaming=True"):
            handle.end_input()
        np.testing.assert_array_equal(_final(handle)["c"], inputs["a"] + inputs["b"])

        handle = session.submit(streaming=True)
        with pytest.raises(UsageError, match="'a' is a scalar; accepted: arrays"):
            handle.feed({"a": np.float32(1.0), "b": np.float32(2.0)})
        with pytest.raises(UsageError, match="takes a mapping of input name to array"):
            handle.feed([1, 2])
        handle.feed({"a": inputs["a"][:10], "b": inputs["b"][:10]})
        handle.feed({"a": inputs["a"][10:]})
        handle.end_input()
        with pytest.raises(UsageError, match=r"chunk 1 has inputs \['a'\]; accepted"):
            handle.next(10)
        _wound_up(session, 2)

        handle = session.submit(streaming=True)
        handle.end_input()
        with pytest.raises(UsageError, match="ended with no input"):
            handle.next(10)
        _wound_up(session, 3)

        handle = session.submit(streaming=True)
        handle.feed({"a": inputs["a"][:10], "b": inputs["b"][:10]})
        handle.feed({"a": inputs["a"][10:], "b": inputs["b"][10:].astype(np.float64)})
        handle.end_input()
        with pytest.raises(UsageError, match="chunk 1's 'b' is float64"):
            handle.next(10)
        _wound_up(session, 4)
        assert [r.status for r in session.metrics().requests] == ["completed"] + ["failed"] * 3
        assert session.usable

    # A program that reads its input whole refuses streaming=True, naming the pipeline.
    document = yaml.safe_load(add_pipeline.read_text(encoding="utf-8"))
    document["pipeline"] = "whole_input"
    document["adapter"] = {"name": "tests.helpers.programs:WholeInputChain"}
    whole = tmp_path / "whole.yaml"
    whole.write_text(yaml.safe_dump(document), encoding="utf-8")
    with PipelineSession(whole, **options) as session:
        assert not session.streams_input
        assert session.kind == "whole-input chain"
        with pytest.raises(
            UsageError, match=r"pipeline whole_input \(whole-input chain\) takes its input whole"
        ):
            session.submit(inputs, streaming=True)
        np.testing.assert_array_equal(
            _final(session.submit(inputs))["c"], inputs["a"] + inputs["b"]
        )


def test_health_names_the_failure_once_a_cancel_retired_a_stage(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    manifest = make_loop_bundle(tmp_path)
    pipeline = write_pipeline(tmp_path / "loop.yaml", StageSpec(manifest, max_io="4MiB"))
    with np.load(manifest.parent / "inputs.npz", allow_pickle=False) as archive:
        x = archive["x"]
    with PipelineSession(pipeline, **options) as session:
        (pid,) = child_pids()
        handle = session.submit({"x": x, "n": np.array(ENDLESS_STEPS, np.int64)})
        wait_busy(pid)
        assert session.usable
        assert handle.cancel()
        with pytest.raises(RequestCancelled):
            handle.next(10)
        health = session.health
        assert not health.usable
        assert not session.usable
        assert "retired" in str(health.reason)
    assert process_gone(pid)
    assert not session.health.usable
