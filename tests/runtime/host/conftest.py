"""Host tests start real processes: none may outlive its test, not even as a zombie."""

from __future__ import annotations

from collections.abc import Iterator

import psutil
import pytest


@pytest.fixture(autouse=True)
def no_children_left() -> Iterator[None]:
    """Stricter than the suite's guard, which ignores zombies: no child of any kind remains."""
    yield
    leftovers = []
    for child in psutil.Process().children(recursive=True):
        try:
            status = child.status()
        except psutil.NoSuchProcess:
            continue
        try:
            command = " ".join(child.cmdline()[:3])
        except psutil.Error:
            command = "(zombie)"
        leftovers.append(f"{child.pid} {status} {command}")
    assert not leftovers, f"child processes left behind: {leftovers}"
