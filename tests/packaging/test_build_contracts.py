"""packaging/build_contracts.py: the staged contracts are the project's own files, renamed."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from runtime import __version__
from tests.helpers.distributions import REPO, load_build_contracts

bc = load_build_contracts()
CONTRACTS = REPO / "runtime" / "contracts"


def test_rename_imports_rewrites_only_import_statements() -> None:
    source = (
        '"""See :class:`~runtime.contracts.codec.Frame`."""\n'
        "from runtime.contracts.codec import FrameDecoder\n"
        "from runtime.contracts import DType\n"
        "from .buffers import BufferDescriptor\n"
        "if TYPE_CHECKING:\n"
        "    from runtime.contracts.codec import Frame\n"
        'REGENERATE = "python -m runtime.contracts.conformance.build_v1"\n'
    )

    renamed = bc.rename_imports(source)

    assert renamed.splitlines() == [
        '"""See :class:`~runtime.contracts.codec.Frame`."""',
        "from omni_stage_contracts.codec import FrameDecoder",
        "from omni_stage_contracts import DType",
        "from .buffers import BufferDescriptor",
        "if TYPE_CHECKING:",
        "    from omni_stage_contracts.codec import Frame",
        'REGENERATE = "python -m runtime.contracts.conformance.build_v1"',
    ]


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("import yaml\n", "yaml"),
        ("from runtime.errors import ConfigError\n", "runtime.errors"),
        ("def f():\n    import numpy as np\n", "numpy"),
    ],
)
def test_check_imports_names_the_file_line_and_module(source: str, module: str) -> None:
    with pytest.raises(bc.BuildError, match=rf"x\.py:\d+: imports '{module}'"):
        bc.check_imports(source, "x.py")


def test_check_imports_allows_stdlib_own_package_relative_and_listed_modules() -> None:
    bc.check_imports(
        "import json\nfrom . import codec\nfrom omni_stage_contracts.codec import Frame\n", "x.py"
    )
    bc.check_imports("import numpy as np\n", "wire.py", frozenset({"numpy"}))


def test_stage_copies_the_contracts_changing_only_their_imports(tmp_path: Path) -> None:
    package = bc.stage(tmp_path / "stage")

    sources = {path: package / path.name for path in CONTRACTS.glob("*.py")}
    sources |= {
        path: package / "conformance" / path.name
        for path in (CONTRACTS / "conformance").glob("*.py")
    }
    sources[REPO / "runtime" / "wire.py"] = package / "wire.py"
    for source, staged in sources.items():
        original = source.read_text(encoding="utf-8").splitlines()
        copied = staged.read_text(encoding="utf-8").splitlines()
        assert len(copied) == len(original), staged
        changed = [(a, b) for a, b in zip(original, copied, strict=True) if a != b]
        assert all(
            a.lstrip().startswith("from runtime.contracts")
            and b == a.replace("runtime.contracts", "omni_stage_contracts", 1)
            for a, b in changed
        ), changed
    assert (package / "conformance" / "v1.json").read_bytes() == (
        CONTRACTS / "conformance" / "v1.json"
    ).read_bytes()
    version = ast.literal_eval(
        (package / "_version.py").read_text(encoding="utf-8").split("__version__ = ")[1]
    )
    assert version == __version__
    assert (package / "py.typed").is_file()
    for name in ("pyproject.toml", "README.md"):
        assert (tmp_path / "stage" / name).read_bytes() == (bc.PROJECT / name).read_bytes()
    # The standard-library entry point never reaches the NumPy helpers.
    assert "wire" not in (package / "__init__.py").read_text(encoding="utf-8")


def test_stage_refuses_a_contract_module_with_a_third_party_import(tmp_path: Path) -> None:
    root = tmp_path / "project"
    shutil.copytree(REPO / "runtime" / "contracts", root / "runtime" / "contracts")
    shutil.copyfile(REPO / "runtime" / "__init__.py", root / "runtime" / "__init__.py")
    shutil.copyfile(REPO / "runtime" / "wire.py", root / "runtime" / "wire.py")
    (root / "runtime" / "contracts" / "extra.py").write_text(
        '"""x"""\n\nimport yaml\n', encoding="utf-8"
    )

    with pytest.raises(bc.BuildError, match=r"runtime/contracts/extra\.py:3: imports 'yaml'"):
        bc.stage(tmp_path / "stage", root)


def test_project_version_needs_a_literal_version(tmp_path: Path) -> None:
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "__init__.py").write_text("VERSION = '1'\n", encoding="utf-8")

    with pytest.raises(bc.BuildError, match=r"no `__version__ = '...'` assignment"):
        bc.project_version(tmp_path)


def test_main_reports_a_build_error_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "project"
    shutil.copytree(REPO / "runtime" / "contracts", root / "runtime" / "contracts")
    shutil.copyfile(REPO / "runtime" / "wire.py", root / "runtime" / "wire.py")
    (root / "runtime" / "__init__.py").write_text('"""No version."""\n', encoding="utf-8")
    monkeypatch.setattr(bc, "ROOT", root)

    assert bc.main(["--stage", str(tmp_path / "stage"), "--stage-only"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("build_contracts: ")
    assert "no `__version__" in err
