"""Session-wide fixtures for the speech tests: the installed voice, Piper itself, and one export.

The export (cut, validation, two bundles) runs once per test session into a temporary voice
directory through :func:`ensure_voice_bundles`, the same call ``make run`` uses; it is shared
with the CLI and playback tests through :func:`tests.helpers.voice.export_once`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import onnxruntime as ort
import pytest
from piper import PiperVoice

from runtime.adapters.tts_text import Phonemizer, VoiceConfig
from runtime.adapters.voice_export import InstalledVoice, find_voice
from tests.helpers.voice import Exported, export_once

if TYPE_CHECKING:
    from pathlib import Path


@dataclass(frozen=True)
class Sessions:
    """In-process sessions on the exported graphs and on the uncut voice."""

    acoustic: ort.InferenceSession
    decoder: ort.InferenceSession
    full: ort.InferenceSession


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="session")
def installed_voice() -> InstalledVoice:
    return find_voice("joe")


@pytest.fixture(scope="session")
def voice_config(installed_voice: InstalledVoice) -> VoiceConfig:
    return VoiceConfig.load(installed_voice.config_path)


@pytest.fixture(scope="session")
def phonemizer(voice_config: VoiceConfig) -> Phonemizer:
    return Phonemizer(voice_config)


@pytest.fixture(scope="session")
def piper_voice(installed_voice: InstalledVoice) -> PiperVoice:
    return PiperVoice.load(installed_voice.model_path, installed_voice.config_path)


@pytest.fixture(scope="session")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    return export_once(tmp_path_factory)


@pytest.fixture(scope="session")
def sessions(exported: Exported, installed_voice: InstalledVoice) -> Sessions:
    return Sessions(
        acoustic=_session(exported.bundles.acoustic.graph_path),
        decoder=_session(exported.bundles.decoder.graph_path),
        full=_session(installed_voice.model_path),
    )
