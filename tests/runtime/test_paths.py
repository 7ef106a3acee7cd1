"""``${data}`` paths: the user data directory, and a voice's bundles looked up in order (the
user's own copy, then a voice the installation ships, then the user's folder for an export)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from runtime.assets import ASSETS_ENV, shipped_voice_dir
from runtime.paths import data_dir, expand_data_placeholder, voice_dir

REPO = Path(__file__).resolve().parents[2]
MANIFEST = "${data}/voices/joe/acoustic/manifest.json"


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "data"
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(folder))
    monkeypatch.delenv(ASSETS_ENV, raising=False)
    return folder


def _shipping(root: Path, *voices: str) -> Path:
    """An assets folder (it holds pipelines/) that ships ``voices``."""
    (root / "pipelines").mkdir(parents=True)
    for voice in voices:
        (root / "voices" / voice / "acoustic").mkdir(parents=True)
    return root


def test_a_checkout_ships_no_voice_so_voices_resolve_to_the_user_data_directory(
    data: Path,
) -> None:
    assert not (REPO / "assets" / "voices").exists()
    assert shipped_voice_dir("joe") is None
    assert voice_dir("joe") == data / "voices" / "joe"
    assert expand_data_placeholder(MANIFEST) == f"{data}/voices/joe/acoustic/manifest.json"


def test_a_shipped_voice_is_read_in_place_until_the_user_has_an_own_copy(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assets = _shipping(tmp_path / "assets", "joe")
    monkeypatch.setenv(ASSETS_ENV, str(assets))

    assert shipped_voice_dir("joe") == assets / "voices" / "joe"
    assert voice_dir("joe") == assets / "voices" / "joe"
    assert expand_data_placeholder(MANIFEST) == f"{assets}/voices/joe/acoustic/manifest.json"
    assert expand_data_placeholder("${data}/voices/joe") == str(assets / "voices" / "joe")
    assert not data.exists()  # looking it up writes nothing

    (data / "voices" / "joe").mkdir(parents=True)
    assert voice_dir("joe") == data / "voices" / "joe"
    assert expand_data_placeholder(MANIFEST) == f"{data}/voices/joe/acoustic/manifest.json"


def test_a_voice_not_shipped_resolves_to_the_user_data_directory(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ASSETS_ENV, str(_shipping(tmp_path / "assets", "joe")))

    assert shipped_voice_dir("amy") is None
    assert voice_dir("amy") == data / "voices" / "amy"
    assert expand_data_placeholder("${data}/voices/amy/decoder/manifest.json") == (
        f"{data}/voices/amy/decoder/manifest.json"
    )


def test_a_frozen_build_ships_voices_inside_its_bundle(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "bundle"
    _shipping(bundle / "assets", "joe")
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(bundle), raising=False)

    assert voice_dir("joe") == bundle / "assets" / "voices" / "joe"


def test_other_data_paths_and_odd_voice_names_are_plain_user_data_paths(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assets = _shipping(tmp_path / "assets", "joe")
    (assets / "voices" / ".hidden").mkdir()
    monkeypatch.setenv(ASSETS_ENV, str(assets))

    assert expand_data_placeholder("${data}") == str(data)
    assert expand_data_placeholder("${data}/models/x.onnx") == f"{data}/models/x.onnx"
    assert expand_data_placeholder("${data}/voices") == f"{data}/voices"
    # Only a plain folder name is a voice: nothing climbs out of the voices folder.
    assert expand_data_placeholder("${data}/voices/../pipelines/a.yaml") == (
        f"{data}/voices/../pipelines/a.yaml"
    )
    assert expand_data_placeholder("${data}/voices/.hidden/x") == f"{data}/voices/.hidden/x"
    assert expand_data_placeholder("${database}/x") == "${database}/x"
    assert expand_data_placeholder("relative/${data}/x") == "relative/${data}/x"
    assert data_dir() == data
