"""``python benchmarks/speech.py --quick`` runs as a user runs it and writes well-formed JSON,
and the suite's hook returns the figures it needs. Slow: it starts the speech pipeline and
runs Piper beside it (about a minute on two busy cores)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from benchmarks import speech_figures
from tests.helpers.voice import REPO, export_once

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow


def _finite(value: object) -> bool:
    return isinstance(value, float | int) and not isinstance(value, bool) and math.isfinite(value)


def test_quick_run_writes_measurement_baseline_ratio_and_goal(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    out = tmp_path / "speech.json"
    environment = {
        "OMNI_EDGE_DATA_DIR": str(export_once(tmp_path_factory).data_dir),
        "OMNI_EDGE_CONFIG_DIR": str(tmp_path / "config"),
        "PATH": "/usr/bin:/bin",
    }
    completed = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "speech.py"), "--quick", "--out", str(out)],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    print(completed.stdout)
    document = json.loads(out.read_text())
    assert document["benchmark"] == "speech"
    assert document["quick"] is True
    assert set(document["texts"]) == {"short", "paragraph"}
    for text in document["texts"].values():
        for key in (
            "time_to_first_audio_s",
            "one_process_first_audio_s",
            "real_time_factor",
            "one_process_real_time_factor",
        ):
            assert _finite(text[key])
            assert text[key] > 0
    figures = document["figures"]
    assert set(figures) == {"time_to_first_audio", "real_time_factor"}
    for figure in figures.values():
        assert set(figure) == {"measurement", "baseline", "ratio", "goal", "pass"}
        assert _finite(figure["measurement"])
        assert _finite(figure["baseline"])
        assert figure["ratio"] == pytest.approx(figure["measurement"] / figure["baseline"], 0.01)
        assert isinstance(figure["pass"], bool)
    assert figures["time_to_first_audio"]["goal"] == "ratio <= 1.0"
    assert figures["real_time_factor"]["goal"] == "ratio <= 1.2"
    assert figures["real_time_factor"]["pass"] is (figures["real_time_factor"]["ratio"] <= 1.2)


def test_the_suite_hook_returns_the_four_figures(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(export_once(tmp_path_factory).data_dir))
    from benchmarks.base import BenchOptions

    first, rtf = speech_figures.measure(BenchOptions(quick=True, workdir=tmp_path))
    assert first.key == "speech.first_audio"
    assert rtf.key == "speech.rtf"
    for figure in (first, rtf):
        assert figure.measurement is not None
        assert figure.measurement > 0
        assert figure.baseline is not None
        assert figure.baseline > 0
