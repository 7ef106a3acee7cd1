"""Build the desktop application with PyInstaller and pack the Linux archive.

    python packaging/build_frozen.py [--outdir dist] [--workdir build/frozen] [--if-changed]

Runs PyInstaller on ``packaging/omni-edge-studio.spec`` (one folder), adds the desktop
entry, the icons and ``install-desktop-entry.sh`` beside the executable, and packs
``<outdir>/omni-edge-studio-<version>-linux-x86_64.tar.gz`` holding one folder,
``omni-edge-studio-<version>/``. The archive is reproducible for the same inputs (sorted
members, fixed owner and times). ``--if-changed`` keeps an existing archive whose inputs
(the project's sources, assets, packaging files and the installed distributions) are
unchanged, recorded in ``<archive>.inputs``. The demo bundles must be built first
(``make bundles``); the speech demo's voice is exported into ``build/voices`` by the spec
(once per release of the voice package). PyInstaller needs ``objdump`` and the spec's ICU
data trimming ``as``, ``ld`` (Debian: binutils) and ``icupkg`` (Debian: icu-devtools).
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
SPEC: Final = ROOT / "packaging" / "omni-edge-studio.spec"
NAME: Final = "omni-edge-studio"
LINUX_FILES: Final = (
    (ROOT / "packaging" / "linux" / f"{NAME}.desktop", 0o644),
    (ROOT / "packaging" / "linux" / "install-desktop-entry.sh", 0o755),
    (ROOT / "assets" / "icon" / f"{NAME}.png", 0o644),
    (ROOT / "assets" / "icon" / f"{NAME}.svg", 0o644),
)
#: Files and trees whose content decides the build (with the installed distributions).
INPUT_FILES: Final = (
    "packaging/omni-edge-studio.spec",
    "packaging/launcher.py",
    "packaging/rthook_frozen.py",
    "packaging/build_frozen.py",
    "packaging/icu_data.py",
    "packaging/linux",
    "assets/icon",
    "assets/pipelines",
    "assets/topologies",
    "assets/bundles",
    "runtime",
    "workers",
    "app",
)
_IGNORED_PARTS: Final = frozenset({"__pycache__"})
#: Modification time of every archive member (2020-01-01), so equal inputs give equal bytes.
ARCHIVE_MTIME: Final = 1577836800


class BuildError(Exception):
    """The application cannot be built here; the message says what is missing."""


def project_version(root: Path = ROOT) -> str:
    """``__version__`` of ``runtime/__init__.py``, read without importing it."""
    init = root / "runtime" / "__init__.py"
    for node in ast.parse(init.read_text(encoding="utf-8"), str(init)).body:
        if (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == ["__version__"]
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    raise BuildError(f"{init}: no `__version__ = '...'` assignment")


def platform_tag() -> str:
    """``linux-x86_64`` on the machines this archive is built for."""
    return f"{sys.platform}-{platform.machine().lower()}"


def archive_name(version: str, tag: str) -> str:
    return f"{NAME}-{version}-{tag}.tar.gz"


def _input_paths(root: Path) -> list[Path]:
    paths: list[Path] = []
    for entry in INPUT_FILES:
        path = root / entry
        if path.is_file():
            paths.append(path)
        elif path.is_dir():
            paths.extend(
                p
                for p in path.rglob("*")
                if p.is_file()
                and not _IGNORED_PARTS.intersection(p.relative_to(root).parts)
                and p.suffix != ".pyc"
            )
    return sorted(paths)


def input_digest(root: Path = ROOT) -> str:
    """SHA-256 over the build's inputs: the files of :data:`INPUT_FILES` and the name and
    version of every distribution installed in this interpreter's environment."""
    digest = hashlib.sha256()
    for path in _input_paths(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    installed = sorted(
        f"{dist.metadata['Name']}=={dist.version}"
        for dist in importlib.metadata.distributions()
        if dist.metadata["Name"]
    )
    digest.update("\n".join([sys.version, *installed]).encode())
    return digest.hexdigest()


#: Tools the Linux build runs, with the Debian package of each.
LINUX_TOOLS: Final = (
    ("objdump", "binutils", "PyInstaller needs it to read shared libraries"),
    ("as", "binutils", "the ICU data library is re-linked with it"),
    ("ld", "binutils", "the ICU data library is re-linked with it"),
    ("icupkg", "icu-devtools", "it trims ICU's data package"),
)


def check_tools() -> None:
    """PyInstaller and, on Linux, the tools of :data:`LINUX_TOOLS`."""
    try:
        importlib.metadata.version("pyinstaller")
    except importlib.metadata.PackageNotFoundError:
        raise BuildError(
            "PyInstaller is not installed in this environment; install the development "
            "extra: pip install -e '.[dev]'"
        ) from None
    if sys.platform.startswith("linux"):
        for tool, package, why in LINUX_TOOLS:
            if shutil.which(tool) is None:
                raise BuildError(
                    f"{tool} is missing; {why} (Debian/Ubuntu: apt-get install {package})"
                )
    if not (ROOT / "assets" / "bundles" / "add" / "manifest.json").is_file():
        raise BuildError("the demo bundles are not built: run `make bundles` first")


def run_pyinstaller(workdir: Path) -> Path:
    """Run the spec; return the one-folder application it wrote."""
    dist = workdir / "dist"
    command = [
        sys.executable,
        "-m",
        "PyInstaller",
        "--noconfirm",
        "--log-level",
        "WARN",
        "--distpath",
        str(dist),
        "--workpath",
        str(workdir / "work"),
        str(SPEC),
    ]
    result = subprocess.run(command, cwd=ROOT, check=False)
    if result.returncode != 0:
        raise BuildError(f"PyInstaller exited {result.returncode}: {' '.join(command)}")
    folder = dist / NAME
    if not (folder / NAME).is_file():
        raise BuildError(f"PyInstaller wrote no executable at {folder / NAME}")
    return folder


def tree_size(folder: Path) -> tuple[int, int]:
    """(bytes, files) of the regular files under ``folder`` (links not followed)."""
    total = count = 0
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
            count += 1
    return total, count


def _reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = ARCHIVE_MTIME
    if info.isdir() or info.mode & 0o111:
        info.mode = 0o755
    else:
        info.mode = 0o644
    return info


def pack(folder: Path, top: str, archive: Path) -> None:
    """``archive`` (gzip) holding ``folder`` as ``top/``, members sorted, owner root."""
    partial = archive.with_name(archive.name + ".partial")
    with (
        partial.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        tar.add(folder, arcname=top, recursive=False, filter=_reset)
        for path in sorted(folder.rglob("*")):
            tar.add(
                path,
                arcname=f"{top}/{path.relative_to(folder).as_posix()}",
                recursive=False,
                filter=_reset,
            )
    os.replace(partial, archive)


@dataclass(frozen=True, slots=True)
class BuildRecord:
    """What one build wrote; kept beside the archive as ``<archive>.inputs`` (JSON)."""

    archive: str
    version: str
    inputs: str
    unpacked_bytes: int
    files: int
    archive_bytes: int
    pyinstaller: str
    pyinstaller_s: float
    build_s: float
    rebuilt: bool = True

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def read(cls, stamp: Path) -> BuildRecord | None:
        """The record in ``stamp``; None when it is missing or not one this script wrote."""
        try:
            fields = json.loads(stamp.read_text(encoding="utf-8"))
            return cls(**{**fields, "rebuilt": False})
        except (OSError, ValueError, TypeError):
            return None

    def summary(self) -> str:
        mib = 1024 * 1024
        return (
            f"{self.archive}: {self.archive_bytes / mib:.1f} MiB packed, "
            f"{self.unpacked_bytes / mib:.1f} MiB ({self.unpacked_bytes / 1e6:.1f} MB) in "
            f"{self.files} files unpacked"
            + (f"; built in {self.build_s:.0f} s" if self.rebuilt else "; inputs unchanged")
        )


def build(outdir: Path, workdir: Path, *, if_changed: bool = False) -> BuildRecord:
    """Build the archive into ``outdir`` (see the module's docstring)."""
    if not sys.platform.startswith("linux"):
        raise BuildError(
            "the archive is built on Linux; on Windows run PyInstaller on "
            "packaging/omni-edge-studio.spec and Inno Setup on "
            "packaging/windows/omni-edge-studio.iss (see the script's header)"
        )
    version = project_version()
    archive = outdir / archive_name(version, platform_tag())
    stamp = archive.with_name(archive.name + ".inputs")
    digest = input_digest()
    if if_changed and archive.is_file():
        recorded = BuildRecord.read(stamp)
        if recorded is not None and recorded.inputs == digest:
            return recorded
    check_tools()
    started = time.perf_counter()
    folder = run_pyinstaller(workdir)
    frozen_s = time.perf_counter() - started
    for source, mode in LINUX_FILES:
        target = folder / source.name
        shutil.copyfile(source, target)
        target.chmod(mode)
    size, files = tree_size(folder)
    outdir.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    pack(folder, f"{NAME}-{version}", archive)
    record = BuildRecord(
        archive=str(archive),
        version=version,
        inputs=digest,
        unpacked_bytes=size,
        files=files,
        archive_bytes=archive.stat().st_size,
        pyinstaller=importlib.metadata.version("pyinstaller"),
        pyinstaller_s=round(frozen_s, 1),
        build_s=round(time.perf_counter() - started, 1),
    )
    fields = record.to_json()
    del fields["rebuilt"]
    stamp.write_text(json.dumps(fields, indent=2) + "\n", encoding="utf-8")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outdir", type=Path, default=ROOT / "dist", help="for the archive")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=ROOT / "build" / "frozen",
        help="PyInstaller's work and output folders (kept: later builds reuse its cache)",
    )
    parser.add_argument(
        "--if-changed",
        action="store_true",
        help="keep an existing archive built from the same inputs",
    )
    args = parser.parse_args(argv)
    try:
        record = build(args.outdir.resolve(), args.workdir.resolve(), if_changed=args.if_changed)
    except BuildError as exc:
        print(f"build_frozen: {exc}", file=sys.stderr)
        return 1
    print(record.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
