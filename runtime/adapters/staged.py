"""Installing a folder made on first use (exported bundles) atomically, beside its target."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["install_staged"]

T = TypeVar("T")


def install_staged(
    target: Path,
    build: Callable[[Path], Path],
    *,
    current: Callable[[], T | None],
    load: Callable[[Path], T],
) -> T:
    """Make ``target`` with ``build`` and return it loaded.

    ``build`` gets an empty staging folder beside ``target`` and returns the folder it made
    there; that folder replaces ``target`` only when complete, so a failure leaves nothing
    behind and readers never see half a folder. When another process installs the same
    folder first, whichever copy ``current`` finds verified is kept.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.export-", dir=target.parent))
    retired: Path | None = None
    try:
        made = build(staging)
        if target.exists() or target.is_symlink():
            retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, retired / "previous")
        try:
            os.replace(made, target)
        except OSError:
            # Another process finished the same export first; keep whichever verifies.
            winner = current()
            if winner is None:
                raise
            return winner
        return load(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if retired is not None:
            shutil.rmtree(retired, ignore_errors=True)
