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

:func:`spool_stream` (and :class:`SpooledFeatures`, fed block by block) keeps not even the
features in memory: each batch goes to an anonymous temporary file as it is computed, only the
running maximum stays, and the transcription adapter reads each window (30 s, or its encoder's
window) back and normalises it when its turn comes. That is what ``omni-edge transcribe`` uses: a two-hour file needs the
memory of one batch and one window, and 230 MB of temporary disk.
"""

from __future__ import annotations

import tempfile
import threading
from typing import IO, TYPE_CHECKING, Final

import numpy as np

from runtime.adapters.whisper_mel import (
    BLOCK_FRAMES,
    FRAMES_PER_WINDOW,
    HOP_LENGTH,
    N_FFT,
    SAMPLE_RATE,
    PreparedAudio,
    log_mel,
    mel_filters,
    normalise_features,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

__all__ = ["FeatureStream", "SpooledFeatures", "prepare_stream", "spool_stream"]

_HALF: Final = N_FFT // 2
_PADDING: Final = 160
#: Below this many samples the audio is simply joined and computed in one call.
_SHORT: Final = 4 * N_FFT
_FLOAT_BYTES: Final = 4


class _Spectrum:
    """Unnormalised log-mel frames of a padded signal fed in pieces, in fixed batches, kept in
    :attr:`blocks` or handed to ``sink`` as each batch is computed."""

    def __init__(self, n_mels: int, sink: Callable[[np.ndarray], None] | None = None) -> None:
        self.filters = mel_filters(n_mels)
        self.window = np.hanning(N_FFT + 1)[:-1].astype(np.float32)
        self.buffer = np.zeros(0, dtype=np.float32)
        self.blocks: list[np.ndarray] = []
        self.sink = self.blocks.append if sink is None else sink
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
        self.sink(
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
        normalise_features(out, out.max())
        return out


class FeatureStream:
    """Log-mel features of 16 kHz mono float32 blocks, computed as the blocks arrive (one
    batch of spectrum whenever a batch's samples are in); :meth:`finish` pads the end and
    normalises, giving :class:`PreparedAudio` equal to the adapter's for the joined audio.

    The same steps as :func:`prepare_stream`, kept apart from it: that loop's allocation
    pattern is what the long-file memory test measures, and a feed-driven object changes it.
    With a ``sink``, each batch of unnormalised frames goes there instead of being kept (see
    :class:`SpooledFeatures`)."""

    def __init__(
        self, n_mels: int = 80, *, sink: Callable[[np.ndarray], None] | None = None
    ) -> None:
        self.n_mels = n_mels
        self._spectrum = _Spectrum(n_mels, sink)
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

    def _end(self) -> np.ndarray | None:
        """Feed the end's padding (the last batches are computed); None, or the whole audio
        when it was too short to start the spectrum. ValueError when nothing was fed."""
        if not self._started:
            if self._head_size == 0:
                raise ValueError("the audio stream held no samples")
            return np.concatenate(self._head)
        # Whisper's 160 zeros at the end, then reflect padding of the padded waveform's end.
        end = np.concatenate((self._tail, np.zeros(_PADDING, dtype=np.float32)))
        self._spectrum.feed(np.zeros(_PADDING, dtype=np.float32))
        self._spectrum.feed(np.ascontiguousarray(end[-2 : -(_HALF + 2) : -1]), last=True)
        return None

    def finish(self) -> PreparedAudio:
        """The features of everything fed; ValueError when nothing was."""
        short = self._end()
        if short is not None:
            return PreparedAudio(short.size, log_mel(short, self.n_mels))
        return PreparedAudio(self.samples, self._spectrum.features())


class SpooledFeatures:
    """The features of a long audio, held on disk instead of in memory, for a request that
    reads them back one encoder window at a time (:meth:`window`).

    :meth:`feed` computes the unnormalised log-mel batches as blocks arrive (as
    :class:`FeatureStream` does) and appends each to an anonymous temporary file (frame-major
    float32, 32 KB a second of audio), keeping only its running maximum; :meth:`finish` pads
    the end. Whisper floors every frame at the *whole* audio's maximum less 8, so no window is
    final before the last block is read; :meth:`window` then reads its frames back and
    normalises them, equal bit for bit to the same frames of :func:`log_mel` of the joined
    audio. The memory stays one spectrum batch and one window whatever the audio's length;
    the file is removed by the system even if the process dies, and closed by :meth:`close`
    (idempotent; the transcription adapter closes it when its request ends).

    :attr:`on_progress`, when set, is told ``(seconds transcribed, seconds in all)`` after
    each window, on the engine's thread: keep it quick."""

    def __init__(self, n_mels: int = 80) -> None:
        self.n_mels = n_mels
        self.on_progress: Callable[[float, float], None] | None = None
        self._stream = FeatureStream(n_mels, sink=self._write)
        self._file: IO[bytes] | None = tempfile.TemporaryFile(prefix="omni-edge-mel-")
        self._lock = threading.Lock()
        self._maximum: np.float32 | None = None
        self._frames = 0
        self._finished = False

    @property
    def samples(self) -> int:
        """Samples fed so far (16 kHz)."""
        return self._stream.samples

    @property
    def seconds(self) -> float:
        return self._stream.seconds

    @property
    def frames(self) -> int:
        """Frames of features (once finished: the audio's samples // 160 + 1)."""
        return self._frames

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def closed(self) -> bool:
        return self._file is None

    def feed(self, block: np.ndarray) -> None:
        """16 kHz mono float32 samples; their complete batches of frames go to the file."""
        if self._finished:
            raise RuntimeError("the features are finished; nothing more can be fed")
        self._stream.feed(block)

    def finish(self) -> SpooledFeatures:
        """Pad the end and write the last frames; ValueError when nothing was fed."""
        if not self._finished:
            short = self._stream._end()
            if short is not None:
                self._write(log_mel(short, self.n_mels, normalise=False))
            self._finished = True
        return self

    def _write(self, block: np.ndarray) -> None:
        peak = block.max()
        self._maximum = peak if self._maximum is None else max(self._maximum, peak)
        with self._lock:
            if self._file is None:
                raise RuntimeError("the features were closed while they were computed")
            self._file.write(np.ascontiguousarray(block.T).data)
        self._frames += block.shape[1]

    def window(self, start: int, size: int, frames: int = FRAMES_PER_WINDOW) -> np.ndarray:
        """Frames ``start .. start + size``, normalised and zero-padded to one encoder window
        ``[1, n_mels, frames]`` (as :func:`~runtime.adapters.whisper_mel.window_features`)."""
        if not self._finished or self._maximum is None:
            raise RuntimeError("the features are read back only once finished")
        out = np.zeros((1, self.n_mels, frames), dtype=np.float32)
        size = max(0, min(size, frames, self._frames - start))
        row = self.n_mels * _FLOAT_BYTES
        with self._lock:
            if self._file is None:
                raise RuntimeError("the features were closed before the request read them")
            self._file.seek(start * row)
            raw = self._file.read(size * row)
        if len(raw) != size * row:
            raise OSError(
                f"the features' temporary file ended at frame {start + len(raw) // row} of "
                f"{self._frames}"
            )
        taken = out[0, :, :size]
        taken[...] = np.frombuffer(raw, dtype=np.float32).reshape(size, self.n_mels).T
        normalise_features(taken, self._maximum)
        return out

    def report(self, done_s: float) -> None:
        """Tell :attr:`on_progress` (if set) that ``done_s`` seconds are transcribed."""
        if self.on_progress is not None:
            self.on_progress(min(done_s, self.seconds), self.seconds)

    def close(self) -> None:
        """Let the file go (idempotent)."""
        with self._lock:
            file, self._file = self._file, None
        if file is not None:
            file.close()

    def __enter__(self) -> SpooledFeatures:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def spool_stream(
    blocks: Iterable[np.ndarray],
    n_mels: int = 80,
    *,
    on_block: Callable[[int], None] | None = None,
) -> SpooledFeatures:
    """16 kHz mono float32 ``blocks`` -> finished :class:`SpooledFeatures` (the caller closes
    them, or the request they are given to). ``on_block`` is told the samples seen so far after
    each block (for progress). An empty stream is a ValueError; readers refuse one first."""
    spool = SpooledFeatures(n_mels)
    try:
        for block in blocks:
            spool.feed(block)
            if on_block is not None:
                on_block(spool.samples)
        return spool.finish()
    except BaseException:
        spool.close()
        raise


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
