"""Where the bundled demo pipelines and topology files are (checkout, install or frozen build)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

ASSETS_ENV = "OMNI_EDGE_ASSETS"
#: Demos listed first, in this order; any other pipeline follows alphabetically.
PREFERRED = ("speak", "speech", "add", "mlp-chain")


def assets_dir() -> Path:
    override = os.environ.get(ASSETS_ENV)
    if override:
        return Path(override)
    frozen = getattr(sys, "_MEIPASS", None)
    if frozen is not None:
        return Path(frozen) / "assets"
    return Path(__file__).resolve().parent.parent / "assets"


def _rank(path: Path) -> tuple[int, str]:
    return (PREFERRED.index(path.stem) if path.stem in PREFERRED else len(PREFERRED), path.stem)


def demo_pipelines(folder: Path | None = None) -> list[tuple[Path, str]]:
    """(path, description) of every bundled demo pipeline."""
    folder = folder if folder is not None else assets_dir() / "pipelines"
    demos = []
    for path in sorted(folder.glob("*.yaml"), key=_rank):
        description = ""
        try:
            document = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            document = None
        if isinstance(document, dict) and isinstance(document.get("description"), str):
            description = document["description"]
        demos.append((path, description))
    return demos


def llm_environment(path: Path) -> str | None:
    """The managed environment a demo's local language-model stage runs in, if it has one.

    Such a demo needs that environment (``omni-edge env create NAME``) and a minute or more
    to start vLLM; a stage with a remote route (``url``) needs neither.
    """
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    stages = document.get("stages") if isinstance(document, dict) else None
    for stage in stages if isinstance(stages, list) else ():
        backend = stage.get("backend") if isinstance(stage, dict) else None
        if not isinstance(backend, dict) or backend.get("name") != "native.vllm.v1":
            continue
        route = backend.get("route")
        route = route if isinstance(route, dict) else {}
        if "url" in route:
            continue
        interpreter = route.get("interpreter", "env:vllm-cpu")
        if isinstance(interpreter, str) and interpreter.startswith("env:"):
            return interpreter.removeprefix("env:")
        return "vllm"
    return None


def default_demo(folder: Path | None = None) -> Path | None:
    """The speech demo when it is bundled, else the first demo."""
    demos = demo_pipelines(folder)
    return demos[0][0] if demos else None


def topology_files() -> list[Path]:
    return sorted((assets_dir() / "topologies").glob("*.yaml"))
