"""Fixtures for the graph worker tests: real bundles and real worker processes."""

from __future__ import annotations

from contextlib import ExitStack
from typing import TYPE_CHECKING

import pytest

from tests.helpers.onnx_graphs import make_bundle
from tests.workers.support import WorkerProcess, make_loop_bundle, running_worker

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path


@pytest.fixture
def add_manifest(tmp_path: Path) -> Path:
    return make_bundle(tmp_path, kind="add", name="add")


@pytest.fixture
def matmul_manifest(tmp_path: Path) -> Path:
    """``y = x @ W`` with W in ``weights.bin`` (ONNX external data)."""
    return make_bundle(tmp_path, kind="matmul", external_weights=True, name="matmul")


@pytest.fixture
def loop_manifest(tmp_path: Path) -> Path:
    return make_loop_bundle(tmp_path)


@pytest.fixture
def spawn_worker() -> Iterator[Callable[..., WorkerProcess]]:
    """Start ORT workers (see :func:`running_worker`); every one is reaped on teardown."""
    with ExitStack() as stack:

        def spawn(
            *, by_path: bool = False, generation: int = 1, shm: bool = False
        ) -> WorkerProcess:
            return stack.enter_context(
                running_worker(by_path=by_path, generation=generation, shm=shm)
            )

        yield spawn
