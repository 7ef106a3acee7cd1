"""The default voice for tests: one export per machine and code, the speak pipeline, speech
checks.

Session fixtures defined in one directory's conftest are not visible in another, so the
export lives here, memoized by the session's base temporary directory: the speech adapter,
CLI and playback tests all use the same bundles. The export itself (about a minute) is made
once into a cache keyed by the runtime's source and the installed voice release, under a
file lock: both passes of ``make test`` and every pytest-xdist worker copy it into their own
session (a fraction of a second), and a change to the runtime's code makes a new export.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from runtime.adapters.voice_export import (
    VoiceBundles,
    ensure_voice_bundles,
    find_voice,
    load_voice_bundles,
)
from runtime.config import load_pipeline

if TYPE_CHECKING:
    from runtime.config import PipelineConfig

_EXPORTS: dict[Path, Exported] = {}


@dataclass(frozen=True)
class Exported:
    """The session's voice bundles; ``data_dir`` is what ``OMNI_EDGE_DATA_DIR`` should be
    for pipelines that name ``${data}/voices/joe``."""

    bundles: VoiceBundles
    root: Path
    seconds: float

    @property
    def data_dir(self) -> Path:
        return self.root.parent.parent


def export_once(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    """The voice ``joe`` in ``<basetemp>/voice-data/voices/joe``: copied from the machine's
    test cache (see the module), exported there first if it is not."""
    base = tmp_path_factory.getbasetemp()
    found = _EXPORTS.get(base)
    if found is None:
        cached, seconds = _cached_export()
        root = base / "voice-data" / "voices" / "joe"
        shutil.copytree(cached, root)
        found = _EXPORTS[base] = Exported(load_voice_bundles(root), root, seconds)
    return found


REPO = Path(__file__).resolve().parents[2]
#: The machine's cache of test exports (one per key; older keys are removed).
CACHE = Path(tempfile.gettempdir()) / "omni-edge-test-voice"


def _export_key() -> str:
    """The runtime's source and the installed voice release: what an export depends on."""
    digest = hashlib.sha256()
    installed = find_voice("joe")
    digest.update(f"{installed.source.package}=={installed.version}".encode())
    for path in sorted((REPO / "runtime").rglob("*.py")):
        digest.update(path.relative_to(REPO).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _cached_export() -> tuple[Path, float]:
    """The cached export's folder and how long it took (exporting it under the lock if it is
    missing; another process waits for it)."""
    key = _export_key()
    CACHE.mkdir(exist_ok=True)
    folder = CACHE / key
    record = CACHE / f"{key}.json"
    with (CACHE / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if record.exists() and folder.is_dir():
            return folder, float(json.loads(record.read_text())["seconds"])
        for old in CACHE.iterdir():
            if old.is_dir():
                shutil.rmtree(old)
            elif old.name != "lock":
                old.unlink()
        started = time.perf_counter()
        ensure_voice_bundles("joe", folder)
        seconds = time.perf_counter() - started
        record.write_text(json.dumps({"seconds": seconds}))
        return folder, seconds


SPEAK_PIPELINE = REPO / "assets" / "pipelines" / "speak.yaml"


def speak_config(exported: Exported, **options: Any) -> PipelineConfig:
    """``assets/pipelines/speak.yaml`` on the session's bundles, with adapter options replaced."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMNI_EDGE_DATA_DIR", str(exported.data_dir))
        config = load_pipeline(SPEAK_PIPELINE)
    assert config.adapter is not None
    if options:
        adapter = dataclasses.replace(config.adapter, options={**config.adapter.options, **options})
        config = dataclasses.replace(config, adapter=adapter)
    return config


def _loud_frames(audio: np.ndarray, n_fft: int = 1024, hop: int = 256) -> np.ndarray:
    frames = np.lib.stride_tricks.sliding_window_view(np.asarray(audio, np.float64), n_fft)[::hop]
    rms = np.sqrt(np.mean(frames**2, axis=1))
    return frames[rms > 0.1 * rms.max()]


def spectral_flatness(audio: np.ndarray) -> float:
    """Median spectral flatness of the louder frames: about 0.56 for white noise, near 0 for
    speech (harmonics and formants)."""
    frames = _loud_frames(audio)
    power = np.abs(np.fft.rfft(frames * np.hanning(frames.shape[1]), axis=1)) ** 2 + 1e-12
    return float(np.median(np.exp(np.mean(np.log(power), axis=1)) / np.mean(power, axis=1)))


def voiced_fraction(audio: np.ndarray, sample_rate: int) -> float:
    """Share of the louder frames with a clear pitch between 70 and 400 Hz (autocorrelation)."""
    voiced = 0
    frames = _loud_frames(audio)
    for frame in frames:
        centred = frame - frame.mean()
        correlation = np.correlate(centred, centred, "full")[centred.size - 1 :]
        if correlation[0] <= 0:
            continue
        peak = correlation[sample_rate // 400 : sample_rate // 70].max() / correlation[0]
        voiced += peak > 0.5
    return voiced / max(1, len(frames))


def assert_speech(audio: np.ndarray, sample_rate: int) -> None:
    """Audible (not silence), harmonic (not noise) and pitched in the range of a voice.
    Measured on the voice joe: flatness below 0.001, about half of the frames voiced; white
    noise: flatness 0.56, no frame voiced."""
    rms = float(np.sqrt(np.mean(np.asarray(audio, np.float64) ** 2)))
    assert rms > 0.005, f"the audio is (nearly) silent: RMS {rms:.5f}"
    flatness = spectral_flatness(audio)
    assert flatness < 0.1, f"the audio sounds like noise: spectral flatness {flatness:.3f}"
    voiced = voiced_fraction(audio, sample_rate)
    assert voiced >= 0.25, f"only {voiced:.0%} of the audio has a voice's pitch"
