"""The record a built-in model folder carries: what it is and the sha256 of every file.

A built-in model (the tiny test model, the converted SmolLM2) is made once into the user
data directory, in a folder written beside its final place and renamed into it when
complete, with ``omni-edge-model.json`` naming its kind, its version and the sha256 of
every other file. The folder is used only while that record verifies: a missing,
truncated or altered file, or a folder of an older version, is made again.

Hashing a model's files takes a third of a second per 260 MB, on the way to every load. Once
they verify, ``omni-edge-model.checked.json`` keeps each file's size, modification time and
inode, with the digest of the record they verified against: while those are unchanged the
files are not hashed again (as git's index and make trust a file's status). Writing to a
file, truncating, replacing or removing it changes them, and the next check hashes again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import stat
from pathlib import Path
from typing import Any, Final

__all__ = [
    "CHECKED_NAME",
    "MARKER_NAME",
    "ModelBuildError",
    "marker_ready",
    "remove_partials",
    "sha256_file",
    "write_marker",
]

MARKER_NAME: Final = "omni-edge-model.json"
#: The status of the files when they last verified against the record (see the module).
CHECKED_NAME: Final = "omni-edge-model.checked.json"
#: Folders being written are named ``<final name><PARTIAL>-<pid>`` beside the final one.
PARTIAL: Final = ".partial"


class ModelBuildError(RuntimeError):
    """A built-in model could not be made; names the command and the tail of its output."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def marker_ready(model_dir: Path, *, version: int, kind: str | None = None) -> bool:
    """True when ``model_dir`` holds a complete model of this ``kind`` and ``version``, every
    file intact."""
    try:
        marker = json.loads((Path(model_dir) / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or marker.get("version") != version:
        return False
    if kind is not None and marker.get("kind") != kind:
        return False
    files = marker.get("files")
    if not isinstance(files, dict) or not files:
        return False
    folder = Path(model_dir)
    record = hashlib.sha256(json.dumps(marker, sort_keys=True).encode()).hexdigest()
    status = _status(folder, files)
    if status is None:
        return False
    if _checked(folder) == {"record": record, "files": status}:
        return True
    for name, expected in files.items():
        if sha256_file(folder / str(name)) != expected:
            return False
    # Kept for the next check; a folder this user cannot write to is hashed each time.
    with contextlib.suppress(OSError):
        (folder / CHECKED_NAME).write_text(json.dumps({"record": record, "files": status}))
    return True


def _status(folder: Path, files: dict[str, Any]) -> dict[str, list[int]] | None:
    """Each file's size, modification time and inode; None when one is missing."""
    status: dict[str, list[int]] = {}
    for name in files:
        try:
            found = (folder / str(name)).stat()
        except OSError:
            return None
        if not stat.S_ISREG(found.st_mode):
            return None
        status[str(name)] = [found.st_size, found.st_mtime_ns, found.st_ino]
    return status


def _checked(folder: Path) -> object:
    try:
        return json.loads((folder / CHECKED_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_marker(folder: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Hash every file of ``folder`` and write the marker: ``record`` plus ``files``."""
    files = {
        path.name: sha256_file(path)
        for path in sorted(folder.iterdir())
        if path.is_file() and path.name not in (MARKER_NAME, CHECKED_NAME)
    }
    marker = {**record, "files": files}
    (folder / MARKER_NAME).write_text(json.dumps(marker, indent=2), encoding="utf-8")
    return marker


def remove_partials(target: Path) -> None:
    """Remove folders a killed build left beside ``target`` (``<name>.partial-<pid>``)."""
    parent = target.parent
    if not parent.is_dir():
        return
    for leftover in parent.glob(f"{target.name}{PARTIAL}-*"):
        shutil.rmtree(leftover, ignore_errors=True)
