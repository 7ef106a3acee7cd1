"""``omni-edge-studio --self-test``: run every bundled demo through the studio, headless.

Each demo is opened, checked before loading, run through the real window and bridge,
and its result checked: graph chains against the same graphs run in this process by
ONNX Runtime, streaming pipelines for finite audio or text. Then its stages are
unloaded and the ledger must be empty; at the end no child process may remain. The
user's settings and device selection are not touched (a temporary settings file, and
every device allowed). Prints a summary; the exit status is non-zero on any failure.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil
from PySide6 import __version__ as pyside_version
from PySide6.QtCore import QEventLoop, QMessageLogContext, QTimer, QtMsgType, qInstallMessageHandler
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication

from app.conversations import ConversationStore
from app.demos import demo_pipelines, llm_environment
from app.models import InputKind, RunOutcome, RunState
from app.settings import StudioSettings
from app.voice_presenters import names_voice_chat

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from PySide6.QtCore import SignalInstance

    from app.window import MainWindow

SPEECH_TEXT = "Omni Edge Studio self test."
#: What the voice says for a transcription demo (the recogniser's export validates on it).
TRANSCRIBED_TEXT = "The quick brown fox jumps over the lazy dog."


#: A warning the offscreen platform prints for every window it shows; not a problem.
OFFSCREEN_NOISE = "This plugin does not support propagateSizeHints()"


def _quiet_offscreen(kind: QtMsgType, _context: QMessageLogContext, message: str) -> None:
    if message != OFFSCREEN_NOISE:
        print(message, file=sys.stderr)


class StepFailed(Exception):
    """A self-test step did not reach its expected state."""


@dataclass
class DemoResult:
    pipeline: str
    path: str
    ok: bool
    seconds: float
    detail: str
    outputs: dict[str, Any] = field(default_factory=dict)
    skipped: bool = False


def wait_until(
    condition: Callable[[], bool], signals: list[SignalInstance], timeout_s: float, what: str
) -> None:
    """Run the event loop until ``condition`` holds, re-checking when any of ``signals`` fires."""
    if condition():
        return
    loop = QEventLoop()
    timer = QTimer()
    timer.setSingleShot(True)
    timer.timeout.connect(loop.quit)

    def check(*_args: object) -> None:
        if condition():
            loop.quit()

    for signal in signals:
        signal.connect(check)
    timer.start(int(timeout_s * 1000))
    try:
        while not condition() and timer.isActive():
            loop.exec()
    finally:
        for signal in signals:
            signal.disconnect(check)
        timer.stop()
    if not condition():
        raise StepFailed(f"timed out after {timeout_s:.0f} s waiting for {what}")


def chain_reference(path: Path, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The pipeline's graphs run in this process with ONNX Runtime on the CPU, chained with
    the pipeline's own handoff transforms."""
    import onnxruntime as ort

    from runtime.artifacts import verify_bundle
    from runtime.config import GraphBackendConfig, load_pipeline, resolve_callable

    config = load_pipeline(path)
    arrays: dict[str, np.ndarray] = dict(inputs)
    outputs: dict[str, np.ndarray] = {}
    for index, stage in enumerate(config.stages):
        if index > 0:
            assert stage.custom_process_input_func is not None
            transform = resolve_callable(
                stage.custom_process_input_func, file=None, line=None, key=None
            )
            arrays = {
                name: np.asarray(value) for name, value in transform(outputs)["tensors"].items()
            }
        assert isinstance(stage.backend, GraphBackendConfig), "a chain of graph stages"
        bundle = verify_bundle(stage.backend.manifest)
        session = ort.InferenceSession(str(bundle.graph_path), providers=["CPUExecutionProvider"])
        names = [output.name for output in session.get_outputs()]
        outputs = dict(zip(names, session.run(names, arrays), strict=True))
    return outputs


def _normalised(text: str) -> str:
    """Lower-case words, punctuation dropped: what a transcript is compared by."""
    return " ".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


def _spoken_file() -> Path:
    """TRANSCRIBED_TEXT spoken by the bundled voice, as a WAV file in a temporary folder
    (removed when the process exits)."""
    import atexit
    import shutil

    import soundfile

    from runtime.adapters.whisper_export import spoken_clip

    temporary = Path(tempfile.mkdtemp(prefix="omni-studio-selftest-audio-"))
    atexit.register(shutil.rmtree, temporary, True)
    path = temporary / "speech.wav"
    soundfile.write(str(path), spoken_clip(TRANSCRIBED_TEXT), 16000, subtype="FLOAT")
    return path


