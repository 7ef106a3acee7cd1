"""Screenshots of Add model…, My pipelines and the first-use offer on a real X server (Xvfb, started here).

Written to a temporary folder, or to ``OMNI_EDGE_SCREENSHOTS`` when set (``make screenshots``
sets it to ``docs/screenshots/``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from PySide6.QtGui import QImage

from tests.app.test_studio_screenshots import _start_xvfb
from tests.helpers.onnx_graphs import make_add_graph

SCRIPT = Path(__file__).with_name("add_model_screenshots.py")
EXPECTED = ("my-pipelines.png", "add-model-dialog.png", "first-use-offer.png")


def test_screenshots_of_add_model_and_my_pipelines(demo_root: Path, tmp_path: Path) -> None:
    out = Path(os.environ.get("OMNI_EDGE_SCREENSHOTS", tmp_path / "screenshots"))
    model = make_add_graph(tmp_path / "models" / "adder.onnx", n=16)
    whole = make_add_graph(tmp_path / "models" / "whole.onnx", n=4096).read_bytes()
    broken = tmp_path / "models" / "downloaded.onnx"
    broken.write_bytes(whole[: len(whole) // 2])
    xvfb, display = _start_xvfb()
    try:
        environment = {
            **os.environ,
            "DISPLAY": display,
            "QT_QPA_PLATFORM": "xcb",
            "OMNI_EDGE_ASSETS": str(demo_root),
        }
        result = subprocess.run(
            [sys.executable, str(SCRIPT), str(out), str(model), str(broken)],
            env=environment,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    finally:
        xvfb.terminate()
        xvfb.wait(10)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(result.stdout.split()) == sorted(EXPECTED)
    for name in EXPECTED:
        image = QImage(str(out / name))
        assert not image.isNull(), name
        assert image.width() >= 400
        assert image.height() >= 250
        colours = {
            image.pixel(x, y)
            for x in range(0, image.width(), 7)
            for y in range(0, image.height(), 7)
        }
        assert len(colours) > 20, name
