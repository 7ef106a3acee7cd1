"""What the studio's widgets show, computed from runtime values; no Qt, no threads.

The bridge (:mod:`app.bridge`) receives the runtime's callbacks and hands what they carry to
these functions: device topologies, ledger snapshots, bundle reports, plans, execution plans,
runtime events, errors and request outputs become the plain values of :mod:`app.models`;
:class:`RunMetrics` accumulates the current request's metrics. :func:`describe_pipeline` reads
and verifies a pipeline's files, so the bridge calls it on its control thread. Nothing here
subscribes to the runtime or waits on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from app.models import (
    BudgetRow,
    DeviceView,
    ErrorAction,
    ErrorInfo,
    ExecutionView,
    FileView,
    InputKind,
    LedgerRow,
    LedgerView,
    LoadView,
    MachineConstraintView,
    ManifestView,
    PipelineInfo,
    PlanView,
    ReceivedAudio,
    RequestMetrics,
    ReservationView,
    StageExecutionView,
    StageLoadView,
    StagePlanView,
    StageTiming,
    TensorResults,
    TextChunk,
    TopologyView,
    TranscriptSegment,
)
from app.voice_presenters import is_voice_chat
from runtime.artifacts import inspect_bundle, load_example_inputs
from runtime.audio.devices import AudioDeviceError, UnknownAudioDevice
from runtime.config import (
    GraphBackendConfig,
    LlmBackendConfig,
    RemoteLlmRoute,
    RouteConfig,
    load_pipeline,
)
from runtime.devices import DISCOVERED, DeviceSelection
from runtime.errors import (
    AdmissionRefused,
    ConfigError,
    DeviceExcluded,
    ModelError,
    OmniError,
    PlacementRefused,
    ResourceUnavailable,
    UsageError,
    VerificationError,
    WorkerDied,
)
from runtime.events import (
    Event,
    LoadSnapshot,
    PipelineClosed,
    PipelineLoadFailed,
    PipelineReady,
    RequestAdmitted,
    RequestFinished,
    StageCallFinished,
    StageFailed,
    StageReady,
    StageStarting,
    StageWorkerUp,
    WorkerRetired,
)
from runtime.ledger import format_bytes
from runtime.outputs import TEXT_KEY, OmniRequestOutput
from runtime.pipeline_files import is_manifest_path, pipeline_for_bundle
from runtime.pipeline_input import AUDIO_INPUT, TENSOR_INPUT, example_text, input_kind
from runtime.planning import plan_pipeline

if TYPE_CHECKING:
    import concurrent.futures as cf

    from runtime.artifacts import BundleReport
    from runtime.config import BackendConfig, PipelineConfig
    from runtime.devices import Topology
    from runtime.ledger import LedgerSnapshot
    from runtime.planning import PipelinePlan, StagePlan
    from runtime.records import ExecutionPlan, StageRecord

#: What a text pipeline offers to say when its adapter names no example.
DEFAULT_TEXT = "Hello! This is Omni Edge Studio, speaking on the devices of this computer."
#: The warning the studio shows when a pipeline is opened during a run.
RUN_IN_PROGRESS = ErrorInfo(
    "A run is in progress",
    "Cancel it (Esc) or wait for it to finish before opening another pipeline.",
    kind="warning",
)


def topology_view(
    topology: Topology, selection: DeviceSelection, selection_file: Path
) -> TopologyView:
    if topology.source == DISCOVERED:
        title = topology.name or "This machine"
    else:
        title = topology.name or Path(topology.source).stem
    return TopologyView(
        source=topology.source,
        title=title,
        wsl=topology.wsl,
        devices=tuple(
            DeviceView(
                physical_id=device.physical_id,
                name=device.name,
                kind=device.kind.value,
                providers=tuple(device.providers),
                constraints=tuple(
                    dict.fromkeys(
                        name
                        for domain in topology.domains[device.physical_id]
                        for name in topology.charges(device.physical_id, domain)
                    )
                ),
                allowed=selection.allows(device.physical_id),
            )
            for device in topology.devices
        ),
        constraints=tuple(
            MachineConstraintView(
                name=name,
                capacity=info.capacity,
                observed_free=info.observed_free,
                devices=tuple(info.devices),
            )
            for name, info in topology.constraints.items()
        ),
        notes=tuple(topology.notes),
        selection_file=str(selection_file),
        all_allowed=selection.allowed is None,
    )


def ledger_view(snapshot: LedgerSnapshot) -> LedgerView:
    return LedgerView(
        rows=tuple(
            LedgerRow(state.name, state.capacity, state.reserved, state.quarantined)
            for state in snapshot.constraints.values()
        ),
        reservations=tuple(
            ReservationView(r.id, r.owner, r.stage, dict(r.amounts)) for r in snapshot.reservations
        ),
        quarantined=tuple(
            ReservationView(
                q.reservation.id,
                q.reservation.owner,
                q.reservation.stage,
                dict(q.reservation.amounts),
                q.reason,
            )
            for q in snapshot.quarantined
        ),
        version=snapshot.version,
    )


def manifest_view(stage: str, report: BundleReport) -> ManifestView:
    manifest = report.manifest
    metadata: tuple[tuple[str, object], ...] = ()
    if manifest is not None:
        metadata = tuple((str(key), value) for key, value in sorted(manifest.metadata.items()))
    return ManifestView(
        stage=stage,
        manifest_path=str(report.manifest_path),
        component=None if manifest is None else manifest.component,
        identity=None if manifest is None else manifest.identity,
        ok=report.ok,
        files=tuple(
            FileView(
                name=check.name,
                status=check.status,
                expected_sha256=check.expected_sha256,
                actual_sha256=check.actual_sha256,
                size=check.size,
                detail=check.detail,
            )
            for check in report.files
        ),
        metadata=metadata,
        errors=tuple(str(error) for error in report.errors),
    )


def plan_view(plan: PipelinePlan, charged: LedgerSnapshot | None = None) -> PlanView:
    """The plan as the studio shows it; with ``charged`` (the studio's ledger), as that ledger
    would admit it (:func:`with_quarantine`), so the badge agrees with what Run does."""
    view = _plan_view(plan)
    return view if charged is None else with_quarantine(view, charged)


def with_quarantine(view: PlanView, snapshot: LedgerSnapshot) -> PlanView:
    """What is quarantined in the studio's ledger (a retired worker not confirmed gone) stays
    charged against the machine's memory whatever pipeline loads next: it counts as in use,
    and a constraint it leaves too small refuses the plan, as loading it would. Reservations
    do not count (the studio unloads what it keeps warm to make room)."""
    rows: list[BudgetRow] = []
    refusals = list(view.refusals)
    for row in view.budget:
        state = snapshot.constraints.get(row.constraint)
        if state is None or not state.quarantined:
            rows.append(row)
            continue
        quarantined = state.quarantined
        machine_headroom = state.capacity - quarantined - row.total
        rows.append(
            replace(
                row,
                in_use=row.in_use + quarantined,
                headroom=min(row.headroom, machine_headroom),
                fits=row.fits and machine_headroom >= 0,
            )
        )
        if row.fits and machine_headroom < 0:
            refusals.append(
                f"{row.constraint}: {format_bytes(quarantined)} of the machine's "
                f"{format_bytes(state.capacity)} is quarantined (a worker not confirmed gone), "
                f"so the plan's {format_bytes(row.total)} does not fit until it is freed"
            )
    admitted = view.admitted and len(refusals) == len(view.refusals)
    return replace(view, budget=tuple(rows), refusals=tuple(refusals), admitted=admitted)


def _stage_plan_view(stage: StagePlan, backend: BackendConfig) -> StagePlanView:
    """A planned stage's row: its route read from the stage's configuration."""
    route = backend.route
    if isinstance(route, RemoteLlmRoute):
        # A server elsewhere: named by its URL, with no provider or domain here.
        names = (route.url, "", "")
    else:
        names = (route.name, route.ep, route.os_domain)
    graph = route if isinstance(route, RouteConfig) else None
    return StagePlanView(
        name=stage.name,
        backend=stage.backend,
        route=names[0],
        ep=names[1],
        os_domain=names[2],
        device=stage.device,
        demands=dict(stage.demands),
        allowed_providers=() if graph is None else graph.allowed_providers,
        min_fraction_on_target=1.0 if graph is None else graph.min_fraction_on_target,
    )


def _plan_view(plan: PipelinePlan) -> PlanView:
    backends = {stage.name: stage.backend for stage in plan.config.stages}
    return PlanView(
        admitted=plan.admitted,
        topology=plan.topology.source,
        stages=tuple(_stage_plan_view(stage, backends[stage.name]) for stage in plan.stages),
        budget=tuple(
            BudgetRow(
                constraint=row.constraint,
                declared=row.declared,
                capacity=row.capacity,
                in_use=row.in_use,
                total=row.total,
                headroom=row.headroom,
                fits=row.fits,
                demands=dict(row.demands),
            )
            for row in plan.budget.constraints
        ),
        refusals=tuple(plan.refusals),
        warnings=tuple(plan.warnings),
    )


def _stage_execution_view(record: StageRecord) -> StageExecutionView:
    worker, placement, reservation = record.worker, record.placement, record.reservation
    return StageExecutionView(
        name=record.stage,
        route=record.route_name,
        ep=record.ep,
        pid=None if worker is None else worker.pid,
        generation=0 if worker is None else worker.generation,
        provider_counts={} if placement is None else dict(placement.counts),
        total_nodes=0 if placement is None else placement.total_nodes,
        fraction_on_target=None if placement is None else placement.fraction_on_target,
        target_provider=None if placement is None else placement.target_provider,
        placement_method=None if placement is None else placement.method,
        reservation_id=None if reservation is None else reservation.id,
        reservation={} if reservation is None else dict(reservation.amounts),
        load_s=record.load_s,
        warmup_s=record.warmup_s,
        worker_rss_bytes=record.worker_rss_bytes,
        usable=record.usable,
    )


def execution_view(plan: ExecutionPlan) -> ExecutionView:
    """The loaded stages as the studio's execution view shows them."""
    return ExecutionView(
        pipeline=plan.pipeline,
        label=plan.label,
        stages=tuple(_stage_execution_view(record) for record in plan.stages),
    )


_ERROR_KINDS: tuple[tuple[type[BaseException], str, ErrorAction | None], ...] = (
    (AudioDeviceError, "The audio device could not be used", ErrorAction.OPEN_DEVICES),
    (UnknownAudioDevice, "The audio device could not be used", ErrorAction.OPEN_DEVICES),
    (AdmissionRefused, "Not enough memory for this plan", ErrorAction.OPEN_DEVICES),
    (DeviceExcluded, "A stage's device is not available", ErrorAction.OPEN_DEVICES),
    (
        PlacementRefused,
        "A stage would run somewhere other than its route declares",
        ErrorAction.SHOW_PLAN,
    ),
    (VerificationError, "A bundle failed verification", ErrorAction.SHOW_MANIFEST),
    (ConfigError, "The pipeline file is not valid", None),
    (WorkerDied, "A worker process died", ErrorAction.SHOW_LOG),
    (ResourceUnavailable, "The pipeline is busy", None),
    (UsageError, "The request was not accepted", None),
)


def _causes(error: BaseException) -> list[BaseException]:
    """The error and what caused it (``cause`` attributes, then ``__cause__``), first first."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        nested = getattr(current, "cause", None)
        current = nested if isinstance(nested, BaseException) else current.__cause__
    return chain


def error_info(error: BaseException) -> ErrorInfo:
    """What the banner says about a runtime error, and the action that helps."""
    chain = _causes(error)
    for kind, title, action in _ERROR_KINDS:
        for link in chain:
            if isinstance(link, kind):
                return ErrorInfo(title, str(error), action, type(link).__name__)
    if isinstance(error, OmniError):
        return ErrorInfo("The run failed", str(error), ErrorAction.SHOW_LOG, type(error).__name__)
    return ErrorInfo(
        f"Unexpected {type(error).__name__}", str(error), ErrorAction.SHOW_LOG, type(error).__name__
    )


def _as_text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.ndarray):
        if value.size == 1:
            return _as_text(value.reshape(()).item())
        return "".join(_as_text(item) for item in value.reshape(-1).tolist())
    return str(value)


def transcript_segment(output: OmniRequestOutput) -> TranscriptSegment | None:
    """A transcription's segment output (text with where it lies in the audio), or None."""
    span = output.span
    if span is None:
        return None
    return TranscriptSegment(
        output.request_id, output.index, span.start_s, span.end_s, span.text.strip()
    )


def output_items(
    output: OmniRequestOutput, received_s: float
) -> list[ReceivedAudio | TextChunk | TensorResults | TranscriptSegment]:
    """Turn one request output into studio values (copies; the output may be released after).

    Its non-empty audio (:meth:`AudioChunk.from_output <runtime.outputs.AudioChunk.from_output>`,
    which raises :class:`~runtime.errors.ModelError` for malformed audio) becomes
    :class:`ReceivedAudio`; ``text`` a :class:`TextChunk`; any other arrays of an output that
    carries neither become :class:`TensorResults`.
    """
    segment = transcript_segment(output)
    if segment is not None:
        return [segment]
    items: list[ReceivedAudio | TextChunk | TensorResults | TranscriptSegment] = []
    audio = output.audio
    # A stream may close with an empty chunk (its last output carries only metrics).
    if audio is not None and audio.pcm.size:
        items.append(
            ReceivedAudio(
                request_id=output.request_id,
                index=output.index,
                chunk_index=output.index if audio.chunk_index is None else audio.chunk_index,
                pcm=audio.pcm.copy(),
                sample_rate=audio.sample_rate,
                received_s=received_s,
            )
        )
    # A language-model stage's text, or a graph stage's output named like it.
    text: object = output.text
    if text is None and TEXT_KEY in output.outputs:
        text = output.outputs[TEXT_KEY]
    if text is not None:
        items.append(
            TextChunk(
                output.request_id, output.index, _as_text(text), output.finished, output.prompt
            )
        )
    if audio is None and text is None:
        arrays = {name: np.array(value, copy=True) for name, value in output.tensors.items()}
        if arrays:
            items.append(TensorResults(output.request_id, output.stage, arrays))
    return items


@dataclass
class RequestTracker:
    """Accumulates one request's metrics from events and outputs (GUI thread only)."""

    request_id: str
    submitted_at: float  # time.monotonic()
    first_audio_s: float | None = None
    last_audio_s: float | None = None
    audio_s: float = 0.0
    chunks: int = 0
    finished_at: float | None = None
    status: str = "running"
    stages: dict[str, StageTiming] = field(default_factory=dict)

    def add_call(self, stage: str, queue_s: float, run_s: float, transfer_s: float) -> None:
        old = self.stages.get(stage) or StageTiming(stage, 0, 0.0, 0.0, 0.0)
        self.stages[stage] = StageTiming(
            stage,
            old.calls + 1,
            old.queue_s + queue_s,
            old.run_s + run_s,
            old.transfer_s + transfer_s,
        )

    def add_audio(self, chunk: ReceivedAudio) -> None:
        if self.first_audio_s is None:
            self.first_audio_s = chunk.received_s
        self.audio_s += chunk.duration_s
        self.chunks += 1
        self.last_audio_s = chunk.received_s

    def finish(self, status: str, at: float) -> None:
        self.status = status
        self.finished_at = at

    def snapshot(self, now: float) -> RequestMetrics:
        end = self.finished_at if self.finished_at is not None else now
        return RequestMetrics(
            request_id=self.request_id,
            elapsed_s=max(0.0, end - self.submitted_at),
            first_audio_s=self.first_audio_s,
            audio_s=self.audio_s,
            chunks=self.chunks,
            stages=tuple(self.stages.values()),
            status=self.status,
            audio_produced_at_s=self.last_audio_s,
        )


class RunMetrics:
    """The metrics of the studio's current request, fed from runtime events and outputs
    (GUI thread only). Each method returns the metrics to show now, or None when the event
    or output belongs to no tracked request."""

    def __init__(self) -> None:
        self.tracker: RequestTracker | None = None

    def admitted(self, request_id: str, at: float) -> None:
        self.tracker = RequestTracker(request_id, at)

    def submitted(self, request_id: str, at: float) -> None:
        """A request was handed back by ``submit``: keep the tracker its admission started."""
        if self.tracker is None or self.tracker.request_id != request_id:
            self.tracker = RequestTracker(request_id, at)

    def call_finished(self, event: StageCallFinished, now: float) -> RequestMetrics | None:
        tracker = self.tracker
        if tracker is None or tracker.request_id != event.request_id:
            return None
        tracker.add_call(event.stage, event.queue_s, event.run_s, event.transfer_s)
        return tracker.snapshot(now)

    def received(
        self, output: OmniRequestOutput, at: float, now: float
    ) -> tuple[
        list[ReceivedAudio | TextChunk | TensorResults | TranscriptSegment], RequestMetrics | None
    ]:
        """The studio values of an output received at ``at`` (see :func:`output_items`)."""
        tracker = self.tracker
        items = output_items(output, 0.0 if tracker is None else at - tracker.submitted_at)
        if tracker is None:
            return items, None
        for item in items:
            if isinstance(item, ReceivedAudio):
                tracker.add_audio(item)
        return items, tracker.snapshot(now)

    def finished(self, status: str, now: float) -> RequestMetrics | None:
        tracker = self.tracker
        if tracker is None or tracker.finished_at is not None:
            return None
        tracker.finish(status, now)
        return tracker.snapshot(now)


def event_line(event: Event) -> tuple[str, str] | None:
    """A log line (level, text) for a runtime event, or None for events not worth a line."""
    if isinstance(event, StageStarting):
        return "INFO", f"{event.stage}: starting on route {event.route}"
    if isinstance(event, StageReady):
        worker, placement = event.record.worker, event.record.placement
        counts = (
            ""
            if placement is None
            else ", ".join(f"{count} on {name}" for name, count in placement.counts.items())
        )
        return "INFO", (
            f"{event.stage}: ready in {event.elapsed_s:.1f} s, worker pid "
            f"{None if worker is None else worker.pid} generation "
            f"{None if worker is None else worker.generation}; nodes: {counts or 'not reported'}"
        )
    if isinstance(event, StageWorkerUp):
        return "INFO", f"{event.stage}: worker pid {event.pid} started, loading"
    if isinstance(event, StageFailed):
        return (
            "WARNING",
            f"{event.stage}: not started after {event.elapsed_s:.1f} s: {event.message}",
        )
    if isinstance(event, PipelineLoadFailed):
        level = "INFO" if event.cancelled else "WARNING"
        return level, f"pipeline {event.pipeline} not loaded: {event.message}"
    if isinstance(event, PipelineReady):
        return "INFO", f"pipeline {event.pipeline} is ready"
    if isinstance(event, RequestAdmitted):
        return "INFO", f"request {event.request_id} admitted{' (queued)' if event.queued else ''}"
    if isinstance(event, StageCallFinished):
        return "DEBUG", (
            f"{event.stage}: call of {event.request_id} ran {event.run_s * 1e3:.2f} ms, "
            f"transfer {event.transfer_s * 1e3:.2f} ms"
        )
    if isinstance(event, RequestFinished):
        level = "WARNING" if event.status == "failed" else "INFO"
        detail = f": {event.message}" if event.message and event.status != "completed" else ""
        return level, f"request {event.request_id} {event.status}{detail}"
    if isinstance(event, WorkerRetired):
        level = "INFO" if event.confirmed_gone else "WARNING"
        gone = "gone" if event.confirmed_gone else "NOT confirmed gone (reservation quarantined)"
        return level, f"{event.stage}: worker pid {event.pid} retired ({event.reason}), {gone}"
    if isinstance(event, PipelineClosed):
        return "INFO", f"pipeline {event.pipeline} closed"
    return None


def load_view(snapshot: LoadSnapshot) -> LoadView:
    """A load's progress as the Run and conversation views show it."""
    stages = tuple(
        StageLoadView(
            stage.stage, stage.kind, stage.phase, stage.since, stage.elapsed_s, stage.model
        )
        for stage in snapshot.stages
    )
    return LoadView(
        snapshot.pipeline,
        snapshot.status,
        snapshot.started,
        stages,
        snapshot.elapsed_s,
        snapshot.message,
    )


@dataclass(frozen=True, slots=True)
class OpenedPipeline:
    info: PipelineInfo
    config: PipelineConfig
    #: The admission shown: loading ``config`` may take its verified bundles (no second hash).
    plan: PipelinePlan | None = None


def describe_pipeline(
    path: Path,
    topology: Topology,
    selection: DeviceSelection,
    charged: LedgerSnapshot | None = None,
) -> OpenedPipeline:
    """Everything the studio shows before loading: config, plan (against ``charged``, see
    :func:`plan_view`), manifests, example inputs.

    It reads and verifies files (the bridge calls it on its control thread); a bundle's
    manifest or folder gets the one-stage pipeline :func:`pipeline_for_bundle` writes."""
    bundle = is_manifest_path(path)
    # Each file is read once: the pipeline parsed once, each bundle hashed once.
    known: dict[Path, BundleReport] = {}
    source = path
    if bundle:
        report = inspect_bundle(path)
        known[report.manifest_path] = report
        source = pipeline_for_bundle(path, topology, report.verified())
    config = load_pipeline(source)
    plan = plan_pipeline(config, topology=topology, selection=selection, bundles=known)
    kinds = {TENSOR_INPUT: InputKind.TENSORS, AUDIO_INPUT: InputKind.AUDIO}
    kind = kinds.get(input_kind(config), InputKind.TEXT)
    examples: dict[str, np.ndarray] = {}
    first = config.stages[0].backend
    first_report = plan.stages[0].bundle
    if (
        kind is InputKind.TENSORS
        and isinstance(first, GraphBackendConfig)
        and first_report is not None
        and first_report.ok
    ):
        examples = load_example_inputs(first_report.verified())
    text = example_text(config)
    info = PipelineInfo(
        path=source,
        name=config.pipeline,
        description=config.description or "",
        origin="bundle" if bundle else "pipeline",
        input_kind=kind,
        stage_names=tuple(stage.name for stage in config.stages),
        example_inputs=examples,
        example_text=text if text is not None else DEFAULT_TEXT if kind is InputKind.TEXT else "",
        plan=plan_view(plan, charged),
        manifests=tuple(
            manifest_view(stage.name, stage.bundle)
            for stage in plan.stages
            if stage.bundle is not None
        ),
        chat=kind is InputKind.TEXT
        and any(isinstance(stage.backend, LlmBackendConfig) for stage in config.stages),
        voice=is_voice_chat(config),
    )
    return OpenedPipeline(info, config, plan)


def toggled_selection(
    selection: DeviceSelection, topology: Topology, physical_id: str, allowed: bool
) -> DeviceSelection:
    """``selection`` with one device allowed or excluded; allowing the last excluded device
    gives the selection that allows every device (and so any device found later).
    :class:`~runtime.errors.UsageError` for a device the topology does not have."""
    if not allowed:
        return selection.exclude(topology, physical_id)
    selection = selection.allow(topology, physical_id)
    if selection.allowed is not None and selection.allowed >= {
        device.physical_id for device in topology.devices
    }:
        return DeviceSelection()
    return selection


# --- audio for playback, off the GUI thread ----------------------------------------------------


class AudioSink(Protocol):
    """Where a run's PCM goes for playback, from any thread (``app.playback.AudioOutput``)."""

    def begin(self, request_id: str) -> None:
        """Take chunks of ``request_id`` from now on (GUI thread, before any arrives)."""

    def feed(self, pcm: np.ndarray, sample_rate: int, *, request_id: str | None = None) -> None:
        """Queue one chunk (any thread); a chunk of another request than the current is dropped."""


def queue_audio(sink: AudioSink, request_id: str, done: cf.Future[Any]) -> bool:
    """Feed an output's audio to ``sink`` on the thread that delivered it; True when fed."""
    if done.cancelled() or done.exception() is not None:
        return False
    item = done.result()
    if not isinstance(item, OmniRequestOutput):
        return False
    try:
        audio = item.audio
    except ModelError:
        return False  # the GUI reports it when it turns the output into values
    if audio is None or not audio.pcm.size:
        return False
    try:
        sink.feed(np.array(audio.pcm, dtype=np.float32), audio.sample_rate, request_id=request_id)
    except ValueError:
        return False  # a chunk at another rate: the GUI reports it
    return True
