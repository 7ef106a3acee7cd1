"""Finding the demo assets in a checkout, an installed wheel, a frozen build or an override."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import runtime.assets as assets
from runtime.assets import (
    ASSETS_ENV,
    AssetsNotFound,
    UnknownDemo,
    assets_candidates,
    assets_dir,
    demo_pipeline,
    demo_pipelines,
)
from runtime.errors import EXIT_FAILED, EXIT_USAGE

REPO = Path(__file__).resolve().parents[2]


def _assets(root: Path, *pipelines: str) -> Path:
    (root / "pipelines").mkdir(parents=True)
    for name in pipelines:
        (root / "pipelines" / f"{name}.yaml").write_text("pipeline: x\n", encoding="utf-8")
    return root


@pytest.fixture(autouse=True)
def no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ASSETS_ENV, raising=False)


def test_a_checkout_uses_the_assets_folder_beside_the_packages() -> None:
    assert [layout for layout, _ in assets_candidates()] == ["installed", "checkout"]
    assert assets_dir() == REPO / "assets"
    assert demo_pipeline("add") == REPO / "assets" / "pipelines" / "add.yaml"
    assert REPO / "assets" / "pipelines" / "mlp-chain.yaml" in demo_pipelines()


def test_an_installed_package_uses_its_packaged_assets_before_anything_else(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    package = tmp_path / "site-packages" / "runtime"
    packaged = _assets(package / "_assets", "add")
    # A stray top-level assets/ in site-packages is not the runtime's.
    _assets(tmp_path / "site-packages" / "assets", "other")
    monkeypatch.setattr(assets, "_PACKAGE_DIR", package)

    assert assets_dir() == packaged
    assert demo_pipeline("add") == packaged / "pipelines" / "add.yaml"


def test_a_frozen_build_uses_the_assets_inside_its_bundle(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bundled = _assets(tmp_path / "bundle" / "assets", "add")
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path / "bundle"), raising=False)

    assert assets_candidates()[0] == ("frozen", bundled)
    assert assets_dir() == bundled


def test_the_environment_variable_overrides_every_layout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    chosen = _assets(tmp_path / "mine", "b", "a")
    monkeypatch.setenv(ASSETS_ENV, str(chosen))

    assert assets_candidates() == [(ASSETS_ENV, chosen)]
    assert demo_pipelines() == [chosen / "pipelines" / "a.yaml", chosen / "pipelines" / "b.yaml"]


def test_missing_assets_name_every_place_looked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(assets, "_PACKAGE_DIR", tmp_path / "site-packages" / "runtime")

    with pytest.raises(AssetsNotFound) as caught:
        assets_dir()

    message = str(caught.value)
    assert f"installed: {tmp_path / 'site-packages' / 'runtime' / '_assets'}" in message
    assert f"checkout: {tmp_path / 'site-packages' / 'assets'}" in message
    assert ASSETS_ENV in message
    assert caught.value.exit_code == EXIT_FAILED


def test_an_unknown_demo_lists_the_available_ones(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(ASSETS_ENV, str(_assets(tmp_path, "add", "mlp-chain")))

    with pytest.raises(UnknownDemo, match=r"no demo pipeline named 'nope' .*'add', 'mlp-chain'"):
        demo_pipeline("nope")
    assert UnknownDemo("x").exit_code == EXIT_USAGE
