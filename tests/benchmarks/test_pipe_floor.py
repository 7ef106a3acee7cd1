"""The two-process floor beside the graph figures: measured, checked, and nothing left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import graphs
from benchmarks.pipe_floor import measure_floor
from tests.runtime.engine.support import child_pids

FLOOR_FILES = "bench-floor-*"


def _segments() -> set[str]:
    return {path.name for path in Path("/dev/shm").glob(FLOOR_FILES)}


def test_the_floor_runs_the_same_session_in_a_second_process(tmp_path: Path) -> None:
    model, inputs = graphs.matmul_model(64, 128)
    bundle = graphs.write_bundle(tmp_path, "mm", model, inputs)
    before = child_pids()
    # Segments another process left (one killed mid-measurement) are not this floor's.
    segments = _segments()
    floor = measure_floor(
        bundle, inputs, intra_op_threads=1, allow_spinning=False, rounds=2, batch=20, warmup=5
    )
    for key in ("floor_p50_ms", "floor_without_copies_p50_ms", "floor_in_process_p50_ms"):
        value = floor[key]
        assert isinstance(value, float)
        assert value > 0
    # A call through a second process costs more than the same call in this one.
    assert isinstance(floor["floor_ratio"], float)
    assert floor["floor_ratio"] > 1.0
    assert child_pids() - before == set(), "no process of the floor is left"
    assert _segments() - segments == set(), "no segment of the floor is left"


def test_a_worker_that_stops_fails_the_floor_and_leaves_nothing(tmp_path: Path) -> None:
    model, inputs = graphs.add_model()
    bundle = graphs.write_bundle(tmp_path, "add", model, inputs)
    before = child_pids()
    # Segments another process left (one killed mid-measurement) are not this floor's.
    segments = _segments()
    with pytest.raises(RuntimeError, match="the floor's worker stopped"):
        measure_floor(
            bundle,
            inputs,
            intra_op_threads=1,
            allow_spinning=False,
            rounds=1,
            batch=5,
            warmup=1,
            python="/bin/false",
        )
    assert child_pids() - before == set(), "no process of the floor is left"
    assert _segments() - segments == set(), "no segment of the floor is left"
