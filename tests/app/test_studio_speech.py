"""The speech demo in the studio: the waveform grows and the metrics fill as audio streams;
cancelling mid-speech returns to idle with nothing held.

The Piper voice is exported into bundles once per test session (shared with the other
speech tests); each run loads two workers holding the voice's graphs.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from PySide6.QtCore import Qt

from app.models import InputKind, RunState
from tests.app.support import open_pipeline, wait_state
from tests.helpers.voice import export_once

if TYPE_CHECKING:
    from collections.abc import Callable

REPO_ROOT = Path(__file__).resolve().parents[2]
SPEAK = REPO_ROOT / "assets" / "pipelines" / "speak.yaml"
LONG_TEXT = " ".join(
    [
        "Streaming speech starts quickly and keeps going while the audio plays.",
        "This request is long on purpose, so that it can be cancelled in the middle.",
        "Every sentence becomes its own utterance with its own acoustic call.",
        "The decoder runs chunk by chunk, and the studio draws each chunk as it arrives.",
    ]
)


@pytest.fixture(scope="session")
def voice_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user data folder holding the exported voice the speak demo names (``${data}``)."""
    return export_once(tmp_path_factory).data_dir


@pytest.fixture
def speech(voice_data: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(voice_data))
    return SPEAK


def test_speech_grows_the_waveform_and_fills_the_metrics(
    make_window: Callable[..., Any], qtbot: Any, speech: Path
) -> None:
    window = make_window()
    info = open_pipeline(qtbot, window, speech)
    assert info.input_kind is InputKind.TEXT
    assert window.output.waiting.isVisibleTo(window)
    assert not window.output.tensor_box.isVisibleTo(window)
    window.run_pane.text_input.setPlainText("Hello from the studio. The waveform grows as I speak.")
    # The audio reaches the output on the runtime's threads, never through the GUI thread.
    fed_on: list[int] = []
    fed: list[np.ndarray] = []
    feed = window.audio.feed

    def recording_feed(pcm: np.ndarray, sample_rate: int, **options: Any) -> None:
        fed_on.append(threading.get_ident())
        fed.append(np.array(pcm))
        feed(pcm, sample_rate, **options)

    window.audio.feed = recording_feed  # type: ignore[method-assign]
    drawn: list[int] = []
    window.output.waveform.grew.connect(drawn.append)
    with qtbot.waitSignal(window.bridge.run_finished, timeout=120_000) as finished:
        window.run_action.trigger()
    assert finished.args[0].status == "completed"
    wait_state(qtbot, window, RunState.LOADED)
    with qtbot.waitSignal(window.metrics_panel._refresh.timeout, timeout=2000, raising=False):
        pass
    waveform = window.output.waveform
    assert window.output.audio_box.isVisibleTo(window)
    assert not window.output.waiting.isVisibleTo(window)
    assert waveform.chunks >= 2
    # The waveform redraws on its display timer: its last redraw may follow the run's end.
    qtbot.waitUntil(lambda: bool(drawn) and drawn[-1] == waveform.sample_count, timeout=2000)
    assert len(drawn) >= 2
    assert drawn == sorted(drawn)
    assert drawn[-1] == waveform.sample_count
    assert waveform.sample_rate == 22050
    assert waveform.duration_s > 1.0
    assert len(fed) == waveform.chunks
    assert threading.main_thread().ident not in fed_on
    np.testing.assert_array_equal(np.concatenate(fed), waveform.samples[: waveform.sample_count])
    metrics = window.metrics_panel.metrics
    assert metrics is not None
    assert metrics.first_audio_s is not None
    assert 0 < metrics.first_audio_s < metrics.elapsed_s
    assert metrics.real_time_factor is not None
    assert metrics.chunks == waveform.chunks
    assert {timing.stage for timing in metrics.stages} == {"stage-0", "stage-1"}
    assert window.metrics_panel.first_audio.value.text() != "-"
    assert window.metrics_panel.rtf.value.text() != "-"
    assert window.output.audio_label.text().startswith(f"{waveform.chunks} chunks")
    print(
        f"speech: first audio {metrics.first_audio_s:.3f} s, RTF {metrics.real_time_factor:.3f}, "
        f"{waveform.duration_s:.2f} s in {waveform.chunks} chunks"
    )


def test_cancel_mid_speech_returns_to_idle_with_the_ledger_at_zero(
    make_window: Callable[..., Any], qtbot: Any, speech: Path
) -> None:
    window = make_window()
    open_pipeline(qtbot, window, speech)
    window.run_pane.text_input.setPlainText(LONG_TEXT)
    with qtbot.waitSignal(window.bridge.audio_chunk, timeout=120_000):
        window.run_action.trigger()
    assert window.cancel_action.isEnabled()
    with qtbot.waitSignal(window.bridge.run_finished, timeout=30_000) as finished:
        qtbot.keyClick(window, Qt.Key.Key_Escape)
    assert finished.args[0].status == "cancelled"
    wait_state(qtbot, window, RunState.READY)
    assert window.run_action.isEnabled()
    assert not window.cancel_action.isEnabled()
    assert window.bridge.ledger_snapshot().is_empty
    assert window.devices_panel.ledger.is_empty
    assert window.output.waveform.chunks >= 1
