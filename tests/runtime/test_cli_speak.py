"""``omni-edge speak`` and ``omni-edge bundle export-voice`` as a user runs them.

The must-show runs the installed command in a real subprocess: a 22,050 Hz mono WAV of speech
and the metrics file. Playback runs on an ALSA null device (a real PortAudio stream, not paced
in real time); Ctrl+C is a real SIGINT. Refusals run in this process: they end before any
stage starts.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil
import pytest
import soundfile

from runtime.adapters.speak import METRIC_KEYS
from runtime.adapters.voice_export import MAX_ABS_ERROR, MIN_SNR_DB
from runtime.cli import main
from runtime.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from tests.helpers.voice import assert_speech, export_once
from tests.runtime.audio.conftest import alsa_null, thread_baseline
from tests.runtime.engine.support import shm_entries

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests.helpers.voice import Exported

__all__ = ["alsa_null", "thread_baseline"]

CLI_TIMEOUT_S = 180.0
RATE = 22050


@pytest.fixture
def voice(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Exported:
    """The session's voice bundles as the user data directory; no saved device selection."""
    exported = export_once(tmp_path_factory)
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(exported.data_dir))
    monkeypatch.setenv("OMNI_EDGE_CONFIG_DIR", str(tmp_path_factory.mktemp("config")))
    return exported


def _command(*args: str) -> list[str]:
    """The installed ``omni-edge`` script when there is one, else the same entry point by module."""
    script = os.path.join(os.path.dirname(sys.executable), "omni-edge")
    if os.path.isfile(script):
        return [script, *args]
    return [sys.executable, "-m", "runtime.cli", *args]


