"""The project's wheel installed alone into a fresh environment runs the add demo exactly."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.distributions import REPO, clean_env, fresh_venv, pip_install, run

REQUESTS = 20

#: Run by the installed interpreter from a folder outside the checkout.
CHECK_SCRIPT = f"""
import json
import sys

import numpy as np
import psutil

import runtime
from runtime.api import Omni
from runtime.assets import assets_candidates, assets_dir, demo_pipeline
from runtime.ledger import outstanding_reservations

pipeline = demo_pipeline("add")
rng = np.random.default_rng(2024)
mismatches = []
forms = set()
with Omni.from_yaml(pipeline) as omni:
    workers = []
    for child in psutil.Process().children(recursive=True):
        workers.append(
            {{
                "cmdline": child.cmdline(),
                "pythonpath": child.environ().get("PYTHONPATH"),
                "python_flags": child.environ().get("PYTHONDONTWRITEBYTECODE"),
            }}
        )
    reserved_while_open = len(outstanding_reservations())
    for index in range({REQUESTS}):
        a = rng.standard_normal((1, 1024), dtype=np.float32)
        b = rng.standard_normal((1, 1024), dtype=np.float32)
        outputs = omni.run({{"a": a, "b": b}})
        total = outputs["sum"]
        forms.add(json.dumps([sorted(outputs), str(total.dtype), list(total.shape)]))
        if not np.array_equal(total, a + b):
            mismatches.append(index)
left = [
    child.pid
    for child in psutil.Process().children(recursive=True)
    if child.status() != psutil.STATUS_ZOMBIE
]
print(
    json.dumps(
        {{
            "executable": sys.executable,
            "runtime": runtime.__file__,
            "layouts": [[layout, str(folder)] for layout, folder in assets_candidates()],
            "assets": str(assets_dir()),
            "pipeline": str(pipeline),
            "requests": {REQUESTS},
            "mismatches": mismatches,
            "forms": sorted(forms),
            "workers": workers,
            "reserved_while_open": reserved_while_open,
            "reservations_after_close": [repr(item) for item in outstanding_reservations()],
            "children_after_close": left,
        }}
    )
)
"""


def _files(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in root.rglob("*")}


@pytest.fixture(scope="module")
def installed(
    project_wheel: Path, wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """A fresh environment with the project's wheel and its dependencies, nothing else."""
    root = tmp_path_factory.mktemp("installed")
    python = fresh_venv(root / "venv")
    pip_install(python, "--no-index", "--find-links", str(wheelhouse), str(project_wheel), cwd=root)
    (site,) = (root / "venv" / "lib").glob("python3*/site-packages")
    return {"root": root, "python": python, "site": site}


def test_the_wheel_carries_the_demo_assets_and_their_bundles(project_wheel: Path) -> None:
    names = set(zipfile.ZipFile(project_wheel).namelist())
    for pipeline in (REPO / "assets" / "pipelines").glob("*.yaml"):
        assert f"runtime/_assets/pipelines/{pipeline.name}" in names
    for topology in (REPO / "assets" / "topologies").glob("*.yaml"):
        assert f"runtime/_assets/topologies/{topology.name}" in names
    assert "runtime/_assets/icon/omni-edge-studio.png" in names
    for member in ("add/manifest.json", "add/add.onnx", "mlp-stage0/weights.bin"):
        assert f"runtime/_assets/bundles/{member}" in names
    assert "runtime/contracts/conformance/v1.json" in names
    assert not [name for name in names if "__pycache__" in name or name.endswith(".built")]


def test_installed_wheel_runs_twenty_add_requests_exactly_and_releases_everything(
    installed: dict[str, Path],
) -> None:
    root, python, site = installed["root"], installed["python"], installed["site"]
    work = root / "work"
    work.mkdir()
    script = work / "check.py"
    script.write_text(CHECK_SCRIPT, encoding="utf-8")
    before = _files(site / "runtime") | _files(site / "workers")
    env = clean_env(
        root / "home",
        OMNI_EDGE_DATA_DIR=str(root / "data"),
        OMNI_EDGE_CONFIG_DIR=str(root / "config"),
        PYTHONDONTWRITEBYTECODE="1",
    )

    result = run([str(python), "-s", str(script)], cwd=work, env=env, timeout=180)
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])

    assert Path(report["runtime"]).is_relative_to(site)
    assert report["assets"] == str(site / "runtime" / "_assets")
    assert ["installed", report["assets"]] in report["layouts"]
    assert report["pipeline"] == str(site / "runtime" / "_assets" / "pipelines" / "add.yaml")
    assert report["requests"] == REQUESTS
    assert report["mismatches"] == []
    assert report["forms"] == [json.dumps([["sum"], "float32", [1, 1024]])]
    # The worker imports runtime and workers from this environment, never from the checkout.
    (worker,) = report["workers"]
    assert worker["cmdline"][:3] == [str(python), "-m", "workers.ort_worker"]
    assert worker["pythonpath"] == str(site)
    assert str(REPO) not in json.dumps(report)
    assert report["reserved_while_open"] >= 1
    assert report["reservations_after_close"] == []
    assert report["children_after_close"] == []
    # Nothing was written into the installation or the working folder.
    assert _files(site / "runtime") | _files(site / "workers") == before
    assert _files(work) == {"check.py"}


def test_installed_commands_run_the_bundled_add_demo(installed: dict[str, Path]) -> None:
    root = installed["root"]
    bin_dir = root / "venv" / "bin"
    work = root / "cli-work"
    work.mkdir()
    env = clean_env(
        root / "home",
        OMNI_EDGE_DATA_DIR=str(root / "data"),
        OMNI_EDGE_CONFIG_DIR=str(root / "config"),
        PYTHONDONTWRITEBYTECODE="1",
    )
    locate = "from runtime.assets import demo_pipeline; print(demo_pipeline('add'))"
    demo = run([str(bin_dir / "python"), "-c", locate], cwd=work, env=env, timeout=60)
    pipeline = demo.stdout.strip()

    result = run([str(bin_dir / "omni-edge"), "run", pipeline], cwd=work, env=env, timeout=180)
    assert "sum: float32 [1, 1024]" in result.stdout.splitlines()

    # The studio's entry point is installed; without a display it says so instead of aborting.
    studio = subprocess.run(
        [str(bin_dir / "omni-edge-studio")],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert studio.returncode == 2, studio.stderr
    assert "no display found" in studio.stderr
    assert list(work.iterdir()) == []
