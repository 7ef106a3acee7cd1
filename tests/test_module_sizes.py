"""The house stays in rooms: no module of the studio, the runtime or the workers grows past 900
lines (split it by concern instead)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 900


def test_no_module_is_over_900_lines() -> None:
    over = {
        str(path.relative_to(REPO)): count
        for package in ("app", "runtime", "workers")
        for path in sorted((REPO / package).rglob("*.py"))
        if (count := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not over, f"modules over {MAX_LINES} lines: {over}"
