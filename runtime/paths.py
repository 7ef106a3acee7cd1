"""Where the application keeps its files: platform user directories, never the install folder.

``OMNI_EDGE_DATA_DIR`` and ``OMNI_EDGE_CONFIG_DIR`` override them (tests, portable setups).
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "omni-edge-studio"
DATA_PLACEHOLDER = "${data}"


def data_dir() -> Path:
    """User data: managed environments, voice bundles, tiny test models."""
    override = os.environ.get("OMNI_EDGE_DATA_DIR")
    return Path(override) if override else Path(platformdirs.user_data_dir(APP_NAME))


def config_dir() -> Path:
    """User configuration: the saved device selection."""
    override = os.environ.get("OMNI_EDGE_CONFIG_DIR")
    return Path(override) if override else Path(platformdirs.user_config_dir(APP_NAME))


def expand_data_placeholder(text: str) -> str:
    """Replace a leading ``${data}`` with :func:`data_dir` (pipelines name user-data bundles)."""
    if text == DATA_PLACEHOLDER or text.startswith(DATA_PLACEHOLDER + "/"):
        return str(data_dir()) + text[len(DATA_PLACEHOLDER) :]
    return text
