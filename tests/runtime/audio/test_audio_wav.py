"""WAV files appear whole or not at all."""

from __future__ import annotations

import gc
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile

from runtime.audio import WavWriteError, WavWriter, write_wav
from runtime.errors import UsageError


def _tone(seconds: float, rate: int = 22050) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * 330 * t)).astype(np.float32)


def _folder_names(folder: Path) -> list[str]:
    return sorted(entry.name for entry in folder.iterdir())


def test_write_wav_is_16_bit_mono_and_round_trips(tmp_path: Path) -> None:
    pcm = _tone(0.5)
    path = write_wav(tmp_path / "hello.wav", pcm, 22050)
    info = soundfile.info(str(path))
    assert (info.format, info.subtype, info.channels, info.samplerate, info.frames) == (
        "WAV",
        "PCM_16",
        1,
        22050,
        len(pcm),
    )
    back, rate = soundfile.read(str(path), dtype="float32")
    assert rate == 22050
    np.testing.assert_allclose(back, pcm, atol=1.5 / 32768)
    assert _folder_names(tmp_path) == ["hello.wav"]


def test_out_of_range_samples_are_clipped_not_wrapped(tmp_path: Path) -> None:
    pcm = np.array([1.7, -2.5, 0.25], dtype=np.float32)
    back, _ = soundfile.read(str(write_wav(tmp_path / "c.wav", pcm, 8000)), dtype="int16")
    assert back.tolist() == [32767, -32768, 8192]


def test_streaming_writer_equals_whole_write(tmp_path: Path) -> None:
    pcm = _tone(1.3)
    with WavWriter(tmp_path / "stream.wav", 22050) as writer:
        for start in range(0, len(pcm), 4000):
            writer.write(pcm[start : start + 4000])
            assert not (tmp_path / "stream.wav").exists(), "the file must appear only on close"
    assert writer.frames_written == len(pcm)
    write_wav(tmp_path / "whole.wav", pcm, 22050)
    streamed, _ = soundfile.read(str(tmp_path / "stream.wav"), dtype="int16")
    whole, _ = soundfile.read(str(tmp_path / "whole.wav"), dtype="int16")
    np.testing.assert_array_equal(streamed, whole)
    assert writer.close() == tmp_path / "stream.wav"


def test_an_error_inside_the_writer_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "out.wav"
    target.write_bytes(b"previous take")
    writer = WavWriter(target, 22050)

    def write_and_fail() -> None:
        with writer:
            writer.write(_tone(0.2))
            raise KeyError("synthesis failed")

    with pytest.raises(KeyError):
        write_and_fail()
    assert _folder_names(tmp_path) == ["out.wav"]
    assert target.read_bytes() == b"previous take"
    with pytest.raises(UsageError, match="already closed or aborted"):
        writer.write(_tone(0.1))
    with pytest.raises(UsageError, match="was aborted"):
        writer.close()


def test_an_abandoned_writer_removes_its_temporary_file(tmp_path: Path) -> None:
    writer = WavWriter(tmp_path / "lost.wav", 16000)
    writer.write(_tone(0.1, 16000))
    assert len(_folder_names(tmp_path)) == 1
    del writer
    gc.collect()
    assert _folder_names(tmp_path) == []


@pytest.mark.parametrize(
    ("pcm", "match"),
    [
        (np.zeros(5, np.float64), "1-D float32"),
        (np.zeros((5, 2), np.float32), "1-D float32"),
        ([0.0, 0.1], "1-D float32"),
        (np.array([0.0, np.nan], np.float32), "NaN or infinite"),
    ],
)
def test_bad_audio_is_refused(tmp_path: Path, pcm: object, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        write_wav(tmp_path / "bad.wav", pcm, 22050)  # type: ignore[arg-type]
    assert _folder_names(tmp_path) == []


def test_bad_targets_and_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        WavWriter(tmp_path / "missing" / "a.wav", 22050)
    with pytest.raises(UsageError, match="it is a folder"):
        WavWriter(tmp_path, 22050)
    with pytest.raises(UsageError, match="positive int in Hz"):
        WavWriter(tmp_path / "a.wav", 0)
    with pytest.raises(UsageError, match="subtype 'MP3'"):
        WavWriter(tmp_path / "a.wav", 22050, subtype="MP3")
    assert _folder_names(tmp_path) == []


def test_a_file_that_cannot_be_created_names_the_path() -> None:
    with pytest.raises(WavWriteError, match=r"cannot create /proc/omni\.wav"):
        WavWriter("/proc/omni.wav", 22050)


def test_a_vanished_folder_fails_on_close_and_leaves_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "takes"
    folder.mkdir()
    writer = WavWriter(folder / "a.wav", 22050)
    writer.write(_tone(0.1))
    shutil.rmtree(folder)
    with pytest.raises(WavWriteError, match="cannot finish"):
        writer.close()
    assert _folder_names(tmp_path) == []
