"""The studio's view values: what the bridge hands to widgets.

Widgets receive these plain, frozen values through the bridge's signals and never touch
runtime objects, so nothing in a widget can block on the runtime or subscribe to it.
This module imports neither Qt nor the runtime.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path


class RunState(enum.Enum):
    """Where the studio is with the current pipeline; the buttons follow it."""

    EMPTY = "no pipeline"
    OPENING = "opening"
    READY = "ready"
    LOADING = "loading stages"
    RUNNING = "running"
    CANCELLING = "cancelling"
    LOADED = "idle, stages loaded"
    UNLOADING = "unloading"
    CLOSING = "closing"
    CLOSED = "closed"

    @property
    def can_run(self) -> bool:
        return self in (RunState.READY, RunState.LOADED)

    @property
    def can_cancel(self) -> bool:
        return self in (RunState.LOADING, RunState.RUNNING)

    @property
    def busy(self) -> bool:
        return self in (
            RunState.OPENING,
            RunState.LOADING,
            RunState.RUNNING,
            RunState.CANCELLING,
            RunState.UNLOADING,
            RunState.CLOSING,
        )


class InputKind(enum.Enum):
    """What a pipeline takes: tensors (graph pipelines), text (speech, language models) or
    audio (transcription)."""

    TENSORS = "tensors"
    TEXT = "text"
    AUDIO = "audio"


class ErrorAction(enum.Enum):
    """The useful next step a banner offers for an error."""

    OPEN_DEVICES = "Open the Devices panel"
    SHOW_PLAN = "Show the Plan"
    SHOW_MANIFEST = "Show the Manifest"
    SHOW_LOG = "Show the Log"


# ------------------------------------------------------------------------------ errors


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """A runtime failure as the banner shows it."""

    title: str
    message: str
    action: ErrorAction | None = None
    kind: str = "error"  # the runtime error's class name, or "warning"


# ------------------------------------------------------------------------------ devices


@dataclass(frozen=True, slots=True)
class DeviceView:
    physical_id: str
    name: str
    kind: str
    providers: tuple[str, ...]
    constraints: tuple[str, ...]
    allowed: bool


@dataclass(frozen=True, slots=True)
class MachineConstraintView:
    """A memory constraint as the machine declares it (capacity, free memory observed now)."""

    name: str
    capacity: int | None
    observed_free: int | None
    devices: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TopologyView:
    source: str
    title: str
    wsl: bool
    devices: tuple[DeviceView, ...]
    constraints: tuple[MachineConstraintView, ...]
    notes: tuple[str, ...]
    selection_file: str
    all_allowed: bool


@dataclass(frozen=True, slots=True)
class LedgerRow:
    name: str
    capacity: int
    reserved: int
    quarantined: int

    @property
    def free(self) -> int:
        return self.capacity - self.reserved - self.quarantined


@dataclass(frozen=True, slots=True)
class ReservationView:
    id: str
    owner: str
    stage: str
    amounts: Mapping[str, int]
    reason: str | None = None  # set for a quarantined reservation


@dataclass(frozen=True, slots=True)
class LedgerView:
    rows: tuple[LedgerRow, ...]
    reservations: tuple[ReservationView, ...]
    quarantined: tuple[ReservationView, ...]
    version: int

    @property
    def is_empty(self) -> bool:
        return not self.reservations and not self.quarantined

    def row(self, name: str) -> LedgerRow | None:
        return next((row for row in self.rows if row.name == name), None)

    @property
    def reserved_total(self) -> int:
        return sum(row.reserved for row in self.rows)

    @property
    def quarantined_total(self) -> int:
        return sum(row.quarantined for row in self.rows)


EMPTY_LEDGER = LedgerView(rows=(), reservations=(), quarantined=(), version=0)


# ------------------------------------------------------------------------------ plan


@dataclass(frozen=True, slots=True)
class BudgetRow:
    constraint: str
    declared: bool
    capacity: int
    in_use: int
    total: int
    headroom: int
    fits: bool
    demands: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class StagePlanView:
    """One stage before loading (from the plan) and, once loaded, as it actually runs."""

    name: str
    backend: str
    route: str
    ep: str
    os_domain: str
    device: str | None
    demands: Mapping[str, int]
    allowed_providers: tuple[str, ...]
    min_fraction_on_target: float


@dataclass(frozen=True, slots=True)
class PlanView:
    admitted: bool
    topology: str
    stages: tuple[StagePlanView, ...]
    budget: tuple[BudgetRow, ...]
    refusals: tuple[str, ...]
    warnings: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StageExecutionView:
    """A loaded stage: where it runs and what it holds."""

    name: str
    route: str
    ep: str
    pid: int | None
    generation: int
    provider_counts: Mapping[str, int]
    total_nodes: int
    fraction_on_target: float | None
    target_provider: str | None
    placement_method: str | None
    reservation_id: str | None
    reservation: Mapping[str, int]
    load_s: float | None
    warmup_s: float | None
    worker_rss_bytes: int | None
    usable: bool


@dataclass(frozen=True, slots=True)
class ExecutionView:
    pipeline: str
    label: str
    stages: tuple[StageExecutionView, ...]


def load_seconds(value: float) -> str:
    """0.4 s below ten seconds, 12 s above: what a person waiting reads."""
    return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"


@dataclass(frozen=True, slots=True)
class StageLoadView:
    """One stage of a load: what serves it, its phase since ``since`` (monotonic seconds),
    and the seconds it took once ready or failed."""

    stage: str
    kind: str
    phase: str
    since: float
    elapsed_s: float | None = None
    #: What it loads: the model's or the bundle's name ("" when there is none to show).
    model: str = ""

    @property
    def done(self) -> bool:
        return self.phase in ("ready", "failed")

    @property
    def label(self) -> str:
        """``stage-0 · smollm2-135m-instruct (vLLM worker)``."""
        model = f" · {self.model}" if self.model else ""
        return f"{self.stage}{model} ({self.kind})"

    def seconds(self, now: float) -> float:
        return self.elapsed_s if self.elapsed_s is not None else max(0.0, now - self.since)

    def line(self, now: float) -> str:
        """``assistant (vLLM worker): loading… 12 s``, ``voice (graph worker): ready 0.4 s``."""
        dots = "" if self.done else "…"
        return f"{self.label}: {self.phase}{dots} {load_seconds(self.seconds(now))}"


@dataclass(frozen=True, slots=True)
class LoadView:
    """A pipeline's load as the Run and conversation views show it: ``status`` is loading,
    ready or failed; the seconds count from ``started`` until ``elapsed_s`` is known."""

    pipeline: str
    status: str
    started: float
    stages: tuple[StageLoadView, ...]
    elapsed_s: float | None = None
    message: str = ""

    @property
    def loading(self) -> bool:
        return self.status == "loading"

    def lines(self, now: float) -> list[str]:
        return [stage.line(now) for stage in self.stages]

    def summary(self, now: float) -> str:
        took = load_seconds(
            self.elapsed_s if self.elapsed_s is not None else max(0.0, now - self.started)
        )
        if self.status == "ready":
            return f"{len(self.stages)} stage(s) loaded in {took}"
        if self.status == "failed":
            return f"loading stopped after {took}: {self.message}"
        waiting = [f"{s.stage} ({s.kind})" for s in self.stages if not s.done]
        return (
            f"loading… {took}: waiting for {', '.join(waiting)}" if waiting else f"loading… {took}"
        )


# ------------------------------------------------------------------------------ manifest


@dataclass(frozen=True, slots=True)
class FileView:
    name: str
    status: str
    expected_sha256: str
    actual_sha256: str | None
    size: int | None
    detail: str | None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True, slots=True)
class ManifestView:
    stage: str
    manifest_path: str
    component: str | None
    identity: str | None
    ok: bool
    files: tuple[FileView, ...]
    #: Top-level metadata keys with their JSON values (nested objects and lists included).
    metadata: tuple[tuple[str, object], ...]
    errors: tuple[str, ...]


# ------------------------------------------------------------------------------ pipeline


@dataclass(frozen=True, slots=True)
class PipelineInfo:
    """An opened pipeline: what the run pane and the panels show before anything loads."""

    path: Path
    name: str
    description: str
    origin: str  # "pipeline" or "bundle" (a manifest opened on its own)
    input_kind: InputKind
    stage_names: tuple[str, ...]
    example_inputs: Mapping[str, np.ndarray]
    example_text: str
    plan: PlanView
    manifests: tuple[ManifestView, ...]
    #: Text in, with a language-model stage: the studio shows a conversation view.
    chat: bool = False
    #: A spoken conversation (voice-chat): the conversation view with the microphone.
    voice: bool = False


# ------------------------------------------------------------------------------ outputs


@dataclass(frozen=True, slots=True)
class ReceivedAudio:
    """One chunk of a request's streamed PCM (mono float32), as the studio received it."""

    request_id: str
    index: int
    chunk_index: int
    pcm: np.ndarray
    sample_rate: int
    received_s: float  # seconds after the request was submitted
    #: Already queued for playback off the GUI thread (by the bridge, as it arrived).
    queued: bool = False

    @property
    def duration_s(self) -> float:
        return len(self.pcm) / self.sample_rate if self.sample_rate else 0.0


