"""The studio's window icon: found in the installation's assets, loadable by Qt."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtGui import QIcon

from app.demos import icon_path

if TYPE_CHECKING:
    from pathlib import Path

    import pytest
    from pytestqt.qtbot import QtBot


def test_the_checkout_has_an_icon_qt_can_load(qtbot: QtBot) -> None:
    path = icon_path()
    assert path is not None
    icon = QIcon(str(path))
    assert not icon.isNull()
    assert icon.pixmap(64, 64).width() == 64


def test_an_assets_folder_without_the_icon_gives_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pipelines").mkdir()
    monkeypatch.setenv("OMNI_EDGE_ASSETS", str(tmp_path))
    assert icon_path() is None