def _run_demo(window: MainWindow, path: Path, timeout_s: float) -> DemoResult:
    bridge = window.bridge
    started = time.perf_counter()
    errors: list[str] = []
    bridge.error.connect(lambda info: errors.append(f"{info.title}: {info.message}"))
    outcomes: list[RunOutcome] = []
    bridge.run_finished.connect(outcomes.append)
    window.open_path(path)

    def opened() -> bool:
        info = bridge.pipeline
        return bool(errors) or (
            bridge.state is RunState.READY
            and info is not None
            and info.path == path.expanduser().absolute()
        )

    wait_until(opened, [bridge.state_changed, bridge.error], timeout_s, f"{path.name} to open")
    info = bridge.pipeline
    if errors or info is None:
        raise StepFailed("; ".join(errors) or "the pipeline did not open")
    if not info.plan.admitted:
        raise StepFailed("refused before loading: " + "; ".join(info.plan.refusals))
    if info.chat:  # the conversation view sends its message
        window.chat.composer.setPlainText(SPEECH_TEXT)
    elif info.input_kind is InputKind.TEXT:
        window.run_pane.text_input.setPlainText(SPEECH_TEXT)
    # Spoken before the event loop is watched: the voice speaks on this thread.
    spoken_file = _spoken_file() if info.input_kind is InputKind.AUDIO else None
    window.stall_monitor.reset()
    if spoken_file is not None:
        # A transcription pipeline transcribes the bundled voice speaking TRANSCRIBED_TEXT,
        # from a file opened as a user opens one (Run would ask for the file).
        if not window.transcribe.transcribe_file(spoken_file):
            raise StepFailed("the studio refused to transcribe the spoken file")
    else:
        window.run()
    wait_until(
        lambda: bool(outcomes) and bridge.state in (RunState.LOADED, RunState.READY),
        [bridge.run_finished, bridge.state_changed],
        timeout_s,
        f"{info.name} to finish",
    )
    stalls = window.stall_monitor.stats()
    workers = _worker_command_lines()
    outcome = outcomes[-1]
    if outcome.status != "completed":
        raise StepFailed(f"the request {outcome.status}: {outcome.message or '; '.join(errors)}")
    summary: dict[str, Any] = {}
    if info.input_kind is InputKind.TENSORS:
        results = window.output.tensors.results
        if results is None:
            raise StepFailed("the run completed without tensor results")
        reference = chain_reference(info.path, info.example_inputs)
        window.output.tensors.set_reference("in-process ONNX Runtime", reference)
        comparisons = window.output.tensors.comparisons
        bad = [c for c in comparisons if not c.ok]
        if not comparisons or bad:
            raise StepFailed(
                "outputs differ from in-process ONNX Runtime: " + "; ".join(c.problem for c in bad)
            )
        for comparison in comparisons:
            array = results.arrays[comparison.name]
            summary[comparison.name] = {
                "dtype": str(array.dtype),
                "shape": list(array.shape),
                "max_abs_diff": comparison.max_abs,
            }
        detail = (
            ", ".join(
                f"{name} {tuple(item['shape'])} {item['dtype']} max |diff| {item['max_abs_diff']:.3g}"
                for name, item in summary.items()
            )
            + " vs in-process ONNX Runtime"
        )
    else:
        waveform = window.output.waveform
        samples = waveform.samples[: waveform.sample_count]
        chunks = waveform.chunks
        texts = window.chat.reply_chunks if info.chat else window.output.text_view.chunks
        if info.input_kind is InputKind.AUDIO:
            texts = len(window.transcribe.view.segments)
        if chunks == 0 and texts == 0:
            raise StepFailed("the run completed without audio or text")
        if not np.all(np.isfinite(samples)):
            raise StepFailed("the audio has non-finite samples")
        metrics = window.metrics_panel.metrics
        summary = {
            "audio_chunks": chunks,
            "audio_s": waveform.duration_s,
            "sample_rate": waveform.sample_rate,
            "text_chunks": texts,
            "first_audio_s": None if metrics is None else metrics.first_audio_s,
            "real_time_factor": None if metrics is None else metrics.real_time_factor,
        }
        detail = f"{chunks} audio chunks, {waveform.duration_s:.2f} s at {waveform.sample_rate} Hz, {texts} text chunks"
        if info.input_kind is InputKind.AUDIO:
            spoken = " ".join(part.text.strip() for part in window.transcribe.view.segments)
            if _normalised(spoken) != _normalised(TRANSCRIBED_TEXT):
                raise StepFailed(f"the transcript {spoken!r} is not {TRANSCRIBED_TEXT!r}")
            summary["transcript"] = window.transcribe.view.text()
            detail = f"{texts} segments: {window.transcribe.view.text()}"
    if bridge.state is RunState.LOADED:
        bridge.unload()
    wait_until(
        lambda: bridge.state is RunState.READY,
        [bridge.state_changed],
        timeout_s,
        "the stages to unload",
    )
    if not bridge.ledger_snapshot().is_empty:
        raise StepFailed(f"the ledger still holds {bridge.ledger_snapshot()} after unloading")
    detail += (
        f"; event loop during the run: p99 {stalls.p99_ms:.1f} ms, max {stalls.max_ms:.1f} ms "
        f"over {stalls.samples} ticks"
    )
    summary["event_loop"] = stalls.to_json()
    summary["workers"] = workers
    return DemoResult(info.name, str(path), True, time.perf_counter() - started, detail, summary)


