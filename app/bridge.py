"""The one bridge between the runtime and Qt.

``RuntimeBridge`` owns a control thread (a ``QThread``) that makes every blocking runtime
call — describing a pipeline, starting and closing an ``Orchestrator``, cancelling — and
it is the only module that subscribes to runtime callbacks (the orchestrator's
``EventBus``, the ``ResourceLedger``, the runtime's loggers, request output streams).
Those callbacks run on runtime threads; the bridge turns them into plain values from
:mod:`app.models` and emits Qt signals, which Qt queues onto the GUI thread. Widgets
only ever see those values, so the GUI never waits on the runtime.

State that belongs to the GUI (``state``, the current request) is touched only on the GUI
thread; state that belongs to the runtime (the orchestrator) only in control jobs, which
run one at a time in submission order.
"""

from __future__ import annotations

import logging
import queue
import re
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml
from PySide6.QtCore import QObject, Qt, QThread, Signal

from app.models import (
    AudioChunk,
    BudgetRow,
    DeviceView,
    ErrorAction,
    ErrorInfo,
    ExecutionView,
    FileView,
    InputKind,
    LedgerRow,
    LedgerView,
    LogLine,
    MachineConstraintView,
    ManifestView,
    PipelineInfo,
    PlanView,
    RequestMetrics,
    ReservationView,
    RunOutcome,
    RunState,
    StageExecutionView,
    StagePlanView,
    StageTiming,
    TensorResults,
    TextChunk,
    TopologyView,
)
from runtime.artifacts import load_example_inputs, verify_bundle
from runtime.config import GraphBackendConfig, load_pipeline, resolve_callable
from runtime.devices import (
    DISCOVERED,
    DeviceSelection,
    discover_topology,
    load_selection,
    load_topology,
    save_selection,
    selection_path,
)
from runtime.engine.events import (
    Event,
    EventBus,
    PipelineClosed,
    PipelineReady,
    RequestAdmitted,
    RequestFinished,
    StageCallFinished,
    StageReady,
    StageStarting,
    WorkerRetired,
)
from runtime.engine.orchestrator import Orchestrator
from runtime.engine.outputs import END, OmniRequestOutput
from runtime.errors import (
    AdmissionRefused,
    ConfigError,
    DeviceExcluded,
    OmniError,
    PlacementRefused,
    RequestCancelled,
    ResourceUnavailable,
    UsageError,
    VerificationError,
    WorkerDied,
)
from runtime.ledger import LedgerEvent, LedgerSnapshot, ResourceLedger
from runtime.paths import data_dir, expand_data_placeholder
from runtime.planning import PipelinePlan, plan_pipeline

if TYPE_CHECKING:
    import concurrent.futures as cf
    from collections.abc import Callable, Mapping

    from runtime.artifacts import BundleReport
    from runtime.config import PipelineConfig
    from runtime.devices import Topology
    from runtime.engine.orchestrator import Request

log = logging.getLogger("omni.studio.bridge")

#: Loggers whose records the Log panel shows (runtime, workers' stderr, the ledger).
FORWARDED_LOGGERS = ("omni", "runtime")
#: Keys of a request output that carry streamed audio or text rather than tensors.
STREAM_KEYS = frozenset({"pcm", "sample_rate", "chunk_index", "text"})
DEFAULT_TEXT = "Hello! This is Omni Edge Studio, speaking on the devices of this computer."
#: Memory a bundle opened on its own asks for beyond twice its files (interpreter, runtime).
BUNDLE_BASE_DEMAND = 128 * 1024 * 1024


# ----------------------------------------------------------------------------- conversions


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


