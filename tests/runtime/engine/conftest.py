"""Fixtures for the engine tests: the demo bundles and pipelines, built once, and the machine."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from runtime.devices import DeviceSelection, discover_topology
from tests.workers.support import make_loop_bundle

if TYPE_CHECKING:
    from runtime.devices import Topology

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``bundles/`` built by ``assets/build_demos.py`` next to a copy of ``pipelines/*.yaml``,
    so the pipelines' relative manifest paths resolve as they do under ``assets/``."""
    root = tmp_path_factory.mktemp("demos")
    subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "assets" / "build_demos.py"),
            "--out",
            str(root / "bundles"),
        ],
        check=True,
        capture_output=True,
    )
    (root / "pipelines").mkdir()
    for pipeline in (REPO_ROOT / "assets" / "pipelines").glob("*.yaml"):
        shutil.copy(pipeline, root / "pipelines" / pipeline.name)
    return root


@pytest.fixture(scope="session")
def loop_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A graph whose call runs ``n`` steps (``n`` an input): a huge ``n`` runs until cancelled."""
    return make_loop_bundle(tmp_path_factory.mktemp("loop"))


@pytest.fixture(scope="session")
def machine() -> Topology:
    """This machine, discovered once."""
    return discover_topology()


@pytest.fixture
def options(machine: Topology) -> dict[str, Any]:
    """Engine options independent of the user's saved device selection."""
    return {"topology": machine, "selection": DeviceSelection()}
