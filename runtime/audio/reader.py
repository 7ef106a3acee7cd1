"""Audio files read block by block as 16 kHz mono float32, whatever their format, rate and
channel count.

:func:`open_audio` opens a path, ``-`` (standard input) or a binary stream with ``soundfile``
(libsndfile: WAV, FLAC, OGG Vorbis/Opus, MP3, AIFF, CAF, W64, RF64 and the rest it reads) and
returns an :class:`AudioStream` whose iteration yields blocks of 16 kHz mono float32: each
block read is averaged over its channels and resampled with soxr's streaming converter (the
filter's state kept across blocks), so a two-hour file needs the memory of one block, not of
the file. A pipe cannot seek, and libsndfile needs to, so standard input and unseekable
streams are first copied to a private temporary file that the stream removes when closed.

Every problem is an :class:`AudioReadError` (a usage error, exit code 2) that names the file
and what is accepted, with a stable ``code``: ``not_found``, ``empty``, ``not_audio``,
``bad_rate``, ``bad_channels``, ``too_long``, ``truncated``, ``bad_samples``.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import shutil
import sys
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

import numpy as np

from runtime.audio.resample import StreamResampler
from runtime.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import TracebackType

__all__ = [
    "ACCEPTED_FORMATS",
    "MAX_CHANNELS",
    "MAX_RATE",
    "MIN_RATE",
    "TARGET_RATE",
    "AudioInfo",
    "AudioReadError",
    "AudioStream",
    "Source",
    "open_audio",
    "read_audio",
]

TARGET_RATE: Final = 16_000
MIN_RATE: Final = 8_000
MAX_RATE: Final = 384_000
#: More channels than this is not a recording of speech (and costs a block's memory per channel).
MAX_CHANNELS: Final = 64
#: Input frames read at once: about 1.5 s at 44.1 kHz.
BLOCK_FRAMES: Final = 65_536
ACCEPTED_FORMATS: Final = (
    "audio files libsndfile reads (WAV, FLAC, OGG Vorbis or Opus, MP3, AIFF, CAF, W64, RF64, "
    f"...) at {MIN_RATE:,} to {MAX_RATE:,} Hz with 1 to {MAX_CHANNELS} channels"
)
_SPOOL_PREFIX: Final = "omni-edge-audio-"
#: A path, ``-`` for standard input, or a binary stream (an upload, a pipe).
Source = str | os.PathLike[str] | IO[bytes] | io.RawIOBase | io.BufferedIOBase
_COPY_BYTES: Final = 1 << 20


class AudioReadError(UsageError):
    """An audio file cannot be read; names the file and what is accepted. ``code`` is stable."""

    def __init__(self, message: str, *, code: str, source: str) -> None:
        super().__init__(message)
        self.code = code
        self.source = source


@dataclass(frozen=True, slots=True)
class AudioInfo:
    """What the file says about itself: its format, rate, channels and length in frames."""

    source: str
    format: str
    subtype: str
    sample_rate: int
    channels: int
    frames: int

    @property
    def duration_s(self) -> float:
        return self.frames / self.sample_rate


def _fail(source: str, code: str, problem: str) -> AudioReadError:
    return AudioReadError(
        f"{source}: {problem}; accepted: {ACCEPTED_FORMATS}", code=code, source=source
    )


def _spool(stream: IO[bytes] | io.RawIOBase | io.BufferedIOBase) -> Path:
    """Copy an unseekable stream to a private temporary file (removed by the caller)."""
    handle, name = tempfile.mkstemp(prefix=_SPOOL_PREFIX, suffix=".audio")
    path = Path(name)
    try:
        with os.fdopen(handle, "wb") as out:
            shutil.copyfileobj(stream, out, _COPY_BYTES)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def _seekable(stream: IO[bytes] | io.RawIOBase | io.BufferedIOBase) -> bool:
    try:
        return bool(stream.seekable())
    except (AttributeError, OSError, ValueError):
        return False


def _bytes_left(stream: IO[bytes] | io.RawIOBase | io.BufferedIOBase) -> int | None:
    """Bytes from a seekable stream's position to its end (None when it cannot say), so an
    empty upload is ``empty`` as an empty file is."""
    try:
        here = stream.tell()
        end = stream.seek(0, os.SEEK_END)
        stream.seek(here)
    except (AttributeError, OSError, ValueError):
        return None
    return end - here


class AudioStream:
    """An open audio file yielding 16 kHz mono float32 blocks; close it (or use ``with``) to
    release the file and remove a temporary copy of standard input."""

    def __init__(
        self,
        handle: Any,
        info: AudioInfo,
        *,
        max_seconds: float | None,
        spool: Path | None,
        block_frames: int,
    ) -> None:
        self.info = info
        self.max_seconds = max_seconds
        self._handle = handle
        self._spool = spool
        self._block_frames = block_frames
        self._frames_read = 0
        self._samples_out = 0
        self._started = False
        self._finalizer = weakref.finalize(self, _discard, handle, spool)

    @property
    def source(self) -> str:
        return self.info.source

    @property
    def duration_s(self) -> float | None:
        """The length the file declares, in seconds (None when it declares none)."""
        return self.info.duration_s if self.info.frames > 0 else None

    @property
    def position_s(self) -> float:
        """Seconds of input read so far."""
        return self._frames_read / self.info.sample_rate

    @property
    def samples_out(self) -> int:
        """16 kHz samples yielded so far."""
        return self._samples_out

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __iter__(self) -> Iterator[np.ndarray]:
        if self._started:
            raise RuntimeError(f"{self.source} is read once; open it again to read it again")
        self._started = True
        return self._blocks()

    def _blocks(self) -> Iterator[np.ndarray]:
        info = self.info
        resampler = StreamResampler(info.sample_rate, TARGET_RATE)
        limit = self.max_seconds
        while True:
            if self.closed:
                raise RuntimeError(f"{self.source} was closed while it was read")
            try:
                block = self._handle.read(self._block_frames, dtype="float32", always_2d=True)
            except RuntimeError as exc:  # soundfile.LibsndfileError and codec errors
                raise _fail(
                    info.source,
                    "truncated",
                    f"the audio cannot be read past {self.position_s:.2f} s ({exc}); the file "
                    "may be truncated or damaged",
                ) from exc
            if block.shape[0] == 0:
                break
            self._frames_read += block.shape[0]
            if limit is not None and self.position_s > limit:
                raise _too_long(info.source, self.position_s, limit, at_least=True)
            # Huge or infinite channels average to a non-finite sample, refused just below
            # (not a RuntimeWarning, which a program running with -W error would raise).
            with np.errstate(over="ignore", invalid="ignore"):
                mono = block[:, 0] if block.shape[1] == 1 else block.mean(axis=1, dtype=np.float32)
            if not np.all(np.isfinite(mono)):
                raise _fail(
                    info.source,
                    "bad_samples",
                    f"the audio holds NaN or infinite samples near {self.position_s:.2f} s",
                )
            out = resampler.process(np.ascontiguousarray(mono, dtype=np.float32))
            self._check_converted(out)
            if out.size:
                self._samples_out += out.size
                yield out
        if self._frames_read == 0:
            raise _fail(info.source, "empty", "the file holds no audio (0 samples)")
        tail = resampler.flush()
        self._check_converted(tail)
        if tail.size:
            self._samples_out += tail.size
            yield tail

    def _check_converted(self, out: np.ndarray) -> None:
        """Finite samples near float32's limit overflow the resampler's filter into NaN."""
        if not np.all(np.isfinite(out)):
            raise _fail(
                self.source,
                "bad_samples",
                f"the audio holds samples too large to resample near {self.position_s:.2f} s "
                "(float values far past full scale)",
            )

    def read_all(self) -> np.ndarray:
        """Every block joined: the whole file as one 16 kHz mono array (for short clips)."""
        return np.concatenate(list(self))

    def close(self) -> None:
        """Release the file and remove a temporary copy (idempotent)."""
        self._finalizer()

    def __enter__(self) -> AudioStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _discard(handle: Any, spool: Path | None) -> None:
    try:
        handle.close()
    finally:
        if spool is not None:
            spool.unlink(missing_ok=True)


def _too_long(source: str, seconds: float, limit: float, *, at_least: bool) -> AudioReadError:
    length = f"{'at least ' if at_least else ''}{seconds:.1f} s"
    return AudioReadError(
        f"{source}: the audio is {length} long; accepted: at most {limit:g} s",
        code="too_long",
        source=source,
    )


def open_audio(
    source: Source,
    *,
    max_seconds: float | None = None,
    name: str | None = None,
    block_frames: int = BLOCK_FRAMES,
) -> AudioStream:
    """Open ``source`` (a path, ``"-"`` for standard input, or a binary stream) for reading as
    16 kHz mono float32 blocks; raises :class:`AudioReadError` (see the module).

    ``max_seconds`` refuses a file that declares a longer length at once, and one that turns
    out longer while it is read; ``name`` is what errors call a stream (default: its path,
    ``stdin`` or ``<stream>``)."""
    import soundfile

    if max_seconds is not None and (not math.isfinite(max_seconds) or max_seconds <= 0):
        raise ValueError(f"max_seconds must be a positive number of seconds; got {max_seconds!r}")
    if block_frames < 1:
        raise ValueError(f"block_frames must be at least 1; got {block_frames!r}")
    spool: Path | None = None
    target: Any
    if isinstance(source, (str, os.PathLike)) and os.fspath(source) == "-":
        label = name or "stdin"
        spool = _spool(sys.stdin.buffer)
        target = spool
    elif isinstance(source, (str, os.PathLike)):
        path = Path(source)
        label = name or str(path)
        if not path.is_file():
            problem = "is a folder" if path.is_dir() else "does not exist"
            raise AudioReadError(
                f"{label}: the file {problem}; accepted: a path to an audio file, or - for "
                "standard input",
                code="not_found",
                source=label,
            )
        target = path
    else:
        label = name or getattr(source, "name", None) or "<stream>"
        label = str(label)
        if _seekable(source):
            target = source
        else:
            spool = _spool(source)
            target = spool
    try:
        size = target.stat().st_size if isinstance(target, Path) else _bytes_left(target)
        if size == 0:
            raise _fail(label, "empty", "the file is empty (0 bytes)")
        try:
            handle = soundfile.SoundFile(target)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise _fail(label, "not_audio", f"not audio that can be read ({_reason(exc)})") from exc
        try:
            info = AudioInfo(
                label,
                str(handle.format),
                str(handle.subtype),
                int(handle.samplerate),
                int(handle.channels),
                max(0, int(handle.frames)),
            )
            _check(info, max_seconds)
        except BaseException:
            handle.close()
            raise
    except BaseException:
        if spool is not None:
            spool.unlink(missing_ok=True)
        raise
    return AudioStream(
        handle, info, max_seconds=max_seconds, spool=spool, block_frames=block_frames
    )


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    # soundfile repeats the path in front of libsndfile's own words.
    if "'" in text and ": " in text:
        text = text.split(": ", 1)[1]
    return text or type(exc).__name__


def _check(info: AudioInfo, max_seconds: float | None) -> None:
    if not MIN_RATE <= info.sample_rate <= MAX_RATE:
        raise _fail(info.source, "bad_rate", f"the sample rate is {info.sample_rate:,} Hz")
    if not 1 <= info.channels <= MAX_CHANNELS:
        raise _fail(info.source, "bad_channels", f"the file has {info.channels} channels")
    if info.frames == 0:
        raise _fail(
            info.source,
            "empty",
            "the file holds no audio it can read (0 samples); it may be empty, truncated or "
            "damaged",
        )
    if max_seconds is not None and info.duration_s > max_seconds:
        raise _too_long(info.source, info.duration_s, max_seconds, at_least=False)


def read_audio(
    source: Source,
    *,
    max_seconds: float | None = None,
    name: str | None = None,
) -> np.ndarray:
    """The whole of ``source`` as one 16 kHz mono float32 array (see :func:`open_audio`)."""
    with contextlib.closing(open_audio(source, max_seconds=max_seconds, name=name)) as stream:
        return stream.read_all()
