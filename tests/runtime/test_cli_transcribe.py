"""``omni-edge transcribe`` and ``omni-edge model``: the recogniser made on first use, the same
transcript from a 16 kHz WAV, a 44.1 kHz three-channel FLAC, an OGG and standard input, each
output format well-formed, bad input refused naming the file before any worker starts, a
long file's progress lines after every window, and twenty minutes featurised in fixed memory.

The pipeline's stages run in real ONNX Runtime workers; the speech is the bundled voice."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import psutil
import pytest
import soundfile as sf
import soxr

from runtime.adapters.whisper_export import spoken_clips
from runtime.cli import main
from runtime.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from tests.runtime.engine.support import process_gone, shm_entries

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / "assets" / "pipelines" / "transcribe.yaml"
FIRST = "The quick brown fox jumps over the lazy dog."
SECOND = "Margaret Thompson flew from Chicago to Lisbon with her brother Daniel."
RATE = 16_000


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A data folder the pipeline's ``${data}`` points at while this module runs."""
    root = tmp_path_factory.mktemp("transcribe-data")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMNI_EDGE_DATA_DIR", str(root))
        yield root


@pytest.fixture(scope="module")
def made(data_dir: Path) -> list[str]:
    """``model list`` before, ``model make`` (its progress), ``model list --json`` after."""
    before = _cli("model", "list")
    assert before.returncode == EXIT_OK, before.stderr
    assert re.search(r"^whisper-tiny\.en\tspeech recogniser\tnot made\t", before.stdout, re.M)
    make = _cli("model", "make", "whisper-tiny.en")
    assert make.returncode == EXIT_OK, make.stderr
    assert "exporting speech recogniser whisper 'tiny.en'" in make.stderr
    assert "validated against the NumPy reference" in make.stderr
    after = _cli("model", "list", "--json")
    (row,) = json.loads(after.stdout)
    assert row["state"] == "made"
    assert row["bytes"] > 100e6
    assert Path(row["path"]) == data_dir / "recognisers" / "whisper-tiny.en"
    return make.stderr.splitlines()


@pytest.fixture(scope="module")
def speech() -> tuple[np.ndarray, np.ndarray]:
    first, second = spoken_clips([FIRST, SECOND])
    return first, second


def _cli(
    *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "runtime.cli", *args],
        input=None if stdin is None else stdin,
        capture_output=True,
        cwd=REPO,
        timeout=600,
        env={**os.environ, **(env or {})},
        check=False,
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["transcribe", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9$]+", text.lower())