def _worker_command_lines() -> list[list[str]]:
    """The command lines of this process's live children: the loaded stages' workers."""
    lines: list[list[str]] = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                lines.append(child.cmdline())
        except psutil.Error:
            continue  # the child ended while it was being looked at
    return lines


#: Legacy charsets Qt decodes through ICU (an HTML page's <meta charset>): label, bytes, text.
ICU_CHARSETS = (
    ("windows-1252", b"\x80 caf\xe9", "\u20ac caf\xe9"),
    ("ISO-8859-2", b"\xa3\xf3d\xbc", "\u0141\xf3d\u017a"),
    ("KOI8-R", b"\xf0\xd2\xc9\xd7\xc5\xd4", "\u041f\u0440\u0438\u0432\u0435\u0442"),
    ("Shift_JIS", b"\x93\xfa\x96{\x8c\xea", "\u65e5\u672c\u8a9e"),
    ("EUC-JP", b"\xc6\xfc\xcb\xdc\xb8\xec", "\u65e5\u672c\u8a9e"),
    ("ISO-2022-JP", b"\x1b$BF|K\\8l\x1b(B", "\u65e5\u672c\u8a9e"),
    ("GBK", b"\xd6\xd0\xce\xc4", "\u4e2d\u6587"),
    ("gb18030", b"\xd6\xd0\xce\xc4", "\u4e2d\u6587"),
    ("Big5", b"\xa4\xa4\xa4\xe5", "\u4e2d\u6587"),
    ("EUC-KR", b"\xc7\xd1\xb1\xb9\xbe\xee", "\ud55c\uad6d\uc5b4"),
)


def qt_icu_checks() -> dict[str, Any]:
    """Qt's functions that read ICU data, on English data (a build may trim ICU's data to
    what Qt reads): collation, locale case mapping, time-zone names, legacy charsets."""
    from PySide6.QtCore import QByteArray, QCollator, QLocale, QMimeData, QTimeZone

    english = QLocale("en_US")
    collator = QCollator(english)
    checks = {
        # ICU's collation puts "a" before "B"; code-point order would not.
        "collation": collator.compare("a", "B") < 0 < collator.compare("b", "A"),
        "locale case mapping": QLocale("tr_TR").toUpper("i") == "\u0130",
        "time-zone name": QTimeZone.utc().displayName(
            QTimeZone.TimeType.StandardTime, QTimeZone.NameType.LongName, english
        )
        == "Coordinated Universal Time",
    }
    collator.setNumericMode(True)
    checks["numeric collation"] = collator.compare("file2", "file10") < 0
    for label, encoded, text in ICU_CHARSETS:
        mime = QMimeData()
        page = f'<html><head><meta charset="{label}"></head><body>'.encode() + encoded
        mime.setData("text/html", QByteArray(page + b"</body></html>"))
        checks[f"charset {label}"] = text in mime.html()
    return {"ok": all(checks.values()), "checks": checks}


def audio_backend(unavailable_reason: str | None) -> dict[str, Any]:
    """The PortAudio library the studio loaded for playback (a frozen build carries its own);
    it loads when a streaming demo first expects audio."""
    module = sys.modules.get("sounddevice")
    if module is None:
        return {"loaded": False, "reason": unavailable_reason or "no demo expected audio"}
    return {
        "loaded": True,
        "portaudio": str(module.get_portaudio_version()[1]),
        "library": str(getattr(module, "_libname", "")),
    }


