"""Shared by the studio's spoken-conversation tests: a user data folder holding what the
voice-chat pipeline names under ``${data}`` (the recogniser's bundles, the voice, the voice
activity bundle), each made once per session, linked into each test's own folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from runtime.adapters.vad_bundle import ensure_vad_bundle
from tests.app.transcribe_support import recogniser_data
from tests.helpers.voice import export_once

if TYPE_CHECKING:
    import pytest

REPO = Path(__file__).resolve().parents[2]
VOICE_CHAT = REPO / "assets" / "pipelines" / "voice-chat.yaml"
_VAD: dict[Path, Path] = {}


def vad_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``<basetemp>/vad-data/vad``, holding the voice activity bundle (made once)."""
    base = tmp_path_factory.getbasetemp()
    found = _VAD.get(base)
    if found is None:
        found = base / "vad-data" / "vad"
        ensure_vad_bundle(found / "silero")
        _VAD[base] = found
    return found


def voice_chat_data(folder: Path, tmp_path_factory: pytest.TempPathFactory, **more: Path) -> Path:
    """``folder`` made a user data folder for voice-chat.yaml: links to the session's
    recogniser bundles, voice and voice activity bundle, and to ``more`` (name: target, e.g.
    the machine's managed environments). Everything else written there (conversations) is
    the test's own."""
    links = {
        "recognisers": recogniser_data(tmp_path_factory) / "recognisers",
        "voices": export_once(tmp_path_factory).data_dir / "voices",
        "vad": vad_folder(tmp_path_factory),
        **more,
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, target in links.items():
        link = folder / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target, target_is_directory=True)
    return folder
