"""Test-wide setup: headless Qt, and a guard that fails any test leaving residue behind."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.helpers.shm import session_segments

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

# A shell starting the suite in the background ignores SIGINT, and child processes would
# inherit that: the Ctrl+C tests then signal CLIs that cannot hear it. A handler (unlike an
# ignored signal) is reset to the default in every program this process starts.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

SHM_DIR = Path("/dev/shm")
GRACE_S = 3.0


#: Every shared-memory segment the runtime creates starts with this (see runtime.transport.shm).
SHM_PREFIX = "oe-"


#: Fixtures that need what a marker stands for: a test using one gets the marker, so a tier
#: (``make unit`` leaves out slow, vllm, package, audio, gui, model and faults; docs/testing.md)
#: selects by need without listing tests.
MARKER_FIXTURES = {
    "vllm": ("vllm_env", "tiny_model", "smollm2_model"),
    "audio": ("alsa_null", "jack_server"),
    "gui": ("qtbot", "make_window"),
    "package": ("wheelhouse", "project_wheel", "contracts_dist"),
    # The exported voice (tests/helpers/voice.py: one export per session, about a minute).
    "model": ("exported", "sessions", "voice"),
    # The reliability fault matrix: hung calls and kills waited out to their deadlines.
    "faults": ("fault_run",),
}
#: Folders whose every test gets the marker.
MARKER_FOLDERS = {"package": Path(__file__).parent / "packaging"}


# First: the -m selection (pytest's own hook of this name) must see the markers.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test by the fixtures it uses and the folder it is in."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        wanted = {marker for marker, fixtures in MARKER_FIXTURES.items() if used & set(fixtures)}
        wanted |= {m for m, folder in MARKER_FOLDERS.items() if item.path.is_relative_to(folder)}
        for marker in sorted(wanted):
            if item.get_closest_marker(marker) is None:
                item.add_marker(marker)


def _shm_entries() -> set[str]:
    """The runtime's segments of this session (see :mod:`tests.helpers.shm`)."""
    return session_segments(SHM_PREFIX)


def _live_children() -> list[psutil.Process]:
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
        except psutil.NoSuchProcess:
            continue
    return alive


def _describe(process: psutil.Process) -> str:
    try:
        return f"{process.pid} {' '.join(process.cmdline()[:4])}"
    except psutil.Error:
        return str(process.pid)


def _outstanding_reservations() -> list[object]:
    try:
        from runtime.ledger import outstanding_reservations
    except ImportError:
        return []
    return list(outstanding_reservations())


@pytest.fixture(autouse=True)
def fresh_bundle_checks() -> Iterator[None]:
    """Each test checks bundles afresh: no sound report of an earlier test stands for hashing."""
    from runtime.artifacts import forget_bundle_reports

    forget_bundle_reports()
    yield
    forget_bundle_reports()


@pytest.fixture(autouse=True)
def no_residue(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves a child process, a shared-memory segment or a reservation."""
    shm_before = _shm_entries()
    reservations_before = len(_outstanding_reservations())
    yield
    deadline = time.monotonic() + GRACE_S
    while True:
        children = _live_children()
        new_shm = _shm_entries() - shm_before
        reservations = _outstanding_reservations()
        if len(reservations) <= reservations_before:
            reservations = []
        if not (children or new_shm or reservations) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    problems = []
    if children:
        problems.append("child processes left running: " + ", ".join(map(_describe, children)))
        for child in children:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
    if new_shm:
        problems.append(f"shared memory left in /dev/shm: {sorted(new_shm)}")
        for name in new_shm:
            (SHM_DIR / name).unlink(missing_ok=True)
    if reservations:
        problems.append(f"ledger reservations left: {reservations}")
    if problems:
        pytest.fail(f"{request.node.nodeid} left residue: " + "; ".join(problems))
