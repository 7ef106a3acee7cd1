"""Fixtures of the reliability suite: the engine tests' demo bundles and machine, a private
``TMPDIR`` per test, Hypothesis profiles, and the session's records.

``HYPOTHESIS_PROFILE=slow`` runs every fuzz target with 100,000 examples (or
``OMNI_FUZZ_EXAMPLES``) and marks it ``slow`` (so ``make slow`` selects it); the default
profile keeps ``make test`` quick.
When ``OMNI_RELIABILITY_RECORDS`` names a file, the session's records are written there
as JSON when it ends (``benchmarks/reliability.py`` reads them).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Generator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, is_hypothesis_test, settings

from tests.reliability.support import RECORDS, RECORDS_VARIABLE
from tests.runtime.engine.conftest import demo_root, loop_manifest, machine, options

__all__ = ["demo_root", "loop_manifest", "machine", "options"]

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "fast")
SLOW_EXAMPLES = int(os.environ.get("OMNI_FUZZ_EXAMPLES") or 100_000)
FAST_EXAMPLES = 100
SLOW_TIMEOUT_S = 4 * 3600

settings.register_profile("fast", max_examples=FAST_EXAMPLES, deadline=None)
settings.register_profile(
    "slow",
    max_examples=SLOW_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(PROFILE)

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if PROFILE != "slow":
        return
    for item in items:
        if item.path.is_relative_to(_HERE) and is_hypothesis_test(getattr(item, "obj", None)):
            item.add_marker(pytest.mark.slow)
            # 100,000 examples outlast the suite's default per-test timeout.
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item, so fixtures can record whether the test passed."""
    report: pytest.TestReport = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get(RECORDS_VARIABLE)
    if target and RECORDS:
        path = Path(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(RECORDS, indent=2) + "\n", encoding="utf-8")


@pytest.fixture
def private_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty ``TMPDIR`` for this test and the workers it starts (they inherit it)."""
    folder = tmp_path / "tmpdir"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder
