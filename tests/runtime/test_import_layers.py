"""The runtime's import layers (import-linter): every module placed, no import exempted."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _layers_contract() -> dict[str, Any]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [contract for contract in contracts if contract["type"] == "layers"]
    return dict(layers)


def test_the_runtime_layers_place_every_module_and_exempt_no_import() -> None:
    contract = _layers_contract()
    assert contract["containers"] == ["runtime"]
    assert contract["exhaustive"] is True
    assert "ignore_imports" not in contract
    assert "exhaustive_ignores" not in contract
    # The bottom layers hold the leaves: the wire contracts, the errors and the event values,
    # and below them the frozen records and metrics the events carry.
    assert contract["layers"][-2:] == ["contracts | errors | events", "records | metrics"]


def test_every_import_contract_is_kept() -> None:
    done = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout
