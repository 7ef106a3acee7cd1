"""Where the demo assets are: pipelines, the bundles they name, and topology files.

One layout in every form of the application (``pipelines/``, ``bundles/``, ``topologies/``),
found in this order:

* ``OMNI_EDGE_ASSETS`` names the folder (tests, portable setups);
* a frozen build carries it as ``assets/`` inside the bundle (``sys._MEIPASS``);
* an installed wheel carries it as package data, ``runtime/_assets``;
* a checkout has it as ``assets/`` beside the ``runtime`` package.

The folder is only read: pipelines name their bundles relative to themselves
(``../bundles/add/manifest.json``), and user data goes to :mod:`runtime.paths`. A build may
also ship exported voices in ``voices/<voice>/`` (the frozen application does), which
:func:`runtime.paths.voice_dir` reads until the user has a copy of their own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Final

from runtime.errors import OmniError, UsageError

__all__ = [
    "ASSETS_ENV",
    "PACKAGED_ASSETS",
    "SHIPPED_VOICES",
    "AssetsNotFound",
    "UnknownDemo",
    "assets_candidates",
    "assets_dir",
    "demo_pipeline",
    "demo_pipelines",
    "shipped_voice_dir",
]

ASSETS_ENV: Final = "OMNI_EDGE_ASSETS"
#: The assets' folder inside the installed ``runtime`` package (written by the wheel build).
PACKAGED_ASSETS: Final = "_assets"
#: The folder of exported voices inside the assets folder (``voices/<voice>/acoustic`` ...).
SHIPPED_VOICES: Final = "voices"
_PACKAGE_DIR: Final = Path(__file__).resolve().parent


class AssetsNotFound(OmniError):
    """No demo assets folder exists where this installation keeps it."""


class UnknownDemo(UsageError):
    """A demo pipeline name that the assets folder does not hold."""


def assets_candidates() -> list[tuple[str, Path]]:
    """``(layout, folder)`` pairs in the order :func:`assets_dir` tries them."""
    override = os.environ.get(ASSETS_ENV)
    if override:
        return [(ASSETS_ENV, Path(override))]
    candidates: list[tuple[str, Path]] = []
    bundle = getattr(sys, "_MEIPASS", None)
    if getattr(sys, "frozen", False) and isinstance(bundle, str):
        candidates.append(("frozen", Path(bundle) / "assets"))
    candidates.append(("installed", _PACKAGE_DIR / PACKAGED_ASSETS))
    candidates.append(("checkout", _PACKAGE_DIR.parent / "assets"))
    return candidates


def assets_dir() -> Path:
    """The first candidate folder that holds ``pipelines/``; raises :class:`AssetsNotFound`."""
    candidates = assets_candidates()
    for _layout, folder in candidates:
        if (folder / "pipelines").is_dir():
            return folder
    looked = "; ".join(f"{layout}: {folder}" for layout, folder in candidates)
    raise AssetsNotFound(
        f"no demo assets folder (one holding pipelines/) was found; looked in {looked}. "
        f"Set {ASSETS_ENV} to a folder with pipelines/, bundles/ and topologies/"
    )


def demo_pipelines() -> list[Path]:
    """Every demo pipeline file, sorted by name."""
    return sorted((assets_dir() / "pipelines").glob("*.yaml"))


def demo_pipeline(name: str) -> Path:
    """The demo pipeline ``name`` (``add`` is ``pipelines/add.yaml``); raises :class:`UnknownDemo`."""
    available = demo_pipelines()
    for path in available:
        if path.stem == name:
            return path
    names = ", ".join(repr(path.stem) for path in available) or "none"
    raise UnknownDemo(
        f"no demo pipeline named {name!r} in {assets_dir() / 'pipelines'}; available: {names}"
    )


def shipped_voice_dir(voice: str) -> Path | None:
    """``<assets>/voices/<voice>`` when this installation ships that voice's exported bundles
    (the frozen application does; a checkout or a wheel does not), else None. Never raises:
    no assets folder means no shipped voice."""
    try:
        folder = assets_dir() / SHIPPED_VOICES / voice
    except AssetsNotFound:
        return None
    return folder if folder.is_dir() else None
