"""Streaming sample-rate conversion for the player (libsoxr through python ``soxr``).

A voice produces audio at its own rate (22050 Hz for the default voice) while an output
device may run at another (a JACK server at 48 kHz). ``StreamResampler`` converts chunk by
chunk as audio arrives, keeping the filter state between chunks so the joined output
equals a one-shot conversion, and flushes the filter's tail at the end.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["StreamResampler"]

_EMPTY = np.zeros(0, dtype=np.float32)


def _positive_rate(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int in Hz; got {value!r}")
    return value


class StreamResampler:
    """Convert mono float32 audio from ``in_rate`` to ``out_rate`` one chunk at a time.

    When both rates are equal it is the identity (the chunk comes back as a float32
    contiguous array, without going through libsoxr). After :meth:`flush` it refuses
    more input: a stream is converted once, start to end.
    """

    __slots__ = ("_flushed", "_in_rate", "_out_rate", "_stream")

    def __init__(self, in_rate: int, out_rate: int, *, quality: str = "HQ") -> None:
        self._in_rate = _positive_rate("in_rate", in_rate)
        self._out_rate = _positive_rate("out_rate", out_rate)
        self._flushed = False
        self._stream: Any | None = None
        if in_rate != out_rate:
            import soxr

            self._stream = soxr.ResampleStream(
                in_rate, out_rate, num_channels=1, dtype="float32", quality=quality
            )

    @property
    def in_rate(self) -> int:
        return self._in_rate

    @property
    def out_rate(self) -> int:
        return self._out_rate

    @property
    def is_identity(self) -> bool:
        """True when no conversion happens (equal rates)."""
        return self._stream is None

    def process(self, chunk: np.ndarray) -> np.ndarray:
        """Convert the next chunk (1-D float32); returns what the filter can emit so far."""
        if self._flushed:
            raise RuntimeError("the resampler was flushed; start a new one for a new stream")
        if chunk.ndim != 1 or chunk.dtype != np.float32:
            raise ValueError(
                f"the resampler takes 1-D float32 samples; got {chunk.dtype} with shape "
                f"{chunk.shape}"
            )
        contiguous = np.ascontiguousarray(chunk)
        if self._stream is None:
            return contiguous
        result: np.ndarray = self._stream.resample_chunk(contiguous, last=False)
        return result

    def flush(self) -> np.ndarray:
        """End the stream: return the filter's remaining output (empty for the identity)."""
        if self._flushed or self._stream is None:
            self._flushed = True
            return np.zeros(0, dtype=np.float32)
        self._flushed = True
        tail: np.ndarray = self._stream.resample_chunk(_EMPTY, last=True)
        return tail
