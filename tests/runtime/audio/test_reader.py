"""The audio file reader: formats, rates and channels to 16 kHz mono, standard input, bad
input as typed errors naming the file, nothing left behind, bounded memory on a long file."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr

from runtime.audio.reader import (
    AudioReadError,
    open_audio,
    read_audio,
)
from runtime.errors import EXIT_USAGE

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Temporary files go to a folder of the test's own, so leftovers can be counted."""
    spool = tmp_path / "spool"
    spool.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    return spool


def _tone(seconds: float, rate: int, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    mono = (0.4 * np.sin(2 * np.pi * 440 * t) * np.sin(2 * np.pi * 3 * t)).astype(np.float32)
    return mono if channels == 1 else np.repeat(mono[:, None], channels, axis=1)


def _assert_nothing_left(spool: Path) -> None:
    assert list(spool.iterdir()) == []


@pytest.mark.parametrize(
    ("fmt", "ext", "rate", "channels"),
    [
        ("WAV", "wav", 16_000, 1),
        ("WAV", "wav", 48_000, 6),
        ("FLAC", "flac", 44_100, 2),
        ("OGG", "ogg", 22_050, 2),
        ("AIFF", "aiff", 8_000, 1),
    ],
)
def test_formats_rates_and_channels_become_16k_mono(
    tmp_path: Path, fmt: str, ext: str, rate: int, channels: int
) -> None:
    audio = _tone(2.0, rate, channels)
    path = tmp_path / f"clip.{ext}"
    sf.write(path, audio, rate, format=fmt)
    with open_audio(path) as stream:
        assert stream.info.sample_rate == rate
        assert stream.info.channels == channels
        assert stream.duration_s == pytest.approx(2.0, abs=0.01)
        samples = stream.read_all()
    assert stream.closed
    assert samples.dtype == np.float32
    assert samples.ndim == 1
    assert samples.size == pytest.approx(32_000, abs=2)
    mono = audio if channels == 1 else audio.mean(axis=1, dtype=np.float32)
    expected = soxr.resample(mono, rate, 16_000) if rate != 16_000 else mono
    # Lossy OGG is compared loosely; lossless formats match a one-shot conversion closely.
    tolerance = 0.05 if fmt == "OGG" else 2e-3
    n = min(expected.size, samples.size)
    assert np.max(np.abs(samples[:n] - expected[:n])) < tolerance


def test_blocks_are_bounded_and_join_to_the_same_audio(tmp_path: Path) -> None:
    path = tmp_path / "long.flac"
    sf.write(path, _tone(5.0, 44_100, 2), 44_100)
    whole = read_audio(path)
    with open_audio(path, block_frames=1000) as stream:
        blocks = list(stream)
        assert stream.position_s == pytest.approx(5.0)
        assert stream.samples_out == whole.size
    assert len(blocks) > 50
    assert max(block.size for block in blocks) < 1000
    assert np.array_equal(np.concatenate(blocks), whole)


def test_a_stream_is_read_once(tmp_path: Path) -> None:
    path = tmp_path / "a.wav"
    sf.write(path, _tone(0.5, 16_000), 16_000)
    with open_audio(path) as stream:
        stream.read_all()
        with pytest.raises(RuntimeError, match="read once"):
            iter(stream)


def test_a_seekable_stream_is_read_in_place(private_tmp: Path) -> None:
    buffer = io.BytesIO()
    sf.write(buffer, _tone(1.0, 22_050), 22_050, format="FLAC")
    buffer.seek(0)
    with open_audio(buffer, name="upload.flac") as stream:
        assert stream.source == "upload.flac"
        assert stream.read_all().size == pytest.approx(16_000, abs=2)
        # Nothing is copied for a stream that seeks.
        _assert_nothing_left(private_tmp)


class _Pipe(io.RawIOBase):
    """A stream that cannot seek, as a pipe."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readinto(self, buffer: bytearray) -> int:  # type: ignore[override]
        chunk = self._data.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)


def test_an_unseekable_stream_is_spooled_and_the_copy_removed(private_tmp: Path) -> None:
    buffer = io.BytesIO()
    sf.write(buffer, _tone(1.0, 44_100, 2), 44_100, format="WAV")
    stream = open_audio(_Pipe(buffer.getvalue()))
    assert len(list(private_tmp.iterdir())) == 1
    assert stream.read_all().size == pytest.approx(16_000, abs=2)
    stream.close()
    _assert_nothing_left(private_tmp)


def test_stdin_is_read(tmp_path: Path, private_tmp: Path) -> None:
    path = tmp_path / "in.ogg"
    sf.write(path, _tone(1.5, 48_000), 48_000, format="OGG")
    script = textwrap.dedent(
        """
        import tempfile, sys
        tempfile.tempdir = sys.argv[1]
        from runtime.audio.reader import open_audio
        with open_audio("-") as stream:
            print(stream.source, stream.info.format, stream.read_all().size)
        """
    )
    with path.open("rb") as stdin:
        done = subprocess.run(
            [sys.executable, "-c", script, str(private_tmp)],
            stdin=stdin,
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
            check=True,
        )
    source, fmt, samples = done.stdout.split()
    assert (source, fmt) == ("stdin", "OGG")
    assert int(samples) == pytest.approx(24_000, abs=2)
    _assert_nothing_left(private_tmp)


# -- bad input ----------------------------------------------------------------------------


def _bad_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Each bad input: its file and the code its error carries."""
    files: dict[str, tuple[Path, str]] = {}
    text = tmp_path / "notes.wav"
    text.write_text("These are notes, not audio.\n" * 20)
    files["not audio"] = (text, "not_audio")
    png = tmp_path / "picture.flac"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(2000))
    files["random bytes"] = (png, "not_audio")
    zero = tmp_path / "zero.wav"
    zero.write_bytes(b"")
    files["zero bytes"] = (zero, "empty")
    header = tmp_path / "header-only.wav"
    sf.write(header, np.zeros((0, 1), np.float32), 16_000)
    files["no samples"] = (header, "empty")
    flac = tmp_path / "cut.flac"
    sf.write(flac, _tone(3.0, 44_100, 2), 44_100)
    data = flac.read_bytes()
    flac.write_bytes(data[: len(data) // 2])
    files["truncated flac"] = (flac, "truncated")
    ogg = tmp_path / "cut.ogg"
    sf.write(ogg, _tone(3.0, 44_100, 2), 44_100, format="OGG")
    data = ogg.read_bytes()
    ogg.write_bytes(data[: len(data) // 2])
    files["truncated ogg"] = (ogg, "empty")
    slow = tmp_path / "slow.wav"
    sf.write(slow, _tone(1.0, 4_000), 4_000)
    files["rate too low"] = (slow, "bad_rate")
    fast = tmp_path / "fast.wav"
    sf.write(fast, _tone(0.01, 768_000), 768_000)
    files["rate too high"] = (fast, "bad_rate")
    wide = tmp_path / "wide.wav"
    sf.write(wide, np.zeros((100, 65), np.float32), 16_000)
    files["too many channels"] = (wide, "bad_channels")
    nan = tmp_path / "nan.wav"
    samples = _tone(1.0, 16_000)
    samples[8000] = np.nan
    sf.write(nan, samples, 16_000, subtype="FLOAT")
    files["NaN samples"] = (nan, "bad_samples")
    files["missing"] = (tmp_path / "missing.wav", "not_found")
    files["folder"] = (tmp_path, "not_found")
    return files


def test_each_bad_input_is_a_typed_error_naming_the_file(tmp_path: Path, private_tmp: Path) -> None:
    for case, (path, code) in _bad_files(tmp_path).items():
        with pytest.raises(AudioReadError) as caught:
            read_audio(path)
        error = caught.value
        assert error.code == code, case
        assert error.exit_code == EXIT_USAGE
        assert str(path) in str(error), case
        assert "accepted:" in str(error), case
        assert error.source == str(path)
    _assert_nothing_left(private_tmp)


def test_bad_input_through_a_pipe_leaves_no_copy(tmp_path: Path, private_tmp: Path) -> None:
    for case, (path, code) in _bad_files(tmp_path).items():
        if not path.is_file():
            continue
        with pytest.raises(AudioReadError) as caught:
            read_audio(_Pipe(path.read_bytes()), name="stdin")
        assert caught.value.code == code, case
        assert str(caught.value).startswith("stdin: ")
    _assert_nothing_left(private_tmp)


def test_an_empty_upload_is_empty_as_an_empty_file_is(private_tmp: Path) -> None:
    """A seekable stream with no bytes left is refused as ``empty``, not as ``not_audio``."""
    for stream in (io.BytesIO(b""), _at_end(b"RIFF")):
        with pytest.raises(AudioReadError, match=r"^upload\.wav: the file is empty") as caught:
            read_audio(stream, name="upload.wav")
        assert caught.value.code == "empty"
    _assert_nothing_left(private_tmp)


def _at_end(data: bytes) -> io.BytesIO:
    stream = io.BytesIO(data)
    stream.seek(0, io.SEEK_END)
    return stream


def test_samples_too_large_to_resample_are_refused(tmp_path: Path) -> None:
    """Finite float samples near float32's limit overflow the resampler: the output would be
    NaN, so the file is refused as ``bad_samples`` instead of yielding it."""
    path = tmp_path / "loud.wav"
    samples = _tone(0.5, 8_000)
    samples[100:103] = -3e38
    sf.write(path, samples, 8_000, subtype="FLOAT")
    with pytest.raises(AudioReadError, match=r"too large to resample") as caught:
        read_audio(path)
    assert caught.value.code == "bad_samples"
    assert str(caught.value).startswith(f"{path}: ")


def test_channels_that_average_to_nan_are_bad_samples_without_a_warning(tmp_path: Path) -> None:
    """Infinities of both signs in one frame average to NaN: a typed error, even where
    warnings are errors (numpy would otherwise warn of an invalid value)."""
    path = tmp_path / "inf.wav"
    samples = _tone(0.5, 16_000, 2)
    samples[100] = [np.inf, -np.inf]
    sf.write(path, samples, 16_000, subtype="FLOAT")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AudioReadError, match=r"NaN or infinite samples") as caught:
            read_audio(path)
    assert caught.value.code == "bad_samples"


def test_too_long_is_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "long.wav"
    sf.write(path, _tone(3.0, 16_000), 16_000)
    with pytest.raises(AudioReadError, match=r"3\.0 s long; accepted: at most 2 s") as caught:
        open_audio(path, max_seconds=2)
    assert caught.value.code == "too_long"
    # Within the limit it reads.
    assert read_audio(path, max_seconds=3.5).size == 48_000


def test_too_long_is_also_found_while_reading(tmp_path: Path) -> None:
    """A length a file does not declare truthfully is counted as it is read."""
    path = tmp_path / "long.wav"
    sf.write(path, _tone(3.0, 16_000), 16_000)
    with open_audio(path, block_frames=4000) as stream:
        # As if the header had declared nothing: only the samples read count.
        stream.max_seconds = 2.0
        with pytest.raises(AudioReadError, match=r"at least 2\.2 s long") as caught:
            list(stream)
    assert caught.value.code == "too_long"


def test_a_truncated_wav_reads_what_it_holds(tmp_path: Path) -> None:
    """A WAV cut mid-word: its header claims more than it holds; what is there is read."""
    path = tmp_path / "cut.wav"
    sf.write(path, _tone(2.0, 16_000), 16_000, subtype="PCM_16")
    data = path.read_bytes()
    path.write_bytes(data[: 44 + 2 * 12_345])
    samples = read_audio(path)
    assert samples.size == 12_345
    np.testing.assert_allclose(samples, _tone(2.0, 16_000)[:12_345], atol=1e-4)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_seconds"):
        open_audio("x.wav", max_seconds=0)
    with pytest.raises(ValueError, match="block_frames"):
        open_audio("x.wav", block_frames=0)


# -- memory -------------------------------------------------------------------------------


def _peak_growth_mib(path: Path) -> tuple[float, int]:
    """RSS growth of a fresh process while it streams ``path``, sampled at every block (the
    high-water mark of ``getrusage`` is set by imports, above what a stream adds)."""
    script = textwrap.dedent(
        """
        import sys
        import psutil
        from runtime.audio.reader import open_audio
        process = psutil.Process()
        # Warm everything up on a short read, so the figure is the stream's alone.
        with open_audio(sys.argv[2]) as stream:
            for _ in stream:
                pass
        before = peak = process.memory_info().rss
        total = 0
        with open_audio(sys.argv[1]) as stream:
            for block in stream:
                total += block.size
                peak = max(peak, process.memory_info().rss)
        print((peak - before) / 2**20, total)
        """
    )
    short = path.with_name("short.flac")
    sf.write(short, _tone(3.0, 44_100, 2), 44_100)
    done = subprocess.run(
        [sys.executable, "-c", script, str(path), str(short)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        check=True,
    )
    growth, total = done.stdout.split()
    return float(growth), int(total)


def test_a_long_file_streams_with_bounded_memory(tmp_path: Path) -> None:
    """Ten minutes of 44.1 kHz stereo FLAC (106 MB as float32, 38 MB at 16 kHz mono) read
    with well under a tenth of that."""
    path = tmp_path / "ten-minutes.flac"
    minute = _tone(60.0, 44_100, 2)
    with sf.SoundFile(path, "w", 44_100, 2, format="FLAC") as out:
        for _ in range(10):
            out.write(minute)
    growth, samples = _peak_growth_mib(path)
    assert samples == pytest.approx(600 * 16_000, abs=4)
    assert growth < 8.0, f"RSS grew {growth:.1f} MiB streaming 10 minutes"
