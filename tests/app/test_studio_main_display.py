"""``omni-edge-studio`` without a display explains itself instead of letting Qt abort."""

from __future__ import annotations

import pytest

from app.main import main


def test_no_display_is_a_clear_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(name, raising=False)
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "no display found" in err
    assert "--self-test" in err
