"""packaging/build_frozen.py: names, the inputs' digest, the archive's form, the rebuild cache."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest

from runtime import __version__
from tests.packaging.frozen import load_build_frozen

bf = load_build_frozen()


def test_the_archive_is_named_after_the_version_and_the_platform() -> None:
    assert bf.project_version() == __version__
    assert bf.archive_name("0.1.0", "linux-x86_64") == "omni-edge-studio-0.1.0-linux-x86_64.tar.gz"
    assert bf.platform_tag() == "linux-x86_64"


def _tree(root: Path) -> Path:
    for entry in bf.INPUT_FILES:
        path = root / entry
        if entry.endswith((".py", ".spec")):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"# {entry}\n", encoding="utf-8")
        else:
            path.mkdir(parents=True, exist_ok=True)
            (path / "file.txt").write_text(entry, encoding="utf-8")
    return root


def test_the_input_digest_follows_sources_and_ignores_bytecode(tmp_path: Path) -> None:
    root = _tree(tmp_path / "checkout")
    first = bf.input_digest(root)
    assert bf.input_digest(root) == first

    cache = root / "runtime" / "__pycache__"
    cache.mkdir()
    (cache / "module.cpython-311.pyc").write_bytes(b"\0bytecode")
    (root / "app" / "stale.pyc").write_bytes(b"\0bytecode")
    assert bf.input_digest(root) == first

    (root / "runtime" / "file.txt").write_text("changed", encoding="utf-8")
    changed = bf.input_digest(root)
    assert changed != first

    (root / "runtime" / "file.txt").rename(root / "runtime" / "renamed.txt")
    assert bf.input_digest(root) not in (first, changed)


def test_the_archive_holds_one_folder_owned_by_root_and_is_reproducible(tmp_path: Path) -> None:
    folder = tmp_path / "app"
    (folder / "_internal" / "sub").mkdir(parents=True)
    (folder / "omni-edge-studio").write_bytes(b"\x7fELF")
    (folder / "omni-edge-studio").chmod(0o700)
    (folder / "_internal" / "sub" / "data.txt").write_text("data", encoding="utf-8")
    (folder / "_internal" / "link.so").symlink_to("sub/data.txt")

    bf.pack(folder, "top-1.0", tmp_path / "a.tar.gz")
    (folder / "_internal" / "sub" / "data.txt").touch()  # a newer time changes nothing
    bf.pack(folder, "top-1.0", tmp_path / "b.tar.gz")

    assert (tmp_path / "a.tar.gz").read_bytes() == (tmp_path / "b.tar.gz").read_bytes()
    assert not list(tmp_path.glob("*.partial"))
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        members = {member.name: member for member in tar.getmembers()}
    assert list(members) == [
        "top-1.0",
        "top-1.0/_internal",
        "top-1.0/_internal/link.so",
        "top-1.0/_internal/sub",
        "top-1.0/_internal/sub/data.txt",
        "top-1.0/omni-edge-studio",
    ]
    assert {(m.uname, m.uid, m.mtime) for m in members.values()} == {("root", 0, bf.ARCHIVE_MTIME)}
    assert members["top-1.0/omni-edge-studio"].mode == 0o755
    assert members["top-1.0/_internal/sub/data.txt"].mode == 0o644
    assert members["top-1.0/_internal/link.so"].issym()
    assert members["top-1.0/_internal/link.so"].linkname == "sub/data.txt"


def test_an_unchanged_build_is_kept_without_running_pyinstaller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / bf.archive_name(__version__, bf.platform_tag())
    archive.write_bytes(b"archive")
    recorded = {
        "archive": str(archive),
        "version": __version__,
        "inputs": bf.input_digest(),
        "unpacked_bytes": 5,
        "files": 1,
        "archive_bytes": 7,
        "pyinstaller": "6",
        "pyinstaller_s": 1.0,
        "build_s": 2.0,
    }
    stamp = archive.with_name(archive.name + ".inputs")
    stamp.write_text(json.dumps(recorded), encoding="utf-8")

    def refuse(workdir: Path) -> Path:
        raise AssertionError(f"PyInstaller ran in {workdir}")

    monkeypatch.setattr(bf, "run_pyinstaller", refuse)
    record = bf.build(tmp_path, tmp_path / "work", if_changed=True)
    assert record.rebuilt is False
    assert record.unpacked_bytes == 5
    assert "inputs unchanged" in record.summary()

    # Other inputs, or a stamp this script did not write, mean a rebuild.
    stamp.write_text(json.dumps({**recorded, "inputs": "0" * 64}), encoding="utf-8")
    with pytest.raises(AssertionError, match="PyInstaller ran"):
        bf.build(tmp_path, tmp_path / "work", if_changed=True)
    stamp.write_text("{not json", encoding="utf-8")
    with pytest.raises(AssertionError, match="PyInstaller ran"):
        bf.build(tmp_path, tmp_path / "work", if_changed=True)


def test_a_missing_objdump_is_named_with_its_package(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    real_which = shutil.which
    monkeypatch.setattr(
        bf.shutil, "which", lambda name: None if name == "objdump" else real_which(name)
    )
    assert bf.main(["--outdir", str(tmp_path / "out"), "--workdir", str(tmp_path / "w")]) == 1
    error = capsys.readouterr().err
    assert "objdump is missing" in error
    assert "apt-get install binutils" in error
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("tool", "package"), [("icupkg", "icu-devtools"), ("ld", "binutils")])
def test_a_missing_icu_data_tool_is_named_with_its_package(
    tool: str,
    package: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    real_which = shutil.which
    monkeypatch.setattr(bf.shutil, "which", lambda name: None if name == tool else real_which(name))
    assert bf.main(["--outdir", str(tmp_path / "out"), "--workdir", str(tmp_path / "w")]) == 1
    error = capsys.readouterr().err
    assert f"{tool} is missing" in error
    assert f"apt-get install {package}" in error
    assert not (tmp_path / "out").exists()
