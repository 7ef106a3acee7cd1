"""``runtime.contracts`` loads nothing outside the standard library."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def modules_after(statement: str) -> dict[str, Any]:
    """Run ``statement`` in a fresh isolated interpreter; list sys.modules before and after.

    ``-I`` keeps the working directory off sys.path, so the repository root is put first
    explicitly: the check then holds whether or not the project is installed.
    """
    code = (
        "import sys, json; "
        f"sys.path.insert(0, {str(REPO)!r}); "
        "before = sorted(sys.modules); "
        f"{statement}; "
        "print(json.dumps({'before': before, 'after': sorted(sys.modules), "
        "'file': sys.modules['runtime'].__file__ if 'runtime' in sys.modules else None}))"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    loaded: dict[str, Any] = json.loads(result.stdout)
    return loaded


def outside_stdlib(names: list[str]) -> list[str]:
    return [
        name
        for name in names
        if name.split(".")[0] not in sys.stdlib_module_names and name.split(".")[0] != "runtime"
    ]


@pytest.mark.parametrize("module", ["runtime.contracts", "runtime.contracts.conformance"])
def test_import_loads_only_the_standard_library(module: str) -> None:
    loaded = modules_after(f"import {module}")
    assert loaded["file"] == str(REPO / "runtime" / "__init__.py")
    # What the interpreter loaded at startup (__main__, site hooks) is not the import's doing.
    new = sorted(set(loaded["after"]) - set(loaded["before"]))
    assert module in new
    assert outside_stdlib(new) == [], f"{module} loads modules outside the standard library"
    ours = [n for n in new if n.split(".")[0] == "runtime"]
    others = [n for n in ours if n != "runtime" and not n.startswith("runtime.contracts")]
    assert others == [], f"{module} loads other runtime modules: {others}"


def test_the_check_sees_a_third_party_import() -> None:
    loaded = modules_after("import hypothesis")
    new = sorted(set(loaded["after"]) - set(loaded["before"]))
    assert "hypothesis" in outside_stdlib(new)
