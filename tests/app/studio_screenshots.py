"""Take screenshots of the studio on a real X server (run by ``test_studio_screenshots.py``).

    DISPLAY=:N QT_QPA_PLATFORM=xcb python tests/app/studio_screenshots.py OUT LOOP.yaml ENDLESS.npz [--speech]

OMNI_EDGE_ASSETS points at the demo pipelines and bundles. Writes ``main-window-running.png``
(a long graph mid-run), ``main-window-result.png`` (a finished run with its results),
``panel-<name>.png`` for every panel, ``devices-hx370-rtx5090-laptop.png`` (a bundled
topology with more devices) and ``error-banner.png`` (an admission refusal), each captured
from the X server, then prints the file names. With ``--speech`` (the voice exported under
the user data folder) also ``main-window-speech.png``: the speak demo mid-stream.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import httpx

if __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from PySide6.QtCore import QEventLoop, QRect, QTimer
from PySide6.QtWidgets import QApplication, QWidget

from app.demos import assets_dir
from app.models import RunState
from app.selftest import wait_until
from app.settings import StudioSettings
from app.theme import follow_system_scheme
from app.window import PANELS, MainWindow

TIMEOUT_S = 120.0


def grab(window: MainWindow, widget: QWidget, path: Path) -> None:
    """Capture ``widget``'s area of the window from the X server (not a widget render)."""
    QApplication.processEvents()
    screen = window.screen()
    origin = widget.mapTo(window, widget.rect().topLeft())
    area = QRect(origin, widget.size())
    pixmap = screen.grabWindow(window.winId(), area.x(), area.y(), area.width(), area.height())
    if not pixmap.save(str(path)):
        raise SystemExit(f"could not write {path}")
    print(path.name)


def settle(seconds: float) -> None:
    """Let the event loop paint (and refresh the metrics) for ``seconds`` before a capture."""
    loop = QEventLoop()
    QTimer.singleShot(int(seconds * 1000), loop.quit)
    loop.exec()


def serve_on(window: MainWindow) -> None:
    """The Serve switch on, with one request answered (the models list)."""
    bridge = window.bridge
    bridge.serve_port = 0
    window.serve_panel.switch.setChecked(True)
    wait_until(
        lambda: bridge.serve_view.state == "serving", [bridge.serve_changed], TIMEOUT_S, "serving"
    )
    address = bridge.serve_view.address
    assert address is not None
    httpx.get(f"{address}/models", timeout=30).raise_for_status()
    wait_until(
        lambda: bridge.serve_view.served == 1, [bridge.serve_changed], TIMEOUT_S, "a request"
    )


def serve_off(window: MainWindow) -> None:
    bridge = window.bridge
    window.serve_panel.switch.setChecked(False)
    wait_until(
        lambda: bridge.serve_view.state == "stopped", [bridge.serve_changed], TIMEOUT_S, "stopping"
    )


def speech_shot(window: MainWindow, out: Path) -> None:
    bridge = window.bridge
    window.open_path(assets_dir() / "pipelines" / "speak.yaml")
    wait_until(
        lambda: (
            bridge.state is RunState.READY
            and bridge.pipeline is not None
            and bridge.pipeline.name == "speak"
        ),
        [bridge.state_changed],
        TIMEOUT_S,
        "speak to open",
    )
    window.run_pane.text_input.setPlainText(
        "Streaming speech starts quickly, then grows its chunks while the audio plays. "
        "The studio draws every chunk as it arrives, and the metrics fill in as it goes."
    )
    window.show_panel("metrics")
    window.run()
    wait_until(
        lambda: window.output.waveform.chunks >= 4, [bridge.audio_chunk], TIMEOUT_S, "audio chunks"
    )
    settle(0.3)
    grab(window, window, out / "main-window-speech.png")
    wait_until(
        lambda: bridge.state is RunState.LOADED,
        [bridge.state_changed],
        TIMEOUT_S,
        "speech to finish",
    )
    bridge.unload()
    wait_until(
        lambda: bridge.state is RunState.READY,
        [bridge.state_changed],
        TIMEOUT_S,
        "unloading speech",
    )


