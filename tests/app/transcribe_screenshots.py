"""Take screenshots of the studio's speech input on a real X server (run by
``test_studio_transcribe_screenshots.py``).

    DISPLAY=:N QT_QPA_PLATFORM=xcb python tests/app/transcribe_screenshots.py OUT LONG.wav CLIP.wav

OMNI_EDGE_ASSETS points at the demo pipelines, OMNI_EDGE_DATA_DIR at a data folder holding
the recogniser's bundles, JACK_DEFAULT_SERVER at a running JACK dummy server. Writes
``studio-transcribing.png`` (a file transcribing, its first segments shown),
``studio-dictating.png`` (Dictate recording from the JACK source, the level meters moving)
and ``studio-dictated.png`` (the transcript in the message box), then prints the names.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile
import soxr

if __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from PySide6.QtWidgets import QApplication

from app.demos import assets_dir
from app.models import RunState
from app.selftest import wait_until
from app.settings import StudioSettings
from app.theme import follow_system_scheme
from app.window import MainWindow
from tests.app.studio_screenshots import grab, settle
from tests.runtime.audio.jack_capture_child import FilePlayer

TIMEOUT_S = 300.0


def transcribing_shot(window: MainWindow, long_wav: Path, out: Path) -> None:
    bridge = window.bridge
    view = window.transcribe.view
    window.show_panel("metrics")
    window.transcribe.transcribe_file(long_wav)
    wait_until(lambda: len(view.segments) >= 2, [bridge.transcript_segment], TIMEOUT_S, "segments")
    settle(0.2)
    grab(window, window, out / "studio-transcribing.png")
    wait_until(
        lambda: bridge.state is RunState.LOADED, [bridge.state_changed], TIMEOUT_S, "the end"
    )
    bridge.unload()
    wait_until(lambda: bridge.state is RunState.READY, [bridge.state_changed], TIMEOUT_S, "unload")


def dictating_shots(window: MainWindow, clip_wav: Path, out: Path) -> None:
    bridge = window.bridge
    window.open_path(assets_dir() / "pipelines" / "chat.yaml")
    wait_until(
        lambda: bridge.pipeline is not None and bridge.pipeline.chat,
        [bridge.pipeline_opened],
        TIMEOUT_S,
        "chat to open",
    )
    window.show_panel("devices")
    box = window.devices_panel.audio_input
    box.refresh_button.click()
    box.device_box.setCurrentIndex(box.device_box.findData("system"))
    chat = window.chat
    chat.composer.setPlainText("Summarise this for me:")
    recorder = window.transcribe.recorder
    chat.dictate_button.click()
    wait_until(lambda: recorder.running, [recorder.running_changed], TIMEOUT_S, "recording")
    wait_until(lambda: box.meter.updates > 0, [recorder.level], TIMEOUT_S, "a level")
    clip, rate = soundfile.read(str(clip_wav), dtype="float32")
    player = FilePlayer(soxr.resample(clip, rate, 48000).astype(np.float32))
    try:
        player.connect_to_inputs()
        player.play()
        heard: list[float] = []
        recorder.level.connect(lambda level: heard.append(level.recorded_s))
        wait_until(
            lambda: bool(heard) and heard[-1] >= 2.0 and box.meter.rms_dbfs > -40.0,
            [recorder.level],
            TIMEOUT_S,
            "speech at the input",
        )
        grab(window, window, out / "studio-dictating.png")
        wanted = 0.5 + clip.size / rate
        wait_until(lambda: heard[-1] >= wanted, [recorder.level], TIMEOUT_S, "the clip's end")
        before = chat.composer.toPlainText()
        chat.dictate_button.click()
        wait_until(
            lambda: chat.composer.toPlainText() != before,
            [chat.composer.textChanged],
            TIMEOUT_S,
            "the transcript",
        )
    finally:
        player.close()
    settle(0.2)
    grab(window, window, out / "studio-dictated.png")


def main(out: Path, long_wav: Path, clip_wav: Path) -> int:
    app = QApplication(sys.argv[:1])
    follow_system_scheme(app)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="studio-shots-") as folder:
        window = MainWindow(settings=StudioSettings(Path(folder) / "studio.ini"))
        window.resize(1480, 920)
        window.show()
        bridge = window.bridge
        wait_until(
            lambda: window.devices_panel.topology is not None,
            [bridge.topology_changed],
            TIMEOUT_S,
            "devices",
        )
        transcribing_shot(window, long_wav, out)
        dictating_shots(window, clip_wav, out)
        window.close()
        wait_until(lambda: bridge.state is RunState.CLOSED, [bridge.shut_down], TIMEOUT_S, "close")
    app.processEvents()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])))
