"""Whisper's log-mel features of audio that arrives in blocks (a file read block by block).

:func:`prepare_stream` takes 16 kHz mono float32 blocks (an
:class:`~runtime.audio.reader.AudioStream`, say) and returns the transcription adapter's
:class:`~runtime.adapters.whisper.PreparedAudio` without ever holding the whole audio: the
spectrum is computed in the same 6,000-frame batches :func:`~runtime.adapters.whisper_mel.log_mel`
uses, from a buffer of one batch's samples, so the features equal ``log_mel`` of the joined
audio bit for bit. What stays is the features (32 KB a second of audio: 19 MB for ten minutes,
230 MB for two hours) and one batch (about 4 MB of samples), against 64 KB a second for the
audio itself. The features are normalised once at the end, since Whisper floors them at
their maximum over the whole audio less 8.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import numpy as np

from runtime.adapters.whisper_mel import (
    BLOCK_FRAMES,
    HOP_LENGTH,
    N_FFT,
    SAMPLE_RATE,
    PreparedAudio,
    log_mel,
    mel_filters,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

__all__ = ["FeatureStream", "prepare_stream"]

_HALF: Final = N_FFT // 2
_PADDING: Final = 160
#: Below this many samples the audio is simply joined and computed in one call.
_SHORT: Final = 4 * N_FFT


class _Spectrum:
    """Unnormalised log-mel frames of a padded signal fed in pieces, in fixed batches."""

    def __init__(self, n_mels: int) -> None:
        self.filters = mel_filters(n_mels)
        self.window = np.hanning(N_FFT + 1)[:-1].astype(np.float32)
        self.buffer = np.zeros(0, dtype=np.float32)
        self.blocks: list[np.ndarray] = []
        self.frames = 0

    def feed(self, padded: np.ndarray, *, last: bool = False) -> None:
        """Append padded samples; compute every full batch (and, when ``last``, the rest
        less the final frame, which Whisper drops)."""
        self.buffer = np.concatenate((self.buffer, padded)) if self.buffer.size else padded
        batch_samples = (BLOCK_FRAMES - 1) * HOP_LENGTH + N_FFT
        # More samples follow, so none of these frames is the last one (which is dropped).
        while not last and self.buffer.size >= batch_samples:
            self._batch(BLOCK_FRAMES)
        if last:
            count = 1 + (self.buffer.size - N_FFT) // HOP_LENGTH
            # The last STFT frame is dropped, as faster-whisper drops it.
            while count - 1 > 0:
                size = min(BLOCK_FRAMES, count - 1)
                self._batch(size)
                count -= size

    def _batch(self, size: int) -> None:
        buffer = self.buffer
        frames = np.lib.stride_tricks.as_strided(
            buffer, (size, N_FFT), (HOP_LENGTH * buffer.strides[0], buffer.strides[0])
        )
        stft = np.fft.rfft(frames * self.window, n=N_FFT, axis=-1).T.astype(np.complex64)
        magnitudes = np.abs(stft) ** 2
        self.blocks.append(
            np.log10(np.clip(self.filters @ magnitudes, a_min=1e-10, a_max=None)).astype(
                np.float32, copy=False
            )
        )
        self.frames += size
        self.buffer = buffer[size * HOP_LENGTH :].copy()

    def features(self) -> np.ndarray:
        """The frames so far, joined and normalised; the batches are let go as they are copied."""
        out = np.empty((self.filters.shape[0], self.frames), dtype=np.float32)
        start = 0
        self.blocks.reverse()
        while self.blocks:
            block = self.blocks.pop()
            out[:, start : start + block.shape[1]] = block
            start += block.shape[1]
        np.maximum(out, out.max() - 8.0, out=out)
        out += 4.0
        out /= 4.0
        return out


class FeatureStream:
    """Log-mel features of 16 kHz mono float32 blocks, computed as the blocks arrive (one
    batch of spectrum whenever a batch's samples are in); :meth:`finish` pads the end and
    normalises, giving :class:`PreparedAudio` equal to the adapter's for the joined audio.

    The same steps as :func:`prepare_stream`, kept apart from it: that loop's allocation
    pattern is what the long-file memory test measures, and a feed-driven object changes it."""

    def __init__(self, n_mels: int = 80) -> None:
        self.n_mels = n_mels
        self._spectrum = _Spectrum(n_mels)
        self._head: list[np.ndarray] = []
        self._head_size = 0
        self._tail = np.zeros(0, dtype=np.float32)
        self._started = False
        #: Samples fed so far.
        self.samples = 0

    @property
    def seconds(self) -> float:
        return self.samples / SAMPLE_RATE

    def feed(self, block: np.ndarray) -> None:
        samples = np.asarray(block, dtype=np.float32).reshape(-1)
        self.samples += samples.size
        if not self._started:
            self._head.append(samples)
            self._head_size += samples.size
            if self._head_size >= _SHORT:
                joined = np.concatenate(self._head)
                self._head = []
                # Reflect padding at the start: the samples after the first, mirrored.
                self._spectrum.feed(np.concatenate((joined[_HALF:0:-1], joined)))
                self._tail = joined[-(_HALF + 1) :]
                self._started = True
        elif samples.size:
            self._spectrum.feed(samples)
            self._tail = np.concatenate((self._tail, samples))[-(_HALF + 1) :]

    def finish(self) -> PreparedAudio:
        """The features of everything fed; ValueError when nothing was."""
        if not self._started:
            if self._head_size == 0:
                raise ValueError("the audio stream held no samples")
            audio = np.concatenate(self._head)
            return PreparedAudio(audio.size, log_mel(audio, self.n_mels))
        # Whisper's 160 zeros at the end, then reflect padding of the padded waveform's end.
        end = np.concatenate((self._tail, np.zeros(_PADDING, dtype=np.float32)))
        self._spectrum.feed(np.zeros(_PADDING, dtype=np.float32))
        self._spectrum.feed(np.ascontiguousarray(end[-2 : -(_HALF + 2) : -1]), last=True)
        return PreparedAudio(self.samples, self._spectrum.features())


def prepare_stream(
    blocks: Iterable[np.ndarray],
    n_mels: int = 80,
    *,
    on_block: Callable[[int], None] | None = None,
) -> PreparedAudio:
    """16 kHz mono float32 ``blocks`` -> :class:`PreparedAudio` equal to the adapter's for the
    joined audio (see the module). ``on_block`` is told the samples seen so far after each
    block (for progress). An empty stream is a ValueError; readers refuse one first."""
    spectrum = _Spectrum(n_mels)
    head: list[np.ndarray] = []
    head_size = 0
    total = 0
    tail = np.zeros(0, dtype=np.float32)
    started = False
    for block in blocks:
        samples = np.asarray(block, dtype=np.float32).reshape(-1)
        total += samples.size
        if not started:
            head.append(samples)
            head_size += samples.size
            if head_size >= _SHORT:
                joined = np.concatenate(head)
                head = []
                # Reflect padding at the start: the samples after the first, mirrored.
                spectrum.feed(np.concatenate((joined[_HALF:0:-1], joined)))
                tail = joined[-(_HALF + 1) :]
                started = True
        elif samples.size:
            spectrum.feed(samples)
            tail = np.concatenate((tail, samples))[-(_HALF + 1) :]
        if on_block is not None:
            on_block(total)
    if not started:
        if head_size == 0:
            raise ValueError("the audio stream held no samples")
        audio = np.concatenate(head)
        return PreparedAudio(audio.size, log_mel(audio, n_mels))
    # Whisper's 160 zeros at the end, then reflect padding of the padded waveform's end.
    end = np.concatenate((tail, np.zeros(_PADDING, dtype=np.float32)))
    spectrum.feed(np.zeros(_PADDING, dtype=np.float32))
    spectrum.feed(np.ascontiguousarray(end[-2 : -(_HALF + 2) : -1]), last=True)
    return PreparedAudio(total, spectrum.features())
