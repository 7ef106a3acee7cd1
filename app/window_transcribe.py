"""The main window's speech input, kept beside :mod:`app.window`:

- **Transcribe a file.** An audio file dropped on the window or opened (File > Open audio…,
  or Open audio… in the run pane and the transcript of a transcription pipeline) is read on a
  thread of its own and run through the transcription pipeline (the bundled transcribe.yaml
  is opened first when another pipeline is open); the transcript view shows each segment with
  its times as it finishes, with Copy and Save as.
- **Dictate.** The conversation view's Dictate button records from the input chosen in the
  Devices panel (:class:`app.bridge_audio_input.InputRecorder`; its level drives the meters)
  until it is clicked again, then transcribes the recording with the transcription pipeline
  loaded beside the chat (:class:`app.bridge_transcriber.Transcriber`, on the studio's ledger)
  and puts the text into the message box, unsent.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QFileDialog, QWidget

from app.bridge_audio_input import Recording, input_device_names
from app.demos import assets_dir
from app.models import ErrorInfo, InputKind, PipelineInfo, RunOutcome
from app.presenters import RUN_IN_PROGRESS
from app.transcripts import AUDIO_FILTER, AudioFileError, read_audio_request
from app.widgets.transcript import TranscriptView

if TYPE_CHECKING:
    from PySide6.QtWidgets import QMenu, QSplitter

    from app.bridge import RuntimeBridge
    from app.bridge_audio_input import InputLevel
    from app.bridge_transcriber import Transcriber, Transcription
    from app.settings import StudioSettings
    from app.widgets.banner import ErrorBanner
    from app.widgets.chat import ChatView
    from app.widgets.devices import DevicesPanel
    from app.widgets.metrics import MetricsPanel
    from app.widgets.output import OutputArea
    from app.widgets.run_pane import RunPane
    from app.window_setup import FirstUseHook

#: The bundled transcription pipeline's file name.
TRANSCRIBE_PIPELINE = "transcribe.yaml"


class TranscribeHost(Protocol):
    """What the hook uses of the main window (:class:`app.window.MainWindow`)."""

    bridge: RuntimeBridge
    settings: StudioSettings
    banner: ErrorBanner
    chat: ChatView
    output: OutputArea
    run_pane: RunPane
    devices_panel: DevicesPanel
    metrics_panel: MetricsPanel
    center_splitter: QSplitter
    file_menu: QMenu
    add_model_action: QAction
    first_use: FirstUseHook
    demos: list[tuple[Path, str]]

    def open_path(self, path: Path | str) -> bool: ...

    def close(self) -> bool: ...


class TranscribeHook(QObject):
    """Owns the transcript view, the audio reader, the recorder and the dictation's
    transcriber; the window asks it before running and before closing."""

    #: An audio file could not be read: the message (naming it and what is accepted).
    read_failed = Signal(str)
    #: A file was read (on the reader's thread): its path, and its request or the error.
    _read_done = Signal(object, object)

    def __init__(self, window: TranscribeHost, *, parent: QWidget) -> None:
        super().__init__(parent)
        #: The window as a widget: the parent of this hook and of its dialogs.
        self.widget = parent
        self.window = window
        self.view = TranscriptView()
        self.view.hide()
        window.center_splitter.addWidget(self.view)
        window.center_splitter.setStretchFactor(window.center_splitter.count() - 1, 1)
        self.open_audio_action = QAction("Open &audio…", parent)
        self.open_audio_action.setToolTip("Transcribe an audio file")
        self.open_audio_action.triggered.connect(self.choose_audio)
        window.file_menu.insertAction(window.add_model_action, self.open_audio_action)
        #: A file waiting for the transcription pipeline to be opened.
        self.pending: Path | None = None
        #: The file transcribed last (Run transcribes it again).
        self.source: Path | None = None
        self._reader: threading.Thread | None = None
        self.recorder = window.bridge.recorder
        self.transcriber: Transcriber | None = None
        self._transcriber_closed = False
        self._record_after_stop = False
        self._close_pending = False
        self.dictation = "idle"
        self._read_done.connect(self._on_read, Qt.ConnectionType.QueuedConnection)
        self._connect()

    def _connect(self) -> None:
        window = self.window
        bridge = window.bridge
        bridge.pipeline_opened.connect(self._on_opened)
        bridge.run_started.connect(self.view.run_started)
        bridge.transcript_segment.connect(self.view.add_segment)
        bridge.run_finished.connect(self._on_finished)
        self.view.open_requested.connect(self.choose_audio)
        self.view.save_failed.connect(
            lambda path, why: window.banner.show_error(
                ErrorInfo("The transcript was not saved", f"{path}: {why}")
            )
        )
        window.run_pane.audio_requested.connect(self.choose_audio)
        window.first_use.setup_declined.connect(self._forget_pending)
        window.chat.dictate_requested.connect(self.dictate)
        box = window.devices_panel.audio_input
        box.device_chosen.connect(self._on_input_chosen)
        box.test_toggled.connect(self._on_test)
        box.refresh_requested.connect(self.list_inputs)
        box.show_devices([], window.settings.input_device, None)
        self.recorder.level.connect(self._on_level)
        self.recorder.stopped.connect(self._on_recorded)

    # -- transcribing a file ------------------------------------------------------------

    def pipeline_path(self) -> Path:
        """The bundled transcription pipeline (among the window's demos when listed)."""
        for path, _description in self.window.demos:
            if path.name == TRANSCRIBE_PIPELINE:
                return path
        return assets_dir() / "pipelines" / TRANSCRIBE_PIPELINE

    def _audio_pipeline_open(self) -> bool:
        """A transcription pipeline is open (audio in; a spoken conversation is not one)."""
        info = self.window.bridge.pipeline
        return info is not None and info.input_kind is InputKind.AUDIO and not info.voice

    def choose_audio(self) -> None:
        folder = str(self.source.parent) if self.source is not None else str(Path.cwd())
        path, _filter = QFileDialog.getOpenFileName(
            self.widget, "Transcribe an audio file", folder, AUDIO_FILTER
        )
        if path:
            self.transcribe_file(Path(path))

    def transcribe_file(self, path: Path | str) -> bool:
        """Transcribe ``path``: read it off the GUI thread, then run the transcription
        pipeline on it (opening that pipeline first when another is open)."""
        path = Path(path)
        window = self.window
        if window.bridge.state.busy or self._reader is not None:
            window.banner.show_error(RUN_IN_PROGRESS)
            return False
        if not self._audio_pipeline_open():
            self.pending = path
            if window.open_path(self.pipeline_path()):
                return True
            self.pending = None
            return False
        self._read(path)
        return True

    def run(self) -> bool:
        """Run pressed: with a transcription pipeline open, transcribe the last file again
        (or choose one); False for any other pipeline."""
        if not self._audio_pipeline_open():
            return False
        if self.source is None:
            self.choose_audio()
        else:
            self.transcribe_file(self.source)
        return True

    def _read(self, path: Path) -> None:
        self.window.banner.dismiss()
        self.view.new_run(f"{path.name}: reading…")
        thread = threading.Thread(
            target=self._read_job, args=(path,), name="omni-studio-audio-file"
        )
        self._reader = thread
        thread.start()

    def _read_job(self, path: Path) -> None:
        try:
            result: dict[str, Any] | AudioFileError = read_audio_request(path)
        except AudioFileError as exc:
            result = exc
        self._read_done.emit(path, result)

    def _on_read(self, path: Path, result: dict[str, Any] | AudioFileError) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.join()
        window = self.window
        if self._close_pending:
            return
        if isinstance(result, AudioFileError):
            self.view.finished("failed", str(result))
            window.banner.show_error(ErrorInfo("The audio file could not be read", str(result)))
            self.read_failed.emit(str(result))
            return
        if not self._audio_pipeline_open() or not window.bridge.state.can_run:
            self.view.finished("failed", "the transcription pipeline is not ready")
            return
        audio = result["audio"]
        seconds = audio.shape[0] / result["sample_rate"]
        channels = 1 if audio.ndim == 1 else audio.shape[1]
        self.source = path
        self.view.new_run(
            f"{path.name} · {seconds:.1f} s · {result['sample_rate']} Hz · {channels} ch"
        )
        window.output.new_run()
        window.metrics_panel.clear()
        if not window.bridge.run(result):
            self.view.finished("failed", "the pipeline did not accept the request")

    def _on_opened(self, info: PipelineInfo) -> None:
        audio = info.input_kind is InputKind.AUDIO and not info.voice
        self.view.setVisible(audio)
        if audio:
            self.window.output.hide()
            self.view.new_run("Drop an audio file on the window, or open one.")
            self.view.status.set_status("no audio yet", "#6b7785")
        pending, self.pending = self.pending, None
        if audio and pending is not None:
            self._read(pending)

    def _forget_pending(self) -> None:
        self.pending = None

    def _on_finished(self, outcome: RunOutcome) -> None:
        if self.view.isVisible() or self._audio_pipeline_open():
            self.view.finished(outcome.status, outcome.message)

    # -- the input device and Dictate ---------------------------------------------------

    def list_inputs(self) -> None:
        names, problem = input_device_names(rescan=True)
        self.window.devices_panel.audio_input.show_devices(
            names, self.window.settings.input_device, problem
        )

    def _on_input_chosen(self, name: str | None) -> None:
        self.window.settings.input_device = name

    def _on_test(self, on: bool) -> None:
        if on:
            if not self.recorder.monitor(self.window.settings.input_device):
                self.window.devices_panel.audio_input.set_listening(self.recorder.running)
        elif not self.recorder.keeping:
            self.recorder.stop()

    def _on_level(self, level: InputLevel) -> None:
        self.window.devices_panel.audio_input.show_level(level)
        if self.dictation == "recording":
            self.window.chat.dictate_meter.show_level(level)

    def dictate(self, start: bool) -> None:
        """Dictate clicked: start recording, or stop and transcribe what was recorded."""
        chat = self.window.chat
        if not start:
            if self.dictation == "recording":
                self.recorder.stop()
                self._set_dictation("transcribing")
            return
        if self.dictation != "idle":
            return
        self._set_dictation("recording")
        if self.recorder.running:  # the Devices panel's test: stop it, then record
            self._record_after_stop = True
            self.recorder.stop()
            return
        self.recorder.record(self.window.settings.input_device)
        chat.dictate_meter.clear()

    def _set_dictation(self, state: str) -> None:
        self.dictation = state
        self.window.chat.set_dictating(state)

    def _on_recorded(self, recording: Recording) -> None:
        window = self.window
        if self._record_after_stop:
            self._record_after_stop = False
            window.devices_panel.audio_input.set_listening(False)
            if not self._close_pending:
                self.recorder.record(window.settings.input_device)
            return
        if recording.error is not None:
            message = recording.error
            if recording.device not in message:
                message = f"{recording.device}: {message}"
            window.banner.show_error(ErrorInfo("The audio input could not be used", message))
        if self.dictation == "idle" or self._close_pending:
            window.devices_panel.audio_input.set_listening(False)
            return
        window.devices_panel.audio_input.set_listening(False)
        if recording.error is not None or recording.samples.size == 0:
            self._set_dictation("idle")
            return
        self._set_dictation("transcribing")
        self._ensure_transcriber().transcribe(recording.samples, recording.sample_rate)

    def _ensure_transcriber(self) -> Transcriber:
        if self.transcriber is None:
            self.transcriber = self.window.bridge.transcriber(self.pipeline_path())
            self.transcriber.transcribed.connect(self._on_transcribed)
            self.transcriber.closed.connect(self._on_transcriber_closed)
        return self.transcriber

    def _on_transcribed(self, result: Transcription) -> None:
        self._set_dictation("idle")
        if result.error is not None:
            self.window.banner.show_error(
                ErrorInfo("The dictation was not transcribed", result.error)
            )
            return
        self.window.chat.insert_dictation(result.text)

    def _on_transcriber_closed(self) -> None:
        self._transcriber_closed = True
        if self._close_pending:
            self.window.close()

    # -- closing ------------------------------------------------------------------------

    def defer_close(self) -> bool:
        """True while the dictation's transcriber unloads (the window closes once it has):
        the input and the file reader are closed first, waiting only for them."""
        self._close_pending = True
        self.recorder.close()
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.join()
        transcriber = self.transcriber
        if transcriber is None or self._transcriber_closed:
            return False
        if transcriber.closing:
            return True
        return transcriber.close()
