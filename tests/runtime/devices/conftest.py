"""Fixtures for the device tests."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private settings folder for the test, through the documented override."""
    folder = tmp_path / "config"
    monkeypatch.setenv("OMNI_EDGE_CONFIG_DIR", str(folder))
    return folder
