"""Built distributions: the project's wheel, omni-stage-contracts, and a wheelhouse."""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

import pytest

from tests.helpers.distributions import CONSTRAINTS, REPO, WHEELHOUSE, run

#: What a wheel build of the project needs from the checkout (assets/bundles is built anew).
PROJECT_FILES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md")
PROJECT_TREES = (
    "runtime",
    "workers",
    "app",
    "assets/pipelines",
    "assets/topologies",
    "assets/icon",
)


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    """``build/wheelhouse`` holding the wheels of the project's dependencies."""
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "dependencies"
    ]
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
            "--only-binary",
            ":all:",
            "-c",
            str(CONSTRAINTS),
            "-d",
            str(WHEELHOUSE),
            *dependencies,
        ],
        cwd=REPO,
        timeout=600,
    )
    return WHEELHOUSE


@pytest.fixture(scope="session")
def project_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built from a copy of the checkout with freshly built bundles."""
    root = tmp_path_factory.mktemp("project-build")
    source = root / "source"
    for name in PROJECT_FILES:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / name, source / name)
    for tree in PROJECT_TREES:
        shutil.copytree(
            REPO / tree, source / tree, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    run(
        [
            sys.executable,
            str(REPO / "assets" / "build_demos.py"),
            "--out",
            str(source / "assets" / "bundles"),
        ],
        cwd=root,
        timeout=300,
    )
    run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(root / "dist"), str(source)],
        cwd=root,
        timeout=300,
    )
    (wheel,) = (root / "dist").glob("omni_edge_studio-*-py3-none-any.whl")
    return wheel


@pytest.fixture(scope="session")
def contracts_dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """omni-stage-contracts' ``sdist`` and ``wheel``, built by packaging/build_contracts.py."""
    root = tmp_path_factory.mktemp("contracts-build")
    run(
        [
            sys.executable,
            str(REPO / "packaging" / "build_contracts.py"),
            "--stage",
            str(root / "stage"),
            "--outdir",
            str(root / "dist"),
        ],
        cwd=root,
        timeout=300,
    )
    (sdist,) = (root / "dist").glob("omni_stage_contracts-*.tar.gz")
    (wheel,) = (root / "dist").glob("omni_stage_contracts-*-py3-none-any.whl")
    return {"sdist": sdist, "wheel": wheel}
