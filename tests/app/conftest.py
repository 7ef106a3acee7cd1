"""Studio test fixtures: isolated user folders, demo bundles, windows that always shut down,
and a guard that fails any test leaving a QThread or a Python thread running.

Child processes, shared memory and ledger reservations are guarded for every test by
``tests/conftest.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from PySide6.QtCore import QThread

from tests.app.support import running_threads
from tests.workers.support import make_loop_bundle

REPO_ROOT = Path(__file__).resolve().parents[2]
LIBJACK_METADATA = Path("/dev/shm") / f"jack_db-{os.getuid()}"
#: Test modules of the studio's Qt-free modules.
QT_FREE_TESTS = ("test_presenters", "test_conversations")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every studio test drives real Qt widgets, except the Qt-free modules' (presenters,
    conversations: no QApplication)."""
    here = Path(__file__).parent
    for item in items:
        path = Path(str(item.fspath))
        if here in path.parents and not path.name.startswith(QT_FREE_TESTS):
            item.add_marker(pytest.mark.gui)


@pytest.fixture(autouse=True)
def no_leaked_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[QThread]]:
    """Fail a test that leaves a QThread (or any thread it started) running."""
    started: list[QThread] = []
    original = QThread.start

    def tracking_start(self: QThread, *args: Any) -> None:
        started.append(self)
        original(self, *args)

    monkeypatch.setattr(QThread, "start", tracking_start)
    before = {thread.ident for thread in threading.enumerate() if thread.ident is not None}
    yield started
    leaked = running_threads(started, before)
    if leaked:
        pytest.fail("threads left running: " + ", ".join(leaked))


@pytest.fixture(autouse=True)
def libjack_metadata() -> Iterator[None]:
    """Listing audio devices starts PortAudio, whose JACK probe makes libjack create its
    metadata folder in /dev/shm even with no JACK server; remove it when this test made it.
    Anything else new in /dev/shm still fails the test (``tests/conftest.py``)."""
    existed = LIBJACK_METADATA.exists()
    yield
    servers = [p for p in psutil.process_iter(["name"]) if p.info["name"] in ("jackd", "jackdbus")]
    if not existed and not servers and LIBJACK_METADATA.is_dir():
        shutil.rmtree(LIBJACK_METADATA, ignore_errors=True)


@pytest.fixture(autouse=True)
def user_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The device selection, settings and user data live in the test's own folders."""
    config = tmp_path / "config"
    monkeypatch.setenv("OMNI_EDGE_CONFIG_DIR", str(config))
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(tmp_path / "data"))
    return config


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``bundles/`` built by ``assets/build_demos.py`` and a copy of ``pipelines/``, laid out
    as under ``assets/`` (``OMNI_EDGE_ASSETS`` can point here)."""
    root = tmp_path_factory.mktemp("studio-assets")
    subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "assets" / "build_demos.py"),
            "--out",
            str(root / "bundles"),
        ],
        check=True,
        capture_output=True,
    )
    shutil.copytree(REPO_ROOT / "assets" / "pipelines", root / "pipelines")
    shutil.copytree(REPO_ROOT / "assets" / "topologies", root / "topologies")
    return root


@pytest.fixture(scope="session")
def loop_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A graph whose call runs ``n`` steps: with a huge ``n`` it runs until cancelled."""
    return make_loop_bundle(tmp_path_factory.mktemp("studio-loop"))


@pytest.fixture
def endless_inputs(loop_manifest: Path, tmp_path: Path) -> Path:
    """Inputs for the loop graph that keep it computing until it is cancelled."""
    with np.load(loop_manifest.parent / "inputs.npz", allow_pickle=False) as archive:
        x = archive["x"]
    path = tmp_path / "endless.npz"
    np.savez(path, x=x, n=np.array(10**12, np.int64))
    return path


@pytest.fixture
def make_window(qtbot: Any, tmp_path: Path, demo_root: Path) -> Iterator[Callable[..., Any]]:
    """Create studio windows; each is closed (runtime shut down) when the test ends."""
    from app.models import RunState
    from app.settings import StudioSettings
    from app.window import MainWindow

    windows: list[MainWindow] = []

    def make(**options: Any) -> MainWindow:
        options.setdefault("settings", StudioSettings(tmp_path / "config" / "studio.ini"))
        options.setdefault("demos_folder", demo_root / "pipelines")
        window = MainWindow(**options)
        # Not qtbot.addWidget: it would delete the window before its runtime has shut down.
        windows.append(window)
        window.show()
        return window

    yield make
    for window in windows:
        if window.bridge.state is not RunState.CLOSED:
            with qtbot.waitSignal(window.bridge.shut_down, timeout=30_000):
                window.close()
        window.deleteLater()
