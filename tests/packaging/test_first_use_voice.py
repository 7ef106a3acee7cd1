"""The studio exports a voice a pipeline names on first use: which voices count as missing,
and which are exported. A voice the installation ships (the frozen application carries the
speech demo's exported bundles) is never missing, so nothing is exported for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.adapters.voice_bundles import EXPORT_FORMAT
from runtime.assets import ASSETS_ENV
from runtime.pipeline_files import export_missing_voices, missing_voices
from tests.helpers.distributions import REPO

SPEAK = REPO / "assets" / "pipelines" / "speak.yaml"


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    data = tmp_path / "data"
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(data))
    monkeypatch.delenv(ASSETS_ENV, raising=False)
    return data


def test_the_speech_demo_needs_the_joe_voice_until_its_bundles_are_there(data_dir: Path) -> None:
    voice = data_dir / "voices" / "joe"
    assert missing_voices(SPEAK) == ["joe"]
    (voice / "acoustic").mkdir(parents=True)
    (voice / "acoustic" / "manifest.json").write_text("{}", encoding="utf-8")
    assert missing_voices(SPEAK) == ["joe"]  # the decoder's bundle is still missing
    (voice / "decoder").mkdir()
    (voice / "decoder" / "manifest.json").write_text("{}", encoding="utf-8")
    assert missing_voices(SPEAK) == []


def test_a_previous_releases_export_counts_as_missing(data_dir: Path) -> None:
    """Bundles of an older export format are exported again once, on first use."""
    voice = data_dir / "voices" / "joe"
    for part in ("acoustic", "decoder"):
        (voice / part).mkdir(parents=True)
        manifest = {"metadata": {"voice_export_format": EXPORT_FORMAT - 1}}
        (voice / part / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    assert missing_voices(SPEAK) == ["joe"]
    for part in ("acoustic", "decoder"):
        manifest = {"metadata": {"voice_export_format": EXPORT_FORMAT}}
        (voice / part / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    assert missing_voices(SPEAK) == []


def test_pipelines_without_user_data_voices_need_none(data_dir: Path, tmp_path: Path) -> None:
    assert missing_voices(REPO / "assets" / "pipelines" / "add.yaml") == []
    assert missing_voices(tmp_path / "absent.yaml") == []
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    assert missing_voices(binary) == []


def test_only_voices_this_installation_knows_are_exported(data_dir: Path, tmp_path: Path) -> None:
    pipeline = tmp_path / "other.yaml"
    pipeline.write_text(
        SPEAK.read_text(encoding="utf-8").replace("${data}/voices/joe/", "${data}/voices/nobody/"),
        encoding="utf-8",
    )
    heard: list[str] = []

    assert missing_voices(pipeline) == ["nobody"]
    assert export_missing_voices(pipeline, progress=heard.append) == []
    assert heard == []
    assert not data_dir.exists()


def test_a_shipped_voice_is_not_missing_and_nothing_is_exported(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assets = tmp_path / "assets"
    (assets / "pipelines").mkdir(parents=True)
    for part in ("acoustic", "decoder"):
        (assets / "voices" / "joe" / part).mkdir(parents=True)
        (assets / "voices" / "joe" / part / "manifest.json").write_text("{}", encoding="utf-8")
    monkeypatch.setenv(ASSETS_ENV, str(assets))
    heard: list[str] = []

    assert missing_voices(SPEAK) == []
    assert export_missing_voices(SPEAK, progress=heard.append) == []
    assert heard == []
    assert not data_dir.exists()

    # Half a shipped voice is still missing (the export then writes the user's own copy).
    (assets / "voices" / "joe" / "decoder" / "manifest.json").unlink()
    assert missing_voices(SPEAK) == ["joe"]
