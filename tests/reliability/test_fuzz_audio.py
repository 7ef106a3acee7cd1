"""Fuzzing the audio reader (:mod:`runtime.audio.reader`): real files made with soundfile
(WAV, FLAC, OGG Vorbis or Opus in several encodings, at rates from 8 to 48 kHz with 1 to 6
channels), then truncated, with bytes flipped, header fields rewritten, garbage around them,
replaced by noise or text, or empty, read through a path, standard input (a real pipe,
spooled to a temporary copy), a seekable stream and an unseekable one.

Each read must be correct (1-D float32 blocks at 16 kHz, finite, as many samples as the
frames read last at 16 kHz; an unaltered file reads all it holds) or an
:class:`AudioReadError` with a documented code whose message starts with the name of what
was read; nothing else may escape. Each read runs under a deadline (a hang fails) and,
every few examples, under ``tracemalloc`` with an allowance of a few blocks, whatever
length a header declares. After each example nothing is left: no temporary copy, no file
descriptor, no process.

The default profile runs 100 examples; ``HYPOTHESIS_PROFILE=slow`` runs
``OMNI_FUZZ_EXAMPLES`` (``make reliability``).
"""

from __future__ import annotations

import io
import math
import os
import sys
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import soundfile
from hypothesis import example, given
from hypothesis import strategies as st

from runtime.audio.reader import (
    BLOCK_FRAMES,
    MAX_CHANNELS,
    MAX_RATE,
    MIN_RATE,
    TARGET_RATE,
    AudioReadError,
    open_audio,
)
from tests.reliability.support import Census
from tests.reliability.test_fuzz import FUZZ, Examples, examples

__all__ = ["examples"]

#: Every code the reader documents; any other is a bug.
CODES = frozenset(
    (
        *("not_found", "empty", "not_audio", "bad_rate"),
        *("bad_channels", "too_long", "truncated", "bad_samples"),
    )
)
#: Encodings per container, with the rates and channel counts libsndfile writes them at.
ENCODINGS: dict[str, tuple[str, ...]] = {
    "WAV": ("PCM_16", "PCM_U8", "PCM_24", "FLOAT", "ULAW", "IMA_ADPCM", "MS_ADPCM", "GSM610"),
    "FLAC": ("PCM_16", "PCM_24", "PCM_S8"),
    "OGG": ("VORBIS", "OPUS"),
}
OPUS_RATES = (8_000, 12_000, 16_000, 24_000, 48_000)
#: Encodings that pad the last block: a whole file may read up to one block more than written.
BLOCK_CODECS = frozenset({"IMA_ADPCM", "MS_ADPCM", "GSM610"})
CODEC_BLOCK_FRAMES = 8192
#: A read of a file under a second that takes longer than this has hung.
DEADLINE_S = 30.0
#: One example in this many is traced (tracing slows the decoders down).
TRACE_EVERY = 4
#: What a read may allocate: a few blocks of the channels the file declares, plus a fixed
#: part (soundfile's and soxr's own objects); never what a header says the length is.
BLOCK_ALLOWANCE = 6
FIXED_ALLOWANCE = 4 << 20
#: Float samples up to this far past full scale resample to finite values (far larger ones
#: may overflow the filter, and are then refused as ``bad_samples``).
SANE_PEAK = 1e6
ROUTES = ("path", "stdin", "stream", "pipe")
#: Values that break header fields: zero, one, the largest of each width, a sign flip.
FIELD_VALUES = (0, 1, 2, 3, 7, 64, 65, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)
#: Offsets of the canonical WAV header's fields: (offset, width in bytes).
WAV_FIELDS = ((4, 4), (20, 2), (22, 2), (24, 4), (28, 4), (32, 2), (34, 2), (40, 4))


@dataclass(frozen=True, slots=True)
class Original:
    """A file soundfile wrote: its bytes and what was written into it."""

    data: bytes = field(repr=False)
    container: str
    subtype: str
    rate: int
    channels: int
    frames: int
    finite: bool
    #: Finite and within :data:`SANE_PEAK`: an unaltered file like this must read.
    sane: bool


