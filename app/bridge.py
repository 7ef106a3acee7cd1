"""The one bridge between the runtime and Qt.

``RuntimeBridge`` owns a control thread (:class:`app.control.ControlThread`) that makes every
blocking runtime call — describing a pipeline, loading and closing its stages
(:class:`runtime.api.PipelineSession`), cancelling — and it is the only object that subscribes
to runtime callbacks (a load's ``EventBus``, the ``ResourceLedger``, the runtime's loggers)
and reads requests' outputs (each :class:`runtime.api.RequestHandle` on a reader thread of its
own). Those run on runtime threads; what they carry reaches the GUI thread through the
bridge's one hop
(:class:`app.control.GuiHop`), where the bridge turns what it carries into plain values from
:mod:`app.models` with :mod:`app.presenters` and emits Qt signals. Widgets only ever see
those values, so the GUI never waits on the runtime.

A run's audio does not wait for the GUI thread: where the window gave the bridge an audio
sink (:meth:`RuntimeBridge.set_audio_sink`, the studio's ``AudioOutput``), each chunk is queued
for playback on the reader thread that received it, before the GUI sees it; the GUI then
only draws it (``ReceivedAudio.queued``) and acknowledges the output.

The bridge is composed of parts, each in its own module, each given what it needs when the
bridge makes it and each reaching the GUI only through the same hop: the loaded pipelines
(:mod:`app.bridge_pipelines`), the device selection and topology (:mod:`app.bridge_devices`),
the Serve switch (:mod:`app.bridge_serving`), the imports of My pipelines
(:mod:`app.bridge_models`), the first-use setup (:mod:`app.bridge_setup`), the audio input
(:mod:`app.bridge_audio_input`), the dictation's transcriber
(:mod:`app.bridge_transcriber`) and the spoken conversation (:mod:`app.bridge_voice`).

State that belongs to the GUI (``state``, the current request) is touched only on the GUI
thread; state that belongs to the runtime (the loaded pipelines) only in control jobs, which
run one at a time in submission order. Besides the hop, only Qt's own end-of-thread notice
(``QThread.finished``) crosses into the GUI thread; it carries nothing from the runtime.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PySide6.QtCore import QObject, Signal

from app.bridge_audio_input import InputRecorder
from app.bridge_devices import MachineChoice
from app.bridge_models import ModelImports
from app.bridge_pipelines import LoadCancelled, LoadedPipelines, PendingLoad
from app.bridge_serving import ServeSwitch, serve_unavailable_reason
from app.bridge_setup import SetupJobs
from app.bridge_transcriber import Transcriber
from app.bridge_voice import VoiceEnded, VoiceStart, VoiceTalk, export_missing_vad
from app.control import ControlThread, GuiHop, LogForwarder
from app.models import (
    ErrorInfo,
    LedgerView,
    LoadView,
    LogLine,
    PipelineInfo,
    ReceivedAudio,
    RunOutcome,
    RunState,
    ServeView,
    TextChunk,
    TranscriptSegment,
)
from app.presenters import (
    RUN_IN_PROGRESS,
    AudioSink,
    OpenedPipeline,
    RunMetrics,
    describe_pipeline,
    error_info,
    event_line,
    execution_view,
    ledger_view,
    load_view,
    plan_view,
)
from runtime.adapters.whisper_export import export_missing_recognisers
from runtime.api import OmniRequestOutput, PipelineSession
from runtime.devices import DeviceSelection
from runtime.errors import ModelError, OmniError, RequestCancelled
from runtime.events import (
    Event,
    PipelineClosed,
    PipelineLoadFailed,
    PipelineLoading,
    PipelineReady,
    RequestAdmitted,
    StageCallFinished,
    StageFailed,
    StageReady,
    StageStarting,
    StageWorkerUp,
)
from runtime.ledger import LedgerEvent, ResourceLedger
from runtime.pipeline_files import export_missing_voices, is_manifest_path
from runtime.planning import plan_pipeline

if TYPE_CHECKING:
    from collections.abc import Callable

    from app.bridge_voice import LiveConversation
    from runtime.api import ExecutionPlan, RequestHandle, Resolution
    from runtime.config import PipelineConfig
    from runtime.devices import Topology

#: Loggers whose records the Log panel shows (runtime, workers' stderr, the ledger).
FORWARDED_LOGGERS = ("omni", "runtime")
#: The runtime events a load's progress is made of.
LOADING_EVENTS = (
    PipelineLoading,
    StageStarting,
    StageWorkerUp,
    StageReady,
    StageFailed,
    PipelineReady,
    PipelineLoadFailed,
)


# ----------------------------------------------------------------------------- the bridge


class RuntimeBridge(QObject):
    """The studio's runtime: one ledger (the machine's memory), one open pipeline, signals out.

    :meth:`load` starts loading the open pipeline's stages in the background (the window
    calls it when a pipeline is opened); Run waits for that load, or starts one when none is
    under way. Opening another pipeline, a device-selection change or closing cancels a load
    under way and unloads what it started. A completed run keeps them
    loaded (warm) until Unload, a device-selection change or closing. Opening another
    pipeline keeps a loaded one warm beside it, so pipelines opened in turn load together as
    far as the machine's memory allows: reopened, it runs at once, and a load that does not
    fit unloads the warm ones, oldest first, before it is refused. A cancelled run unloads
    them all, so Cancel always leaves nothing held in the ledger.
    """

    state_changed = Signal(object)  # RunState
    topology_changed = Signal(object)  # TopologyView
    ledger_changed = Signal(object)  # LedgerView
    pipeline_opened = Signal(object)  # PipelineInfo
    plan_changed = Signal(object)  # PlanView (device selection or machine changed)
    execution_changed = Signal(object)  # ExecutionView, or None when unloaded
    load_progress = Signal(object)  # LoadView of the load under way or the last, or None
    run_started = Signal(str)  # request id
    audio_chunk = Signal(object)  # ReceivedAudio
    text_chunk = Signal(object)  # TextChunk
    transcript_segment = Signal(object)  # TranscriptSegment
    tensors_ready = Signal(object)  # TensorResults
    metrics_changed = Signal(object)  # RequestMetrics
    run_finished = Signal(object)  # RunOutcome
    error = Signal(object)  # ErrorInfo
    log_line = Signal(object)  # LogLine
    serve_changed = Signal(object)  # ServeView
    shut_down = Signal()

    def __init__(
        self,
        *,
        topology_file: Path | None = None,
        selection: DeviceSelection | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.ledger = ResourceLedger(name="studio")
        #: The one hop into the GUI thread, shared by every part of the bridge.
        self._hop = GuiHop(self)
        self._state = RunState.EMPTY
        self._info: PipelineInfo | None = None
        self._config: PipelineConfig | None = None
        #: The admission shown for ``_config``: its load takes the verified bundles.
        self._resolution: Resolution | None = None
        self._loaded = False
        self._request: RequestHandle | None = None
        #: The threads reading requests' outputs (each ends with its request).
        self._readers: list[threading.Thread] = []
        self._metrics = RunMetrics()
        self._cancel_after_load = self._keep_after_cancel = False
        #: The load under way (GUI thread), and the request waiting for it.
        self._pending_load: PendingLoad | None = None
        self._waiting_input: object = None
        self._load_view: LoadView | None = None
        self._audio_sink: AudioSink | None = None
        self._thread = ControlThread(self, lambda exc: self._post(partial(self._job_failed, exc)))
        self._machine = MachineChoice(
            ledger=self.ledger,
            submit=self._submit,
            post=self._post,
            show_topology=self.topology_changed.emit,
            show_ledger=self.ledger_changed.emit,
            show_error=self.error.emit,
            line=self._studio_line,
            changed=self._machine_changed,
            selection=selection,
        )
        self._serving = ServeSwitch(
            submit=self._submit,
            post=self._post,
            emit=self.serve_changed.emit,
            line=self._post_studio_line,
            machine=self._machine.machine,
            unavailable=serve_unavailable_reason(),
            ledger=self.ledger,
        )
        # Control-thread state: the open pipeline's loaded stages and those kept warm.
        self._pipelines = LoadedPipelines(
            ledger=self.ledger,
            machine=self._machine.machine,
            line=self._post_studio_line,
            on_event=self._on_runtime_event,
            on_load_event=self._on_load_event,
        )
        #: Long jobs beside the control thread: Add model's imports, first-use setup.
        self.imports = ModelImports(post=self._post, parent=self)
        self.setup_jobs = SetupJobs(post=self._post, parent=self)
        #: The audio input: the Devices panel's level meter and Dictate's recordings.
        self.recorder = InputRecorder(post=self._post, parent=self)
        self._transcriber: Transcriber | None = None
        #: The spoken conversation on a voice-chat pipeline: started as a run (:meth:`talk`).
        self.voice = VoiceTalk(post=self._post, submit=self._submit, parent=self)
        self.voice.ended.connect(self._talk_ended)

        self._thread.finished.connect(self._on_thread_finished)
        self._unsubscribe_ledger = self.ledger.subscribe(self._on_ledger_event)
        self._detach_logs = LogForwarder(self._post_log_line).attach(FORWARDED_LOGGERS)
        self._thread.start()
        self._machine.use(topology_file)

    # -- properties (GUI thread) -------------------------------------------------------

    @property
    def state(self) -> RunState:
        return self._state

    @property
    def pipeline(self) -> PipelineInfo | None:
        return self._info

    @property
    def selection(self) -> DeviceSelection:
        return self._machine.selection

    @property
    def topology(self) -> Topology | None:
        """The machine (or topology file) plans and runs use, once discovered."""
        return self._machine.topology

    @property
    def loading(self) -> bool:
        """A load of the stages is under way (a request may be waiting for it)."""
        return self._pending_load is not None

    @property
    def load_view(self) -> LoadView | None:
        """The load under way or the last one, as ``load_progress`` last carried it."""
        return self._load_view

    @property
    def request_id(self) -> str | None:
        return None if self._request is None else self._request.request_id

    def ledger_snapshot(self) -> LedgerView:
        return ledger_view(self.ledger.snapshot())

    def start_beside(
        self, path: Path, topology: Topology | None, selection: DeviceSelection
    ) -> PipelineSession:
        """Load the pipeline ``path`` beside the open one, on the studio's ledger, so the two
        share the machine's memory (blocks while it loads: call it off the GUI thread, as the
        dictation's transcriber does). A recogniser it names is exported first when missing."""
        export_missing_recognisers(path, progress=self._post_studio_line)
        session = PipelineSession(path, ledger=self.ledger, topology=topology, selection=selection)
        try:
            session.load()
        except BaseException:
            session.close()
            raise
        return session

    def transcriber(self, pipeline: Path) -> Transcriber:
        """The dictation's transcriber, made on first use with ``pipeline`` (transcribe.yaml):
        loaded beside the open pipeline (:meth:`start_beside`) on the machine chosen now."""
        if self._transcriber is None:
            self._transcriber = Transcriber(
                pipeline,
                start=self.start_beside,
                machine=lambda: (self.topology, self.selection),
                post=self._post,
                parent=self,
            )
        return self._transcriber

    # -- commands (GUI thread) ----------------------------------------------------------

    def open_pipeline(self, path: str | Path) -> bool:
        """Describe a pipeline YAML or a bundle manifest; ``pipeline_opened`` follows."""
        if self._state in (RunState.CLOSING, RunState.CLOSED):
            return False
        if self._state.busy:
            self.error.emit(RUN_IN_PROGRESS)
            return False
        self._set_state(RunState.OPENING)
        self._abandon_load()
        if self._loaded:
            self._submit(self._keep_warm_job)
            self._loaded = False
        self._show_load(None)
        self._submit(partial(self._open_job, Path(path).expanduser().absolute()))
        return True

    def load(self) -> bool:
        """Start loading the open pipeline's stages in the background, so that the first Run
        finds them loaded or waits for this load; False when they are loaded or loading."""
        if self._state is not RunState.READY or self._config is None or self._loaded:
            return False
        if self._pending_load is not None:
            return False
        self._start_load(self._config)
        return True

    def run(self, request_input: object = None) -> bool:
        """Run one request (tensors as a mapping, or text); it waits for the load under way,
        or loads the stages first when none is."""
        if not self._state.can_run or self._config is None:
            return False
        self._cancel_after_load = self._keep_after_cancel = False
        if self._loaded:
            self._set_state(RunState.RUNNING)
            self._submit(partial(self._submit_job, request_input))
            return True
        if self._pending_load is None:
            self._start_load(self._config)
        else:
            self._studio_line("the request waits for the stages being loaded")
        self._waiting_input = request_input
        self._set_state(RunState.LOADING)
        return True

    def talk(self, start: VoiceStart) -> bool:
        """Start a spoken conversation on the open voice-chat pipeline: like a run, it waits
        for the load under way or loads the stages first; it runs until ``voice`` ends it."""
        return self.run(start)

    def cancel(self, *, keep_loaded: bool = False) -> bool:
        """Cancel the running request (or the load it is waiting for). The stages are then
        unloaded, unless ``keep_loaded`` (the chat view's Stop) and all are still usable; a
        request stopped that way while the stages load leaves the load going on."""
        self._keep_after_cancel = keep_loaded
        if self._state is RunState.LOADING:
            self._waiting_input = None
            if keep_loaded:
                self._finish_run(
                    RunOutcome(None, "cancelled", "cancelled before the stages loaded")
                )
                self._set_state(RunState.READY)
                return True
            if self._pending_load is not None:
                self._pending_load.cancel()
            self._cancel_after_load = True
            self._set_state(RunState.CANCELLING)
            return True
        if self._state is RunState.RUNNING:
            self._set_state(RunState.CANCELLING)
            if self.voice.cancel():
                return True
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

    @property
    def serve_view(self) -> ServeView:
        return self._serving.view

    @property
    def serve_port(self) -> int | None:
        """The port the Serve switch listens on (None: the server's default, 0: any free)."""
        return self._serving.port

    @serve_port.setter
    def serve_port(self, port: int | None) -> None:
        self._serving.port = port

    @property
    def serve_unavailable(self) -> str | None:
        """Why the Serve switch cannot work in this build, or None."""
        return self._serving.unavailable

    def start_serving(self) -> bool:
        """Serve the open pipeline (see :class:`ServeSwitch`); False when none is open or a
        server runs already."""
        return self._config is not None and self._serving.start(self._config)

    def stop_serving(self) -> bool:
        """Stop the server and close its pipelines; False when none runs."""
        return self._serving.stop()

    def set_device_allowed(self, physical_id: str, allowed: bool) -> None:
        """Allow or exclude one device; saved to the selection file the CLI reads."""
        self._machine.set_allowed(physical_id, allowed)

    def allow_all_devices(self) -> None:
        self._machine.apply(DeviceSelection())

    def set_topology_source(self, topology_file: Path | None) -> None:
        """Use this machine (None) or a topology file for plans and runs."""
        if self._state.busy:
            return
        self._unload_if_idle()
        self._machine.use(topology_file)
        self._replan()

    def shutdown(self) -> None:
        """Cancel, retire everything, stop the control thread; ``shut_down`` follows."""
        if self._state in (RunState.CLOSING, RunState.CLOSED):
            return
        self._set_state(RunState.CLOSING)
        if self._pending_load is not None:
            self._pending_load.cancel()
        self._submit(self._serving.stop_job)
        self._submit(self.voice.close_job)
        self._submit(self._pipelines.unload)
        self._thread.stop()

    # -- GUI-thread helpers -------------------------------------------------------------

    def _submit(self, job: Callable[[], None]) -> None:
        self._thread.submit(job)

    def _post(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the GUI thread (from any thread): the bridge's one hop."""
        self._hop.post(callback)

    def _set_state(self, state: RunState) -> None:
        if state is not self._state:
            self._state = state
            self.state_changed.emit(state)

    def _studio_line(self, text: str, level: str = "INFO") -> None:
        self.log_line.emit(LogLine(time.time(), level, "studio", text))

    def _post_studio_line(self, text: str) -> None:
        """A studio log line from the control thread."""
        self._post(partial(self._studio_line, text))

    def _post_log_line(self, line: LogLine) -> None:
        """A runtime log record's line, from any thread."""
        self._post(partial(self.log_line.emit, line))

    def _machine_changed(self) -> None:
        """The device selection changed: loaded stages go (unless busy) and plans follow."""
        self._unload_if_idle()
        self._replan()

    def _unload_if_idle(self) -> None:
        if self._state is RunState.LOADED:
            self._unload_then_ready()
        else:
            if self._state is RunState.READY and self._abandon_load():
                self._studio_line("the stages being loaded were unloaded")
            self._submit(self._pipelines.unload_warm)

    def _start_load(self, config: PipelineConfig) -> None:
        pending = self._pending_load = PendingLoad()
        resolution = self._resolution if config is self._config else None
        self._submit(partial(self._load_job, config, pending, resolution))

    def _abandon_load(self) -> bool:
        """Cancel the load under way; whatever it started is unloaded (its continuations are
        then ignored). False when none was under way."""
        pending, self._pending_load = self._pending_load, None
        if pending is None:
            return False
        pending.cancel()
        self._submit(self._pipelines.close_open)
        return True

    def _show_load(self, view: LoadView | None) -> None:
        self._load_view = view
        self.load_progress.emit(view)

    def _unload_then_ready(self) -> None:
        self._loaded = False
        self._set_state(RunState.UNLOADING)
        self._submit(self._pipelines.unload)
        self._submit(lambda: self._post(self._unloaded))

    def _unloaded(self) -> None:
        if self._state is RunState.UNLOADING:
            self._set_state(RunState.READY)

    def _replan(self) -> None:
        if self._info is not None:
            self._submit(partial(self._plan_job, self._info.path))

    # -- control-thread jobs ------------------------------------------------------------

    def _open_job(self, path: Path) -> None:
        topology, selection = self._machine.machine()
        assert topology is not None
        try:
            if not is_manifest_path(path):
                export_missing_voices(path, progress=self._post_studio_line)
                export_missing_vad(path, progress=self._post_studio_line)
                # Offered first in the window; exported here only where no offer is made.
                export_missing_recognisers(path, progress=self._post_studio_line)
            opened = describe_pipeline(path, topology, selection, self.ledger.snapshot())
        except (OmniError, OSError, ValueError) as exc:
            self._post(partial(self._open_failed, exc))
            return
        warm = self._pipelines.reopen(opened.config)
        if warm is not None:
            self._post(partial(self._opened, opened, warm.session.execution_plan))
            return
        self._post(partial(self._opened, opened))

    def _plan_job(self, path: Path) -> None:
        topology, selection = self._machine.machine()
        assert topology is not None
        try:
            plan = plan_pipeline(path, topology=topology, selection=selection)
        except (OmniError, OSError) as exc:
            self._post(partial(self.error.emit, error_info(exc)))
            return
        self._post(partial(self.plan_changed.emit, plan_view(plan, self.ledger.snapshot())))

    def _load_job(
        self, config: PipelineConfig, pending: PendingLoad, resolution: Resolution | None
    ) -> None:
        try:
            self._pipelines.load(config, pending, resolution)
        except Exception as exc:  # noqa: BLE001 - the GUI hears of any failure and recovers
            self._post(partial(self._load_failed, pending, exc))
            return
        self._post(partial(self._after_load, pending))

    def _submit_job(self, request_input: object) -> None:
        if isinstance(request_input, VoiceStart):
            self._talk_job(request_input)
            return
        try:
            request = self._pipelines.submit(request_input)
        except OmniError as exc:
            self._post(partial(self._request_failed, exc))
            return
        self._post(partial(self._submitted, request))

    def _talk_job(self, start: VoiceStart) -> None:
        try:
            live = self.voice.start_job(self._pipelines.session(), start)
        except (OmniError, OSError) as exc:
            self._post(partial(self._request_failed, exc))
            return
        self._post(partial(self._talk_started, live))

    def _cancel_job(self, request_id: str) -> None:
        self._pipelines.cancel(request_id)

    def _settle_job(self, cancelled: bool, keep_after_cancel: bool = False) -> None:
        kept = self._pipelines.settle(cancelled=cancelled, keep_after_cancel=keep_after_cancel)
        self._post(partial(self._settled, kept, cancelled))

    def _keep_warm_job(self) -> None:
        """Another pipeline is being opened: keep the loaded one warm, while it is usable."""
        if self._pipelines.keep_warm():
            self._post(partial(self.execution_changed.emit, None))

    # -- GUI-thread continuations ------------------------------------------------------

    def _opened(self, opened: OpenedPipeline, warm: ExecutionPlan | None = None) -> None:
        """``warm``: the execution plan of its stages, still loaded from earlier."""
        if self._state is not RunState.OPENING:
            return  # closing: the unload that follows takes the warm stages too
        self._info = opened.info
        self._config = opened.config
        self._resolution = None if opened.plan is None else opened.plan.resolution
        self._loaded = warm is not None
        self._set_state(RunState.LOADED if self._loaded else RunState.READY)
        self._studio_line(f"opened {opened.info.path}" + (" (loaded)" if self._loaded else ""))
        self.pipeline_opened.emit(opened.info)
        if warm is not None:
            self.execution_changed.emit(execution_view(warm))

    def _open_failed(self, error: BaseException) -> None:
        if self._state is not RunState.OPENING:
            return
        self._set_state(RunState.READY if self._config is not None else RunState.EMPTY)
        self.error.emit(error_info(error))

    def _load_failed(self, pending: PendingLoad, error: BaseException) -> None:
        if pending is not self._pending_load:
            return  # abandoned: its end is no news
        self._pending_load = None
        if self._state in (RunState.CLOSING, RunState.CLOSED):
            return
        waiting = self._state in (RunState.LOADING, RunState.CANCELLING)
        self._waiting_input = None
        if isinstance(error, LoadCancelled):
            self._studio_line("loading cancelled; nothing was left loaded")
            if waiting:
                self._finish_run(
                    RunOutcome(None, "cancelled", "cancelled while the stages were loading")
                )
        else:
            self._studio_line(f"loading failed: {error}", "ERROR")
            self.error.emit(error_info(error))
            if waiting:
                self._finish_run(RunOutcome(None, "failed", str(error)))
        self._set_state(RunState.READY)

    def _after_load(self, pending: PendingLoad) -> None:
        if pending is not self._pending_load:
            return  # abandoned: the job submitted with the cancel closes what it loaded
        self._pending_load = None
        self._loaded = True
        request_input, self._waiting_input = self._waiting_input, None
        if self._state in (RunState.CLOSING, RunState.CLOSED):
            return
        if self._state is RunState.READY:
            self._set_state(RunState.LOADED)  # loaded in the background; no request waits
            return
        if self._cancel_after_load:
            self._finish_run(
                RunOutcome(None, "cancelled", "cancelled while the stages were loading")
            )
            self._unload_then_ready()
            return
        self._set_state(RunState.RUNNING)
        self._submit(partial(self._submit_job, request_input))

    def _submitted(self, handle: RequestHandle) -> None:
        self._request = handle
        self._metrics.submitted(handle.request_id, time.monotonic())
        self.run_started.emit(handle.request_id)
        if self._cancel_after_load and self._state is RunState.CANCELLING:
            self._submit(partial(self._cancel_job, handle.request_id))
        self._watch(handle)

    def _talk_started(self, live: LiveConversation) -> None:
        self.voice.attach(live)
        if self._cancel_after_load and self._state is RunState.CANCELLING:
            self.voice.cancel()

    def _talk_ended(self, ended: VoiceEnded) -> None:
        """A spoken conversation ended: as a request's end, but its stages stay loaded."""
        if self._state in (RunState.CLOSING, RunState.CLOSED):
            return
        if ended.error is not None:
            self.error.emit(error_info(ended.error))
        message = "" if ended.error is None else str(ended.error)
        self._finish_run(RunOutcome(None, ended.status, message))
        self._submit(partial(self._settle_job, ended.status == "cancelled", True))

    def _request_failed(self, error: OmniError | OSError) -> None:
        if self._state in (RunState.CLOSING, RunState.CLOSED):
            return
        self.error.emit(error_info(error))
        self._finish_run(RunOutcome(None, "failed", str(error)))
        self._set_state(RunState.LOADED if self._loaded else RunState.READY)

    def set_audio_sink(self, sink: AudioSink | None) -> None:
        """Queue each run's audio on ``sink`` as it arrives, off the GUI thread (GUI thread)."""
        self._audio_sink = sink

    def _watch(self, handle: RequestHandle) -> None:
        """Read ``handle``'s outputs on a thread of its own until the request ends."""
        sink = self._audio_sink
        if sink is not None:
            sink.begin(handle.request_id)
        self._readers = [reader for reader in self._readers if reader.is_alive()]
        reader = threading.Thread(
            target=self._read_outputs, args=(handle, sink), name="omni-studio-outputs"
        )
        self._readers.append(reader)
        reader.start()

    def _read_outputs(self, handle: RequestHandle, sink: AudioSink | None) -> None:
        """The reader's thread: each output's audio goes to the player before the GUI hears
        of it; the GUI acknowledges each output once shown. Ends with the request."""
        request_id = handle.request_id
        while True:
            try:
                output = handle.next()
            except RequestCancelled as exc:
                self._post(partial(self._stream_ended, request_id, "cancelled", exc))
                return
            except Exception as exc:  # noqa: BLE001 - the request's error, shown by the GUI
                self._post(partial(self._stream_ended, request_id, "failed", exc))
                return
            if output is None:
                self._post(partial(self._stream_ended, request_id, "completed", None))
                return
            queued = sink is not None and _queue_audio(sink, request_id, output)
            self._post(partial(self._on_output, handle, output, time.monotonic(), queued))

    def _on_output(
        self, handle: RequestHandle, output: OmniRequestOutput, at: float, queued: bool
    ) -> None:
        try:
            if self._request is handle:
                self._deliver(output, at, queued)
        finally:
            handle.acknowledge(output)

    def _stream_ended(self, request_id: str, status: str, error: Exception | None) -> None:
        request = self._request
        if request is None or request.request_id != request_id:
            return
        if status == "failed" and self._state not in (RunState.CLOSING, RunState.CLOSED):
            assert error is not None
            self.error.emit(error_info(error))
        self._request_ended(RunOutcome(request_id, status, "" if error is None else str(error)))

    def _deliver(self, output: OmniRequestOutput, at: float, queued: bool = False) -> None:
        try:
            items, metrics = self._metrics.received(output, at, time.monotonic())
        except ModelError as exc:
            self.error.emit(ErrorInfo("An output could not be shown", f"{output.stage}: {exc}"))
            return
        for item in items:
            if isinstance(item, ReceivedAudio):
                self.audio_chunk.emit(dataclasses.replace(item, queued=queued) if queued else item)
            elif isinstance(item, TextChunk):
                self.text_chunk.emit(item)
            elif isinstance(item, TranscriptSegment):
                self.transcript_segment.emit(item)
            else:
                self.tensors_ready.emit(item)
        if metrics is not None:
            self.metrics_changed.emit(metrics)

    def _request_ended(self, outcome: RunOutcome) -> None:
        self._request = None
        self._finish_run(outcome)
        if self._state in (RunState.CLOSING, RunState.CLOSED):
            return
        cancelled = outcome.status == "cancelled"
        self._submit(partial(self._settle_job, cancelled, cancelled and self._keep_after_cancel))

    def _finish_run(self, outcome: RunOutcome) -> None:
        metrics = self._metrics.finished(outcome.status, time.monotonic())
        if metrics is not None:
            self.metrics_changed.emit(metrics)
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
        # Every session is closed by now, so every request has ended and its reader with it.
        readers, self._readers = self._readers, []
        for reader in readers:
            reader.join(timeout=10)
        self._unsubscribe_ledger()
        self._detach_logs()
        self._loaded = False
        self._set_state(RunState.CLOSED)
        self.ledger_changed.emit(self.ledger_snapshot())
        self.shut_down.emit()

    # -- runtime callbacks (runtime threads) ---------------------------------------------

    def _on_runtime_event(self, event: Event) -> None:
        self._post(partial(self._handle_event, event))

    def _on_load_event(self, pending: PendingLoad, event: Event) -> None:
        if isinstance(event, LOADING_EVENTS):
            self._post(partial(self._load_progressed, pending, event))

    def _load_progressed(self, pending: PendingLoad, event: Event) -> None:
        """A loading event (GUI thread); those of an abandoned load are dropped."""
        if pending is not self._pending_load:
            return
        if pending.progress.update(event) and pending.progress.snapshot is not None:
            self._show_load(load_view(pending.progress.snapshot))

    def _on_ledger_event(self, event: LedgerEvent) -> None:
        self._post(partial(self._ledger_changed, event, time.time()))

    def _ledger_changed(self, event: LedgerEvent, at: float) -> None:
        """A reservation was made or released (GUI thread)."""
        self.ledger_changed.emit(ledger_view(event.snapshot))
        if event.kind in ("quarantined", "resolved"):  # the badge counts what is quarantined
            self._replan()
        self.log_line.emit(LogLine(at, "INFO", "ledger", f"{event.kind}: {event.detail}"))

    def _handle_event(self, event: Event) -> None:
        line = event_line(event)
        if line is not None:
            level, text = line
            self.log_line.emit(LogLine(time.time(), level, "runtime", text))
        if isinstance(event, RequestAdmitted):
            self._metrics.admitted(event.request_id, event.at)
        elif isinstance(event, StageCallFinished):
            metrics = self._metrics.call_finished(event, time.monotonic())
            if metrics is not None:
                self.metrics_changed.emit(metrics)
        elif isinstance(event, PipelineReady):
            self.execution_changed.emit(execution_view(event.execution_plan))
        elif isinstance(event, PipelineClosed):
            self.execution_changed.emit(None)


def _queue_audio(sink: AudioSink, request_id: str, output: OmniRequestOutput) -> bool:
    """Feed an output's audio to ``sink`` on the thread that read it; True when fed."""
    try:
        audio = output.audio
    except ModelError:
        return False  # the GUI reports it when it turns the output into values
    if audio is None or not audio.pcm.size:
        return False
    try:
        sink.feed(np.array(audio.pcm, dtype=np.float32), audio.sample_rate, request_id=request_id)
    except ValueError:
        return False  # a chunk at another rate: the GUI reports it
    return True
