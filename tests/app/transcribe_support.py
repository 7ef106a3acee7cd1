"""Shared by the studio's speech-in tests: the recogniser's bundles exported once per
session, a spoken WAV file, and the transcription pipeline's own output via the Python API."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import soundfile
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent

from runtime.adapters.whisper_export import ensure_whisper_bundles, spoken_clips
from runtime.api import Omni
from runtime.devices import discover_topology
from runtime.devices.selection import DeviceSelection

if TYPE_CHECKING:
    import pytest

_EXPORTS: dict[Path, Path] = {}
_CLIPS: dict[tuple[str, ...], np.ndarray] = {}
#: Sentences spoken into the test files: long enough together for two 30 s windows.
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "On March 3rd, 2021, Dr. Alvarez paid $42.50 for 17 books in Tokyo.",
    "Margaret Thompson flew from Chicago to Lisbon with her brother Daniel.",
    "The meeting moved from Tuesday at nine to Thursday at half past two.",
    "Turn left at the second light, then drive four hundred meters north.",
    "The recipe needs two cups of flour, one egg and a pinch of salt.",
    "Professor Nakamura will present the results at the conference in Berlin.",
    "After the storm, the river rose faster than anyone expected, and the bridge closed.",
    "Keep the receipt; you can return the jacket within thirty days.",
    "Seven hundred and fifty people answered the survey by Friday.",
)
RATE = 16000
PIPELINE = Path(__file__).resolve().parents[2] / "assets" / "pipelines" / "transcribe.yaml"


def recogniser_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user data folder holding the recogniser's bundles (``${data}``), exported once."""
    base = tmp_path_factory.getbasetemp()
    found = _EXPORTS.get(base)
    if found is None:
        found = base / "recogniser-data"
        ensure_whisper_bundles("tiny.en", found / "recognisers" / "whisper-tiny.en")
        _EXPORTS[base] = found
    return found


def speech(sentences: tuple[str, ...] = SENTENCES, gap_s: float = 0.4) -> np.ndarray:
    """``sentences`` spoken by the bundled voice at 16 kHz with ``gap_s`` of silence between."""
    if sentences not in _CLIPS:
        gap = np.zeros(int(gap_s * RATE), np.float32)
        pieces: list[np.ndarray] = []
        for clip in spoken_clips(list(sentences)):
            pieces.extend((clip, gap))
        _CLIPS[sentences] = np.concatenate(pieces)
    return _CLIPS[sentences]


def write_wav(path: Path, samples: np.ndarray, rate: int = RATE) -> Path:
    soundfile.write(str(path), samples, rate, subtype="PCM_16")
    return path


def api_transcript(path: Path) -> tuple[list[tuple[float, float, str]], str]:
    """The transcription pipeline's segments (start, end, text) and final text for the file
    at ``path``, through the Python API, the file read with soundfile."""
    samples, rate = soundfile.read(str(path), dtype="float32")
    segments: list[tuple[float, float, str]] = []
    text = ""
    with Omni(PIPELINE, topology=discover_topology(), selection=DeviceSelection()) as omni:
        for output in omni.generate({"audio": samples, "sample_rate": rate}):
            if output.finished:
                text = output.text or ""
            else:
                segments.append(
                    (
                        float(output.outputs["start_s"]),
                        float(output.outputs["end_s"]),
                        (output.text or "").strip(),
                    )
                )
    return segments, text


def drop_file(window: Any, path: Path) -> None:
    """Drop ``path`` on the window, as a file manager would."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    event = QDropEvent(
        QPointF(20, 20),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
    )
    window.dropEvent(event)
