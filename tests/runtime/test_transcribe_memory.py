"""A long file streams through ``omni-edge transcribe`` in 30 s windows with bounded memory.

Each file is transcribed by the real command in a fresh process (44.1 kHz stereo FLAC read
block by block, features spooled to disk, every window read back, encoded and decoded by the
ONNX Runtime workers); the process then reports its own peak RSS (the high-water mark, so no
transient is missed) and its largest worker's. A longer file must not raise either peak
beyond a few MiB of noise, where the features and audio held in memory would add tens of MiB;
the issue's figure (peak at most 1.2x that of the short file) holds with room to spare.

Both comparisons run in ``make slow``: 6 minutes with 2 (speech at both ends, quiet noise
between, which the model skips as silence quickly) and 20 minutes of continuous speech with 2.
``make test`` checks the part that holds the memory at a smaller scale
(``test_cli_transcribe.py::test_features_of_a_long_file_need_their_own_memory_only``: 20
minutes read and featurised into spooled features, in one process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import soundfile as sf
import soxr

from runtime.adapters.whisper_export import export_missing_recognisers, spoken_clips

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / "assets" / "pipelines" / "transcribe.yaml"
RATE = 16_000
FIRST = "The quick brown fox jumps over the lazy dog."
SENTENCES = (
    FIRST,
    "Margaret Thompson flew from Chicago to Lisbon with her brother Daniel.",
    "On March 3, Dr. Alvarez paid $42 for 17 books.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "The library opens at eight and closes at nine, except on Sundays.",
    "Did you remember to lock the back door before we left?",
)
#: Bigger than the noise between two runs of the same file (about 5 MiB on a busy machine),
#: smaller than what the features alone of the longer file would add.
GROWTH_MIB = 8.0
CHILD = textwrap.dedent(
    """
    import json, resource, sys
    from benchmarks.rss import peak_rss_bytes
    from runtime.cli import main
    code = main(["transcribe", sys.argv[1], "--format", "verbose_json", "--out", sys.argv[2]])
    # This process's own high-water mark: getrusage's would start at its parent's size.
    mine = peak_rss_bytes() / 2**20
    # The largest reaped worker's, above what it inherits from this process when forked.
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"code": code, "controller_mib": mine, "worker_mib": workers}))
    """
)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A data folder with the recogniser made, which the children's ``${data}`` points at."""
    root = tmp_path_factory.mktemp("transcribe-memory-data")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMNI_EDGE_DATA_DIR", str(root))
        export_missing_recognisers(PIPELINE, lambda _line: None)
        yield root


def _write(path: Path, audio: np.ndarray) -> Path:
    """``audio`` (16 kHz) as 44.1 kHz stereo FLAC, so the reader resamples and mixes."""
    high = soxr.resample(audio, RATE, 44_100)
    sf.write(path, np.stack([high, 0.8 * high], axis=1), 44_100, format="FLAC")
    return path


def _quiet_with_speech_at_both_ends(first: np.ndarray, seconds: int) -> np.ndarray:
    rng = np.random.default_rng(seconds)
    audio = (0.001 * rng.standard_normal(seconds * RATE)).astype(np.float32)
    audio[RATE : RATE + first.size] += first
    end = (seconds - 10) * RATE
    audio[end : end + first.size] += first
    return audio


def _continuous_speech(clips: list[np.ndarray], seconds: int) -> np.ndarray:
    """The clips one after another with half a second of silence, repeated to ``seconds``."""
    pause = np.zeros(RATE // 2, np.float32)
    parts: list[np.ndarray] = []
    total = 0
    while total < seconds * RATE:
        for clip in clips:
            parts += [clip, pause]
            total += clip.size + pause.size
    return np.concatenate(parts)[: seconds * RATE]


def _transcribe(path: Path, data_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The command's peaks (MiB) and its verbose JSON transcript of ``path``."""
    out = path.with_suffix(".json")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "OMNI_EDGE_DATA_DIR": str(data_dir)},
        timeout=1500,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    peaks: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert peaks["code"] == 0, done.stderr[-3000:]
    transcript: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return peaks, transcript


def _words(text: str) -> list[str]:
    return "".join(c if c.isalnum() else " " for c in text.lower()).split()


def _assert_bounded(short: dict[str, Any], long: dict[str, Any]) -> None:
    figures = {"short": short, "long": long}
    controller = long["controller_mib"] - short["controller_mib"]
    assert controller < GROWTH_MIB, figures
    assert long["controller_mib"] <= 1.2 * short["controller_mib"], figures
    assert long["worker_mib"] - short["worker_mib"] < GROWTH_MIB, figures
    assert long["worker_mib"] <= 1.2 * short["worker_mib"], figures


@pytest.mark.slow
def test_six_minutes_need_the_memory_of_two(data_dir: Path, tmp_path: Path) -> None:
    (first,) = spoken_clips([FIRST])
    short, short_text = _transcribe(
        _write(tmp_path / "2-minutes.flac", _quiet_with_speech_at_both_ends(first, 120)), data_dir
    )
    long, long_text = _transcribe(
        _write(tmp_path / "6-minutes.flac", _quiet_with_speech_at_both_ends(first, 360)), data_dir
    )
    _assert_bounded(short, long)
    # Every window was read back and decoded: the speech of the first and of the last.
    for transcript, seconds in ((short_text, 120), (long_text, 360)):
        assert transcript["duration"] == pytest.approx(seconds, abs=0.01)
        segments = transcript["segments"]
        assert [_words(segment["text"]) for segment in segments] == [_words(FIRST)] * 2
        assert segments[0]["start"] == 0.0
        assert segments[-1]["start"] == (seconds // 30 - 1) * 30.0


@pytest.mark.slow
def test_twenty_minutes_of_speech_need_the_memory_of_two(data_dir: Path, tmp_path: Path) -> None:
    clips = spoken_clips(list(SENTENCES))
    short, short_text = _transcribe(
        _write(tmp_path / "2-minutes.flac", _continuous_speech(clips, 120)), data_dir
    )
    long, long_text = _transcribe(
        _write(tmp_path / "20-minutes.flac", _continuous_speech(clips, 1200)), data_dir
    )
    _assert_bounded(short, long)
    # Speech in every window: a segment from each, in order, the last ending the file.
    starts = [segment["start"] for segment in long_text["segments"]]
    assert starts == [30.0 * window for window in range(40)]
    assert long_text["segments"][-1]["end"] == pytest.approx(1200.0, abs=0.02)
    assert len(short_text["segments"]) == 4
    assert _words(long_text["text"])[: len(_words(FIRST))] == _words(FIRST)
