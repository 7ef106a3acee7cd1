"""Wheel build step that pyproject.toml cannot express: the demo assets as package data.

The checkout keeps the demo assets in ``assets/`` beside the packages. A wheel carries
the read-only part of them (pipelines, their prebuilt bundles, topology files) as
``runtime/_assets``, where ``runtime.assets.assets_dir`` finds them once installed. Every
bundle a pipeline names relative to itself must have been built first (``make bundles``).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
ASSETS = ROOT / "assets"
PACKAGED = Path("runtime", "_assets")
#: (folder under assets/, file pattern) copied into the wheel.
SHIPPED = (
    ("pipelines", "*.yaml"),
    ("topologies", "*.yaml"),
    ("topologies", "README.md"),
    ("icon", "omni-edge-studio.png"),
)
_BUNDLE_REFERENCE = re.compile(r"^\s*manifest:\s*\.\./bundles/([A-Za-z0-9._-]+)/manifest\.json\s*$")


def referenced_bundles() -> list[str]:
    """Names of the bundles the shipped pipelines reference relative to themselves."""
    names: set[str] = set()
    for pipeline in sorted((ASSETS / "pipelines").glob("*.yaml")):
        for line in pipeline.read_text(encoding="utf-8").splitlines():
            match = _BUNDLE_REFERENCE.match(line)
            if match:
                names.add(match.group(1))
    return sorted(names)


def copy_assets(target: Path) -> list[Path]:
    """Replace ``target`` with the shipped assets; return the files written."""
    if target.exists():
        shutil.rmtree(target)
    written: list[Path] = []
    for folder, pattern in SHIPPED:
        for source in sorted((ASSETS / folder).glob(pattern)):
            destination = target / folder / source.name
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)
            written.append(destination)
    for name in referenced_bundles():
        bundle = ASSETS / "bundles" / name
        if not (bundle / "manifest.json").is_file():
            raise SystemExit(
                f"assets/bundles/{name}/manifest.json is missing, but a demo pipeline names it: "
                "build the demo bundles first (make bundles, or python assets/build_demos.py)"
            )
        files = (p for p in bundle.rglob("*") if p.is_file() and not p.name.startswith("."))
        for source in sorted(files):
            destination = target / "bundles" / name / source.relative_to(bundle)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)
            written.append(destination)
    return written


class BuildPyWithAssets(build_py):
    """``build_py`` that also writes the demo assets into the built ``runtime`` package."""

    def initialize_options(self) -> None:
        super().initialize_options()
        self._assets: list[Path] = []

    def run(self) -> None:
        super().run()
        # An editable install runs from the checkout, which has assets/ already.
        if not self.editable_mode:
            self._assets = copy_assets(Path(self.build_lib) / PACKAGED)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), *map(str, self._assets)]


setup(cmdclass={"build_py": BuildPyWithAssets})
