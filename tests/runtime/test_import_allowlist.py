"""The deny-by-default import contract (tools/import_contracts.py) and its use in pyproject."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import grimp
import pytest

from tools.import_contracts import AllowlistContract

ROOT = Path(__file__).resolve().parents[2]


def _contract(**options: Any) -> AllowlistContract:
    return AllowlistContract(name="test", session_options={}, contract_options=options)


def _graph(*imports: tuple[str, str]) -> grimp.ImportGraph:
    graph = grimp.ImportGraph()
    for importer, imported in imports:
        for module in (importer, imported):
            parts = module.split(".")
            for depth in range(1, len(parts) + 1):
                graph.add_module(".".join(parts[:depth]))
        graph.add_import(
            importer=importer, imported=imported, line_number=7, line_contents=f"import {imported}"
        )
    return graph


def _allowlists() -> list[dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    return [contract for contract in contracts if contract["type"] == "allowlist"]


def test_a_module_added_on_either_side_is_refused_until_it_is_named() -> None:
    graph = _graph(
        ("app.window", "runtime.api"),
        ("app.window", "runtime.errors"),
        ("app.new_panel", "runtime.engine.orchestrator"),  # a new module, listed nowhere
        ("app.window", "app.widgets"),  # the source's own package is not in scope
        ("app.window", "numpy"),  # nor a third party
    )
    contract = _contract(
        source_modules=["app"], scope=["runtime"], allowed_modules=["runtime.api", "runtime.errors"]
    )
    check = contract.check(graph, verbose=False)
    assert not check.kept
    (violation,) = check.metadata["violations"]
    assert (violation.importer, violation.imported) == (
        "app.new_panel",
        "runtime.engine.orchestrator",
    )
    assert violation.line_numbers == (7,)


def test_an_allowed_package_allows_its_descendants_and_nothing_beside_it() -> None:
    graph = _graph(("workers.w", "runtime.transport.shm"), ("workers.w", "runtime.transporter"))
    contract = _contract(
        source_modules=["workers"], scope=["runtime"], allowed_modules=["runtime.transport"]
    )
    check = contract.check(graph, verbose=False)
    assert [v.imported for v in check.metadata["violations"]] == ["runtime.transporter"]


def test_only_allowed_imports_keep_the_contract() -> None:
    graph = _graph(("workers.w", "runtime.contracts.codec"), ("app.window", "runtime.api"))
    contract = _contract(
        source_modules=["workers"], scope=["runtime", "app"], allowed_modules=["runtime.contracts"]
    )
    assert contract.check(graph, verbose=False).kept


def test_a_name_that_does_not_exist_is_an_error_not_a_silent_allowance() -> None:
    graph = _graph(("workers.w", "runtime.contracts.codec"))
    contract = _contract(
        source_modules=["workers"], scope=["runtime"], allowed_modules=["runtime.contract"]
    )
    with pytest.raises(ValueError, match=r"runtime\.contract\b"):
        contract.check(graph, verbose=False)


def test_the_studio_and_the_workers_are_held_to_allowlists_as_whole_packages() -> None:
    by_source = {tuple(contract["source_modules"]): contract for contract in _allowlists()}
    assert set(by_source) == {("app",), ("workers",)}
    studio, workers = by_source[("app",)], by_source[("workers",)]
    assert "runtime.api" in studio["allowed_modules"]
    # Outside runtime.api, the engine is no one's to import: not the studio's, not a worker's.
    for contract in (studio, workers):
        assert not [
            name for name in contract["allowed_modules"] if name.startswith("runtime.engine")
        ]
    assert "app" in workers["scope"]
    assert not {"runtime.api", "runtime.serve", "runtime.backends"} & set(
        workers["allowed_modules"]
    )
