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
from typing import TYPE_CHECKING

import pytest
from PySide6.QtGui import QImage

from tests.helpers.voice import export_once
from tests.runtime.engine.support import StageSpec, write_pipeline
from tests.runtime.vllm.conftest import smollm2_model, vllm_env

if TYPE_CHECKING:
    from runtime.envs import EnvInfo

__all__ = ["smollm2_model", "vllm_env"]

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("studio_screenshots.py")
CHAT_SPEAK = REPO_ROOT / "assets" / "pipelines" / "chat-speak.yaml"
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
        assert_real_capture(out / name)


def assert_real_capture(path: Path) -> None:
    image = QImage(str(path))
    assert not image.isNull(), path.name
    assert image.width() >= 400
    assert image.height() >= 300
    # Not a blank capture: a real window has many distinct colours.
    colours = {
        image.pixel(x, y) for x in range(0, image.width(), 7) for y in range(0, image.height(), 7)
    }
    assert len(colours) > 20, path.name


CHAT_SCRIPT = Path(__file__).with_name("chat_screenshots.py")
CHAT_EXPECTED = ("chat-view-streaming.png", "chat-view.png", "chat-speak.png")


# Slow: two language-model pipelines start (minutes); `make screenshots` and `make slow` run it.
@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1800)
def test_screenshots_of_the_conversation_view(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    vllm_env: EnvInfo,
    smollm2_model: Path,
) -> None:
    """The built-in assistant answering in the conversation view, and chat-speak speaking."""
    out = Path(os.environ.get("OMNI_EDGE_SCREENSHOTS", tmp_path / "screenshots"))
    data = tmp_path / "data"
    data.mkdir()
    (data / "envs").symlink_to(vllm_env.path.parent, target_is_directory=True)
    (data / "models").symlink_to(smollm2_model.parent, target_is_directory=True)
    voices = export_once(tmp_path_factory).data_dir / "voices"
    (data / "voices").symlink_to(voices, target_is_directory=True)
    chat = tmp_path / "assistant.yaml"
    chat.write_text(
        """\
pipeline: assistant
description: SmolLM2-135M-Instruct alone, answering in the conversation view.
async_chunk: false
stages:
  - stage_id: 0
    backend:
      name: native.vllm.v1
      model: smollm2-135m-instruct
      engine: {dtype: float32, max_model_len: 2048, max_num_seqs: 2,
               kv_cache_memory_bytes: 128MiB, enforce_eager: true, seed: 0}
      sampling: {max_tokens: 96, temperature: 0.0}
      route: {name: local-vllm, interpreter: env:vllm-cpu}
    resource_budget:
      capacities: {machine:ram: 6GiB}
      demands: {machine:ram: 3GiB}
""",
        encoding="utf-8",
    )
    xvfb, display = _start_xvfb()
    try:
        environment = {
            **os.environ,
            "DISPLAY": display,
            "QT_QPA_PLATFORM": "xcb",
            "OMNI_EDGE_DATA_DIR": str(data),
        }
        result = subprocess.run(
            [sys.executable, str(CHAT_SCRIPT), str(out), str(chat), str(CHAT_SPEAK)],
            env=environment,
            capture_output=True,
            text=True,
            timeout=1500,
            check=False,
        )
    finally:
        xvfb.terminate()
        xvfb.wait(10)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(result.stdout.split()) == sorted(CHAT_EXPECTED)
    for name in CHAT_EXPECTED:
        assert_real_capture(out / name)
    # The conversations were saved in the user data folder the window was given.
    assert len(list((data / "conversations").glob("*.json"))) == 3


LOADING_SCRIPT = Path(__file__).with_name("loading_screenshots.py")


# Slow: the built-in assistant's worker loads (a minute on two busy cores); `make screenshots`.
@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_screenshot_of_the_conversation_view_while_the_model_loads(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    vllm_env: EnvInfo,
    smollm2_model: Path,
) -> None:
    """chat-speak opened: its stages load at once, each with its phase and seconds, and a
    message sent meanwhile waits for them, then is answered."""
    out = Path(os.environ.get("OMNI_EDGE_SCREENSHOTS", tmp_path / "screenshots"))
    data = tmp_path / "data"
    data.mkdir()
    (data / "envs").symlink_to(vllm_env.path.parent, target_is_directory=True)
    (data / "models").symlink_to(smollm2_model.parent, target_is_directory=True)
    voices = export_once(tmp_path_factory).data_dir / "voices"
    (data / "voices").symlink_to(voices, target_is_directory=True)
    xvfb, display = _start_xvfb()
    try:
        environment = {
            **os.environ,
            "DISPLAY": display,
            "QT_QPA_PLATFORM": "xcb",
            "OMNI_EDGE_DATA_DIR": str(data),
        }
        result = subprocess.run(
            [sys.executable, str(LOADING_SCRIPT), str(out), str(CHAT_SPEAK)],
            env=environment,
            capture_output=True,
            text=True,
            timeout=1000,
            check=False,
        )
    finally:
        xvfb.terminate()
        xvfb.wait(10)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == ["chat-view-loading.png"]
    assert_real_capture(out / "chat-view-loading.png")
