"""Transcribing a file in the studio: a dropped WAV file opens the transcription pipeline and
its transcript streams into the transcript view, segment by segment, equal to the pipeline's
own output through the Python API; Copy and Save as (.txt, .srt); a file that is not audio
gets a clear error; closing during a transcription leaves nothing behind.

The recogniser's bundles are exported once per session; each transcription runs the encoder
and decoder stages in two ONNX Runtime workers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from PySide6.QtGui import QGuiApplication

from app.models import InputKind, RunState, TranscriptSegment
from app.transcripts import audio_paths, clock, srt_text, transcript_text
from tests.app.support import wait_state, wait_topology
from tests.app.test_studio_selftest import _assets, _self_test
from tests.app.transcribe_support import (
    api_transcript,
    drop_file,
    recogniser_data,
    speech,
    write_wav,
)

if TYPE_CHECKING:
    from collections.abc import Callable


@pytest.fixture
def recognisers(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    data = recogniser_data(tmp_path_factory)
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(data))
    return data


@pytest.fixture
def speech_wav(tmp_path: Path) -> Path:
    return write_wav(tmp_path / "speech.wav", speech())


def test_a_dropped_wav_file_streams_the_pipelines_own_transcript(
    make_window: Callable[..., Any], qtbot: Any, recognisers: Path, speech_wav: Path, tmp_path: Path
) -> None:
    reference, reference_text = api_transcript(speech_wav)
    assert len(reference) >= 2, "the file spans two 30 s windows"
    window = make_window()
    wait_topology(qtbot, window)
    arrived: list[str] = []
    window.bridge.transcript_segment.connect(lambda _segment: arrived.append("segment"))
    window.bridge.run_finished.connect(lambda _outcome: arrived.append("finished"))
    with qtbot.waitSignal(window.bridge.run_finished, timeout=300_000) as finished:
        drop_file(window, speech_wav)
    assert finished.args[0].status == "completed", finished.args[0].message
    info = window.bridge.pipeline
    assert info is not None
    assert info.input_kind is InputKind.AUDIO
    assert info.name == "transcribe"
    view = window.transcribe.view
    assert view.isVisibleTo(window)
    assert not window.output.isVisibleTo(window)
    # Each segment showed as it finished, before the run ended; equal to the Python API's.
    assert arrived == ["segment"] * len(reference) + ["finished"]
    assert [(s.start_s, s.end_s, s.text) for s in view.segments] == reference
    assert " ".join(text for _start, _end, text in reference).split() == reference_text.split()
    shown = view.text_view.toPlainText().splitlines()
    assert len(shown) == len(reference)
    assert shown[0].startswith("[0:00.00 → 0:30.00]")
    assert shown[0].endswith(reference[0][2])
    assert view.status.text().startswith("completed")
    assert speech_wav.name in view.source_label.text()

    assert view.copy()
    assert QGuiApplication.clipboard().text() == view.text()
    assert view.save(tmp_path / "transcript.txt")
    assert (tmp_path / "transcript.txt").read_text(encoding="utf-8") == view.text() + "\n"
    assert view.save(tmp_path / "transcript.srt")
    srt = (tmp_path / "transcript.srt").read_text(encoding="utf-8")
    assert srt.startswith("1\n00:00:00,000 --> 00:00:30,000\n" + reference[0][2] + "\n")
    assert "\n2\n00:00:30,000 --> " in srt
    wait_state(qtbot, window, RunState.LOADED)

    # Run transcribes the same file again, with the stages still loaded: the same text.
    with qtbot.waitSignal(window.bridge.run_finished, timeout=300_000) as again:
        window.run_action.trigger()
    assert again.args[0].status == "completed"
    assert [(s.start_s, s.end_s, s.text) for s in view.segments] == reference


def test_a_file_that_is_not_audio_is_refused_naming_it(
    make_window: Callable[..., Any], qtbot: Any, recognisers: Path, tmp_path: Path
) -> None:
    window = make_window()
    wait_topology(qtbot, window)
    bogus = tmp_path / "notes.wav"
    bogus.write_text("these are notes, not audio\n", encoding="utf-8")
    with qtbot.waitSignal(window.transcribe.read_failed, timeout=60_000) as failed:
        assert window.transcribe.transcribe_file(bogus)
    assert failed.args[0].startswith(f"{bogus}: ")
    assert "accepted: audio files" in failed.args[0]
    assert window.banner.isVisible()
    assert window.banner.message.text() == failed.args[0]
    assert window.transcribe.view.status.text() == "failed"
    assert window.bridge.request_id is None


def test_closing_during_a_transcription_leaves_nothing(
    make_window: Callable[..., Any], qtbot: Any, recognisers: Path, tmp_path: Path
) -> None:
    long_wav = write_wav(tmp_path / "long.wav", np.tile(speech(), 3))
    window = make_window()
    wait_topology(qtbot, window)
    with qtbot.waitSignal(window.bridge.transcript_segment, timeout=300_000):
        assert window.transcribe.transcribe_file(long_wav)
    assert window.bridge.state is RunState.RUNNING
    with qtbot.waitSignal(window.bridge.shut_down, timeout=60_000):
        window.close()
    assert window.bridge.ledger_snapshot().is_empty
    # The residue guard (tests/conftest.py) then checks no worker, segment or reservation.


def test_transcript_times_as_text_and_subrip() -> None:
    segments = [
        TranscriptSegment("r", 0, 0.0, 30.0, "First window."),
        TranscriptSegment("r", 1, 30.0, 3725.456, "Second, past an hour."),
    ]
    assert clock(3725.456) == "1:02:05.45"
    assert clock(62.5) == "1:02.50"
    assert clock(62.5, srt=True) == "00:01:02,500"
    assert transcript_text(segments) == (
        "[0:00.00 → 0:30.00]  First window.\n[0:30.00 → 1:02:05.45]  Second, past an hour."
    )
    assert transcript_text(segments, times=False) == "First window. Second, past an hour."
    assert srt_text(segments) == (
        "1\n00:00:00,000 --> 00:00:30,000\nFirst window.\n\n"
        "2\n00:00:30,000 --> 01:02:05,456\nSecond, past an hour.\n"
    )
    assert audio_paths(["a.WAV", "b.yaml", "c.flac", "d.txt"]) == [Path("a.WAV"), Path("c.flac")]


def test_the_self_test_transcribes_the_voice_with_the_transcription_demo(
    demo_root: Path, tmp_path: Path
) -> None:
    """Headless, no offer is made: opening the demo exports the recogniser (as the command
    line does on first use), and the demo transcribes the bundled voice."""
    assets = _assets(demo_root, tmp_path, ("transcribe",))
    result = _self_test(assets, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    demos = [result for result in report["results"] if result["path"].endswith("transcribe.yaml")]
    assert len(demos) == 1, report["results"]
    assert demos[0]["ok"], demos[0]
    assert "1 segments: [0:00.00 → " in demos[0]["detail"]
    assert demos[0]["outputs"]["transcript"].strip()
    assert (tmp_path / "data" / "recognisers" / "whisper-tiny.en").is_dir()


def test_a_transcript_that_cannot_be_saved_says_where_and_why(
    make_window: Callable[..., Any], qtbot: Any, tmp_path: Path
) -> None:
    window = make_window()
    # The transcription demo is listed with the others, and File has Open audio….
    assert "transcribe.yaml" in [path.name for path, _description in window.demos]
    assert window.transcribe.open_audio_action in window.file_menu.actions()
    view = window.transcribe.view
    view.new_run("clip.wav")
    view.add_segment(TranscriptSegment("r", 0, 0.0, 2.5, "Hello there."))
    assert view.copy_button.isEnabled()
    folder = tmp_path / "a-folder.txt"
    folder.mkdir()
    with qtbot.waitSignal(view.save_failed) as failed:
        assert not view.save(folder)
    assert failed.args[0] == str(folder)
    assert window.banner.isVisible()
    assert window.banner.title.text() == "The transcript was not saved"
    assert str(folder) in window.banner.message.text()
