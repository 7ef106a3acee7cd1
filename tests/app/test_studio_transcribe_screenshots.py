"""Screenshots of the studio's speech input on a real X server (Xvfb) for people to look at:
a file transcribing, and Dictate recording from the test input source (a JACK dummy server
playing a spoken clip into the capture port) with its level meters, then its transcript in
the message box. Written to a temporary folder, or to ``OMNI_EDGE_SCREENSHOTS`` when set
(``make screenshots`` sets it to ``docs/screenshots/``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.app.test_studio_screenshots import _start_xvfb, assert_real_capture
from tests.app.transcribe_support import recogniser_data, speech, write_wav
from tests.runtime.audio.conftest import JackServer, jack_server

__all__ = ["jack_server"]

pytestmark = pytest.mark.audio

SCRIPT = Path(__file__).with_name("transcribe_screenshots.py")
EXPECTED = ("studio-transcribing.png", "studio-dictating.png", "studio-dictated.png")
CLIP = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
)


# make screenshots runs it; make test covers it at a smaller scale: test_studio_dictate.py and
# test_studio_transcribe.py (the same rounds offscreen), test_studio_screenshots.py (Xvfb).
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_screenshots_of_transcribing_and_dictating(
    jack_server: JackServer,
    demo_root: Path,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    out = Path(os.environ.get("OMNI_EDGE_SCREENSHOTS", tmp_path / "screenshots"))
    data = recogniser_data(tmp_path_factory)
    long_wav = write_wav(tmp_path / "interview.wav", np.tile(speech(), 3))
    clip_wav = write_wav(tmp_path / "dictation.wav", speech(CLIP))
    xvfb, display = _start_xvfb()
    try:
        environment = {
            **os.environ,
            **jack_server.environment,
            "DISPLAY": display,
            "QT_QPA_PLATFORM": "xcb",
            "OMNI_EDGE_ASSETS": str(demo_root),
            "OMNI_EDGE_DATA_DIR": str(data),
            "OMNI_EDGE_CONFIG_DIR": str(tmp_path / "config"),
        }
        result = subprocess.run(
            [sys.executable, str(SCRIPT), str(out), str(long_wav), str(clip_wav)],
            env=environment,
            capture_output=True,
            text=True,
            timeout=800,
            check=False,
        )
    finally:
        xvfb.terminate()
        xvfb.wait(10)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(result.stdout.split()) == sorted(EXPECTED)
    for name in EXPECTED:
        assert_real_capture(out / name)
