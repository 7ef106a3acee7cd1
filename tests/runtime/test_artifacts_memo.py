"""A sound bundle is hashed once per process while its files keep their stats; a changed,
recent or broken one is checked again."""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
from helpers.onnx_graphs import EXTERNAL_WEIGHTS, make_bundle

import runtime.artifacts
from runtime.artifacts import forget_bundle_reports, inspect_bundle, verify_bundle
from runtime.errors import VerificationError

if TYPE_CHECKING:
    from pathlib import Path

#: The settle tick these tests use (the file systems here stamp to the nanosecond).
TICK_S = 0.05


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Each file name hashed from now on, counted; a short settle tick."""
    counts: Counter[str] = Counter()
    hash_and_size = runtime.artifacts._hash_and_size

    def counted(path: Path, *args: Any, **kwargs: Any) -> tuple[str, int]:
        counts[path.name] += 1
        return hash_and_size(path, *args, **kwargs)

    monkeypatch.setattr(runtime.artifacts, "_hash_and_size", counted)
    monkeypatch.setattr(runtime.artifacts, "STAMP_GRANULARITY_S", TICK_S)
    return counts


def settled_bundle(tmp_path: Path, hashed: Counter[str]) -> Path:
    """A bundle last written more than a tick ago; nothing counted yet."""
    manifest = make_bundle(tmp_path, kind="matmul", external_weights=True)
    time.sleep(2 * TICK_S)
    hashed.clear()
    return manifest


def test_a_sound_bundle_is_hashed_once(tmp_path: Path, hashed: Counter[str]) -> None:
    manifest = settled_bundle(tmp_path, hashed)
    first = verify_bundle(manifest)
    assert hashed[EXTERNAL_WEIGHTS] == 1
    again = verify_bundle(manifest.parent)  # the directory names the same bundle
    report = inspect_bundle(manifest)
    assert hashed[EXTERNAL_WEIGHTS] == 1
    assert again == first
    assert report.ok
    assert report.verified() == first
    forget_bundle_reports()
    verify_bundle(manifest)
    assert hashed[EXTERNAL_WEIGHTS] == 2


def test_a_changed_file_is_hashed_again_and_refused(tmp_path: Path, hashed: Counter[str]) -> None:
    manifest = settled_bundle(tmp_path, hashed)
    verify_bundle(manifest)
    weights = manifest.parent / EXTERNAL_WEIGHTS
    data = bytearray(weights.read_bytes())
    data[5] ^= 0x01
    stat = weights.stat()
    weights.write_bytes(bytes(data))
    # Even with the old modification time put back, the change time moved.
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(VerificationError) as caught:
        verify_bundle(manifest)
    assert (caught.value.code, caught.value.subject) == ("hash_mismatch", EXTERNAL_WEIGHTS)
    assert hashed[EXTERNAL_WEIGHTS] == 2
    # Nothing of the refused check stands: the next check hashes again.
    with pytest.raises(VerificationError):
        verify_bundle(manifest)
    assert hashed[EXTERNAL_WEIGHTS] == 3


def test_a_bundle_changed_within_the_tick_is_hashed_each_time(
    tmp_path: Path, hashed: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write in the same clock tick as the check could leave the stat alike: such a report
    never stands for another check."""
    monkeypatch.setattr(runtime.artifacts, "STAMP_GRANULARITY_S", 3600.0)
    manifest = make_bundle(tmp_path, kind="matmul", external_weights=True)
    hashed.clear()
    verify_bundle(manifest)
    verify_bundle(manifest)
    assert hashed[EXTERNAL_WEIGHTS] == 2


def test_a_broken_bundle_is_checked_again_once_repaired(
    tmp_path: Path, hashed: Counter[str]
) -> None:
    manifest = settled_bundle(tmp_path, hashed)
    npz = manifest.parent / "inputs.npz"
    kept = npz.read_bytes()
    npz.unlink()
    report = inspect_bundle(manifest)
    assert not report.ok
    with pytest.raises(VerificationError) as caught:
        verify_bundle(manifest)
    assert caught.value.code == "missing_file"
    npz.write_bytes(kept)
    assert verify_bundle(manifest).manifest_path == manifest
    assert hashed[EXTERNAL_WEIGHTS] == 3
