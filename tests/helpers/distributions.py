"""Helpers for installing built distributions into fresh environments outside the checkout.

Each environment is made with ``venv --without-pip`` (never ``--system-site-packages``)
and filled by this interpreter's pip (``pip --python``), with ``constraints.txt`` and
without compiling bytecode, which keeps an install of the whole runtime to seconds.
Dependencies come from ``build/wheelhouse``, downloaded once and reused.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
CONSTRAINTS = REPO / "constraints.txt"
WHEELHOUSE = REPO / "build" / "wheelhouse"


def run(
    argv: list[str], *, cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv``; fail the test with the command's output when it exits non-zero."""
    result = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        pytest.fail(
            f"{' '.join(argv)} exited {result.returncode}\n"
            f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
        )
    return result


def load_build_contracts() -> ModuleType:
    """``packaging/build_contracts.py`` as a module (``packaging`` is also a PyPI package)."""
    path = REPO / "packaging" / "build_contracts.py"
    spec = importlib.util.spec_from_file_location("build_contracts", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def fresh_venv(path: Path) -> Path:
    """A new virtual environment at ``path`` that sees no other site-packages; its python."""
    run([sys.executable, "-m", "venv", "--without-pip", str(path)], cwd=path.parent, timeout=60)
    config = (path / "pyvenv.cfg").read_text(encoding="utf-8")
    assert "include-system-site-packages = false" in config
    return path / "bin" / "python"


def pip_install(python: Path, *args: str, cwd: Path, timeout: float = 240) -> None:
    """``pip install`` into the environment of ``python``, with the project's constraints."""
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-compile",
            "--disable-pip-version-check",
            "-c",
            str(CONSTRAINTS),
            *args,
        ],
        cwd=cwd,
        timeout=timeout,
    )


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """A minimal environment for a program run from an installed environment."""
    env = {key: os.environ[key] for key in ("PATH", "LANG", "XDG_RUNTIME_DIR") if key in os.environ}
    env.update({"HOME": str(home), "TMPDIR": str(home)}, **extra)
    home.mkdir(parents=True, exist_ok=True)
    return env
