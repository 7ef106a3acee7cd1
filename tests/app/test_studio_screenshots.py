"""Screenshots of the studio on a real X server (Xvfb, started here) for people to look at.

They are written to a temporary folder, or to ``OMNI_EDGE_SCREENSHOTS`` when set
(``make screenshots`` sets it to ``docs/screenshots/``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtGui import QImage

from tests.runtime.engine.support import StageSpec, write_pipeline

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("studio_screenshots.py")
EXPECTED = (
    "main-window-running.png",
    "main-window-result.png",
    "devices-hx370-rtx5090-laptop.png",
    "error-banner.png",
    *(f"panel-{name}.png" for name in ("devices", "plan", "manifest", "metrics", "log", "serve")),
)


def _start_xvfb() -> tuple[subprocess.Popen[bytes], str]:
    """Xvfb on a display number it picks itself (written to a pipe)."""
    xvfb = shutil.which("Xvfb")
    if xvfb is None:
        pytest.fail(
            "Xvfb is not installed; install the Debian packages in packaging/debian-packages.txt"
        )
    read_end, write_end = os.pipe()
    process = subprocess.Popen(
        [xvfb, "-displayfd", str(write_end), "-screen", "0", "1600x1000x24", "-nolisten", "tcp"],
        pass_fds=(write_end,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(write_end)
    with os.fdopen(read_end) as stream:
        number = stream.readline().strip()
    if not number:
        process.kill()
        process.wait()
        pytest.fail("Xvfb did not report a display")
    return process, f":{number}"


def test_screenshots_of_the_window_during_a_run_and_of_each_panel(
    demo_root: Path, tmp_path: Path, loop_manifest: Path, endless_inputs: Path
) -> None:
    # The checkout's docs/screenshots/ is refreshed only when asked (make screenshots).
    out = Path(os.environ.get("OMNI_EDGE_SCREENSHOTS", tmp_path / "screenshots"))
    loop = write_pipeline(
        tmp_path / "long-graph.yaml", StageSpec(loop_manifest, max_io="4MiB"), name="long_graph"
    )
    xvfb, display = _start_xvfb()
    try:
        environment = {
            **os.environ,
            "DISPLAY": display,
            "QT_QPA_PLATFORM": "xcb",
            "OMNI_EDGE_ASSETS": str(demo_root),
        }
        result = subprocess.run(
            [sys.executable, str(SCRIPT), str(out), str(loop), str(endless_inputs)],
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
        assert image.height() >= 300
        # Not a blank capture: a real window has many distinct colours.
        colours = {
            image.pixel(x, y)
            for x in range(0, image.width(), 7)
            for y in range(0, image.height(), 7)
        }
        assert len(colours) > 20, name
