"""Hypothesis profiles for the contract tests.

``fast`` (the default) keeps ``make test`` quick; ``HYPOTHESIS_PROFILE=slow`` runs
100,000 examples per property and marks the property tests ``slow`` so that
``make slow`` (``pytest -m slow``) selects them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, is_hypothesis_test, settings

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "fast")

settings.register_profile("fast", max_examples=100, deadline=None)
settings.register_profile(
    "slow",
    max_examples=100_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(PROFILE)

_HERE = Path(__file__).parent
SLOW_TIMEOUT_S = 4 * 3600


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if PROFILE != "slow":
        return
    for item in items:
        if item.path.is_relative_to(_HERE) and is_hypothesis_test(getattr(item, "obj", None)):
            item.add_marker(pytest.mark.slow)
            # 100,000 examples outlast the suite's default per-test timeout.
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
