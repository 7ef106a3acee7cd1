"""The studio's event loop while it streams speech, in a fresh (offscreen) studio process.

    python -m benchmarks.studio_stall PIPELINE.yaml [--requests N] [--idle-s S]
        [--device NAME] [--cli]

Opens the pipeline in the real main window (bridge, widgets, audio output), runs one request
to load the stages, then measures the window's own :class:`app.stall.StallMonitor` (how late
a 10 ms timer fires) over ``N`` streaming requests, and then idle with the stages loaded for
``--idle-s`` seconds (the baseline). With ``--device`` the window plays on the output device
of that name (a JACK server's ``system``: paced in real time) and each request waits for its
playback to end: the requests' real-time factor and the underruns after playback started are
reported. With ``--cli`` the same texts then go through the command line's way (``speak``,
synthesizing at full speed, no player) once the window has closed, for the real-time factor
beside it. Prints one
``done`` JSON line; a pipeline that cannot open prints ``error`` and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SPEECH_TEXT = (
    "The studio keeps drawing while it speaks. Each chunk of audio arrives on the runtime's "
    "thread and crosses into the window through one bridge. Nothing here should make the "
    "window wait."
)
SHORT_TEXT = "The studio keeps drawing while it speaks."
STEP_TIMEOUT_S = 300.0


def _emit(document: dict[str, Any]) -> None:
    print(json.dumps(document), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studio_stall")
    parser.add_argument("pipeline", type=Path)
    parser.add_argument("--requests", type=int, default=1)
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--short", action="store_true", help="one short sentence per request")
    parser.add_argument("--device", help="play on this output device (by name)")
    parser.add_argument("--cli", action="store_true", help="also speak the texts as the CLI does")
    args = parser.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    try:
        from PySide6.QtCore import QEventLoop, QTimer
        from PySide6.QtWidgets import QApplication

        from app.bridge import RuntimeBridge
        from app.models import RunOutcome, RunState
        from app.selftest import StepFailed, wait_until
        from app.settings import StudioSettings
        from app.window import MainWindow
    except ImportError as exc:
        _emit({"event": "error", "message": f"the studio cannot be imported here ({exc})"})
        return 2
    from runtime.devices import DeviceSelection

    app = QApplication.instance() or QApplication(["omni-edge-studio-bench"])
    app.setApplicationName("omni-edge-studio benchmark")

    def spin(seconds: float) -> None:
        loop = QEventLoop()
        QTimer.singleShot(int(seconds * 1000), loop.quit)
        loop.exec()

    with tempfile.TemporaryDirectory(prefix="omni-studio-bench-") as folder:
        window = MainWindow(
            settings=StudioSettings(Path(folder) / "studio.ini"),
            bridge=RuntimeBridge(selection=DeviceSelection()),
        )
        bridge = window.bridge
        errors: list[str] = []
        bridge.error.connect(lambda info: errors.append(f"{info.title}: {info.message}"))
        outcomes: list[RunOutcome] = []
        bridge.run_finished.connect(outcomes.append)
        if args.device is not None:
            from runtime.audio import resolve_output_device

            device = resolve_output_device(args.device)
            window.output.playback.preferred_device = f"{device.name} ({device.host_api})"
        window.show()
        rtfs: list[float] = []
        underruns: list[int] = []
        try:
            window.open_path(args.pipeline)
            wait_until(
                lambda: bool(errors) or bridge.state is RunState.READY,
                [bridge.state_changed, bridge.error],
                STEP_TIMEOUT_S,
                "the pipeline to open",
            )
            if errors or bridge.pipeline is None:
                _emit({"event": "error", "message": "; ".join(errors) or "it did not open"})
                return 2
            window.run_pane.text_input.setPlainText(SHORT_TEXT if args.short else SPEECH_TEXT)

            def run_once() -> RunOutcome:
                count = len(outcomes)
                window.run()
                wait_until(
                    lambda: len(outcomes) > count and bridge.state is RunState.LOADED,
                    [bridge.run_finished, bridge.state_changed],
                    STEP_TIMEOUT_S,
                    "the request to finish",
                )
                outcome = outcomes[-1]
                if outcome.status != "completed":
                    raise StepFailed(f"the request {outcome.status}: {outcome.message}")
                if args.device is not None:
                    audio = window.audio
                    deadline = time.monotonic() + STEP_TIMEOUT_S
                    while audio.state == "playing" and time.monotonic() < deadline:
                        spin(0.05)
                    underruns.append(audio.underruns)
                metrics = window.metrics_panel.metrics
                if metrics is not None and metrics.real_time_factor is not None:
                    rtfs.append(metrics.real_time_factor)
                return outcome

            window.stall_monitor.reset()
            run_once()
            loading = window.stall_monitor.stats()
            window.stall_monitor.reset()
            rtfs.clear()
            underruns.clear()
            started = time.perf_counter()
            for _ in range(args.requests):
                run_once()
            streaming_s = time.perf_counter() - started
            during = window.stall_monitor.stats()
            window.stall_monitor.reset()
            spin(args.idle_s)
            idle = window.stall_monitor.stats()
            metrics = window.metrics_panel.metrics
            _emit(
                {
                    "event": "done",
                    "during": during.to_json(),
                    "idle": idle.to_json(),
                    "first_run_with_loading": loading.to_json(),
                    "streaming_s": streaming_s,
                    "requests": args.requests,
                    "first_audio_s": None if metrics is None else metrics.first_audio_s,
                    "real_time_factors": rtfs,
                    "underruns": underruns,
                    "device": args.device,
                    "playback_device": window.output.playback.device_box.currentText(),
                }
            )
        except StepFailed as exc:
            _emit({"event": "error", "message": f"{exc}; {'; '.join(errors)}".strip("; ")})
            return 2
        finally:
            window.close()
            wait_until(
                lambda: bridge.state is RunState.CLOSED,
                [bridge.shut_down],
                STEP_TIMEOUT_S,
                "the studio to shut down",
            )
    if args.cli:
        _emit({"event": "cli", **_cli_rtf(args)})
    return 0


def _cli_rtf(args: argparse.Namespace) -> dict[str, Any]:
    """The command line's way with the same texts: ``speak`` writing no audio anywhere (a
    player would pace it, and the figure compares the window with synthesis at full speed)."""
    from runtime.adapters.speak import speak
    from runtime.api import Omni
    from runtime.devices import DeviceSelection

    text = SHORT_TEXT if args.short else SPEECH_TEXT
    factors: list[float] = []
    with Omni(args.pipeline, selection=DeviceSelection()) as omni:
        speak(omni, SHORT_TEXT)  # loads and warms the stages, as the window's first run did
        for _ in range(args.requests):
            result = speak(omni, text)
            assert result.real_time_factor is not None
            factors.append(result.real_time_factor)
    return {"real_time_factors": factors}


if __name__ == "__main__":
    sys.exit(main())