@st.composite
def originals(draw: st.DrawFn) -> Original:
    kind = draw(st.sampled_from(("tone", "noise", "silence", "clipped", "extreme")))
    if kind == "extreme":
        # Only a float file holds values past full scale, NaN and infinities.
        container, subtype = "WAV", "FLOAT"
    else:
        container = draw(st.sampled_from(sorted(ENCODINGS)))
        subtype = draw(st.sampled_from(ENCODINGS[container]))
    if subtype == "OPUS":
        rate = draw(st.sampled_from(OPUS_RATES))
    else:
        common = st.sampled_from((8_000, 16_000, 22_050, 44_100, 48_000))
        rate = draw(common | st.integers(8_000, 48_000))
    # GSM 6.10 is mono only; the ADPCM encoders stop at two channels.
    most = 1 if subtype == "GSM610" else 2 if subtype in BLOCK_CODECS else 6
    channels = draw(st.integers(1, most))
    frames = draw(st.sampled_from((0, 1, 7)) | st.integers(0, rate // 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    t = np.arange(frames, dtype=np.float64)[:, None] / rate
    if kind == "tone":
        audio = 0.5 * np.sin(2 * np.pi * rng.uniform(50, 4000) * t + rng.uniform(0, 6, channels))
    elif kind == "noise":
        audio = rng.uniform(-1, 1, (frames, channels))
    elif kind == "silence":
        audio = np.zeros((frames, channels))
    elif kind == "clipped":
        audio = rng.uniform(-4, 4, (frames, channels))
    else:
        # libsndfile's own encoders crash on these (its u-law one segfaults): float files only.
        audio = rng.uniform(-1, 1, (frames, channels))
        if frames:
            # A run of them: a filter sums its neighbours, so a run overflows where one may not.
            start = draw(st.integers(0, frames - 1))
            run = draw(st.sampled_from((1, 3, 64)))
            audio[start : start + run, draw(st.integers(0, channels - 1))] = draw(
                st.sampled_from((1e6, 1e37, -3e38, 3.4e38, math.nan, math.inf, -math.inf))
            )
    audio = audio.astype(np.float32)
    buffer = io.BytesIO()
    soundfile.write(buffer, audio, rate, format=container, subtype=subtype)
    finite = bool(np.isfinite(audio).all())
    sane = finite and (not frames or float(np.abs(audio).max()) <= SANE_PEAK)
    return Original(buffer.getvalue(), container, subtype, rate, channels, frames, finite, sane)


@st.composite
def mutations(draw: st.DrawFn, original: Original) -> tuple[str, bytes]:
    """How the file is damaged, and its bytes after that."""
    data = original.data
    how = draw(
        st.sampled_from(
            (
                *("as is", "as is", "truncated", "flipped", "header"),
                *("spliced", "noise", "text", "empty", "repeated"),
            )
        )
    )
    if how == "truncated":
        return how, data[: draw(st.integers(0, max(0, len(data) - 1)))]
    if how == "flipped" and data:
        mutable = bytearray(data)
        for _ in range(draw(st.integers(1, 16))):
            at = draw(st.integers(0, len(mutable) - 1))
            mutable[at] = draw(st.integers(0, 255))
        return how, bytes(mutable)
    if how == "header":
        mutable = bytearray(data)
        for _ in range(draw(st.integers(1, 3))):
            if original.container == "WAV" and draw(st.booleans()):
                at, width = draw(st.sampled_from(WAV_FIELDS))
            else:
                width = draw(st.sampled_from((1, 2, 4)))
                at = draw(st.integers(0, max(0, min(len(mutable), 128) - width)))
            value = draw(st.sampled_from(FIELD_VALUES) | st.integers(0, 2**32 - 1))
            value &= (1 << (8 * width)) - 1
            mutable[at : at + width] = value.to_bytes(width, "little")
        return how, bytes(mutable[: len(data)])
    if how == "spliced":
        at = draw(st.integers(0, len(data)))
        return how, data[:at] + draw(st.binary(min_size=1, max_size=256)) + data[at:]
    if how == "noise":
        return how, draw(st.binary(max_size=4096))
    if how == "text":
        return how, b"plain words, not audio\n" * draw(st.integers(1, 50))
    if how == "empty":
        return how, b""
    if how == "repeated":
        # Two files back to back: the second's header lands inside the first's data.
        return how, data + data
    return how, data


@dataclass(frozen=True, slots=True)
class Case:
    """One read: the file, how it was damaged, its bytes after that, the route, the limit."""

    original: Original
    mutation: str
    data: bytes = field(repr=False)
    route: str
    max_seconds: float | None
    block_frames: int = BLOCK_FRAMES


@st.composite
def cases(draw: st.DrawFn) -> Case:
    original = draw(originals())
    mutation, data = draw(mutations(original))
    route = draw(st.sampled_from(ROUTES))
    max_seconds = draw(st.none() | st.none() | st.floats(0.01, 1.0))
    # Small blocks too, so that a file spans several (the resampler's state, the length
    # found past the limit while reading).
    block_frames = draw(st.sampled_from((BLOCK_FRAMES, 4096, 997)))
    return Case(original, mutation, data, route, max_seconds, block_frames)


class _Pipe(io.RawIOBase):
    """A stream that cannot seek, as an upload read off a socket."""

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


@dataclass
class Outcome:
    """What one read gave: the samples' count and the frames read, or the error."""

    samples: int = 0
    frames_read: int = 0
    rate: int = 0
    channels: int = 0
    error: BaseException | None = None
    done: bool = False


def _read(case: Case, inputs: Path, outcome: Outcome) -> None:
    """Read ``case`` through its route into ``outcome`` (the reader's errors included)."""
    source: str | io.RawIOBase | io.BufferedIOBase
    name: str | None = None
    if case.route == "path":
        path = inputs / f"clip.{case.original.container.lower()}"
        path.write_bytes(case.data)
        source = str(path)
    elif case.route == "stream":
        source, name = io.BytesIO(case.data), "upload.bin"
    elif case.route == "pipe":
        source, name = _Pipe(case.data), "pipe.bin"
    else:
        source = "-"
    try:
        with warnings.catch_warnings():
            # A warning would be an exception where warnings are errors: none may escape.
            warnings.simplefilter("error")
            _read_stream(case, source, name, outcome)
    except BaseException as exc:
        outcome.error = exc
    finally:
        outcome.done = True


def _read_stream(
    case: Case, source: str | io.RawIOBase | io.BufferedIOBase, name: str | None, outcome: Outcome
) -> None:
    with open_audio(
        source, max_seconds=case.max_seconds, name=name, block_frames=case.block_frames
    ) as stream:
        outcome.rate = stream.info.sample_rate
        outcome.channels = stream.info.channels
        for block in stream:
            assert block.dtype == np.float32, block.dtype
            assert block.ndim == 1, block.shape
            assert np.isfinite(block).all(), "a block holds NaN or infinite samples"
            outcome.samples += block.size
        assert outcome.samples == stream.samples_out
        outcome.frames_read = round(stream.position_s * stream.info.sample_rate)


def _read_with_deadline(case: Case, inputs: Path) -> Outcome:
    """Read on a thread of its own, so that a read that never ends fails the example."""
    outcome = Outcome()
    if case.route != "stdin":
        worker = threading.Thread(target=_read, args=(case, inputs, outcome), daemon=True)
        worker.start()
        worker.join(DEADLINE_S)
        assert outcome.done, f"the read of {case.mutation} {case.route} hung"
        return outcome
    # Standard input is a real pipe: a writer fills it while the reader spools it.
    read_end, write_end = os.pipe()

    def feed() -> None:
        with os.fdopen(write_end, "wb") as out:
            try:
                out.write(case.data)
            except BrokenPipeError:
                pass

    writer = threading.Thread(target=feed, daemon=True)
    with os.fdopen(read_end, "r") as stdin, pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stdin", stdin)
        writer.start()
        worker = threading.Thread(target=_read, args=(case, inputs, outcome), daemon=True)
        worker.start()
        worker.join(DEADLINE_S)
        assert outcome.done, f"the read of {case.mutation} standard input hung"
    writer.join(DEADLINE_S)
    assert not writer.is_alive()
    return outcome


def _label(case: Case, inputs: Path) -> str:
    return {
        "path": str(inputs / f"clip.{case.original.container.lower()}"),
        "stdin": "stdin",
        "stream": "upload.bin",
        "pipe": "pipe.bin",
    }[case.route]


def _check_outcome(case: Case, inputs: Path, outcome: Outcome) -> None:
    error = outcome.error
    if isinstance(error, AssertionError):
        raise error
    if error is not None:
        if not isinstance(error, AudioReadError):
            raise AssertionError(
                f"{case.mutation} {case.original.container}/{case.original.subtype} through "
                f"{case.route} raised {type(error).__name__}, not AudioReadError"
            ) from error
        label = _label(case, inputs)
        assert error.code in CODES, error.code
        assert error.source == label, (error.source, label)
        assert str(error).startswith(f"{label}: "), str(error)
        assert "accepted:" in str(error), str(error)
        if not case.data:
            assert error.code == "empty", str(error)
        if case.mutation == "as is" and case.original.sane and case.original.frames:
            # An unaltered file is refused only for its length.
            assert error.code == "too_long", str(error)
        return
    # A correct read: as many 16 kHz samples as the frames read last.
    assert MIN_RATE <= outcome.rate <= MAX_RATE, outcome.rate
    assert outcome.frames_read > 0
    expected = outcome.frames_read * TARGET_RATE / outcome.rate
    assert abs(outcome.samples - expected) <= 2, (outcome.samples, expected)
    if case.max_seconds is not None:
        assert outcome.frames_read / outcome.rate <= case.max_seconds
    if case.mutation == "as is":
        original = case.original
        assert original.finite, "NaN or infinite samples were read as audio"
        assert (outcome.rate, outcome.channels) == (original.rate, original.channels)
        extra = CODEC_BLOCK_FRAMES if original.subtype in BLOCK_CODECS else 0
        assert original.frames <= outcome.frames_read <= original.frames + extra, (
            outcome.frames_read,
            original.frames,
        )


def _float_wav(frames: np.ndarray, rate: int) -> Original:
    buffer = io.BytesIO()
    soundfile.write(buffer, frames, rate, format="WAV", subtype="FLOAT")
    channels = 1 if frames.ndim == 1 else frames.shape[1]
    return Original(buffer.getvalue(), "WAV", "FLOAT", rate, channels, len(frames), False, False)


def _with(values: list[float], channels: int) -> np.ndarray:
    audio = np.zeros((400, channels), np.float32)
    audio[100 : 100 + len(values)] = np.array(values, np.float32)[:, None]
    if channels == 2:
        audio[100 : 100 + len(values), 1] *= -1
    return audio


#: Inputs the reader once mishandled: an empty upload (``not_audio``), samples the resampler
#: overflowed into NaN (yielded as audio), infinities that averaged to NaN with a warning.
HUGE = _float_wav(_with([-3e38] * 3, 1), 8_000)
OPPOSED = _float_wav(_with([math.inf], 2), 16_000)
EMPTY = Original(b"", "WAV", "PCM_16", 16_000, 1, 0, finite=True, sane=True)


@FUZZ
@given(case=cases())
@example(case=Case(EMPTY, "empty", b"", "stream", None))
@example(case=Case(HUGE, "as is", HUGE.data, "path", None))
@example(case=Case(OPPOSED, "as is", OPPOSED.data, "pipe", None))
def test_audio_reader(examples: Examples, private_tmpdir: Path, tmp_path: Path, case: Case) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir(exist_ok=True)
    census = Census.take(private_tmpdir)
    with examples.measure(TRACE_EVERY) as measured:
        outcome = _read_with_deadline(case, inputs)
    _check_outcome(case, inputs, outcome)
    for leftover in inputs.iterdir():
        leftover.unlink()
    if measured.traced:
        channels = min(max(outcome.channels, 1), MAX_CHANNELS)
        allowance = FIXED_ALLOWANCE + BLOCK_ALLOWANCE * case.block_frames * 4 * channels
        assert measured.bytes <= allowance, (
            f"{measured.bytes} bytes reading {len(case.data)} bytes with {channels} channels"
        )
    leaks = census.leaks(grace_s=1.0)
    assert not leaks.total, leaks.describe()
