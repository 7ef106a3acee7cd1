"""Where the application keeps its files: platform user directories, never the install folder.

``OMNI_EDGE_DATA_DIR`` and ``OMNI_EDGE_CONFIG_DIR`` override them (tests, portable setups).

Pipelines name user data as ``${data}/...``. A voice's bundles, ``${data}/voices/<voice>/...``,
are looked up in this order (:func:`voice_dir`):

1. ``<data dir>/voices/<voice>`` when that folder exists: the user's own export (``omni-edge
   bundle export-voice``, or the studio's export on first use) always wins;
2. ``<assets>/voices/<voice>`` when this installation ships the voice
   (:func:`runtime.assets.shipped_voice_dir`): the frozen application carries the speech demo's
   voice exported at build time and reads it in place, never copying or writing it;
3. otherwise ``<data dir>/voices/<voice>``, where a first use exports it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final

import platformdirs

from runtime.assets import shipped_voice_dir

APP_NAME = "omni-edge-studio"
DATA_PLACEHOLDER = "${data}"
#: The folder of exported voices in the user data directory (and in a shipped assets folder).
VOICES: Final = "voices"
#: A voice's folder name; anything else under ``${data}/voices/`` is an ordinary data path.
_VOICE_NAME: Final = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


def data_dir() -> Path:
    """User data: managed environments, voice bundles, tiny test models."""
    override = os.environ.get("OMNI_EDGE_DATA_DIR")
    return Path(override) if override else Path(platformdirs.user_data_dir(APP_NAME))


def config_dir() -> Path:
    """User configuration: the saved device selection."""
    override = os.environ.get("OMNI_EDGE_CONFIG_DIR")
    return Path(override) if override else Path(platformdirs.user_config_dir(APP_NAME))


def voice_dir(voice: str) -> Path:
    """The folder voice ``voice``'s bundles are read from, in the order the module names: the
    user's copy when it exists, else the shipped one when there is one, else the user's
    (where an export writes it)."""
    own = data_dir() / VOICES / voice
    if own.is_dir():
        return own
    shipped = shipped_voice_dir(voice)
    return shipped if shipped is not None else own


def expand_data_placeholder(text: str) -> str:
    """Replace a leading ``${data}`` with :func:`data_dir`; a path under
    ``${data}/voices/<voice>`` goes to :func:`voice_dir` instead."""
    if text != DATA_PLACEHOLDER and not text.startswith(DATA_PLACEHOLDER + "/"):
        return text
    rest = text[len(DATA_PLACEHOLDER) :]
    parts = rest.split("/")  # ["", "voices", "<voice>", ...] for a voice's path
    if len(parts) >= 3 and parts[1] == VOICES and _VOICE_NAME.fullmatch(parts[2]):
        return "/".join([str(voice_dir(parts[2])), *parts[3:]])
    return str(data_dir()) + rest
