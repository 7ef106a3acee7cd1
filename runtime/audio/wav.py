"""WAV files of mono float32 audio, written with ``soundfile`` as 16-bit PCM.

A file is written under a hidden temporary name next to its target and renamed into place
only when it is complete, so a failure or a cancelled write never leaves a half-written
WAV behind under the real name.
"""

from __future__ import annotations

import os
import secrets
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from runtime.errors import ExecutionError, UsageError

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["WavWriteError", "WavWriter", "write_wav"]

SUBTYPES = ("PCM_16", "PCM_24", "FLOAT")


class WavWriteError(ExecutionError):
    """The WAV file could not be written (names the file)."""


def _checked_samples(pcm: np.ndarray) -> np.ndarray:
    if not isinstance(pcm, np.ndarray) or pcm.ndim != 1 or pcm.dtype != np.float32:
        shape = getattr(pcm, "shape", None)
        dtype = getattr(pcm, "dtype", type(pcm).__name__)
        raise UsageError(
            f"WAV audio must be a 1-D float32 NumPy array of mono samples; got {dtype} with "
            f"shape {shape}"
        )
    if not np.isfinite(pcm).all():
        raise UsageError("WAV audio contains NaN or infinite samples; audio must be finite")
    # libsndfile wraps out-of-range floats when converting to integers; clip instead.
    clipped: np.ndarray = np.clip(pcm, -1.0, 1.0)
    return clipped


class _OpenFile:
    """What a finalizer needs to discard an unfinished write."""

    __slots__ = ("handle", "temp_path")

    def __init__(self, temp_path: Path) -> None:
        self.temp_path = temp_path
        self.handle: Any | None = None

    def discard(self) -> None:
        handle, self.handle = self.handle, None
        try:
            if handle is not None:
                handle.close()
        finally:
            self.temp_path.unlink(missing_ok=True)


class WavWriter:
    """Append mono float32 chunks to a WAV file; the file appears only on :meth:`close`.

    Used as a context manager, an exception inside the block discards the file.
    """

    def __init__(
        self, path: str | os.PathLike[str], sample_rate: int, *, subtype: str = "PCM_16"
    ) -> None:
        if isinstance(sample_rate, bool) or not isinstance(sample_rate, int) or sample_rate <= 0:
            raise UsageError(f"WAV sample_rate must be a positive int in Hz; got {sample_rate!r}")
        if subtype not in SUBTYPES:
            raise UsageError(f"WAV subtype {subtype!r} is not supported; accepted: {SUBTYPES}")
        self._path = Path(path)
        if not self._path.parent.is_dir():
            raise UsageError(
                f"cannot write {self._path}: folder {self._path.parent} does not exist"
            )
        if self._path.is_dir():
            raise UsageError(f"cannot write {self._path}: it is a folder")
        self._sample_rate = sample_rate
        self._frames = 0
        self._committed = False
        temp = self._path.with_name(f".{self._path.name}.{secrets.token_hex(4)}.partial")
        self._open = _OpenFile(temp)
        self._finalizer = weakref.finalize(self, self._open.discard)
        try:
            import soundfile

            self._open.handle = soundfile.SoundFile(
                temp, mode="w", samplerate=sample_rate, channels=1, format="WAV", subtype=subtype
            )
        except (OSError, RuntimeError) as error:
            self._finalizer()
            raise WavWriteError(f"cannot create {self._path}: {error}") from error

    @property
    def path(self) -> Path:
        """Where the finished file goes."""
        return self._path

    @property
    def frames_written(self) -> int:
        return self._frames

    def write(self, pcm: np.ndarray) -> None:
        """Append 1-D float32 samples (clipped to [-1, 1])."""
        samples = _checked_samples(pcm)
        handle = self._open.handle
        if handle is None:
            raise UsageError(f"the WAV writer for {self._path} is already closed or aborted")
        try:
            handle.write(samples)
        except (OSError, RuntimeError) as error:
            self._finalizer()
            raise WavWriteError(f"cannot write {self._path}: {error}") from error
        self._frames += samples.shape[0]

    def close(self) -> Path:
        """Finish the file and move it into place; returns its path."""
        if self._committed:
            return self._path
        handle = self._open.handle
        if handle is None:
            raise UsageError(f"the WAV writer for {self._path} was aborted; nothing was written")
        try:
            handle.close()
            self._open.handle = None
            os.replace(self._open.temp_path, self._path)
        except (OSError, RuntimeError) as error:
            self._finalizer()
            raise WavWriteError(f"cannot finish {self._path}: {error}") from error
        self._finalizer.detach()
        self._committed = True
        return self._path

    def abort(self) -> None:
        """Discard everything written so far; the target file is not touched."""
        self._finalizer()

    def __enter__(self) -> WavWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.abort()
        elif self._open.handle is not None:
            self.close()


def write_wav(path: str | os.PathLike[str], pcm: np.ndarray, sample_rate: int) -> Path:
    """Write a whole mono float32 buffer as a 16-bit PCM WAV file; returns its path."""
    samples = _checked_samples(pcm)
    with WavWriter(path, sample_rate) as writer:
        writer.write(samples)
    return writer.path
