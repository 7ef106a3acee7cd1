"""The presenters: runtime values turned into what the studio's widgets show. Plain functions
and one metrics accumulator, tested without a QApplication."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.models import (
    ErrorAction,
    InputKind,
    ReceivedAudio,
    TensorResults,
    TextChunk,
    TranscriptSegment,
)
from app.presenters import (
    RequestTracker,
    RunMetrics,
    describe_pipeline,
    error_info,
    event_line,
    execution_view,
    load_view,
    output_items,
    toggled_selection,
)
from runtime.backends.placement import PlacementReport
from runtime.devices import DeviceSelection, discover_topology, load_topology
from runtime.engine.stage_runtime import StageStartError
from runtime.errors import (
    AdmissionRefused,
    ConfigError,
    DeviceExcluded,
    ModelError,
    PlacementRefused,
    UsageError,
    VerificationError,
    WorkerDied,
)
from runtime.events import (
    LoadingStage,
    LoadProgress,
    PipelineLoadFailed,
    PipelineLoading,
    PipelineReady,
    StageCallFinished,
    StageFailed,
    StageReady,
    StageStarting,
    StageWorkerUp,
    WorkerRetired,
)
from runtime.outputs import OmniRequestOutput
from runtime.records import ExecutionPlan, ReservationRecord, StageRecord, WorkerRecord


@dataclass(frozen=True, slots=True)
class _GraphLikeDetail:
    """A stage detail with the common fields a graph stage reports (the studio reads only these)."""

    route_name: str = "local-cpu"
    ep: str = "cpu"
    worker: WorkerRecord | None = None
    reservation: ReservationRecord | None = None
    placement: PlacementReport | None = None
    load_s: float | None = None
    warmup_s: float | None = None
    worker_rss_bytes: int | None = None
    usable: bool = True
    model_dir: None = None

    def to_json(self) -> dict[str, Any]:
        return {"route": {"name": self.route_name, "ep": self.ep}}


def _output(
    outputs: dict[str, object], index: int = 0, finished: bool = False, request: str = "req-1"
) -> OmniRequestOutput:
    return OmniRequestOutput(
        request_id=request,
        stage="decoder",
        outputs=outputs,  # type: ignore[arg-type]
        finished=finished,
        index=index,
    )


def _call(request: str, stage: str, run_s: float) -> StageCallFinished:
    return StageCallFinished(
        request_id=request,
        stage=stage,
        queue_s=0.0,
        run_s=run_s,
        transfer_s=0.0,
        bytes_in=0,
        bytes_out=0,
    )


# --- outputs --------------------------------------------------------------------------------


def test_a_pcm_output_becomes_received_audio_with_its_own_copy() -> None:
    pcm = np.linspace(-0.5, 0.5, 2205, dtype=np.float32)
    output = _output(
        {"pcm": pcm, "sample_rate": np.array(22050), "chunk_index": np.array(3)}, index=3
    )
    (chunk,) = output_items(output, received_s=0.25)
    assert isinstance(chunk, ReceivedAudio)
    assert (chunk.chunk_index, chunk.sample_rate, chunk.received_s) == (3, 22050, 0.25)
    assert chunk.duration_s == pytest.approx(0.1)
    pcm[:] = 0  # the runtime may reuse its buffer once the output is released
    assert chunk.pcm[0] == pytest.approx(-0.5)


def test_audio_without_a_chunk_index_is_numbered_by_the_output() -> None:
    output = _output({"pcm": np.ones(8, np.float32), "sample_rate": 16000}, index=5)
    (chunk,) = output_items(output, 0.0)
    assert isinstance(chunk, ReceivedAudio)
    assert chunk.chunk_index == 5


def test_the_empty_closing_chunk_shows_only_its_text() -> None:
    closing = {"pcm": np.zeros(0, np.float32), "sample_rate": 22050, "text": np.array("Hi.")}
    (text,) = output_items(_output(closing, finished=True), 0.0)
    assert isinstance(text, TextChunk)
    assert (text.text, text.finished) == ("Hi.", True)


def test_text_and_tensor_outputs_are_told_apart() -> None:
    (text,) = output_items(_output({"text": np.array("Hello")}, finished=True), 0.0)
    assert isinstance(text, TextChunk)
    assert (text.text, text.finished) == ("Hello", True)
    tensors_output = _output({"sum": np.ones((1, 4), np.float32), "sample_rate": np.array(1)})
    (tensors,) = output_items(tensors_output, 0.0)
    assert isinstance(tensors, TensorResults)
    assert list(tensors.arrays) == ["sum"]


def test_a_transcribed_segment_becomes_a_transcript_segment() -> None:
    output = OmniRequestOutput(
        request_id="req-1",
        stage="recogniser",
        outputs={"start_s": np.float64(0.5), "end_s": np.float64(1.75)},
        finished=False,
        index=2,
        text=" Hello there. ",
    )
    (segment,) = output_items(output, 0.0)
    assert isinstance(segment, TranscriptSegment)
    assert (segment.index, segment.start_s, segment.end_s) == (2, 0.5, 1.75)
    assert segment.text == "Hello there."


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        (
            {"pcm": np.zeros(4, np.float32), "sample_rate": 16000, "chunk_index": np.arange(2)},
            "'chunk_index' is int64 \\(2,\\); expected one number",
        ),
        (
            {"pcm": np.zeros(4, np.float64), "sample_rate": 16000},
            "'pcm' is float64 \\(4,\\); expected a 1-D float32 array",
        ),
        (
            {"pcm": np.zeros((2, 2), np.float32), "sample_rate": 16000},
            "'pcm' is float32 \\(2, 2\\); expected",
        ),
        ({"pcm": np.zeros(4, np.float32)}, "'sample_rate' is None; expected a positive number"),
    ],
)
def test_malformed_audio_is_refused(outputs: dict[str, object], message: str) -> None:
    with pytest.raises(ModelError, match=f"output 0 of req-1: {message}"):
        output_items(_output(outputs), 0.0)


# --- metrics --------------------------------------------------------------------------------


def test_the_tracker_measures_first_audio_and_real_time_factor() -> None:
    tracker = RequestTracker("req-1", submitted_at=100.0)
    tracker.add_call("acoustic", 0.001, 0.050, 0.002)
    for index, received in enumerate((0.12, 0.30, 0.48)):
        pcm = np.zeros(11025, np.float32)  # 0.5 s at 22050 Hz
        output = _output({"pcm": pcm, "sample_rate": 22050, "chunk_index": index}, index=index)
        (chunk,) = output_items(output, received)
        assert isinstance(chunk, ReceivedAudio)
        tracker.add_audio(chunk)
        tracker.add_call("decoder", 0.0, 0.030, 0.001)
    tracker.finish("completed", 100.5)
    metrics = tracker.snapshot(now=200.0)
    assert metrics.first_audio_s == pytest.approx(0.12)
    assert metrics.audio_s == pytest.approx(1.5)
    assert metrics.chunks == 3
    assert metrics.real_time_factor == pytest.approx(0.48 / 1.5)
    assert metrics.elapsed_s == pytest.approx(0.5)
    decoder = next(stage for stage in metrics.stages if stage.stage == "decoder")
    assert (decoder.calls, decoder.run_s) == (3, pytest.approx(0.09))


def test_run_metrics_follow_the_current_request_only() -> None:
    run = RunMetrics()
    audio = {"pcm": np.zeros(2205, np.float32), "sample_rate": 22050}
    items, metrics = run.received(_output(audio), at=1.0, now=1.0)
    assert [type(item) for item in items] == [ReceivedAudio]
    assert metrics is None  # nothing admitted yet: shown, but not measured
    assert run.finished("completed", 1.0) is None

    run.admitted("req-1", at=10.0)
    run.submitted("req-1", at=10.5)  # the admission's tracker is kept
    assert run.call_finished(_call("req-0", "acoustic", 0.1), now=11.0) is None
    called = run.call_finished(_call("req-1", "acoustic", 0.1), now=11.0)
    assert called is not None
    assert [(stage.stage, stage.calls) for stage in called.stages] == [("acoustic", 1)]
    items, metrics = run.received(_output(audio), at=10.25, now=10.3)
    assert isinstance(items[0], ReceivedAudio)
    assert items[0].received_s == pytest.approx(0.25)
    assert metrics is not None
    assert (metrics.first_audio_s, metrics.chunks) == (pytest.approx(0.25), 1)
    finished = run.finished("cancelled", now=12.0)
    assert finished is not None
    assert (finished.status, finished.elapsed_s) == ("cancelled", pytest.approx(2.0))
    assert run.finished("failed", now=13.0) is None  # a request finishes once

    run.submitted("req-2", at=20.0)  # submitted without an admission event seen
    assert run.tracker is not None
    assert (run.tracker.request_id, run.tracker.submitted_at) == ("req-2", 20.0)


# --- errors, events, execution plans --------------------------------------------------------


def test_errors_map_to_the_action_that_helps() -> None:
    admission = AdmissionRefused(
        "machine:ram needs 4 GiB", constraint="machine:ram", needed=4, free=1
    )
    assert error_info(admission).action is ErrorAction.OPEN_DEVICES
    assert error_info(admission).message == "machine:ram needs 4 GiB"
    assert error_info(DeviceExcluded("excluded")).action is ErrorAction.OPEN_DEVICES
    placement = StageStartError("stage-0", PlacementRefused("1 node on Azure"))
    info = error_info(placement)
    assert (info.action, info.kind) == (ErrorAction.SHOW_PLAN, "PlacementRefused")
    assert "1 node on Azure" in info.message
    assert (
        error_info(VerificationError("bad hash", code="hash_mismatch", subject="a")).action
        is ErrorAction.SHOW_MANIFEST
    )
    assert error_info(WorkerDied("gone")).action is ErrorAction.SHOW_LOG
    assert error_info(ConfigError("bad", file="p.yaml", line=3)).action is None
    assert error_info(RuntimeError("boom")).title == "Unexpected RuntimeError"


def test_events_become_log_lines() -> None:
    placement = PlacementReport(
        counts={"CPUExecutionProvider": 7},
        total_nodes=7,
        method="assignment_info",
        target_provider="CPUExecutionProvider",
    )
    detail = _GraphLikeDetail(worker=WorkerRecord(pid=42, generation=2), placement=placement)
    ready = StageReady(
        stage="decoder", record=StageRecord("decoder", "graph", detail), elapsed_s=0.42
    )
    assert event_line(ready) == (
        "INFO",
        "decoder: ready in 0.4 s, worker pid 42 generation 2; nodes: 7 on CPUExecutionProvider",
    )
    assert event_line(StageWorkerUp(stage="decoder", pid=42)) == (
        "INFO",
        "decoder: worker pid 42 started, loading",
    )
    failed = StageFailed(stage="decoder", message="cancelled", elapsed_s=1.25)
    assert event_line(failed) == ("WARNING", "decoder: not started after 1.2 s: cancelled")
    cancelled = PipelineLoadFailed(pipeline="p", message="cancelled", cancelled=True)
    assert event_line(cancelled) == ("INFO", "pipeline p not loaded: cancelled")
    lost = WorkerRetired(stage="decoder", pid=42, reason="cancelled", confirmed_gone=False)
    level, text = event_line(lost) or ("", "")
    assert level == "WARNING"
    assert "NOT confirmed gone (reservation quarantined)" in text
    assert event_line(_call("req-1", "decoder", 0.002)) == (
        "DEBUG",
        "decoder: call of req-1 ran 2.00 ms, transfer 0.00 ms",
    )


def test_an_execution_plan_becomes_its_stage_rows() -> None:
    placement = PlacementReport(
        counts={"CPUExecutionProvider": 10},
        total_nodes=10,
        method="assignment_info",
        target_provider="CPUExecutionProvider",
    )
    acoustic_detail = _GraphLikeDetail(
        worker=WorkerRecord(pid=7, generation=1),
        placement=placement,
        reservation=ReservationRecord("r-1", {"machine:ram": 512}),
        load_s=0.5,
        usable=False,
    )
    stages = (StageRecord("acoustic", "graph", acoustic_detail), StageRecord("llm", "scripted"))
    view = execution_view(ExecutionPlan(pipeline="speak", stages=stages))
    acoustic, llm = view.stages
    assert (view.pipeline, view.label) == ("speak", "B")
    assert (acoustic.route, acoustic.pid, acoustic.generation) == ("local-cpu", 7, 1)
    assert (acoustic.fraction_on_target, acoustic.total_nodes) == (1.0, 10)
    assert (acoustic.target_provider, acoustic.placement_method) == (
        "CPUExecutionProvider",
        "assignment_info",
    )
    assert (acoustic.ep, acoustic.reservation_id) == ("cpu", "r-1")
    assert acoustic.reservation == {"machine:ram": 512}
    assert (acoustic.load_s, acoustic.warmup_s, acoustic.usable) == (0.5, None, False)
    assert (llm.pid, llm.provider_counts, llm.usable) == (None, {}, True)
    assert (llm.route, llm.generation, llm.reservation_id, llm.reservation) == ("", 0, None, {})


# --- devices and pipelines ------------------------------------------------------------------


def test_allowing_every_device_again_allows_devices_found_later(demo_root: Path) -> None:
    topology = load_topology(demo_root / "topologies" / "cpu-igpu.yaml")
    device = topology.devices[0].physical_id
    excluded = toggled_selection(DeviceSelection(), topology, device, allowed=False)
    assert not excluded.allows(device)
    assert excluded.allowed is not None
    again = toggled_selection(excluded, topology, device, allowed=True)
    assert again.allows(device)
    assert again.allowed is None
    with pytest.raises(UsageError):
        toggled_selection(DeviceSelection(), topology, "no-such-device", allowed=False)


def test_a_graph_pipeline_is_described_with_its_example_inputs(demo_root: Path) -> None:
    path = demo_root / "pipelines" / "add.yaml"
    opened = describe_pipeline(path, discover_topology(), DeviceSelection())
    info = opened.info
    assert (info.origin, info.path, info.name) == ("pipeline", path, opened.config.pipeline)
    assert (info.input_kind, info.example_text) == (InputKind.TENSORS, "")
    assert set(info.example_inputs) == {"a", "b"}
    assert info.stage_names == tuple(stage.name for stage in opened.config.stages)
    assert [manifest.ok for manifest in info.manifests] == [True] * len(info.stage_names)
    assert info.plan.admitted


def test_a_bare_bundle_is_described_through_its_generated_pipeline(
    demo_root: Path, user_dirs: Path
) -> None:
    manifest = demo_root / "bundles" / "add" / "manifest.json"
    info = describe_pipeline(manifest, discover_topology(), DeviceSelection()).info
    assert info.origin == "bundle"
    assert info.path.parent.name == "bundle-pipelines"
    assert (info.name, info.input_kind) == ("bundle_add", InputKind.TENSORS)
    assert info.example_text == ""


def test_a_load_becomes_the_view_of_its_stages() -> None:
    progress = LoadProgress()
    stages = (LoadingStage("assistant", "vLLM worker"), LoadingStage("voice", "graph worker"))
    progress.update(PipelineLoading(pipeline="chat-speak", stages=stages, at=10.0))
    progress.update(StageStarting(stage="assistant", route="local-vllm", at=10.5))
    progress.update(StageStarting(stage="voice", route="cpu", at=10.5))
    progress.update(StageWorkerUp(stage="assistant", pid=7, at=11.0))
    progress.update(
        StageReady(stage="voice", record=StageRecord("voice", "graph"), elapsed_s=0.4, at=10.9)
    )
    assert progress.snapshot is not None
    view = load_view(progress.snapshot)
    assert view.loading
    assert view.lines(24.5) == [
        "assistant (vLLM worker): loading… 14 s",
        "voice (graph worker): ready 0.4 s",
    ]
    assert view.summary(24.5) == "loading… 14 s: waiting for assistant (vLLM worker)"
    progress.update(
        StageReady(
            stage="assistant", record=StageRecord("assistant", "vllm"), elapsed_s=20.0, at=30.5
        )
    )
    progress.update(
        PipelineReady(pipeline="chat-speak", execution_plan=ExecutionPlan("chat-speak"), at=30.6)
    )
    assert progress.snapshot is not None
    done = load_view(progress.snapshot)
    assert not done.loading
    assert done.summary(99.0) == "2 stage(s) loaded in 21 s"
    assert done.lines(99.0)[0] == "assistant (vLLM worker): ready 20 s"