def _clip(speech: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    first, second = speech
    return np.concatenate([first, np.zeros(RATE // 2, np.float32), second])


def test_model_make_and_list(made: list[str]) -> None:
    assert made[0].startswith("omni-edge: exporting speech recogniser")
    # Made once: making it again finds it.
    again = _cli("model", "make", "whisper-tiny.en")
    assert again.returncode == EXIT_OK
    assert "exporting" not in again.stderr
    unknown = _cli("model", "make", "whisper-large")
    assert unknown.returncode == EXIT_USAGE
    assert "whisper-tiny.en" in unknown.stderr


def test_formats_rates_and_channels_give_the_same_transcript(
    made: list[str],
    speech: tuple[np.ndarray, np.ndarray],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    clip = _clip(speech)
    wav = tmp_path / "speech.wav"
    sf.write(wav, clip, RATE, subtype="PCM_16")
    flac = tmp_path / "speech.flac"
    high = soxr.resample(clip, RATE, 44_100)
    sf.write(flac, np.stack([high, 0.8 * high, 0.5 * high], axis=1), 44_100)
    ogg = tmp_path / "speech.ogg"
    sf.write(ogg, soxr.resample(clip, RATE, 48_000), 48_000, format="OGG")
    transcripts = {}
    for path in (wav, flac, ogg):
        code, out, err = _run(capsys, str(path), "--format", "text")
        assert code == EXIT_OK, err
        transcripts[path.suffix] = out
    assert _words(transcripts[".wav"]) == _words(FIRST + " " + SECOND)
    assert transcripts[".flac"] == transcripts[".wav"]
    assert transcripts[".ogg"] == transcripts[".wav"]
    # The default prints the segment with its times.
    code, out, _ = _run(capsys, str(flac))
    assert code == EXIT_OK
    match = re.fullmatch(r"\[00:00:00\.000 --> 00:00:(\d\d\.\d{3})\]  (.+)\n", out)
    assert match is not None, out
    assert float(match[1]) == pytest.approx(clip.size / RATE, abs=0.05)
    assert match[2] == transcripts[".wav"].strip()


def test_stdin_is_transcribed_and_its_copy_removed(
    made: list[str], speech: tuple[np.ndarray, np.ndarray], tmp_path: Path, data_dir: Path
) -> None:
    spool = tmp_path / "tmp"
    spool.mkdir()
    buffer = tmp_path / "speech.flac"
    sf.write(buffer, soxr.resample(speech[0], RATE, 22_050), 22_050)
    done = _cli(
        "transcribe",
        "-",
        "--format",
        "json",
        stdin=buffer.read_bytes(),
        env={"TMPDIR": str(spool), "OMNI_EDGE_DATA_DIR": str(data_dir)},
    )
    assert done.returncode == EXIT_OK, done.stderr
    assert _words(json.loads(done.stdout)["text"]) == _words(FIRST)
    assert list(spool.iterdir()) == []
    bad = _cli(
        "transcribe",
        "-",
        stdin=b"this is not audio\n" * 100,
        env={"TMPDIR": str(spool), "OMNI_EDGE_DATA_DIR": str(data_dir)},
    )
    assert bad.returncode == EXIT_USAGE
    assert bad.stdout == ""
    assert bad.stderr.startswith("omni-edge: stdin: not audio that can be read")
    assert list(spool.iterdir()) == []


def _long_clip(speech: tuple[np.ndarray, np.ndarray], seconds: float) -> np.ndarray:
    """``FIRST`` near the start and ``SECOND`` after the first 30 s window."""
    audio = np.zeros(int(seconds * RATE), np.float32)
    first, second = speech
    audio[RATE : RATE + first.size] = first
    audio[32 * RATE : 32 * RATE + second.size] = second
    return audio


def test_srt_vtt_and_json_are_well_formed(
    made: list[str],
    speech: tuple[np.ndarray, np.ndarray],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "two-windows.wav"
    sf.write(path, _long_clip(speech, 40.0), RATE)
    code, srt, err = _run(capsys, str(path), "--format", "srt")
    assert code == EXIT_OK, err
    cues = srt.split("\n\n")
    assert cues[-1] == ""
    stamp = r"(\d\d):(\d\d):(\d\d),(\d\d\d)"
    ends: list[float] = []
    for number, cue in enumerate(cues[:-1], start=1):
        lines = cue.split("\n")
        assert lines[0] == str(number)
        times = re.fullmatch(f"{stamp} --> {stamp}", lines[1])
        assert times is not None, lines[1]
        start = int(times[2]) * 60 + int(times[3]) + int(times[4]) / 1000
        end = int(times[6]) * 60 + int(times[7]) + int(times[8]) / 1000
        assert start < end
        assert not ends or start >= ends[-1]
        ends.append(end)
        assert lines[2].strip()
    assert len(ends) == 2
    assert _words(" ".join(c.split("\n", 2)[2] for c in cues[:-1])) == _words(f"{FIRST} {SECOND}")

    code, vtt, _ = _run(capsys, str(path), "--format", "vtt")
    assert code == EXIT_OK
    assert vtt.startswith("WEBVTT\n\n")
    blocks = vtt.removeprefix("WEBVTT\n\n").split("\n\n")
    assert blocks[-1] == ""
    for block in blocks[:-1]:
        timing, text = block.split("\n", 1)
        assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3} --> \d\d:\d\d:\d\d\.\d{3}", timing)
        assert text.strip()
    assert len(blocks) == 3

    out = tmp_path / "result.json"
    code, stdout, err = _run(capsys, str(path), "--format", "verbose_json", "--out", str(out))
    assert code == EXIT_OK
    assert stdout == ""
    assert f"to {out}" in err
    document = json.loads(out.read_text())
    assert document["duration"] == pytest.approx(40.0)
    assert [segment["id"] for segment in document["segments"]] == [0, 1]
    assert document["segments"][1]["start"] == pytest.approx(30.0)
    assert _words(document["text"]) == _words(f"{FIRST} {SECOND}")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# -- bad input ----------------------------------------------------------------------------


def _bad_inputs(tmp_path: Path, clip: np.ndarray) -> dict[str, tuple[Path, str]]:
    """Each bad file and the words its error must hold."""
    cases: dict[str, tuple[Path, str]] = {}
    text = tmp_path / "notes.wav"
    text.write_text("not audio at all\n" * 50)
    cases["not audio"] = (text, "not audio that can be read")
    empty = tmp_path / "empty.flac"
    empty.write_bytes(b"")
    cases["empty"] = (empty, "the file is empty")
    header = tmp_path / "header.wav"
    sf.write(header, np.zeros((0, 2), np.float32), 44_100)
    cases["no samples"] = (header, "holds no audio")
    cut = tmp_path / "cut.flac"
    sf.write(cut, clip, RATE)
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    cases["truncated"] = (cut, "truncated or damaged")
    slow = tmp_path / "slow.wav"
    sf.write(slow, clip[::4], 4_000)
    cases["rate"] = (slow, "the sample rate is 4,000 Hz")
    wide = tmp_path / "wide.wav"
    sf.write(wide, np.zeros((1000, 65), np.float32), RATE)
    cases["channels"] = (wide, "the file has 65 channels")
    cases["missing"] = (tmp_path / "missing.ogg", "does not exist")
    return cases


def _children() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


def test_bad_input_is_refused_naming_the_file_before_any_worker_starts(
    made: list[str],
    speech: tuple[np.ndarray, np.ndarray],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spool = tmp_path / "tmp"
    spool.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(spool))
    children, segments = _children(), shm_entries()
    for case, (path, words) in _bad_inputs(tmp_path, speech[0]).items():
        code, out, err = _run(capsys, str(path))
        assert code == EXIT_USAGE, (case, err)
        assert out == ""
        assert err.startswith(f"omni-edge: {path}: "), (case, err)
        assert words in err, (case, err)
        assert "accepted:" in err, case
    assert _children() <= children
    assert shm_entries() <= segments
    assert list(spool.iterdir()) == []


def test_too_long_for_the_pipeline_is_refused(
    made: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    short = tmp_path / "short.yaml"
    short.write_text(PIPELINE.read_text().replace("max_audio_s: 7200", "max_audio_s: 5"))
    path = tmp_path / "six.wav"
    sf.write(path, np.zeros(6 * RATE, np.float32), RATE)
    code, out, err = _run(capsys, str(path), str(short))
    assert code == EXIT_USAGE
    assert out == ""
    assert f"{path}: the audio is 6.0 s long; accepted: at most 5 s" in err


def test_a_pipeline_that_does_not_transcribe_is_refused(
    made: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "a.wav"
    sf.write(path, np.zeros(RATE, np.float32), RATE)
    code, _, err = _run(capsys, str(path), str(REPO / "assets" / "pipelines" / "add.yaml"))
    assert code == EXIT_USAGE
    assert "does not transcribe; accepted:" in err
    code, _, err = _run(capsys, str(path), "--out", str(tmp_path / "nowhere" / "t.txt"))
    assert code == EXIT_USAGE
    assert "does not exist" in err


def test_a_file_that_ends_mid_word_gives_the_words_before(
    made: list[str],
    speech: tuple[np.ndarray, np.ndarray],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    first = speech[0]
    # The voice is cut in the middle of "lazy dog": its header still claims the whole clip.
    whole = tmp_path / "whole.wav"
    sf.write(whole, first, RATE, subtype="PCM_16")
    cut = tmp_path / "cut.wav"
    keep = int(first.size * 0.8)
    cut.write_bytes(whole.read_bytes()[: 44 + 2 * keep])
    code, out, err = _run(capsys, str(cut), "--format", "text")
    assert code == EXIT_OK, err
    words = _words(out)
    assert words[:5] == ["the", "quick", "brown", "fox", "jumps"]
    assert len(words) < len(_words(FIRST)) + 2


# -- long files ---------------------------------------------------------------------------


def test_a_long_file_streams_with_progress(
    made: list[str],
    speech: tuple[np.ndarray, np.ndarray],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("runtime.transcribe_command.PROGRESS_EVERY_S", 0.0)
    path = tmp_path / "three-minutes.flac"
    audio = _long_clip(speech, 180.0)
    audio[170 * RATE : 170 * RATE + speech[0].size] = speech[0]
    sf.write(path, soxr.resample(audio, RATE, 44_100), 44_100)
    code, out, err = _run(capsys, str(path))
    assert code == EXIT_OK, err
    lines = out.splitlines()
    assert len(lines) == 3
    assert lines[2].startswith("[00:02:30.000 --> ")
    assert _words(lines[2].split("]", 1)[1]) == _words(FIRST)
    read = re.findall(r"^omni-edge: read (\d+):(\d\d) of 3:00$", err, re.M)
    done = re.findall(r"^omni-edge: transcribed (\d+):(\d\d) of 3:00$", err, re.M)
    assert len(read) > 5
    # One line per window, silent ones too (the last ends at 3:00), each once.
    assert done == [("0", "30"), ("1", "00"), ("1", "30"), ("2", "00"), ("2", "30"), ("3", "00")]


def test_ctrl_c_leaves_nothing_behind(
    made: list[str], speech: tuple[np.ndarray, np.ndarray], tmp_path: Path, data_dir: Path
) -> None:
    """Interrupted after its first segment, a transcription of standard input exits 130 with
    its workers, their shared memory and every temporary file gone."""
    spool = tmp_path / "tmp"
    spool.mkdir()
    path = tmp_path / "long.flac"
    sf.write(path, _long_clip(speech, 180.0), RATE)
    with path.open("rb") as stdin:
        process = subprocess.Popen(
            [sys.executable, "-m", "runtime.cli", "transcribe", "-"],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
            env={**os.environ, "TMPDIR": str(spool), "OMNI_EDGE_DATA_DIR": str(data_dir)},
        )
        try:
            assert process.stdout is not None
            first = process.stdout.readline().decode()
            assert first.startswith("[00:00:00.000 --> "), first
            workers = psutil.Process(process.pid).children(recursive=True)
            assert workers
            # The copy of stdin went once its features were made, before the workers started.
            assert not [p for p in spool.iterdir() if p.name.startswith("omni-edge-audio-")]
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == EXIT_INTERRUPTED, err.decode()
    assert "interrupted" in err.decode()
    for worker in workers:
        assert process_gone(worker.pid)
    assert shm_entries(f"oe-{process.pid}-") == set()
    assert list(spool.iterdir()) == []


def test_features_of_a_long_file_need_their_own_memory_only(tmp_path: Path) -> None:
    """Reading and featurising 20 minutes of 44.1 kHz stereo (212 MB as float32) into spooled
    features raises the peak RSS (the high-water mark, read at every block) by one spectrum
    batch's working memory, reached within the first minutes, and then no more: the second ten
    minutes add nothing, where features kept in memory would add 18.3 MiB (32 KB a second)
    and the audio as 16 kHz float32 36.6 MiB."""
    t = np.arange(60 * 44_100) / 44_100
    minute = np.stack([(0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)] * 2, axis=1)
    path = tmp_path / "20-minutes.flac"
    with sf.SoundFile(path, "w", 44_100, 2, format="FLAC") as out:
        for _ in range(20):
            out.write(minute)
    warm = tmp_path / "warm.wav"
    sf.write(warm, minute[: 5 * 44_100], 44_100)
    script = textwrap.dedent(
        """
        import sys
        from benchmarks.rss import peak_rss_bytes
        from runtime.adapters.whisper_stream import spool_stream
        from runtime.audio.reader import open_audio
        # This process's own high-water mark (getrusage's would start at pytest's size).
        peak = lambda: peak_rss_bytes() / 2**20
        with open_audio(sys.argv[2]) as stream:
            spool_stream(stream).close()
        before = peak()
        at = {}
        sample = lambda samples: at.setdefault(samples // (16_000 * 60), peak())
        with open_audio(sys.argv[1]) as stream, spool_stream(stream, on_block=sample) as spooled:
            print(before, at[10], peak(), spooled.frames * 80 * 4 / 2**20)
        """
    )
    # In a fresh process, so that nothing else's freed memory hides the growth.
    done = subprocess.run(
        [sys.executable, "-c", script, str(path), str(warm)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        check=True,
    )
    before, ten, twenty, features = map(float, done.stdout.split())
    assert features == pytest.approx(36.6, abs=0.2)
    assert twenty - ten < 1.0, (before, ten, twenty)
    # The fixed part: one 6,000-frame batch's spectrum (about 30 MiB of arrays, as in the
    # one-call front end), soxr's and libsndfile's buffers, and what the allocator keeps.
    assert twenty - before < 80.0, (before, ten, twenty)
