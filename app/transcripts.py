"""Transcripts without Qt: which dropped files are audio, reading one into a transcription
request, and a transcript's segments as plain text or SubRip (.srt)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from app.models import TranscriptSegment

__all__ = [
    "AUDIO_SUFFIXES",
    "AudioFileError",
    "audio_paths",
    "clock",
    "read_audio_request",
    "srt_text",
    "transcript_text",
]

#: Suffixes of the audio files a drop or Open audio… accepts (what libsndfile reads).
AUDIO_SUFFIXES: Final = (
    ".wav",
    ".flac",
    ".ogg",
    ".oga",
    ".opus",
    ".mp3",
    ".aiff",
    ".aif",
    ".caf",
    ".w64",
    ".rf64",
    ".au",
)
ACCEPTED: Final = "audio files libsndfile reads (" + ", ".join(AUDIO_SUFFIXES) + ")"
#: A file dialog's filter for them.
AUDIO_FILTER: Final = (
    "Audio files (" + " ".join(f"*{suffix}" for suffix in AUDIO_SUFFIXES) + ");;All files (*)"
)


class AudioFileError(ValueError):
    """An audio file that cannot be transcribed: the message names it and what is accepted."""


def audio_paths(paths: Iterable[str | Path]) -> list[Path]:
    """The paths among ``paths`` that name audio files by their suffix."""
    return [Path(path) for path in paths if Path(path).suffix.lower() in AUDIO_SUFFIXES]


def read_audio_request(path: Path) -> dict[str, Any]:
    """``path`` as a transcription request ``{"audio": samples, "sample_rate": Hz}``: float32
    samples, ``[samples, channels]`` for more than one channel (the adapter mixes and
    resamples). AudioFileError when it is not audio or holds none."""
    import soundfile

    try:
        samples, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, OSError) as exc:
        raise AudioFileError(f"{path}: {exc}; accepted: {ACCEPTED}") from None
    if samples.size == 0:
        raise AudioFileError(f"{path}: the file holds no audio; accepted: at least one sample")
    audio = samples[:, 0] if samples.shape[1] == 1 else samples
    return {"audio": np.ascontiguousarray(audio), "sample_rate": int(rate)}


def clock(seconds: float, *, srt: bool = False) -> str:
    """``1:02.50`` (minutes:seconds, hours when there are any), or SubRip's ``00:01:02,500``."""
    millis = round(max(seconds, 0.0) * 1000)
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, millis = divmod(rest, 1000)
    if srt:
        return f"{hours:02d}:{minutes:02d}:{whole:02d},{millis:03d}"
    hundredths = millis // 10
    if hours:
        return f"{hours}:{minutes:02d}:{whole:02d}.{hundredths:02d}"
    return f"{minutes}:{whole:02d}.{hundredths:02d}"


def segment_line(segment: TranscriptSegment) -> str:
    """One segment as the transcript view shows it: its times, then its text."""
    return f"[{clock(segment.start_s)} → {clock(segment.end_s)}]  {segment.text}"


def transcript_text(segments: Sequence[TranscriptSegment], *, times: bool = True) -> str:
    """The segments one per line, with their times unless ``times`` is False."""
    if times:
        return "\n".join(segment_line(segment) for segment in segments)
    return " ".join(segment.text for segment in segments if segment.text)


def srt_text(segments: Sequence[TranscriptSegment]) -> str:
    """The segments as a SubRip file (numbered cues, ``HH:MM:SS,mmm --> HH:MM:SS,mmm``)."""
    cues = [
        f"{number}\n{clock(segment.start_s, srt=True)} --> {clock(segment.end_s, srt=True)}\n"
        f"{segment.text}\n"
        for number, segment in enumerate(segments, start=1)
    ]
    return "\n".join(cues)