@dataclass(frozen=True, slots=True)
class TextChunk:
    """Streamed text: a partial output's new text, or (``finished``) the whole text, with the
    prompt the language-model stage rendered for the request when the runtime reports it."""

    request_id: str
    index: int
    text: str
    finished: bool
    prompt: str | None = None


@dataclass(frozen=True, slots=True)
class TranscriptSegment:
    """One finished segment of a transcription: its text and where it lies in the audio."""

    request_id: str
    index: int
    start_s: float
    end_s: float
    text: str


@dataclass(frozen=True, slots=True)
class TensorResults:
    """A request's final tensors (copies owned by the studio)."""

    request_id: str
    stage: str
    arrays: Mapping[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class RunOutcome:
    request_id: str | None
    status: str  # "completed" | "cancelled" | "failed"
    message: str = ""


# ------------------------------------------------------------------------------ metrics


@dataclass(frozen=True, slots=True)
class StageTiming:
    stage: str
    calls: int
    queue_s: float
    run_s: float
    transfer_s: float


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    request_id: str
    elapsed_s: float
    first_audio_s: float | None
    audio_s: float
    chunks: int
    stages: tuple[StageTiming, ...]
    status: str = "running"
    #: Seconds after submission at which the latest audio chunk arrived.
    audio_produced_at_s: float | None = None

    @property
    def real_time_factor(self) -> float | None:
        """Time taken to produce the audio over its duration (below 1: faster than real time)."""
        if self.audio_s <= 0 or self.audio_produced_at_s is None:
            return None
        return self.audio_produced_at_s / self.audio_s


@dataclass(frozen=True, slots=True)
class LogLine:
    wall_time: float
    level: str
    source: str
    text: str


@dataclass(frozen=True, slots=True)
class StallStats:
    """Lateness of the GUI event loop measured by a periodic timer, in milliseconds."""

    samples: int
    interval_ms: float
    mean_ms: float
    p99_ms: float
    max_ms: float
    over_50ms: int

    def to_json(self) -> dict[str, float | int]:
        return {
            "samples": self.samples,
            "interval_ms": self.interval_ms,
            "mean_ms": round(self.mean_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "max_ms": round(self.max_ms, 3),
            "over_50ms": self.over_50ms,
        }


# ------------------------------------------------------------------------------ compare


@dataclass(frozen=True, slots=True)
class Comparison:
    """One output compared with its reference."""

    name: str
    ok: bool
    max_abs: float | None
    max_rel: float | None
    problem: str = ""


@dataclass(frozen=True, slots=True)
class Tolerance:
    atol: float = 1e-5
    rtol: float = 1e-5


def compare_outputs(
    outputs: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    tolerance: Tolerance | None = None,
) -> tuple[Comparison, ...]:
    """Compare each reference array with the output of the same name."""
    tolerance = tolerance or Tolerance()
    results = []
    for name, expected in reference.items():
        actual = outputs.get(name)
        if actual is None:
            results.append(
                Comparison(
                    name,
                    False,
                    None,
                    None,
                    f"no output named {name!r}; outputs: {', '.join(sorted(outputs)) or 'none'}",
                )
            )
            continue
        if actual.shape != expected.shape:
            results.append(
                Comparison(
                    name,
                    False,
                    None,
                    None,
                    f"shape {tuple(actual.shape)} but the reference has {tuple(expected.shape)}",
                )
            )
            continue
        a = np.asarray(actual, dtype=np.float64)
        b = np.asarray(expected, dtype=np.float64)
        difference = np.abs(a - b)
        max_abs = float(difference.max()) if difference.size else 0.0
        scale = np.abs(b)
        with np.errstate(divide="ignore", invalid="ignore"):
            relative = np.where(
                scale > 0, difference / scale, np.where(difference > 0, np.inf, 0.0)
            )
        max_rel = float(relative.max()) if relative.size else 0.0
        ok = bool(np.allclose(a, b, atol=tolerance.atol, rtol=tolerance.rtol, equal_nan=True))
        problem = (
            ""
            if ok
            else (
                f"max abs difference {max_abs:.3g} exceeds atol {tolerance.atol:g} + "
                f"rtol {tolerance.rtol:g} x |reference|"
            )
        )
        results.append(
            Comparison(name, ok, max_abs, max_rel if math.isfinite(max_rel) else None, problem)
        )
    return tuple(results)


# ------------------------------------------------------------------------------- serving


@dataclass(frozen=True, slots=True)
class ServedLine:
    """One request the local server answered."""

    method: str
    path: str
    model: str | None
    status: int
    duration_s: float


@dataclass(frozen=True, slots=True)
class QueueLine:
    """One served pipeline's queue: requests waiting now, and how many may wait."""

    model: str
    queued: int
    max_queue: int


@dataclass(frozen=True, slots=True)
class ServeView:
    """The local OpenAI-compatible server: ``state`` is ``stopped``, ``starting``,
    ``serving``, ``stopping`` or ``failed`` (with ``error``); ``address`` is the base URL
    while serving; ``served`` counts the answered requests and ``recent`` lists the last
    ones, newest last; ``endpoints`` lists what the server answers (``GET /v1/models``) and
    ``queues`` each pipeline's queue, live."""

    state: str = "stopped"
    address: str | None = None
    models: tuple[str, ...] = ()
    served: int = 0
    recent: tuple[ServedLine, ...] = ()
    error: str | None = None
    endpoints: tuple[str, ...] = ()
    queues: tuple[QueueLine, ...] = ()
