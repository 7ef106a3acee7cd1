"""Where the bundled demo pipelines and topology files are (checkout, install or frozen build)."""

from __future__ import annotations

from pathlib import Path

import yaml

from runtime.assets import AssetsNotFound
from runtime.assets import assets_dir as runtime_assets_dir

#: Demos listed first, in this order; any other pipeline follows alphabetically.
PREFERRED = ("speak", "speech", "add", "mlp-chain")
#: The application icon inside the assets folder.
ICON = Path("icon", "omni-edge-studio.png")


def assets_dir() -> Path:
    """The installation's assets folder (see :func:`runtime.assets.assets_dir`).

    Where there is none, the checkout's place for it: the studio then lists no demos.
    """
    try:
        return runtime_assets_dir()
    except AssetsNotFound:
        return Path(__file__).resolve().parent.parent / "assets"


def icon_path() -> Path | None:
    """The application icon, if this installation has it."""
    path = assets_dir() / ICON
    return path if path.is_file() else None


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
