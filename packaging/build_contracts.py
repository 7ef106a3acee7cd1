"""Build ``omni-stage-contracts``: the stage contracts as a distribution of their own.

    python packaging/build_contracts.py [--outdir dist] [--stage DIR] [--stage-only]

Stages ``packages/omni-stage-contracts`` (pyproject.toml, README.md) together with a copy
of ``runtime/contracts`` (its modules and ``conformance/``, fixtures included) and of
``runtime/wire.py`` as the import package ``omni_stage_contracts``, then builds its source
archive and wheel from the stage with ``python -m build``. The code is not forked: only
import statements change, ``runtime.contracts`` becoming ``omni_stage_contracts``. Every
staged module is checked to import only the standard library and its own package (the
``wire`` module also NumPy, its optional extra). The version is ``runtime.__version__``.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
PROJECT: Final = ROOT / "packages" / "omni-stage-contracts"
PACKAGE: Final = "omni_stage_contracts"
SOURCE_PACKAGE: Final = "runtime.contracts"
#: Staged module (relative to the package) -> third-party top-level imports it may use.
EXTRA_IMPORTS: Final = {Path("wire.py"): frozenset({"numpy"})}
_FROM_IMPORT: Final = re.compile(r"^(\s*)from runtime\.contracts((?:\.\w+)*) import ", re.MULTILINE)


class BuildError(Exception):
    """The contracts cannot be staged or built; the message names the file and the cause."""


def project_version(root: Path | None = None) -> str:
    """``__version__`` of ``runtime/__init__.py`` (default: this checkout's), not imported."""
    init = (ROOT if root is None else root) / "runtime" / "__init__.py"
    for node in ast.parse(init.read_text(encoding="utf-8"), str(init)).body:
        if (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == ["__version__"]
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    raise BuildError(f"{init}: no `__version__ = '...'` assignment")


def rename_imports(source: str) -> str:
    """``source`` with every ``from runtime.contracts[.x] import`` naming the new package."""
    return _FROM_IMPORT.sub(rf"\1from {PACKAGE}\2 import ", source)


def check_imports(source: str, filename: str, allowed: frozenset[str] = frozenset()) -> None:
    """Raise :class:`BuildError` for an import outside the standard library, the package
    itself and ``allowed`` (relative imports stay inside the package)."""
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top != PACKAGE and top not in sys.stdlib_module_names and top not in allowed:
                raise BuildError(
                    f"{filename}:{node.lineno}: imports {name!r}; the contracts may import only "
                    f"the standard library and {PACKAGE}"
                    + (f" (this module also: {', '.join(sorted(allowed))})" if allowed else "")
                )


def _stage_module(root: Path, source_path: Path, target: Path, allowed: frozenset[str]) -> None:
    text = rename_imports(source_path.read_text(encoding="utf-8"))
    check_imports(text, source_path.relative_to(root).as_posix(), allowed)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")


def stage(stage_dir: Path, root: Path | None = None) -> Path:
    """Lay out the distribution's project in ``stage_dir`` (replaced); return its package.

    ``root`` is the project holding ``runtime/`` (default: this checkout).
    """
    root = ROOT if root is None else root
    contracts = root / "runtime" / "contracts"
    if stage_dir.exists():
        shutil.rmtree(stage_dir)
    stage_dir.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(PROJECT / name, stage_dir / name)
    package = stage_dir / "src" / PACKAGE
    sources = [(path, package / path.name) for path in sorted(contracts.glob("*.py"))]
    sources += [
        (path, package / "conformance" / path.name)
        for path in sorted((contracts / "conformance").glob("*.py"))
    ]
    sources.append((root / "runtime" / "wire.py", package / "wire.py"))
    staged: set[Path] = set()
    for source_path, target in sources:
        if target in staged:
            raise BuildError(f"{source_path}: {target.relative_to(stage_dir)} is staged twice")
        staged.add(target)
        allowed = EXTRA_IMPORTS.get(target.relative_to(package), frozenset())
        _stage_module(root, source_path, target, allowed)
    fixtures = sorted((contracts / "conformance").glob("*.json"))
    if not fixtures:
        raise BuildError(f"{contracts / 'conformance'}: no conformance fixtures (*.json)")
    for fixture in fixtures:
        shutil.copyfile(fixture, package / "conformance" / fixture.name)
    (package / "_version.py").write_text(
        f'"""The distribution\'s version: the project\'s at build time."""\n\n'
        f"__version__ = {project_version(root)!r}\n",
        encoding="utf-8",
    )
    (package / "py.typed").write_text("", encoding="utf-8")
    return package


def build(stage_dir: Path, outdir: Path) -> list[Path]:
    """Build the staged project's sdist and wheel into ``outdir``; return their paths."""
    outdir.mkdir(parents=True, exist_ok=True)
    before = set(outdir.iterdir())
    result = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(outdir), str(stage_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        raise BuildError(f"python -m build {stage_dir} failed ({result.returncode}):\n{tail}")
    version = project_version()
    expected = [
        outdir / f"{PACKAGE}-{version}.tar.gz",
        outdir / f"{PACKAGE}-{version}-py3-none-any.whl",
    ]
    missing = [path.name for path in expected if not path.is_file()]
    if missing:
        made = sorted(path.name for path in set(outdir.iterdir()) - before)
        raise BuildError(f"python -m build did not write {missing} into {outdir}; it wrote {made}")
    return expected


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--outdir", type=Path, default=ROOT / "dist", help="default: dist/")
    parser.add_argument(
        "--stage",
        type=Path,
        default=ROOT / "build" / "omni-stage-contracts",
        help="where the project is laid out (replaced; default: build/omni-stage-contracts)",
    )
    parser.add_argument("--stage-only", action="store_true", help="lay out the project only")
    args = parser.parse_args(argv)
    try:
        package = stage(args.stage)
        if args.stage_only:
            print(f"staged {package}")
            return 0
        for path in build(args.stage, args.outdir):
            print(f"built {path}")
    except BuildError as exc:
        print(f"build_contracts: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