def run_self_test(
    *,
    report: Path | None = None,
    step_timeout_s: float = 180.0,
    demos_folder: Path | None = None,
    with_llm: bool = False,
) -> int:
    from app.bridge import RuntimeBridge
    from app.window import MainWindow
    from runtime.devices import DeviceSelection

    app = QApplication.instance() or QApplication(["omni-edge-studio"])
    app.setApplicationName("omni-edge-studio self-test")
    qInstallMessageHandler(_quiet_offscreen)
    demos = [path for path, _description in demo_pipelines(demos_folder)]
    print(
        f"omni-edge-studio self-test: Qt {QGuiApplication.platformName()}, PySide6 {pyside_version}, "
        f"{len(demos)} demo pipeline(s), every device allowed"
    )
    results: list[DemoResult] = []
    with tempfile.TemporaryDirectory(prefix="omni-studio-selftest-") as folder:
        settings = StudioSettings(Path(folder) / "studio.ini")
        window = MainWindow(
            settings=settings,
            bridge=RuntimeBridge(selection=DeviceSelection()),
            demos_folder=demos_folder,
            # The user's saved conversations are neither listed nor added to.
            conversations=ConversationStore(Path(folder) / "conversations"),
        )
        window.first_use.offers = False  # headless: nothing to answer an offer
        window.show()
        try:
            for path in demos:
                environment = llm_environment(path)
                if names_voice_chat(path):
                    result = DemoResult(
                        path.stem,
                        str(path),
                        True,
                        0.0,
                        "not run: a spoken conversation needs a microphone and a speaker (the "
                        "conversation view's Talk, or omni-edge talk)",
                        skipped=True,
                    )
                elif environment is not None and not with_llm:
                    result = DemoResult(
                        path.stem,
                        str(path),
                        True,
                        0.0,
                        f"not run: its language-model stage needs the {environment} environment "
                        "and a minute to start vLLM (--with-llm runs it)",
                        skipped=True,
                    )
                else:
                    try:
                        result = _run_demo(window, path, step_timeout_s)
                    except StepFailed as exc:
                        result = DemoResult(path.stem, str(path), False, 0.0, str(exc))
                results.append(result)
                status = "skip" if result.skipped else "ok  " if result.ok else "FAIL"
                print(f"  {status} {path.stem:<12} {result.seconds:6.2f} s  {result.detail}")
        finally:
            window.close()
            try:
                wait_until(
                    lambda: window.bridge.state is RunState.CLOSED,
                    [window.bridge.shut_down],
                    step_timeout_s,
                    "the studio to shut down",
                )
            except StepFailed as exc:
                results.append(DemoResult("shutdown", "", False, 0.0, str(exc)))
    audio = audio_backend(window.audio.unavailable_reason)
    icu = qt_icu_checks()
    failing = [name for name, ok in icu["checks"].items() if not ok]
    print(f"  {'ok  ' if icu['ok'] else 'FAIL'} Qt ICU: {len(icu['checks'])} checks", *failing)
    if failing:
        results.append(DemoResult("qt_icu", "", False, 0.0, f"failed: {', '.join(failing)}"))
    if audio["loaded"]:
        print(f"  audio: {audio['portaudio']} from {audio['library']}")
    leftovers = [
        child
        for child in psutil.Process().children(recursive=True)
        if child.status() != psutil.STATUS_ZOMBIE
    ]
    if leftovers:
        results.append(
            DemoResult(
                "shutdown",
                "",
                False,
                0.0,
                f"child processes left running: {[child.pid for child in leftovers]}",
            )
        )
    failed = [result for result in results if not result.ok]
    if not demos:
        failed.append(DemoResult("demos", "", False, 0.0, "no demo pipelines were found"))
    for result in failed:
        if result.pipeline in ("shutdown", "demos", "qt_icu"):
            print(f"  FAIL {result.pipeline}: {result.detail}")
    if report is not None:
        report.write_text(
            json.dumps(
                {
                    "ok": not failed,
                    "executable": sys.executable,
                    "frozen": bool(getattr(sys, "frozen", False)),
                    "audio": audio,
                    "qt_icu": icu,
                    "results": [asdict(result) for result in results],
                },
                indent=2,
            ),
            encoding="utf-8",
        )
    print(
        "self-test passed" if not failed else f"self-test FAILED ({len(failed)} problem(s))",
        file=sys.stdout if not failed else sys.stderr,
    )
    return 0 if not failed else 1