def main(out: Path, loop_pipeline: Path, endless: Path, speech: bool = False) -> int:
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

        window.open_path(assets_dir() / "pipelines" / "mlp-chain.yaml")
        wait_until(
            lambda: bridge.state is RunState.READY,
            [bridge.state_changed],
            TIMEOUT_S,
            "mlp-chain to open",
        )
        window.run()
        wait_until(
            lambda: bridge.state is RunState.LOADED,
            [bridge.state_changed],
            TIMEOUT_S,
            "mlp-chain to run",
        )
        window.show_panel("plan")
        settle(0.4)
        grab(window, window, out / "main-window-result.png")
        for name in PANELS:
            window.show_panel(name)
            if name == "serve":
                serve_on(window)
            settle(0.3)
            grab(window, window.panels, out / f"panel-{name}.png")
            if name == "serve":
                serve_off(window)

        topology = assets_dir() / "topologies" / "hx370-rtx5090-laptop.yaml"
        window.show_panel("devices")
        index = window.devices_panel.machine_box.findData(str(topology))
        window.devices_panel.machine_box.setCurrentIndex(index)
        wait_until(
            lambda: (
                window.devices_panel.topology is not None
                and window.devices_panel.topology.source == str(topology)
            ),
            [bridge.topology_changed],
            TIMEOUT_S,
            "the laptop topology",
        )
        wait_until(
            lambda: bridge.state is RunState.READY, [bridge.state_changed], TIMEOUT_S, "unloading"
        )
        settle(0.3)
        grab(window, window.panels, out / "devices-hx370-rtx5090-laptop.png")
        window.devices_panel.machine_box.setCurrentIndex(0)
        wait_until(
            lambda: (
                window.devices_panel.topology is not None
                and window.devices_panel.topology.source == "discovered"
            ),
            [bridge.topology_changed],
            TIMEOUT_S,
            "this machine again",
        )

        if speech:
            speech_shot(window, out)
        window.open_path(loop_pipeline)
        wait_until(
            lambda: (
                bridge.state is RunState.READY
                and bridge.pipeline is not None
                and bridge.pipeline.path == loop_pipeline
            ),
            [bridge.state_changed],
            TIMEOUT_S,
            "the loop to open",
        )
        if not window.load_inputs(endless):
            raise SystemExit("the endless inputs were refused")
        window.show_panel("plan")
        window.run()
        wait_until(
            lambda: bridge.state is RunState.RUNNING and bridge.request_id is not None,
            [bridge.state_changed, bridge.run_started],
            TIMEOUT_S,
            "the loop to run",
        )
        settle(1.5)
        grab(window, window, out / "main-window-running.png")
        window.cancel()
        wait_until(
            lambda: bridge.state is RunState.READY, [bridge.state_changed], TIMEOUT_S, "the cancel"
        )

        big = Path(folder) / "too-big.yaml"
        text = (assets_dir() / "pipelines" / "add.yaml").read_text(encoding="utf-8")
        text = text.replace('"machine:ram": 2GiB', '"machine:ram": 64MiB').replace(
            "../bundles/add/manifest.json", str(assets_dir() / "bundles" / "add" / "manifest.json")
        )
        big.write_text(text, encoding="utf-8")
        window.open_path(big)
        wait_until(
            lambda: (
                bridge.state is RunState.READY
                and bridge.pipeline is not None
                and bridge.pipeline.path == big
            ),
            [bridge.state_changed],
            TIMEOUT_S,
            "the refused plan to open",
        )
        window.run()
        wait_until(lambda: window.banner.isVisible(), [bridge.error], TIMEOUT_S, "the refusal")
        wait_until(
            lambda: bridge.state is RunState.READY, [bridge.state_changed], TIMEOUT_S, "idle"
        )
        window.show_panel("plan")
        settle(0.3)
        grab(window, window, out / "error-banner.png")

        window.close()
        wait_until(
            lambda: bridge.state is RunState.CLOSED, [bridge.shut_down], TIMEOUT_S, "shutdown"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(
        main(
            Path(sys.argv[1]),
            Path(sys.argv[2]).absolute(),
            Path(sys.argv[3]),
            "--speech" in sys.argv[4:],
        )
    )
