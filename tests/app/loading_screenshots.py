"""Take a screenshot of the conversation view while the built-in assistant loads (run by
``test_studio_screenshots.py``).

    DISPLAY=:N QT_QPA_PLATFORM=xcb python tests/app/loading_screenshots.py OUT CHAT-SPEAK.yaml

``OMNI_EDGE_DATA_DIR`` holds the ``vllm-cpu`` environment, the built-in assistant and the
exported voice. Opening the pipeline starts loading its stages; a message sent at once waits
for them. Writes ``chat-view-loading.png`` (each stage's phase and seconds, the message
waiting) once the language model has loaded for a few seconds, then waits for the reply and
prints the file name.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app.models import RunState
from app.selftest import wait_until
from app.settings import StudioSettings
from app.theme import follow_system_scheme
from app.window import MainWindow
from tests.app.studio_screenshots import grab, settle

#: Loading a language model and answering on two busy cores.
TIMEOUT_S = 600.0
#: How long the language model has been loading in the picture, at least.
SHOWN_LOADING_S = 6.0


def _assistant_loading_for(window: MainWindow, seconds: float) -> bool:
    view = window.bridge.load_view
    if view is None or not view.loading:
        return False
    llm = [stage for stage in view.stages if stage.kind == "vLLM worker"]
    graph = [stage for stage in view.stages if stage.kind != "vLLM worker"]
    return (
        bool(llm)
        and not llm[0].done
        and llm[0].seconds(time.monotonic()) >= seconds
        and all(stage.phase == "ready" for stage in graph)
    )


def main(out: Path, chat_speak: Path) -> int:
    app = QApplication(sys.argv[:1])
    follow_system_scheme(app)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="loading-shots-") as folder:
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
        window.open_path(chat_speak)
        wait_until(lambda: bridge.loading, [bridge.load_progress], TIMEOUT_S, "the load to start")
        window.chat.system_prompt.setPlainText(
            "You are a helpful assistant. Answer in one or two short sentences."
        )
        if not window.chat.send("What is the capital of France?"):
            raise SystemExit("the conversation view did not send while the stages load")
        if not window.chat.waiting_for_load:
            raise SystemExit(f"the message does not wait for the load ({bridge.state})")
        # The seconds count on the views' own timers; this one only wakes the wait.
        tick = QTimer()
        tick.start(250)
        wait_until(
            lambda: _assistant_loading_for(window, SHOWN_LOADING_S),
            [tick.timeout, bridge.load_progress],
            TIMEOUT_S,
            "the language model loading for a few seconds",
        )
        settle(0.6)
        grab(window, window, out / "chat-view-loading.png")
        tick.stop()
        wait_until(
            lambda: window.chat.draft is None and bridge.state is RunState.LOADED,
            [bridge.state_changed, bridge.run_finished],
            TIMEOUT_S,
            "the reply",
        )
        reply = window.chat.conversation.last_reply
        if not reply:
            raise SystemExit("the message that waited for the load got no reply")
        window.close()
        wait_until(
            lambda: bridge.state is RunState.CLOSED, [bridge.shut_down], TIMEOUT_S, "shutdown"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1]), Path(sys.argv[2])))