def plan_view(plan: PipelinePlan) -> PlanView:
    return PlanView(
        admitted=plan.admitted,
        topology=plan.topology.source,
        stages=tuple(
            StagePlanView(
                name=stage.name,
                backend=stage.backend,
                route=str(stage.route.get("name", "")),
                ep=str(stage.route.get("ep", "")),
                os_domain=str(stage.route.get("os_domain", "")),
                device=stage.device,
                demands=dict(stage.demands),
                allowed_providers=tuple(stage.route.get("allowed_providers", ())),
                min_fraction_on_target=float(stage.route.get("min_fraction_on_target", 1.0)),
            )
            for stage in plan.stages
        ),
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


def _optional_float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def execution_view(plan: Mapping[str, Any]) -> ExecutionView:
    stages = []
    for record in plan.get("stages", ()):
        worker = record.get("worker") or {}
        route = record.get("route") or {}
        placement = record.get("placement") or {}
        reservation = record.get("reservation") or {}
        stages.append(
            StageExecutionView(
                name=str(record.get("stage", "")),
                route=str(route.get("name", "")),
                ep=str(route.get("ep", "")),
                pid=worker.get("pid"),
                generation=int(worker.get("generation", 0)),
                provider_counts=dict(placement.get("counts", {})),
                total_nodes=int(placement.get("total_nodes", 0)),
                fraction_on_target=_optional_float(placement.get("fraction_on_target")),
                target_provider=placement.get("target_provider"),
                placement_method=placement.get("method"),
                reservation_id=reservation.get("id"),
                reservation=dict(reservation.get("amounts", {})),
                load_s=_optional_float(record.get("load_s")),
                warmup_s=_optional_float(record.get("warmup_s")),
                worker_rss_bytes=record.get("worker_rss_bytes"),
                usable=bool(record.get("usable", True)),
            )
        )
    return ExecutionView(
        pipeline=str(plan.get("pipeline", "")),
        label=str(plan.get("label", "")),
        stages=tuple(stages),
    )


_ERROR_KINDS: tuple[tuple[type[BaseException], str, ErrorAction | None], ...] = (
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


def _scalar_int(value: object, default: int) -> int:
    if value is None:
        return default
    array = np.asarray(value)
    if array.size != 1:
        raise ValueError(f"expected one number, got an array of shape {array.shape}")
    return int(array.reshape(()).item())


def _as_text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.ndarray):
        if value.size == 1:
            return _as_text(value.reshape(()).item())
        return "".join(_as_text(item) for item in value.reshape(-1).tolist())
    return str(value)


def output_items(
    output: OmniRequestOutput, received_s: float
) -> list[AudioChunk | TextChunk | TensorResults]:
    """Turn one request output into studio values (copies; the output may be released after).

    Non-empty ``pcm`` (float32, 1-D) with ``sample_rate`` and optional ``chunk_index`` becomes an
    :class:`AudioChunk`; ``text`` a :class:`TextChunk`; any other arrays of an output that
    carries neither become :class:`TensorResults`.
    """
    outputs = output.outputs
    items: list[AudioChunk | TextChunk | TensorResults] = []
    pcm = outputs.get("pcm")
    samples = None if pcm is None else np.array(pcm, dtype=np.float32, copy=True).reshape(-1)
    # A stream may close with an empty chunk (its last output carries only metrics).
    if samples is not None and samples.size:
        items.append(
            AudioChunk(
                request_id=output.request_id,
                index=output.index,
                chunk_index=_scalar_int(outputs.get("chunk_index"), output.index),
                pcm=samples,
                sample_rate=_scalar_int(outputs.get("sample_rate"), 0),
                received_s=received_s,
            )
        )
    text = outputs.get("text")
    if text is not None:
        items.append(TextChunk(output.request_id, output.index, _as_text(text), output.finished))
    if pcm is None and text is None:
        arrays = {
            name: np.array(value, copy=True)
            for name, value in outputs.items()
            if name not in STREAM_KEYS and isinstance(value, np.ndarray)
        }
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

    def add_audio(self, chunk: AudioChunk) -> None:
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


def event_line(event: Event) -> tuple[str, str] | None:
    """A log line (level, text) for a runtime event, or None for events not worth a line."""
    if isinstance(event, StageStarting):
        return "INFO", f"{event.stage}: starting on route {event.route}"
    if isinstance(event, StageReady):
        record = event.record
        worker = record.get("worker") or {}
        placement = record.get("placement") or {}
        counts = ", ".join(
            f"{count} on {name}" for name, count in placement.get("counts", {}).items()
        )
        return "INFO", (
            f"{event.stage}: ready, worker pid {worker.get('pid')} generation "
            f"{worker.get('generation')}; nodes: {counts or 'not reported'}"
        )
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


# ----------------------------------------------------------------------------- pipelines


def bundle_pipeline_text(
    manifest_path: Path, component: str, total_size: int, ram: int | None
) -> str:
    """A one-stage CPU pipeline around a bundle opened on its own."""
    demand = BUNDLE_BASE_DEMAND + 2 * total_size
    capacity = max(ram or 0, demand)
    document = {
        "pipeline": f"bundle_{component}",
        "description": f"The bundle {component} in one ONNX Runtime stage on the CPU "
        f"(made by the studio from {manifest_path}).",
        "async_chunk": False,
        "stages": [
            {
                "stage_id": 0,
                "backend": {
                    "name": "external.graph.v1",
                    "manifest": str(manifest_path),
                    "route": {
                        "name": "local-cpu",
                        "interpreter": "bundled",
                        "worker": "ort",
                        "ep": "cpu",
                        "os_domain": "posix",
                        "max_io_bytes": max(64 * 1024, 4 * total_size),
                        "min_fraction_on_target": 1.0,
                        "allowed_providers": ["CPUExecutionProvider"],
                    },
                },
                "resource_budget": {
                    "capacities": {"machine:ram": capacity},
                    "demands": {"machine:ram": demand},
                },
            }
        ],
    }
    return yaml.safe_dump(document, sort_keys=False)


def pipeline_for_bundle(manifest: Path, topology: Topology) -> Path:
    """Write (once) the one-stage pipeline the studio runs a bare bundle with; return its path."""
    bundle = verify_bundle(manifest)
    total = sum(bundle.file_sizes.values())
    ram = topology.constraints.get("machine:ram")
    text = bundle_pipeline_text(
        bundle.manifest_path, bundle.component, total, None if ram is None else ram.capacity
    )
    folder = data_dir() / "bundle-pipelines"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{bundle.component}-{bundle.identity[:12]}.yaml"
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return path


#: A bundle in the user data directory's voice folder, as a pipeline names it.
_DATA_VOICE_MANIFEST = re.compile(r"(\$\{data\}/voices/([A-Za-z0-9._-]+)/[^\s'\"]*manifest\.json)")


def missing_voices(pipeline: Path) -> list[str]:
    """Voices whose bundles ``pipeline`` names under ``${data}/voices/`` but that are found
    neither in the user data directory nor among the voices this installation ships (see
    :func:`runtime.paths.voice_dir`); an unreadable file names none: loading it reports why."""
    try:
        text = pipeline.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    missing = {
        voice
        for manifest, voice in _DATA_VOICE_MANIFEST.findall(text)
        if not Path(expand_data_placeholder(manifest)).is_file()
    }
    return sorted(missing)


def export_missing_voices(pipeline: Path, progress: Callable[[str], None]) -> list[str]:
    """Export, on first use, the voices :func:`missing_voices` finds from their installed
    packages into the user data directory; return their names. A shipped voice is never
    missing (the frozen application exports nothing); a voice this installation does not
    know is left for loading the pipeline to report."""
    from runtime.adapters.voice_export import KNOWN_VOICES, ensure_voice_bundles

    exported = [voice for voice in missing_voices(pipeline) if voice in KNOWN_VOICES]
    for voice in exported:
        ensure_voice_bundles(voice, progress=progress)
    return exported


def is_manifest_path(path: Path) -> bool:
    return path.suffix.lower() == ".json" or path.is_dir()


def input_kind(config: PipelineConfig) -> tuple[InputKind, str]:
    """Whether a pipeline takes tensors or text, and its example text.

    Graph chains take tensors. A pipeline with a model adapter takes text unless the
    adapter class says ``input_kind = "tensors"``; its example text is the adapter option
    ``example_text``, else the class's ``example_text``.
    """
    adapter = getattr(config, "adapter", None)
    graph_only = all(getattr(stage.backend, "is_graph", False) for stage in config.stages)
    if adapter is None:
        return (InputKind.TENSORS, "") if graph_only else (InputKind.TEXT, DEFAULT_TEXT)
    factory = resolve_callable(
        adapter.name, file=str(config.source), line=adapter.line, key="adapter.name"
    )
    declared = str(getattr(factory, "input_kind", InputKind.TEXT.value))
    kind = InputKind.TENSORS if declared == InputKind.TENSORS.value else InputKind.TEXT
    text = adapter.options.get("example_text") or getattr(factory, "example_text", DEFAULT_TEXT)
    return kind, str(text)


@dataclass(frozen=True, slots=True)
class _Opened:
    info: PipelineInfo
    config: PipelineConfig


def describe_pipeline(path: Path, topology: Topology, selection: DeviceSelection) -> _Opened:
    """Everything the studio shows before loading: config, plan, manifests, example inputs."""
    origin = "pipeline"
    source = path
    if is_manifest_path(path):
        origin = "bundle"
        source = pipeline_for_bundle(path, topology)
    config = load_pipeline(source)
    plan = plan_pipeline(source, topology=topology, selection=selection)
    kind, text = input_kind(config)
    examples: dict[str, np.ndarray] = {}
    first = config.stages[0].backend
    first_report = plan.stages[0].bundle
    if (
        kind is InputKind.TENSORS
        and isinstance(first, GraphBackendConfig)
        and first_report is not None
        and first_report.ok
    ):
        examples = load_example_inputs(verify_bundle(first.manifest))
    manifests = tuple(
        manifest_view(stage.name, stage.bundle) for stage in plan.stages if stage.bundle is not None
    )
    info = PipelineInfo(
        path=source,
        name=config.pipeline,
        description=config.description or "",
        origin=origin,
        input_kind=kind,
        stage_names=tuple(stage.name for stage in config.stages),
        example_inputs=examples,
        example_text=text,
        plan=plan_view(plan),
        manifests=manifests,
    )
    return _Opened(info, config)


# ----------------------------------------------------------------------------- threads


class _ControlThread(QThread):
    """Runs the bridge's blocking runtime calls one at a time, in submission order."""

    def __init__(self, parent: QObject, on_error: Callable[[BaseException], None]) -> None:
        super().__init__(parent)
        self.setObjectName("omni-studio-control")
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._on_error = on_error

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def stop(self) -> None:
        """Finish the queued jobs, then end the thread."""
        self._jobs.put(None)

    def run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except Exception as exc:  # one failing job must not end the thread; it is reported
                log.exception("studio control job %r failed", job)
                self._on_error(exc)


class _LogForwarder(logging.Handler):
    """Forwards runtime log records (from any thread) to a callback."""

    def __init__(self, forward: Callable[[LogLine], None]) -> None:
        super().__init__(logging.INFO)
        self._forward = forward

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                text = f"{text}: {record.exc_info[1]}"
            self._forward(LogLine(record.created, record.levelname, record.name, text))
        except (TypeError, ValueError, RuntimeError):  # a bad record, or the bridge is gone
            self.handleError(record)


@dataclass
class _Session:
    """The loaded pipeline (control thread only)."""

    orchestrator: Orchestrator
    unsubscribe: Callable[[], None]

    def usable(self) -> bool:
        clients = getattr(self.orchestrator, "clients", [])
        return self.orchestrator.running and all(getattr(c, "usable", True) for c in clients)

    def close(self) -> None:
        try:
            self.orchestrator.close()
        finally:
            self.unsubscribe()


# ----------------------------------------------------------------------------- the bridge


class RuntimeBridge(QObject):
    """The studio's runtime: one ledger, one loaded pipeline at a time, signals out.

    Run loads the pipeline's stages when they are not loaded; a completed run keeps them
    loaded (warm) until Unload, another pipeline, a device-selection change or closing;
    a cancelled run unloads them, so Cancel always leaves nothing held in the ledger.
    """

    state_changed = Signal(object)  # RunState
    topology_changed = Signal(object)  # TopologyView
    ledger_changed = Signal(object)  # LedgerView
    pipeline_opened = Signal(object)  # PipelineInfo
    plan_changed = Signal(object)  # PlanView (device selection or machine changed)
    execution_changed = Signal(object)  # ExecutionView, or None when unloaded
    run_started = Signal(str)  # request id
    audio_chunk = Signal(object)  # AudioChunk
    text_chunk = Signal(object)  # TextChunk
    tensors_ready = Signal(object)  # TensorResults
    metrics_changed = Signal(object)  # RequestMetrics
    run_finished = Signal(object)  # RunOutcome
    error = Signal(object)  # ErrorInfo
    log_line = Signal(object)  # LogLine
    shut_down = Signal()

    _posted = Signal(object)
    _stream_item = Signal(str, object, float)

    def __init__(
        self,
        *,
        topology_file: Path | None = None,
        selection: DeviceSelection | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.ledger = ResourceLedger(name="studio")
        self._state = RunState.EMPTY
        self._info: PipelineInfo | None = None
        self._config: PipelineConfig | None = None
        self._topology: Topology | None = None
        self._selection_override = selection
        self._selection = selection if selection is not None else DeviceSelection()
        self._loaded = False
        self._request: Request | None = None
        self._tracker: RequestTracker | None = None
        self._cancel_after_load = False
        self._pending_input: object = None
        self._outcome: RunOutcome | None = None
        # Control-thread state.
        self._session: _Session | None = None
        self._ctl_topology: Topology | None = None
        self._ctl_selection = self._selection

        self._posted.connect(self._run_posted, Qt.ConnectionType.QueuedConnection)
        self._stream_item.connect(self._on_stream_item, Qt.ConnectionType.QueuedConnection)
        self._thread = _ControlThread(self, lambda exc: self._post(partial(self._job_failed, exc)))
        self._thread.finished.connect(self._on_thread_finished)
        self._unsubscribe_ledger = self.ledger.subscribe(self._on_ledger_event)
        self._log_handler = _LogForwarder(self.log_line.emit)
        self._logger_levels: dict[str, int] = {}
        for name in FORWARDED_LOGGERS:
            logger = logging.getLogger(name)
            self._logger_levels[name] = logger.level
            if logger.level == logging.NOTSET or logger.level > logging.INFO:
                logger.setLevel(logging.INFO)
            logger.addHandler(self._log_handler)
        self._thread.start()
        self._submit(partial(self._topology_job, topology_file))

    # -- properties (GUI thread) -------------------------------------------------------

    @property
    def state(self) -> RunState:
        return self._state

    @property
    def pipeline(self) -> PipelineInfo | None:
        return self._info

    @property
    def selection(self) -> DeviceSelection:
        return self._selection

    @property
    def request_id(self) -> str | None:
        return None if self._request is None else self._request.request_id

    def ledger_snapshot(self) -> LedgerView:
        return ledger_view(self.ledger.snapshot())

    # -- commands (GUI thread) ----------------------------------------------------------

    def open_pipeline(self, path: str | Path) -> bool:
        """Describe a pipeline YAML or a bundle manifest; ``pipeline_opened`` follows."""
        if self._state in (RunState.CLOSING, RunState.CLOSED):
            return False
        if self._state.busy:
            self.error.emit(
                ErrorInfo(
                    "A run is in progress",
                    "Cancel it (Esc) or wait for it to finish before opening another pipeline.",
                    kind="warning",
                )
            )
            return False
        self._set_state(RunState.OPENING)
        if self._loaded:
            self._submit(self._unload_job)
            self._loaded = False
        self._submit(partial(self._open_job, Path(path).expanduser().absolute()))
        return True

    def run(self, request_input: object = None) -> bool:
        """Run one request (tensors as a mapping, or text); loads the stages first if needed."""
        if not self._state.can_run or self._config is None:
            return False
        self._pending_input = request_input
        self._cancel_after_load = False
        self._outcome = None
        if self._loaded:
            self._set_state(RunState.RUNNING)
            self._submit(partial(self._submit_job, request_input))
        else:
            self._set_state(RunState.LOADING)
            self._submit(partial(self._load_job, self._config, request_input))
        return True

    def cancel(self) -> bool:
        """Cancel the running request (or the load it is waiting for)."""
        if self._state is RunState.LOADING:
            self._cancel_after_load = True
            self._set_state(RunState.CANCELLING)
            return True
        if self._state is RunState.RUNNING:
            self._set_state(RunState.CANCELLING)
            request_id = self.request_id
            if request_id is None:
                self._cancel_after_load = True
            else:
                self._submit(partial(self._cancel_job, request_id))
            return True
        return False

    def unload(self) -> bool:
        """Retire the loaded stages and release their reservations."""
        if self._state is not RunState.LOADED:
            return False
        self._unload_then_ready()
        return True

    def set_device_allowed(self, physical_id: str, allowed: bool) -> None:
        """Allow or exclude one device; saved to the selection file the CLI reads."""
        topology = self._topology
        if topology is None:
            return
        try:
            if allowed:
                selection = self._selection.allow(topology, physical_id)
                if selection.allowed is not None and selection.allowed >= {
                    device.physical_id for device in topology.devices
                }:
                    selection = DeviceSelection()
            else:
                selection = self._selection.exclude(topology, physical_id)
        except UsageError as exc:
            self.error.emit(error_info(exc))
            return
        self._apply_selection(selection)

    def allow_all_devices(self) -> None:
        self._apply_selection(DeviceSelection())

    def set_topology_source(self, topology_file: Path | None) -> None:
        """Use this machine (None) or a topology file for plans and runs."""
        if self._state.busy:
            return
        self._unload_if_idle()
        self._submit(partial(self._topology_job, topology_file))
        self._replan()

    def shutdown(self) -> None:
        """Cancel, retire everything, stop the control thread; ``shut_down`` follows."""
        if self._state in (RunState.CLOSING, RunState.CLOSED):
            return
        self._set_state(RunState.CLOSING)
        self._submit(self._close_job)
        self._thread.stop()

    # -- GUI-thread helpers -------------------------------------------------------------

    def _submit(self, job: Callable[[], None]) -> None:
        self._thread.submit(job)

    def _post(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the GUI thread (from any thread)."""
        self._posted.emit(callback)

    def _run_posted(self, callback: Callable[[], None]) -> None:
        callback()

    def _set_state(self, state: RunState) -> None:
        if state is not self._state:
            self._state = state
            self.state_changed.emit(state)

    def _studio_line(self, text: str, level: str = "INFO") -> None:
        self.log_line.emit(LogLine(time.time(), level, "studio", text))

    def _post_studio_line(self, text: str) -> None:
        """A studio log line from the control thread."""
        self._post(partial(self._studio_line, text))

    def _apply_selection(self, selection: DeviceSelection) -> None:
        self._selection = selection
        if self._topology is not None:
            self.topology_changed.emit(topology_view(self._topology, selection, selection_path()))
        self._submit(partial(self._selection_job, selection))
        self._unload_if_idle()
        self._replan()

    def _unload_if_idle(self) -> None:
        if self._state is RunState.LOADED:
            self._unload_then_ready()

    def _unload_then_ready(self) -> None:
        self._loaded = False
        self._set_state(RunState.UNLOADING)
        self._submit(self._unload_job)
        self._submit(lambda: self._post(self._unloaded))

    def _unloaded(self) -> None:
        if self._state is RunState.UNLOADING:
            self._set_state(RunState.READY)

    def _replan(self) -> None:
        if self._info is not None:
            self._submit(partial(self._plan_job, self._info.path))

    # -- control-thread jobs ------------------------------------------------------------

    def _topology_job(self, topology_file: Path | None) -> None:
        try:
            topology = (
                discover_topology() if topology_file is None else load_topology(topology_file)
            )
            selection = (
                self._selection_override
                if self._selection_override is not None
                else load_selection()
            )
        except OmniError as exc:
            self._post(partial(self.error.emit, error_info(exc)))
            if self._ctl_topology is not None:
                return
            topology = discover_topology()
            selection = DeviceSelection()
        self._ctl_topology = topology
        self._ctl_selection = selection
        self._post(partial(self._topology_ready, topology, selection))

    def _selection_job(self, selection: DeviceSelection) -> None:
        self._ctl_selection = selection
        if self._selection_override is None:
            try:
                file = save_selection(selection)
            except OSError as exc:
                message = f"cannot save the device selection to {selection_path()}: {exc}"
                self._post(
                    partial(self.error.emit, ErrorInfo("Device selection not saved", message))
                )
                return
            self._post(partial(self._studio_line, f"device selection saved to {file}"))

    def _open_job(self, path: Path) -> None:
        assert self._ctl_topology is not None
        try:
            if not is_manifest_path(path):
                export_missing_voices(path, progress=self._post_studio_line)
            opened = describe_pipeline(path, self._ctl_topology, self._ctl_selection)
        except (OmniError, OSError, ValueError) as exc:
            self._post(partial(self._open_failed, exc))
            return
        self._post(partial(self._opened, opened))

    def _plan_job(self, path: Path) -> None:
        assert self._ctl_topology is not None
        try:
            plan = plan_pipeline(path, topology=self._ctl_topology, selection=self._ctl_selection)
        except (OmniError, OSError) as exc:
            self._post(partial(self.error.emit, error_info(exc)))
            return
        self._post(partial(self.plan_changed.emit, plan_view(plan)))

    def _load_job(self, config: PipelineConfig, request_input: object) -> None:
        events = EventBus()
        unsubscribe = events.subscribe(self._on_runtime_event)
        try:
            orchestrator = Orchestrator(
                config,
                ledger=self.ledger,
                events=events,
                topology=self._ctl_topology,
                selection=self._ctl_selection,
            )
            orchestrator.start()
        except OmniError as exc:
            unsubscribe()
            self._post(partial(self._load_failed, exc))
            return
        self._session = _Session(orchestrator, unsubscribe)
        self._post(partial(self._after_load, request_input))

    def _submit_job(self, request_input: object) -> None:
        session = self._session
        if session is None:
            self._post(partial(self._request_failed, UsageError("the pipeline is not loaded")))
            return
        try:
            request = session.orchestrator.submit(request_input)
        except OmniError as exc:
            self._post(partial(self._request_failed, exc))
            return
        self._post(partial(self._submitted, request))

    def _cancel_job(self, request_id: str) -> None:
        session = self._session
        if session is not None:
            session.orchestrator.cancel(request_id, wait=True)

    def _settle_job(self, cancelled: bool) -> None:
        """After a request: keep the stages warm when it completed or failed and they are all
        usable; after a cancel (or a retired worker) unload them, so nothing stays held."""
        session = self._session
        keep = session is not None and not cancelled and session.usable()
        if session is not None and not keep:
            self._unload_job()
        self._post(partial(self._settled, keep, cancelled))

    def _unload_job(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()

    def _close_job(self) -> None:
        self._unload_job()

    # -- GUI-thread continuations ------------------------------------------------------

    def _topology_ready(self, topology: Topology, selection: DeviceSelection) -> None:
        self._topology = topology
        self._selection = selection
        self.topology_changed.emit(topology_view(topology, selection, selection_path()))
        self.ledger_changed.emit(self.ledger_snapshot())

    def _opened(self, opened: _Opened) -> None:
        if self._state is not RunState.OPENING:
            return
        self._info = opened.info
        self._config = opened.config
        self._set_state(RunState.READY)
        self._studio_line(f"opened {opened.info.path}")
        self.pipeline_opened.emit(opened.info)

    def _open_failed(self, error: BaseException) -> None:
        if self._state is not RunState.OPENING:
            return
        self._set_state(RunState.READY if self._config is not None else RunState.EMPTY)
        self.error.emit(error_info(error))

    def _load_failed(self, error: OmniError) -> None:
        if self._state in (RunState.CLOSING, RunState.CLOSED):
            return
        self._studio_line(f"loading failed: {error}", "ERROR")
        self.error.emit(error_info(error))
        self._finish_run(RunOutcome(None, "failed", str(error)))
        self._set_state(RunState.READY)

    def _after_load(self, request_input: object) -> None:
        self._loaded = True
        if self._state in (RunState.CLOSING, RunState.CLOSED):
            return
        if self._cancel_after_load:
            self._finish_run(
                RunOutcome(None, "cancelled", "cancelled while the stages were loading")
            )
            self._unload_then_ready()
            return
        self._set_state(RunState.RUNNING)
        self._submit(partial(self._submit_job, request_input))

    def _submitted(self, request: Request) -> None:
        self._request = request
        if self._tracker is None or self._tracker.request_id != request.request_id:
            self._tracker = RequestTracker(request.request_id, time.monotonic())
        self.run_started.emit(request.request_id)
        if self._cancel_after_load and self._state is RunState.CANCELLING:
            self._submit(partial(self._cancel_job, request.request_id))
        self._watch(request)

    def _request_failed(self, error: OmniError) -> None:
        if self._state in (RunState.CLOSING, RunState.CLOSED):
            return
        self.error.emit(error_info(error))
        self._finish_run(RunOutcome(None, "failed", str(error)))
        self._set_state(RunState.LOADED if self._loaded else RunState.READY)

    def _watch(self, request: Request) -> None:
        request_id = request.request_id
        future = request.stream.next_future()
        future.add_done_callback(
            lambda done: self._stream_item.emit(request_id, done, time.monotonic())
        )

    def _on_stream_item(self, request_id: str, future: cf.Future[object], at: float) -> None:
        item = future.result()
        request = self._request
        if request is None or request.request_id != request_id:
            if isinstance(item, OmniRequestOutput):
                item.release_stage_buffers()
            return
        if isinstance(item, OmniRequestOutput):
            try:
                self._deliver(item, at)
            finally:
                item.release_stage_buffers()
            self._watch(request)
        elif item is END:
            self._request_ended(RunOutcome(request_id, "completed"))
        elif isinstance(item, RequestCancelled):
            self._request_ended(RunOutcome(request_id, "cancelled", str(item)))
        elif isinstance(item, BaseException):
            if self._state not in (RunState.CLOSING, RunState.CLOSED):
                self.error.emit(error_info(item))
            self._request_ended(RunOutcome(request_id, "failed", str(item)))

    def _deliver(self, output: OmniRequestOutput, at: float) -> None:
        tracker = self._tracker
        received_s = 0.0 if tracker is None else at - tracker.submitted_at
        try:
            items = output_items(output, received_s)
        except (ValueError, TypeError) as exc:
            self.error.emit(ErrorInfo("An output could not be shown", f"{output.stage}: {exc}"))
            return
        for item in items:
            if isinstance(item, AudioChunk):
                if tracker is not None:
                    tracker.add_audio(item)
                self.audio_chunk.emit(item)
            elif isinstance(item, TextChunk):
                self.text_chunk.emit(item)
            else:
                self.tensors_ready.emit(item)
        if tracker is not None:
            self.metrics_changed.emit(tracker.snapshot(time.monotonic()))

    def _request_ended(self, outcome: RunOutcome) -> None:
        self._request = None
        self._finish_run(outcome)
        if self._state in (RunState.CLOSING, RunState.CLOSED):
            return
        self._submit(partial(self._settle_job, outcome.status == "cancelled"))

    def _finish_run(self, outcome: RunOutcome) -> None:
        tracker = self._tracker
        if tracker is not None and tracker.finished_at is None:
            tracker.finish(outcome.status, time.monotonic())
            self.metrics_changed.emit(tracker.snapshot(time.monotonic()))
        self._outcome = outcome
        self.run_finished.emit(outcome)

    def _settled(self, kept: bool, cancelled: bool) -> None:
        self._loaded = kept
        if self._state in (RunState.CLOSING, RunState.CLOSED):
            return
        if not kept:
            reason = "the request was cancelled" if cancelled else "a worker was retired"
            self._studio_line(f"stages unloaded ({reason}); the next run loads them again")
        self._set_state(RunState.LOADED if kept else RunState.READY)

    def _job_failed(self, error: BaseException) -> None:
        """A control job raised something unexpected: report it and return to a known state."""
        self.error.emit(error_info(error))
        if self._state in (RunState.CLOSING, RunState.CLOSED) or not self._state.busy:
            return
        if self._request is not None or self._state in (
            RunState.LOADING,
            RunState.RUNNING,
            RunState.CANCELLING,
        ):
            self._request = None
            self._finish_run(RunOutcome(None, "failed", str(error)))
        if self._state is RunState.OPENING:
            self._set_state(RunState.READY if self._config is not None else RunState.EMPTY)
            return
        self._unload_then_ready()

    def _on_thread_finished(self) -> None:
        self._unsubscribe_ledger()
        for name, level in self._logger_levels.items():
            logger = logging.getLogger(name)
            logger.removeHandler(self._log_handler)
            logger.setLevel(level)
        self._loaded = False
        self._set_state(RunState.CLOSED)
        self.ledger_changed.emit(self.ledger_snapshot())
        self.shut_down.emit()

    # -- runtime callbacks (runtime threads) ---------------------------------------------

    def _on_runtime_event(self, event: Event) -> None:
        self._post(partial(self._handle_event, event))

    def _on_ledger_event(self, event: LedgerEvent) -> None:
        self.ledger_changed.emit(ledger_view(event.snapshot))
        self.log_line.emit(LogLine(time.time(), "INFO", "ledger", f"{event.kind}: {event.detail}"))

    def _handle_event(self, event: Event) -> None:
        line = event_line(event)
        if line is not None:
            level, text = line
            self.log_line.emit(LogLine(time.time(), level, "runtime", text))
        if isinstance(event, RequestAdmitted):
            self._tracker = RequestTracker(event.request_id, event.at)
        elif isinstance(event, StageCallFinished):
            tracker = self._tracker
            if tracker is not None and tracker.request_id == event.request_id:
                tracker.add_call(event.stage, event.queue_s, event.run_s, event.transfer_s)
                self.metrics_changed.emit(tracker.snapshot(time.monotonic()))
        elif isinstance(event, PipelineReady):
            self.execution_changed.emit(execution_view(event.execution_plan))
        elif isinstance(event, PipelineClosed):
            self.execution_changed.emit(None)
