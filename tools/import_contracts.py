"""An import-linter contract that denies by default: ``allowlist``.

Every module of ``source_modules`` (packages: each descendant too, so a new module is covered
without being listed) may import a module of the ``scope`` packages only where that module is
named in ``allowed_modules`` (itself or a package above it). Imports outside the scope (the
standard library, third parties, the source's own package) are not this contract's concern.
A new module in the scope is therefore refused until someone names it, with a reason.

Registered in pyproject.toml (``contract_types``); ``lint-imports`` runs from the checkout's
root, which it puts on ``sys.path``, so ``tools.import_contracts`` imports from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from importlinter import Contract, ContractCheck, fields, output

if TYPE_CHECKING:
    import grimp


@dataclass(frozen=True)
class Violation:
    importer: str
    imported: str
    line_numbers: tuple[int, ...]


def _within(module: str, packages: tuple[str, ...]) -> bool:
    """Whether ``module`` is one of ``packages`` or below one of them."""
    return any(module == package or module.startswith(package + ".") for package in packages)


class AllowlistContract(Contract):
    """Modules of ``source_modules`` import from ``scope`` only what ``allowed_modules`` names.

    Configuration options:
        - source_modules: the packages held to the list (with every descendant).
        - scope: the packages whose modules are refused unless allowed.
        - allowed_modules: the modules (with their descendants) that may be imported.
    """

    type_name = "allowlist"

    source_modules = fields.ListField(subfield=fields.ModuleField())
    scope = fields.ListField(subfield=fields.ModuleField())
    allowed_modules = fields.ListField(subfield=fields.ModuleField(), required=False)

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        sources = tuple(module.name for module in self.source_modules)  # type: ignore[attr-defined]
        scope = tuple(module.name for module in self.scope)  # type: ignore[attr-defined]
        allowed = tuple(module.name for module in self.allowed_modules or [])  # type: ignore[attr-defined]
        missing = [name for name in (*sources, *scope, *allowed) if name not in graph.modules]
        if missing:
            # A stale name would silently allow (or check) nothing: say which.
            raise ValueError(
                f"contract {self.name!r} names modules that do not exist: {', '.join(missing)}"
            )
        importers: set[str] = set()
        for source in sources:
            importers.add(source)
            importers.update(graph.find_descendants(source))
        violations = []
        for importer in sorted(importers):
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                if not _within(imported, scope) or _within(imported, allowed):
                    continue
                if _within(imported, sources):
                    continue
                details = graph.get_import_details(importer=importer, imported=imported)
                lines = tuple(sorted({detail["line_number"] for detail in details}))
                violations.append(Violation(importer, imported, lines))
        return ContractCheck(kept=not violations, metadata={"violations": violations})

    def render_broken_contract(self, check: ContractCheck) -> None:
        violations: list[Violation] = check.metadata["violations"]
        output.print_error("Imports of modules the contract does not allow:", bold=False)
        output.new_line()
        for violation in violations:
            lines = ", ".join(map(str, violation.line_numbers))
            output.print_error(f"- {violation.importer} -> {violation.imported} (l.{lines})")
        output.new_line()