def test_speak_writes_a_wav_of_speech_and_the_metrics(voice: Exported, tmp_path: Path) -> None:
    completed = subprocess.run(
        _command("speak", "Hello from the edge.", "--out", "hello.wav", "--metrics", "m.json"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    assert completed.returncode == EXIT_OK, completed.stderr
    print(completed.stdout.strip())
    assert "completed:" in completed.stdout
    assert "wrote hello.wav" in completed.stdout
    info = soundfile.info(str(tmp_path / "hello.wav"))
    assert (info.samplerate, info.channels, info.subtype) == (RATE, 1, "PCM_16")
    audio, rate = soundfile.read(str(tmp_path / "hello.wav"), dtype="float32")
    assert_speech(audio, rate)
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert list(metrics)[: len(METRIC_KEYS)] == list(METRIC_KEYS)
    assert 0 < metrics["time_to_first_audio_s"] < 10
    assert metrics["real_time_factor"] > 0
    assert metrics["audio_seconds"] == pytest.approx(audio.size / RATE)
    assert 1.0 < metrics["audio_seconds"] < 2.0
    # A text this short is decoded in one call (runtime.adapters.tts.WHOLE_FRAMES): one
    # chunk, so no wait between two chunks.
    assert metrics["chunks"] == 1
    assert metrics["max_chunk_gap_s"] == 0.0
    # Not played and not cancelled: those figures do not apply.
    for key in ("time_to_first_playback_s", "underruns", "underrun_seconds", "cancel_latency_s"):
        assert metrics[key] is None
    assert metrics["status"] == "completed"
    assert metrics["sentences"] == 1
    assert metrics["engine"]["chunks"] == metrics["chunks"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["hello.wav", "m.json"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the text is empty"),
        (" \t\n  ", "the text is only whitespace"),
        ("\U0001f600\U0001f44d\U0001f680", "nothing in the text can be spoken by this voice (skip"),
        ("\u4f60\u597d\u4e16\u754c", "(skipped: script); accepted: words in Latin script"),
        ("\x00\x01\x07\x1b", "(skipped: control)"),
        ("a" * 100_001, "the text has 100001 characters; accepted: at most 100000"),
    ],
    ids=["empty", "whitespace", "emoji", "unsupported-script", "control", "too-long"],
)
def test_unspeakable_text_exits_2_with_the_reason_before_anything_loads(
    voice: Exported, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    started = time.perf_counter()
    assert main(["speak", text]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert message in captured.err
    assert captured.err.startswith("omni-edge: ")
    assert psutil.Process().children() == []
    assert time.perf_counter() - started < 20


def test_bad_arguments_exit_2_with_what_is_accepted(
    voice: Exported, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        (["--out", str(tmp_path / "missing" / "x.wav")], "does not exist"),
        (["--metrics", str(tmp_path)], "accepted: a file in an existing folder"),
        (["--pipeline", str(tmp_path / "nope.yaml")], "cannot read the pipeline file"),
    ]
    for extra, message in cases:
        assert main(["speak", "Hello.", *extra]) == EXIT_USAGE
        assert message in capsys.readouterr().err


def _read_lines(stream: Any, lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)


def _wait_for_line(lines: queue.Queue[str], needle: str, timeout_s: float) -> list[str]:
    seen = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.1)
        except queue.Empty:
            continue
        seen.append(line)
        if needle in line:
            return seen
    raise AssertionError(f"no line with {needle!r} within {timeout_s} s; got {seen}")


@pytest.fixture
def cli_process(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Started CLI processes; any still running at the end is killed (and the test fails)."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(10)
            pytest.fail(f"omni-edge {process.pid} was still running")


def test_ctrl_c_while_playing_stops_within_a_block_and_leaves_nothing(
    voice: Exported,
    alsa_null: Path,
    tmp_path: Path,
    cli_process: list[subprocess.Popen[str]],
) -> None:
    text = "A long text keeps the voice busy, sentence after sentence. " * 40
    work = tmp_path / "work"
    work.mkdir()
    shm_before = shm_entries()
    process = subprocess.Popen(
        _command(
            "speak",
            text,
            "--device",
            "omni_speaker_left",
            "--out",
            "long.wav",
            "--metrics",
            "m.json",
        ),
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    cli_process.append(process)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(process.stderr, lines), daemon=True)
    reader.start()
    _wait_for_line(lines, "speaking; press Ctrl+C to stop", CLI_TIMEOUT_S)
    workers = [child.pid for child in psutil.Process(process.pid).children(recursive=True)]
    assert len(workers) == 2
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    stdout, _ = process.communicate(timeout=60)
    reader.join(5)
    assert process.returncode == EXIT_INTERRUPTED, stdout
    assert "interrupted:" in stdout
    metrics = json.loads((work / "m.json").read_text())
    playback = metrics["playback"]
    print(
        f"Ctrl+C: output silent {metrics['cancel_latency_s'] * 1000:.1f} ms later, request "
        f"cancelled after {metrics['engine_cancel_s']:.3f} s; {metrics['chunks']} chunks, first "
        f"audio {metrics['time_to_first_audio_s']:.3f} s"
    )
    assert metrics["status"] == "interrupted"
    assert metrics["chunks"] >= 1
    assert playback["device_name"] == "omni_speaker_left"
    block_s = playback["block_frames"] / playback["device_rate"]
    assert metrics["cancel_latency_s"] <= block_s + 0.05
    assert metrics["engine_cancel_s"] < 5.0
    # Only complete speech is written: no WAV, no partial file.
    assert sorted(path.name for path in work.iterdir()) == ["m.json"]
    for pid in workers:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert shm_entries() - shm_before == set()


@pytest.mark.audio
def test_speak_plays_to_the_end_on_an_alsa_null_device(
    voice: Exported,
    alsa_null: Path,
    thread_baseline: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    metrics_path = tmp_path / "m.json"
    assert main(["speak", "Hello there. Goodbye.", "--play", "--metrics", str(metrics_path)]) == 0
    metrics = json.loads(metrics_path.read_text())
    playback = metrics["playback"]
    assert metrics["status"] == "completed"
    assert playback["device_name"] == "default"
    assert playback["host_api"] == "ALSA"
    assert playback["frames_played"] == playback["frames_queued"]
    assert playback["frames_queued"] == round(metrics["audio_seconds"] * playback["device_rate"])
    assert 0 < metrics["time_to_first_audio_s"] <= metrics["time_to_first_playback_s"]
    assert isinstance(metrics["underruns"], int)
    assert metrics["sentences"] == 2
    assert "speaking; press Ctrl+C to stop" in capsys.readouterr().err


@pytest.mark.audio
def test_an_unknown_device_exits_2_before_anything_loads(
    voice: Exported, alsa_null: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["speak", "Hello.", "--device", "no-such-speaker"]) == EXIT_USAGE
    assert "no-such-speaker" in capsys.readouterr().err
    assert psutil.Process().children() == []


def test_a_pipeline_without_the_speech_adapter_cannot_speak(
    voice: Exported, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.helpers.voice import REPO

    assert main(["speak", "Hi.", "--pipeline", str(REPO / "assets/pipelines/add.yaml")]) == 2
    assert "cannot speak" in capsys.readouterr().err


def test_export_voice_if_missing_keeps_bundles_that_verify(
    voice: Exported, capsys: pytest.CaptureFixture[str]
) -> None:
    # The Makefile's setup step: the default location (the user data directory).
    started = time.perf_counter()
    assert main(["bundle", "export-voice", "--if-missing"]) == EXIT_OK
    took = time.perf_counter() - started
    out = capsys.readouterr().out
    assert f"voice joe already present and verified at {voice.root}" in out
    assert "max abs error" in out
    assert took < 10.0
    assert main(["bundle", "export-voice", "--if-missing", "--json"]) == EXIT_OK
    summary = json.loads(capsys.readouterr().out)
    assert summary["exported"] is False
    assert summary["root"] == str(voice.root)
    assert summary["max_abs_error"] <= MAX_ABS_ERROR
    assert summary["min_snr_db"] >= MIN_SNR_DB


def test_export_voice_refuses_what_it_cannot_do(
    voice: Exported, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    assert main(["bundle", "export-voice", "--out", str(tmp_path / "taken")]) == EXIT_USAGE
    assert "exists and is not an empty directory" in capsys.readouterr().err
    assert main(["bundle", "export-voice", "--voice", "ghost", "--out", str(tmp_path / "g")]) == 2
    assert "unknown voice 'ghost'; accepted: joe" in capsys.readouterr().err
    assert not (tmp_path / "g").exists()


@pytest.mark.slow
def test_export_voice_writes_validated_bundles_that_speak(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("OMNI_EDGE_CONFIG_DIR", str(tmp_path / "config"))
    out = tmp_path / "voices" / "joe"
    assert main(["bundle", "export-voice", "--out", str(out), "--json"]) == EXIT_OK
    summary = json.loads(capsys.readouterr().out)
    assert summary["exported"] is True
    assert summary["min_snr_db"] == "inf" or summary["min_snr_db"] >= MIN_SNR_DB
    assert sorted(path.name for path in out.iterdir()) == ["acoustic", "decoder"]
    assert main(["verify", str(out / "acoustic")]) == EXIT_OK
    assert main(["verify", str(out / "decoder")]) == EXIT_OK
    wav = tmp_path / "det.wav"
    again = tmp_path / "again.wav"
    assert main(["speak", "Deterministic.", "--deterministic", "--out", str(wav)]) == 0
    assert main(["speak", "Deterministic.", "--deterministic", "--out", str(again)]) == 0
    first, _ = soundfile.read(str(wav), dtype="float32")
    second, _ = soundfile.read(str(again), dtype="float32")
    np.testing.assert_array_equal(first, second)
