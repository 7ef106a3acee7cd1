"""The studio's main window: pipelines, the run pane and output, and the panels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QDragEnterEvent, QDropEvent, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QLabel,
    QMainWindow,
    QSizePolicy,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.bridge import RuntimeBridge
from app.conversations import ConversationStore
from app.demos import demo_pipelines, topology_files
from app.inputs import InputFileError, read_inputs, read_npz
from app.models import (
    ErrorAction,
    ErrorInfo,
    InputKind,
    LedgerView,
    PipelineInfo,
    PlanView,
    ReceivedAudio,
    RunOutcome,
    RunState,
    TextChunk,
    TopologyView,
)
from app.playback import AudioOutput
from app.settings import StudioSettings
from app.stall import StallMonitor
from app.transcripts import audio_paths
from app.widgets.banner import ErrorBanner
from app.widgets.chat import ChatView
from app.widgets.common import format_bytes
from app.widgets.devices import DevicesPanel
from app.widgets.log import LogPanel
from app.widgets.manifest import ManifestPanel
from app.widgets.metrics import MetricsPanel
from app.widgets.output import OutputArea
from app.widgets.pipelines import PipelinesPane, droppable_paths
from app.widgets.plan import PlanPanel
from app.widgets.run_pane import RunPane
from app.widgets.serve import ServePanel
from app.window_models import MyPipelinesHook
from app.window_setup import FirstUseHook
from app.window_transcribe import TranscribeHook
from app.window_voice import VoiceHook

APP_TITLE = "Omni Edge Studio"
PANELS = ("devices", "plan", "manifest", "metrics", "log", "serve")
DEFAULT_SIZE = QSize(1480, 920)
#: The Metrics panel and the status bar show event-loop lateness over this many seconds.
STALL_WINDOW_S = 10.0


class MainWindow(QMainWindow):
    """One window, one bridge. Widgets get values from the bridge's signals only."""

    closed = Signal()

    def __init__(
        self,
        *,
        settings: StudioSettings | None = None,
        bridge: RuntimeBridge | None = None,
        audio: AudioOutput | None = None,
        demos_folder: Path | None = None,
        conversations: ConversationStore | None = None,
    ) -> None:
        super().__init__()
        self.settings = settings if settings is not None else StudioSettings()
        self.bridge = (
            bridge
            if bridge is not None
            else RuntimeBridge(topology_file=self.settings.topology_file)
        )
        self.bridge.setParent(self)
        self.audio = audio if audio is not None else AudioOutput()
        self.bridge.set_audio_sink(self.audio)
        self.stall_monitor = StallMonitor(parent=self)
        self._shutting_down = False
        self.setWindowTitle(APP_TITLE)
        self.setAcceptDrops(True)
        self._make_actions()

        self.pipelines = PipelinesPane()
        self.banner = ErrorBanner()
        self.run_pane = RunPane(self.run_action, self.cancel_action, self.unload_action)
        self.output = OutputArea(self.audio)
        self.chat = ChatView(conversations if conversations is not None else ConversationStore())
        self.chat.hide()
        self.devices_panel = DevicesPanel(topology_files())
        self.plan_panel = PlanPanel()
        self.manifest_panel = ManifestPanel()
        self.metrics_panel = MetricsPanel()
        self.log_panel = LogPanel()
        self.serve_panel = ServePanel()
        if self.bridge.serve_unavailable is not None:
            self.serve_panel.set_unavailable(self.bridge.serve_unavailable)
        self.panels = QTabWidget()
        self.panels.setDocumentMode(True)
        for name, widget in zip(
            PANELS,
            (
                self.devices_panel,
                self.plan_panel,
                self.manifest_panel,
                self.metrics_panel,
                self.log_panel,
                self.serve_panel,
            ),
            strict=True,
        ):
            self.panels.addTab(widget, name.capitalize())

        center = QWidget()
        center_layout = QVBoxLayout(center)
        center_layout.setContentsMargins(8, 8, 8, 8)
        center_layout.setSpacing(10)
        center_layout.addWidget(self.banner)
        self.center_splitter = QSplitter(Qt.Orientation.Vertical)
        self.center_splitter.addWidget(self.run_pane)
        self.center_splitter.addWidget(self.chat)
        self.center_splitter.addWidget(self.output)
        self.center_splitter.setStretchFactor(1, 2)
        self.center_splitter.setStretchFactor(2, 1)
        self.center_splitter.setChildrenCollapsible(False)
        center_layout.addWidget(self.center_splitter)
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(8, 8, 0, 8)
        left_layout.addWidget(self.pipelines)
        self.main_splitter = QSplitter(Qt.Orientation.Horizontal)
        self.main_splitter.addWidget(left)
        self.main_splitter.addWidget(center)
        self.main_splitter.addWidget(self.panels)
        self.main_splitter.setStretchFactor(1, 3)
        self.main_splitter.setStretchFactor(2, 3)
        self.main_splitter.setSizes([230, 620, 630])
        self.setCentralWidget(self.main_splitter)

        self.state_label = QLabel(RunState.EMPTY.value)
        self.state_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.ledger_label = QLabel("ledger: empty")
        self.stall_label = QLabel("")
        status = self.statusBar()
        status.addWidget(self.state_label, 1)
        status.addPermanentWidget(self.ledger_label)
        status.addPermanentWidget(self.stall_label)

        self._connect()
        self.chat.refresh_history()
        self.demos = demo_pipelines(demos_folder)
        self.pipelines.set_demos(self.demos)
        self.pipelines.set_recent(self.settings.recent)
        self.my_pipelines = MyPipelinesHook(self, self.add_model_action, parent=self)
        self.first_use = FirstUseHook(self, parent=self)
        self.transcribe = TranscribeHook(self, parent=self)
        self.voice = VoiceHook(self, self.bridge.recorder, parent=self)
        self.chat.before_send = self.first_use.offer_before_run
        self.devices_panel.select_machine(self.settings.topology_file)
        self.output.playback.preferred_device = self.settings.audio_device
        self.resize(DEFAULT_SIZE)
        self._restore_geometry()
        self._stall_timer = QTimer(self)
        self._stall_timer.setInterval(1000)
        self._stall_timer.timeout.connect(self._show_stalls)
        self.stall_monitor.start()
        self._stall_timer.start()
        self._on_state(self.bridge.state)

    # -- construction ------------------------------------------------------------------

    def _make_actions(self) -> None:
        self.open_action = QAction("&Open pipeline or manifest…", self)
        self.open_action.setShortcut(QKeySequence.StandardKey.Open)
        self.open_action.triggered.connect(self.choose_file)
        self.add_model_action = QAction("&Add model…", self)
        self.add_model_action.setToolTip(
            "Make an ONNX file, a GGUF file or a Hugging Face model folder into a pipeline"
        )
        self.quit_action = QAction("&Quit", self)
        self.quit_action.setShortcut(QKeySequence.StandardKey.Quit)
        self.quit_action.triggered.connect(self.close)
        self.run_action = QAction("&Run", self)
        self.run_action.setShortcuts([QKeySequence("Ctrl+Return"), QKeySequence("Ctrl+Enter")])
        self.run_action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        self.run_action.triggered.connect(self.run)
        self.cancel_action = QAction("&Cancel", self)
        self.cancel_action.setShortcut(QKeySequence(Qt.Key.Key_Escape))
        self.cancel_action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        self.cancel_action.triggered.connect(self.cancel)
        self.unload_action = QAction("&Unload stages", self)
        self.unload_action.setToolTip("Retire the loaded workers and release their reservations")
        self.unload_action.triggered.connect(self.bridge.unload)
        for action in (self.run_action, self.cancel_action, self.unload_action):
            self.addAction(action)
        menu = self.menuBar()
        self.file_menu = file_menu = menu.addMenu("&File")
        file_menu.addAction(self.open_action)
        file_menu.addAction(self.add_model_action)
        file_menu.addSeparator()
        file_menu.addAction(self.quit_action)
        run_menu = menu.addMenu("&Run")
        run_menu.addAction(self.run_action)
        run_menu.addAction(self.cancel_action)
        run_menu.addAction(self.unload_action)
        view_menu = menu.addMenu("&View")
        self.panel_actions: dict[str, QAction] = {}
        for index, name in enumerate(PANELS, start=1):
            action = QAction(f"{name.capitalize()} panel", self)
            action.setShortcut(QKeySequence(f"Ctrl+{index}"))
            action.triggered.connect(lambda _checked=False, panel=name: self.show_panel(panel))
            view_menu.addAction(action)
            self.panel_actions[name] = action

    def _connect(self) -> None:
        bridge = self.bridge
        bridge.state_changed.connect(self._on_state)
        bridge.topology_changed.connect(self._on_topology)
        bridge.ledger_changed.connect(self._on_ledger)
        bridge.pipeline_opened.connect(self._on_opened)
        bridge.plan_changed.connect(self._on_plan)
        bridge.execution_changed.connect(self.plan_panel.show_execution)
        bridge.load_progress.connect(self.run_pane.show_loading)
        bridge.load_progress.connect(self.chat.show_loading)
        bridge.load_progress.connect(lambda _view: self._show_state_text())
        bridge.run_started.connect(self.output.run_started)
        bridge.run_started.connect(self.chat.run_started)
        bridge.audio_chunk.connect(self._on_audio)
        bridge.text_chunk.connect(self._on_text)
        bridge.tensors_ready.connect(self.output.show_tensors)
        bridge.metrics_changed.connect(self.metrics_panel.show_metrics)
        bridge.run_finished.connect(self._on_finished)
        bridge.error.connect(self.banner.show_error)
        bridge.log_line.connect(self.log_panel.add_line)
        bridge.serve_changed.connect(self.serve_panel.show_view)
        self.serve_panel.serve_toggled.connect(self._on_serve_toggled)
        bridge.shut_down.connect(self._on_shut_down)
        self.banner.action_triggered.connect(self._on_banner_action)
        self.chat.submit_requested.connect(self._send_chat)
        self.chat.stop_requested.connect(lambda: self.bridge.cancel(keep_loaded=True))
        self.chat.problem.connect(self.banner.show_error)
        self.pipelines.pipeline_chosen.connect(self.open_path)
        self.pipelines.open_requested.connect(self.choose_file)
        self.run_pane.tensor_inputs.replace_requested.connect(self.choose_inputs)
        self.run_pane.tensor_inputs.reset_requested.connect(self.reset_inputs)
        self.output.tensors.compare_requested.connect(self.choose_reference)
        self.output.tensors.save_requested.connect(self.save_outputs)
        self.output.playback.device_changed.connect(self._on_audio_device)
        self.output.playback.playback_error.connect(
            lambda message: self.banner.show_error(
                ErrorInfo("Playback failed", message, kind="warning")
            )
        )
        self.output.playback.underruns_changed.connect(self.metrics_panel.set_underruns)
        self.devices_panel.device_toggled.connect(bridge.set_device_allowed)
        self.devices_panel.allow_all_requested.connect(bridge.allow_all_devices)
        self.devices_panel.topology_source_chosen.connect(self._on_machine_chosen)

    # -- commands ----------------------------------------------------------------------

    def open_path(self, path: Path | str) -> bool:
        path = Path(path)
        self.banner.dismiss()
        if self.first_use.offer_before_open(path):
            return True
        return self.bridge.open_pipeline(path)

    def choose_file(self) -> None:
        current = self.bridge.pipeline
        folder = str(current.path.parent) if current is not None else str(Path.cwd())
        path, _filter = QFileDialog.getOpenFileName(
            self,
            "Open pipeline or manifest",
            folder,
            "Pipelines and manifests (*.yaml *.yml manifest.json);;All files (*)",
        )
        if path:
            self.open_path(path)

    @property
    def chat_mode(self) -> bool:
        """The open pipeline is a chat pipeline: the conversation view sends its requests."""
        info = self.bridge.pipeline
        return info is not None and info.chat

    def run(self) -> None:
        if not self.bridge.state.can_run or self.first_use.offer_before_run():
            return
        if self.voice.run() or self.transcribe.run():
            return
        if self.chat_mode:
            self.chat.send()
            return
        self.banner.dismiss()
        self.output.new_run()
        self.metrics_panel.clear()
        self.bridge.run(self.run_pane.request_input())

    def cancel(self) -> None:
        # Stopping a reply keeps the model loaded for the next turn.
        self.bridge.cancel(keep_loaded=self.chat_mode)

    def _send_chat(self, request: object) -> None:
        self.banner.dismiss()
        self.output.new_run()
        self.metrics_panel.clear()
        if not self.bridge.run(request):
            self.chat.submission_refused()

    def choose_inputs(self) -> None:
        info = self.bridge.pipeline
        if info is None:
            return
        path, _filter = QFileDialog.getOpenFileName(
            self, "Inputs for this pipeline", str(info.path.parent), "NumPy archives (*.npz)"
        )
        if path:
            self.load_inputs(Path(path))

    def load_inputs(self, path: Path) -> bool:
        info = self.bridge.pipeline
        if info is None:
            return False
        try:
            arrays = read_inputs(path, info.example_inputs)
        except InputFileError as exc:
            self.banner.show_error(ErrorInfo("These inputs do not fit the pipeline", str(exc)))
            return False
        self.run_pane.tensor_inputs.show_arrays(arrays, path)
        self.run_pane.set_state(self.bridge.state)
        return True

    def reset_inputs(self) -> None:
        info = self.bridge.pipeline
        if info is not None:
            self.run_pane.tensor_inputs.show_arrays(info.example_inputs, None)
            self.run_pane.set_state(self.bridge.state)

    def choose_reference(self) -> None:
        path, _filter = QFileDialog.getOpenFileName(
            self, "Reference outputs", str(Path.cwd()), "NumPy archives (*.npz)"
        )
        if path:
            self.load_reference(Path(path))

    def load_reference(self, path: Path) -> bool:
        try:
            arrays = read_npz(path)
        except InputFileError as exc:
            self.banner.show_error(ErrorInfo("The reference could not be read", str(exc)))
            return False
        self.output.tensors.set_reference(path.name, arrays)
        return True

    def save_outputs(self) -> None:
        results = self.output.tensors.results
        if results is None:
            return
        path, _filter = QFileDialog.getSaveFileName(
            self, "Save outputs", "outputs.npz", "NumPy archives (*.npz)"
        )
        if path:
            try:
                arrays: dict[str, Any] = dict(results.arrays)
                np.savez(path, **arrays)
            except OSError as exc:
                self.banner.show_error(ErrorInfo("The outputs were not saved", f"{path}: {exc}"))

    def show_panel(self, name: str) -> None:
        self.panels.setCurrentIndex(PANELS.index(name))

    def current_panel(self) -> str:
        return PANELS[self.panels.currentIndex()]

    # -- bridge signals ----------------------------------------------------------------

    def _on_state(self, state: RunState) -> None:
        self.run_action.setEnabled(state.can_run)
        self.cancel_action.setEnabled(state.can_cancel)
        self.unload_action.setEnabled(state is RunState.LOADED)
        self.open_action.setEnabled(not state.busy)
        self.run_pane.set_state(state)
        self.chat.set_state(state)
        self._show_state_text()
        if state is RunState.LOADING:
            self.output.status.set_status("loading stages", "#d98a1c")

    def _show_state_text(self) -> None:
        state = self.bridge.state
        info = self.bridge.pipeline
        name = "" if info is None else f"{info.name}: "
        # Ready to run while its stages load in the background (a Run waits for them).
        loading = " · loading stages" if state is RunState.READY and self.bridge.loading else ""
        self.state_label.setText(f"{name}{state.value}{loading}")

    def _on_topology(self, view: TopologyView) -> None:
        self.devices_panel.show_topology(view)
        allowed = self.bridge.selection.allowed
        self.settings.allowed_devices = None if allowed is None else sorted(allowed)

    def _on_ledger(self, view: LedgerView) -> None:
        self.devices_panel.show_ledger(view)
        if view.is_empty:
            self.ledger_label.setText("ledger: nothing reserved")
        else:
            self.ledger_label.setText(
                f"ledger: {format_bytes(view.reserved_total)} reserved, "
                f"{format_bytes(view.quarantined_total)} quarantined"
            )

    def _on_serve_toggled(self, serve: bool) -> None:
        if serve:
            self.bridge.start_serving()
        else:
            self.bridge.stop_serving()

    def _on_opened(self, info: PipelineInfo) -> None:
        self.setWindowTitle(f"{info.name} — {APP_TITLE}")
        self.run_pane.show_pipeline(info)
        self.run_pane.set_state(self.bridge.state)
        self.plan_panel.show_plan(info.plan)
        self.plan_panel.show_execution(None)
        self.manifest_panel.show_manifests(info.manifests)
        self.serve_panel.set_available(True)
        self.output.new_run()
        self.output.status.set_status("no run yet", "#6b7785")
        self.output.show_streams(info.input_kind is InputKind.TEXT)
        # A chat pipeline's text goes to the conversation view; its audio (chat-speak) shows
        # the output's waveform and playback controls once the first chunk arrives.
        conversation = info.chat or info.voice
        self.chat.setVisible(conversation)
        self.output.setVisible(not conversation)
        if conversation:
            self.chat.set_pipeline(info.name)
        self._fit_run_pane()
        self.metrics_panel.clear()
        self.settings.last_pipeline = (
            info.path if info.origin == "pipeline" else Path(info.manifests[0].manifest_path)
        )
        self.pipelines.set_recent(self.settings.add_recent(self.settings.last_pipeline))
        self.pipelines.mark_current(self.settings.last_pipeline)
        self._load_in_background(info)

    def _load_in_background(self, info: PipelineInfo) -> None:
        """Start loading the stages as soon as the pipeline is opened, so the first Run or
        Send waits less; not when its plan is refused, nor when first use must make something
        first (the offer still waits for Run, and nothing is made before the user agrees)."""
        if info.plan.admitted and self.first_use.needs() is None:
            self.bridge.load()

    def _fit_run_pane(self) -> None:
        """Give the run pane the height it needs and the output the rest."""
        total = sum(self.center_splitter.sizes())
        wanted = self.run_pane.sizeHint().height()
        if total > wanted:
            self.center_splitter.setSizes([wanted, total - wanted])

    def _on_plan(self, plan: PlanView) -> None:
        self.run_pane.show_plan(plan)
        self.plan_panel.show_plan(plan)

    def _on_text(self, chunk: TextChunk) -> None:
        if self.chat_mode:
            self.chat.add_text(chunk)
        else:
            self.output.add_text(chunk)

    def _on_audio(self, chunk: ReceivedAudio) -> None:
        if self.chat_mode and self.output.isHidden():
            self.output.show()
        try:
            self.output.add_audio(chunk)
        except ValueError as exc:
            self.banner.show_error(
                ErrorInfo("An audio chunk could not be played", str(exc), kind="warning")
            )

    def _on_finished(self, outcome: RunOutcome) -> None:
        self.output.finished(outcome.status, outcome.message)
        self.chat.finished(outcome)

    def _on_banner_action(self, action: ErrorAction) -> None:
        panels = {
            ErrorAction.OPEN_DEVICES: "devices",
            ErrorAction.SHOW_PLAN: "plan",
            ErrorAction.SHOW_MANIFEST: "manifest",
            ErrorAction.SHOW_LOG: "log",
        }
        self.show_panel(panels[action])

    def _on_audio_device(self, name: str) -> None:
        if self.output.playback.available:
            self.settings.audio_device = name

    def _on_machine_chosen(self, path: Path | None) -> None:
        self.settings.topology_file = path
        self.bridge.set_topology_source(path)

    def _show_stalls(self) -> None:
        stats = self.stall_monitor.stats(last_s=STALL_WINDOW_S)
        self.metrics_panel.show_stalls(stats)
        if stats.samples:
            self.stall_label.setText(f"UI lateness (10 s) p99 {stats.p99_ms:.1f} ms")

    # -- drag and drop, closing --------------------------------------------------------

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        urls = [url.toLocalFile() for url in event.mimeData().urls() if url.isLocalFile()]
        if droppable_paths(urls) or audio_paths(urls):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        urls = [url.toLocalFile() for url in event.mimeData().urls() if url.isLocalFile()]
        paths = droppable_paths(urls)
        if paths:
            event.acceptProposedAction()
            self.open_path(paths[0])
        elif audio := audio_paths(urls):
            event.acceptProposedAction()
            self.transcribe.transcribe_file(audio[0])

    def _restore_geometry(self) -> None:
        geometry = self.settings.geometry("geometry")
        if geometry is not None:
            self.restoreGeometry(geometry)
        for key, splitter in (
            ("main_splitter", self.main_splitter),
            ("center_splitter", self.center_splitter),
        ):
            state = self.settings.geometry(key)
            if state is not None:
                splitter.restoreState(state)

    def _save_geometry(self) -> None:
        self.settings.set_geometry("geometry", self.saveGeometry())
        self.settings.set_geometry("main_splitter", self.main_splitter.saveState())
        self.settings.set_geometry("center_splitter", self.center_splitter.saveState())
        self.settings.sync()

    def closeEvent(self, event: QCloseEvent) -> None:
        if any(
            [
                self.my_pipelines.defer_close(),
                self.first_use.defer_close(),
                self.transcribe.defer_close(),
            ]
        ):
            event.ignore()
            return
        if self.bridge.state is not RunState.CLOSED:
            # Shut the runtime down first (cancel, retire workers); close again when it is done.
            event.ignore()
            if not self._shutting_down:
                self._shutting_down = True
                self._save_geometry()
                self.state_label.setText("closing: cancelling and retiring workers…")
                self.bridge.shutdown()
            return
        self.stall_monitor.stop()
        self._stall_timer.stop()
        self.audio.close()
        event.accept()
        self.closed.emit()

    def _on_shut_down(self) -> None:
        if self._shutting_down:
            self.close()
