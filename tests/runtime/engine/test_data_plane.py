"""The data plane: how many times a tensor's bytes are copied between the caller and the result.

A two-stage chain (``y = 2x`` twice) on an 8 MiB tensor. The design claims, for
``Omni.generate``: one copy of the input (into the first worker's input slot), one copy for the
handoff (from the first worker's arena into the second worker's input slot), none for the
result (the caller reads the second worker's arena in place), and none in either worker (ONNX
Runtime reads its inputs in place and writes its outputs into its arena). ``Omni.run`` keeps
the result and copies it once more.

The engine's own count (``copied_bytes`` per stage call) is checked against an independent
one: minor page faults. Every copy into new memory faults its pages in (2,048 faults for
8 MiB); the arenas were touched once at load, so copies into them fault nothing.
"""

from __future__ import annotations

import resource
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from benchmarks import graphs
from runtime.api import Omni
from runtime.devices import DeviceSelection

if TYPE_CHECKING:
    from collections.abc import Iterator

ELEMENTS = 2 * 1024 * 1024
NBYTES = ELEMENTS * 4
PAGES = NBYTES // resource.getpagesize()


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("data-plane")
    model, inputs = graphs.scale_model(ELEMENTS)
    stages = []
    for index in range(2):
        bundle = graphs.write_bundle(folder, f"scale-{index}", model, inputs)
        handoff = "benchmarks.graphs:pass_y_as_x" if index else None
        stages.append(graphs.StageSpec(bundle, NBYTES * 2 + (1 << 20), handoff=handoff))
    return graphs.write_pipeline(folder / "chain.yaml", "data_plane", stages)


@pytest.fixture
def omni(chain: Path) -> Iterator[Omni]:
    with Omni.from_yaml(chain, selection=DeviceSelection()) as pipeline:
        yield pipeline


def _minor_faults(pid: int | None = None) -> int:
    if pid is None:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[7])  # minflt is the 10th field; the first two precede ')'


def _worker_pids(omni: Omni) -> list[int]:
    return list(omni.execution_plan.worker_pids)


def test_a_two_stage_chain_copies_the_tensor_twice_and_reads_the_result_in_place(
    omni: Omni,
) -> None:
    x = np.linspace(-1.0, 1.0, ELEMENTS, dtype=np.float32).reshape(1, -1)
    omni.run({"x": x})  # the first request touches whatever is touched once
    workers = _worker_pids(omni)
    before = _minor_faults()
    before_workers = [_minor_faults(pid) for pid in workers]
    outputs = list(omni.generate({"x": x}))
    faults = _minor_faults() - before
    worker_faults = [_minor_faults(pid) - b for pid, b in zip(workers, before_workers, strict=True)]
    # What the caller saw was a view over the second worker's arena (checked while it was valid).
    (final,) = outputs
    stages = omni.metrics()["requests"][-1]["stages"]
    assert [stage["stage"] for stage in stages] == ["stage-0", "stage-1"]
    assert [stage["copied_bytes"] for stage in stages] == [NBYTES, NBYTES], stages
    # No copy of 8 MiB into new memory happened anywhere: that would fault 2,048 pages in.
    assert faults < PAGES // 4, f"the controller faulted {faults} pages in"
    assert all(count < PAGES // 4 for count in worker_faults), worker_faults
    del final


def test_the_caller_reads_the_result_in_place_until_it_acknowledges(omni: Omni) -> None:
    x = np.full((1, ELEMENTS), 0.5, dtype=np.float32)
    for output in omni.generate({"x": x}):
        y = output.outputs["y"]
        assert not y.flags.writeable, "the result is a read-only view over shared memory"
        assert not y.flags.owndata
        np.testing.assert_array_equal(y[0, :4], [2.0, 2.0, 2.0, 2.0])
        kept = output.kept_outputs()["y"]
    assert kept.flags.writeable
    assert kept.flags.owndata
    np.testing.assert_array_equal(kept, np.full((1, ELEMENTS), 2.0, dtype=np.float32))


def test_run_keeps_a_copy_that_outlives_the_next_request(omni: Omni) -> None:
    first = omni.run({"x": np.full((1, ELEMENTS), 1.0, dtype=np.float32)})["y"]
    second = omni.run({"x": np.full((1, ELEMENTS), 3.0, dtype=np.float32)})["y"]
    assert first.flags.writeable
    assert float(first[0, -1]) == 4.0, "the next request must not overwrite a kept result"
    assert float(second[0, -1]) == 12.0


def test_the_arenas_are_in_the_execution_plan(omni: Omni) -> None:
    for stage in omni.execution_plan.to_json()["stages"]:
        arenas = stage["arenas"]
        # Room for the retained result plus the next call, mapped once at load.
        assert arenas["inputs_bytes"] >= 2 * NBYTES
        assert arenas["outputs_bytes"] >= 2 * NBYTES
        threads = stage["threads"]
        assert threads["applied_intra_op_threads"] == threads["intra_op_threads"] >= 1
        # Two pools take turns on the cores: each spins within its own runs only.
        assert threads["applied_allow_spinning"] is True
