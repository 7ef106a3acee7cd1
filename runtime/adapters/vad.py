"""Voice activity: Silero VAD probabilities per 32 ms chunk turned into speech events.

Three layers, each usable alone:

- :class:`SpeechDetector` (pure, no I/O): per-chunk speech probabilities in, frozen
  :class:`SpeechStarted` / :class:`SpeechEnded` events out, with a threshold and a lower
  release threshold (hysteresis), a minimum speech duration, a silence hangover and a pre-roll
  of audio kept from before the start.
- :class:`VadStream`: 16 kHz mono audio in, any amount at a time (32 ms chunks as a microphone
  delivers them, or a whole file); it cuts 512-sample chunks, builds each call's inputs with the
  64 context samples and the recurrent state carried from the previous call (the graph worker
  is stateless: both travel in and out of every call as tensors), and feeds the detector.
- :class:`VadAdapter`: the pipeline program. Its one graph stage is the Silero bundle
  (:mod:`runtime.adapters.vad_bundle`) in an ONNX Runtime worker like every graph stage; a
  request is a clip (``{"audio": samples, "sample_rate": Hz}``, any rate, mono or
  [samples, channels], resampled to 16 kHz with soxr) or a live source (an iterable of 1-D
  float32 chunks at 16 kHz, read as they arrive). Each event goes out as it is found (outputs
  ``event``, ``t``, ``sample``, ``detected_at`` and, for a start, ``pcm`` from the pre-roll
  on); the final output's metrics hold the segments, the per-chunk call times (the model's
  run in the worker, and the whole call from the adapter) and, for a clip, every chunk's
  probability.

Adapter options (``adapter.options`` in the pipeline file; see :class:`VadSettings`):
``threshold`` (0.5), ``neg_threshold`` (threshold - 0.15), ``min_speech_s`` (0.25),
``min_silence_s`` (0.5, the hangover), ``pre_roll_s`` (0.3).

Times are seconds of audio from the stream's start, at chunk boundaries (32 ms resolution).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import deque
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from runtime.adapters.speech_options import (
    PROBABILITIES,
    check_settings,
    read_options,
    release_threshold,
)
from runtime.adapters.vad_bundle import (
    CHUNK_SAMPLES,
    CONTEXT_SAMPLES,
    SAMPLE_RATE,
    VAD_FORMAT,
    initial_state,
    model_inputs,
)
from runtime.errors import ConfigError, ModelError, UsageError

if TYPE_CHECKING:
    from runtime.config import PipelineConfig
    from runtime.engine.inputs import InputStream
    from runtime.engine.program import RequestContext

__all__ = [
    "OPTION_NAMES",
    "SpeechDetector",
    "SpeechEnded",
    "SpeechStarted",
    "VadAdapter",
    "VadEvent",
    "VadOptionsError",
    "VadSettings",
    "VadStream",
    "event_from_outputs",
    "to_mono_16k",
]

CHUNK_S: Final = CHUNK_SAMPLES / SAMPLE_RATE
_DURATIONS: Final = ("min_speech_s", "min_silence_s", "pre_roll_s")
OPTION_NAMES: Final = (*PROBABILITIES, *_DURATIONS)
#: The speech probability at or above which a chunk is voiced, unless given.
DEFAULT_THRESHOLD: Final = 0.5
#: Longest wait for a live source's next chunk before the request looks whether it was
#: cancelled (sources with ``read(timeout)``).
LIVE_WAIT_S: Final = 0.1
#: Longest duration option accepted, in seconds.
MAX_DURATION_S: Final = 30.0
STARTED: Final = "speech_started"
ENDED: Final = "speech_ended"
FINISHED: Final = "finished"


class VadOptionsError(ConfigError):
    """The voice activity adapter's options or stages are not usable."""


@dataclass(frozen=True, slots=True)
class VadSettings:
    """When speech starts and ends.

    A chunk is voiced at ``threshold`` or above and silent under ``neg_threshold`` (between
    the two it changes nothing). Speech starts once voiced chunks span ``min_speech_s`` with
    no silence of ``min_silence_s`` between them (a shorter burst starts nothing); it ends
    after ``min_silence_s`` of silence (the hangover: shorter pauses stay inside the speech).
    ``pre_roll_s`` of audio before the start travels with the start event.
    """

    threshold: float = DEFAULT_THRESHOLD
    neg_threshold: float | None = None
    min_speech_s: float = 0.25
    min_silence_s: float = 0.5
    pre_roll_s: float = 0.3

    def __post_init__(self) -> None:
        check_settings(self, _DURATIONS, MAX_DURATION_S)

    @property
    def release(self) -> float:
        """The probability under which a chunk counts as silence."""
        return release_threshold(self.threshold, self.neg_threshold)

    @classmethod
    def parse(
        cls, options: Mapping[str, Any], *, file: str | None = None, line: int | None = None
    ) -> VadSettings:
        """Check ``adapter.options``; every failure names the option and what is accepted."""

        def fail(name: str, message: str) -> VadOptionsError:
            return VadOptionsError(message, file=file, line=line, key=f"adapter.options.{name}")

        unknown = sorted(set(options) - set(OPTION_NAMES))
        if unknown:
            raise fail(
                unknown[0],
                f"unknown voice activity option {unknown[0]!r}; accepted: "
                f"{', '.join(OPTION_NAMES)}",
            )
        values = read_options(options, _DURATIONS, MAX_DURATION_S, fail)
        threshold = values.get("threshold", DEFAULT_THRESHOLD)
        negative = values.get("neg_threshold")
        if negative is not None and negative > threshold:
            raise fail(
                "neg_threshold",
                f"{negative} is above the threshold {threshold}; accepted: a probability at most "
                "the threshold",
            )
        return cls(**values)


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    """Speech began at ``t`` (seconds from the stream's start); it was recognised once
    ``detected_at`` seconds of audio had arrived. ``pcm`` is the audio from ``pcm_t`` (the
    pre-roll before ``t``) to ``detected_at``, 16 kHz mono float32, read-only."""

    t: float
    sample: int
    detected_at: float
    pcm_t: float
    pcm: np.ndarray = field(compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class SpeechEnded:
    """Speech that began at ``started`` ended at ``t`` (where the silence began); it was
    recognised ``detected_at`` seconds into the stream (after the hangover, or at its end)."""

    t: float
    sample: int
    detected_at: float
    started: float

    @property
    def duration_s(self) -> float:
        return self.t - self.started


VadEvent = SpeechStarted | SpeechEnded


class SpeechDetector:
    """Per-chunk speech probabilities in, :class:`SpeechStarted` / :class:`SpeechEnded` out.

    Feed every chunk, in order, with :meth:`push`; :meth:`finish` ends the stream (speech still
    going ends where its silence began, or at the stream's end). Memory stays bounded: only
    the audio of the pre-roll and of a start not yet confirmed is kept.
    """

    def __init__(self, settings: VadSettings | None = None, sample_rate: int = SAMPLE_RATE) -> None:
        self.settings = settings or VadSettings()
        self.sample_rate = sample_rate
        self._min_speech = round(self.settings.min_speech_s * sample_rate)
        self._min_silence = round(self.settings.min_silence_s * sample_rate)
        self._pre_roll = round(self.settings.pre_roll_s * sample_rate)
        self._position = 0
        self._start: int | None = None
        self._last_voiced = 0
        self._silence_from: int | None = None
        self._speaking = False
        self._audio: deque[tuple[int, np.ndarray]] = deque()
        self._finished = False

    @property
    def speaking(self) -> bool:
        """True between a start and its end."""
        return self._speaking

    @property
    def position_s(self) -> float:
        """Seconds of audio pushed so far."""
        return self._position / self.sample_rate

    def push(self, probability: float, chunk: np.ndarray) -> list[VadEvent]:
        """One chunk's speech probability and its samples; the events it completes."""
        if self._finished:
            raise UsageError("the detector was finished; start a new one for a new stream")
        begin = self._position
        end = begin + int(chunk.shape[0])
        self._position = end
        self._audio.append((begin, chunk))
        events: list[VadEvent] = []
        settings = self.settings
        if probability >= settings.threshold:
            self._silence_from = None
            self._last_voiced = end
            if self._start is None:
                self._start = begin
        elif probability < settings.release and self._start is not None:
            if self._silence_from is None:
                self._silence_from = begin
            if end - self._silence_from >= self._min_silence:
                if self._speaking:
                    events.append(self._ended(self._silence_from))
                self._start = None
                self._silence_from = None
        if (
            self._start is not None
            and not self._speaking
            and self._last_voiced - self._start >= self._min_speech
        ):
            events.append(self._started(self._start))
        self._trim()
        return events

    def finish(self) -> list[VadEvent]:
        """End of the stream: speech still going ends now. Idempotent."""
        if self._finished:
            return []
        self._finished = True
        events: list[VadEvent] = []
        if self._speaking:
            until = self._silence_from if self._silence_from is not None else self._position
            events.append(self._ended(until))
        self._audio.clear()
        return events

    def _started(self, start: int) -> SpeechStarted:
        self._speaking = True
        first = max(0, start - self._pre_roll)
        pieces = [
            piece[max(0, first - at) :] for at, piece in self._audio if at + piece.shape[0] > first
        ]
        pcm = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        pcm = pcm.astype(np.float32, copy=False)
        pcm.flags.writeable = False
        return SpeechStarted(
            t=start / self.sample_rate,
            sample=start,
            detected_at=self._position / self.sample_rate,
            pcm_t=first / self.sample_rate,
            pcm=pcm,
        )

    def _ended(self, at: int) -> SpeechEnded:
        assert self._start is not None
        self._speaking = False
        return SpeechEnded(
            t=at / self.sample_rate,
            sample=at,
            detected_at=self._position / self.sample_rate,
            started=self._start / self.sample_rate,
        )

    def _trim(self) -> None:
        # Keep the pre-roll before now, or before a start not yet confirmed.
        anchor = self._start if self._start is not None and not self._speaking else self._position
        keep_from = anchor - self._pre_roll
        while self._audio and self._audio[0][0] + self._audio[0][1].shape[0] <= keep_from:
            self._audio.popleft()


def to_mono_16k(audio: object, sample_rate: object, *, where: str = "audio") -> np.ndarray:
    """``audio`` (1-D, or [samples, channels]) at ``sample_rate`` as 16 kHz mono float32."""
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int) or sample_rate <= 0:
        raise UsageError(f"{where}: sample_rate {sample_rate!r} is not a rate; accepted: Hz > 0")
    array = np.asarray(audio)
    if array.dtype.kind not in "fiu" or array.ndim not in (1, 2) or array.size == 0:
        raise UsageError(
            f"{where}: samples of dtype {array.dtype} and shape {array.shape} are not audio; "
            "accepted: a non-empty 1-D array or [samples, channels] of numbers"
        )
    if array.dtype.kind in "iu":
        scale = float(np.iinfo(array.dtype).max) + 1.0
        array = array.astype(np.float32) / np.float32(scale)
    mono = array.astype(np.float32) if array.ndim == 1 else array.astype(np.float32).mean(axis=1)
    if not np.isfinite(mono).all():
        raise UsageError(f"{where}: the samples hold NaN or infinity; accepted: finite numbers")
    if sample_rate == SAMPLE_RATE:
        return np.ascontiguousarray(mono)
    import soxr

    resampled: np.ndarray = soxr.resample(mono, sample_rate, SAMPLE_RATE, quality="HQ")
    return np.ascontiguousarray(resampled, dtype=np.float32)


class VadStream:
    """16 kHz mono audio in, any amount at a time; model calls and events out.

    For each full 512-sample chunk, :meth:`chunks` gives the chunk; :meth:`inputs` builds its
    call (the 64 samples before it, then the chunk; the state from the previous call);
    :meth:`accept` takes the call's outputs, carries the state and the context on and returns
    the events. :meth:`run` and :meth:`arun` do all three with a given call.
    """

    def __init__(
        self, settings: VadSettings | None = None, *, keep_probabilities: bool = False
    ) -> None:
        self.detector = SpeechDetector(settings)
        self._keep = keep_probabilities
        self._pending = np.zeros(0, np.float32)
        self._context = np.zeros(CONTEXT_SAMPLES, np.float32)
        self._state = initial_state()
        self.chunks_scored = 0
        #: The last scored chunk's speech probability.
        self.probability = 0.0
        #: Every chunk's speech probability, when kept (a clip's; a live stream keeps none).
        self.probabilities: list[float] = []

    @property
    def state(self) -> np.ndarray:
        """The recurrent state the next call gets (the last call's ``stateN``)."""
        return self._state

    def chunks(self, samples: np.ndarray) -> Iterator[np.ndarray]:
        """The full chunks ``samples`` completes, after what was pending; keeps the rest."""
        if samples.ndim != 1:
            raise UsageError(
                f"voice activity takes 1-D 16 kHz mono samples; got shape {samples.shape}"
            )
        pending = np.concatenate((self._pending, samples.astype(np.float32, copy=False)))
        full = pending.shape[0] // CHUNK_SAMPLES * CHUNK_SAMPLES
        self._pending = pending[full:].copy()
        for begin in range(0, full, CHUNK_SAMPLES):
            yield pending[begin : begin + CHUNK_SAMPLES]

    def last_chunk(self) -> np.ndarray | None:
        """The pending samples padded with zeros to a chunk (None when nothing is pending)."""
        if not self._pending.shape[0]:
            return None
        chunk = np.zeros(CHUNK_SAMPLES, np.float32)
        chunk[: self._pending.shape[0]] = self._pending
        self._pending = np.zeros(0, np.float32)
        return chunk

    def inputs(self, chunk: np.ndarray) -> dict[str, np.ndarray]:
        """The call for ``chunk``: the context and the carried state in."""
        return model_inputs(np.concatenate((self._context, chunk)), self._state)

    def accept(self, chunk: np.ndarray, outputs: Mapping[str, np.ndarray]) -> list[VadEvent]:
        """The call's outputs for ``chunk``: carry ``stateN`` and the context; the events."""
        probability = np.asarray(outputs["output"])
        state = np.asarray(outputs["stateN"])
        if probability.size != 1 or state.shape != self._state.shape:
            raise ModelError(
                f"the voice activity stage returned output {probability.shape} and stateN "
                f"{state.shape}; expected one probability and a state of {self._state.shape}"
            )
        self._state = np.array(state, dtype=np.float32, copy=True)
        self._context = chunk[-CONTEXT_SAMPLES:].copy()
        value = float(probability.reshape(()))
        self.probability = value
        self.chunks_scored += 1
        if self._keep:
            self.probabilities.append(value)
        return self.detector.push(value, chunk)

    def finish(self) -> list[VadEvent]:
        """End of the stream (call after the last chunk)."""
        return self.detector.finish()

    def run(
        self,
        samples: np.ndarray,
        call: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]],
        *,
        last: bool = False,
    ) -> list[VadEvent]:
        """Score ``samples`` with a synchronous ``call`` (an in-process session, say)."""
        events: list[VadEvent] = []
        for chunk in self._chunks_of(samples, last):
            events.extend(self.accept(chunk, call(self.inputs(chunk))))
        if last:
            events.extend(self.finish())
        return events

    async def arun(
        self,
        samples: np.ndarray,
        call: Callable[[dict[str, np.ndarray]], Awaitable[Mapping[str, np.ndarray]]],
        *,
        last: bool = False,
    ) -> list[VadEvent]:
        """Score ``samples`` with an awaitable ``call`` (a graph stage)."""
        events: list[VadEvent] = []
        for chunk in self._chunks_of(samples, last):
            events.extend(self.accept(chunk, await call(self.inputs(chunk))))
        if last:
            events.extend(self.finish())
        return events

    def _chunks_of(self, samples: np.ndarray, last: bool) -> list[np.ndarray]:
        chunks = list(self.chunks(samples))
        if last:
            tail = self.last_chunk()
            if tail is not None:
                chunks.append(tail)
        return chunks


def event_outputs(event: VadEvent) -> dict[str, Any]:
    """An event as a request output's tensors."""
    if isinstance(event, SpeechStarted):
        return {
            "event": STARTED,
            "t": event.t,
            "sample": event.sample,
            "detected_at": event.detected_at,
            "pcm_t": event.pcm_t,
            "pcm": event.pcm,
            "sample_rate": SAMPLE_RATE,
        }
    return {
        "event": ENDED,
        "t": event.t,
        "sample": event.sample,
        "detected_at": event.detected_at,
        "started": event.started,
    }


def event_from_outputs(outputs: Mapping[str, Any]) -> VadEvent | None:
    """The event a :class:`VadAdapter` output carries (None for the final output)."""
    kind = outputs.get("event")
    if kind == STARTED:
        pcm = np.asarray(outputs["pcm"], dtype=np.float32)
        return SpeechStarted(
            t=float(outputs["t"]),
            sample=int(outputs["sample"]),
            detected_at=float(outputs["detected_at"]),
            pcm_t=float(outputs["pcm_t"]),
            pcm=pcm,
        )
    if kind == ENDED:
        return SpeechEnded(
            t=float(outputs["t"]),
            sample=int(outputs["sample"]),
            detected_at=float(outputs["detected_at"]),
            started=float(outputs["started"]),
        )
    return None


@dataclass(frozen=True, slots=True)
class _Clip:
    samples: np.ndarray


@dataclass(frozen=True, slots=True)
class _Live:
    chunks: Iterable[np.ndarray] | AsyncIterable[np.ndarray]


_ACCEPTED = (
    "{'audio': samples (1-D or [samples, channels]), 'sample_rate': Hz (default 16000)}, or a "
    "live source: an iterable of 1-D float32 chunks at 16 kHz"
)


class VadAdapter:
    """The pipeline program of one Silero VAD graph stage (stage 0)."""

    input_kind: Final = "tensors"
    kind: Final = "vad"
    #: A streaming request is fed 1-D float32 chunks at 16 kHz, each scored as it arrives.
    streams_input: Final = True

    def __init__(self, config: PipelineConfig, options: Mapping[str, Any]) -> None:
        from runtime.artifacts import verify_bundle
        from runtime.config import GraphBackendConfig

        source = str(config.source) if config.source is not None else None
        line = config.adapter.line if config.adapter is not None else None
        self.config = config
        self.settings = VadSettings.parse(options, file=source, line=line)
        stage = config.stages[0]
        if len(config.stages) != 1 or not isinstance(stage.backend, GraphBackendConfig):
            raise VadOptionsError(
                "the voice activity adapter drives exactly one graph stage (the Silero VAD "
                f"bundle); this pipeline has {len(config.stages)} stage(s)",
                file=source,
                line=line,
                key="stages",
            )
        bundle = verify_bundle(stage.backend.manifest)
        metadata = bundle.manifest.metadata
        if metadata.get("vad_format") != VAD_FORMAT or metadata.get("sample_rate") != SAMPLE_RATE:
            raise VadOptionsError(
                f"{bundle.manifest_path} is not a voice activity bundle of format {VAD_FORMAT} "
                f"(vad_format {metadata.get('vad_format')!r}); accepted: a bundle made by "
                "runtime.adapters.vad_bundle.ensure_vad_bundle",
                file=source,
                line=line,
                key="stages[0].backend.manifest",
            )

    def prepare(self, request_input: Any) -> _Clip | _Live:
        """A clip resampled to 16 kHz mono, or a live source kept to read as it runs."""
        where = f"pipeline {self.config.pipeline}"
        if isinstance(request_input, Mapping):
            unknown = sorted(set(map(str, request_input)) - {"audio", "sample_rate"})
            if unknown or "audio" not in request_input:
                problem = f"unknown key {unknown[0]!r}" if unknown else "no 'audio'"
                raise UsageError(f"{where}: the request has {problem}; accepted: {_ACCEPTED}")
            rate = request_input.get("sample_rate", SAMPLE_RATE)
            if isinstance(rate, np.integer):
                rate = int(rate)
            return _Clip(to_mono_16k(request_input["audio"], rate, where=where))
        if isinstance(request_input, AsyncIterable) or (
            isinstance(request_input, Iterable)
            and not isinstance(request_input, (str, bytes, np.ndarray))
        ):
            # A source that says its rate (runtime.audio.AudioInput does) must say 16 kHz.
            rate = getattr(request_input, "sample_rate", SAMPLE_RATE)
            if rate != SAMPLE_RATE:
                raise UsageError(
                    f"{where}: the live source delivers {rate!r} Hz; accepted: {SAMPLE_RATE} Hz "
                    "(e.g. AudioInput(sample_rate=16000), its default)"
                )
            return _Live(request_input)
        raise UsageError(
            f"{where}: a request of type {type(request_input).__name__} is not audio; "
            f"accepted: {_ACCEPTED}"
        )

    def prepare_chunk(self, chunk: Any) -> np.ndarray:
        """One chunk of a streaming request: 1-D float32 samples at 16 kHz (copied, so the
        caller may reuse its buffer)."""
        array = np.asarray(chunk)
        if array.ndim != 1 or array.dtype != np.float32:
            raise UsageError(
                f"pipeline {self.config.pipeline}: a chunk of dtype {array.dtype} and shape "
                f"{array.shape}; accepted: 1-D float32 samples at {SAMPLE_RATE} Hz"
            )
        return array.copy()

    async def run_streaming(self, ctx: RequestContext, chunks: InputStream) -> None:
        """The chunks fed after the start, scored as they arrive (a live source)."""
        await self.run(ctx, _Live(chunks))

    async def run(self, ctx: RequestContext, prepared: _Clip | _Live) -> None:
        stage = ctx.stage_name(0)
        clip = isinstance(prepared, _Clip)
        stream = VadStream(self.settings, keep_probabilities=clip)
        call_s: list[float] = []
        wall_s: list[float] = []
        segments: list[list[float]] = []
        started = time.perf_counter()

        async def call(inputs: dict[str, np.ndarray]) -> Mapping[str, np.ndarray]:
            began = time.perf_counter()
            result = await ctx.call(0, inputs)
            wall_s.append(time.perf_counter() - began)
            call_s.append(result.run_s)
            return result.outputs

        async def send(events: list[VadEvent]) -> None:
            for event in events:
                if isinstance(event, SpeechEnded):
                    segments.append([event.started, event.t])
                await ctx.emit(event_outputs(event), stage=stage)

        if isinstance(prepared, _Clip):
            # Chunk by chunk, so each event goes out as soon as it is found in a long file.
            samples = prepared.samples
            for begin in range(0, samples.shape[0], CHUNK_SAMPLES):
                ctx.check_cancelled()
                await send(await stream.arun(samples[begin : begin + CHUNK_SAMPLES], call))
            await send(await stream.arun(np.zeros(0, np.float32), call, last=True))
        else:
            async for chunk in _read_live(prepared.chunks):
                ctx.check_cancelled()
                if chunk.ndim != 1 or chunk.dtype != np.float32:
                    raise UsageError(
                        f"pipeline {self.config.pipeline}: a live chunk of dtype {chunk.dtype} "
                        f"and shape {chunk.shape}; accepted: 1-D float32 at 16 kHz"
                    )
                await send(await stream.arun(chunk, call))
            await send(await stream.arun(np.zeros(0, np.float32), call, last=True))
        audio_s = stream.detector.position_s
        wall = time.perf_counter() - started
        metrics = {
            "chunks": stream.chunks_scored,
            "audio_seconds": audio_s,
            "segments": segments,
            "call_run_s_p50": statistics.median(call_s) if call_s else None,
            "call_wall_s_p50": statistics.median(wall_s) if wall_s else None,
            "real_time_factor": wall / audio_s if audio_s else None,
        }
        if clip:
            metrics["probabilities"] = stream.probabilities
        await ctx.emit({"event": FINISHED}, stage=stage, finished=True, metrics=metrics)


async def _read_live(
    source: Iterable[np.ndarray] | AsyncIterable[np.ndarray],
) -> AsyncIterable[np.ndarray]:
    """Chunks of a live source as they arrive; a blocking iterator is read off the loop.

    A source with ``read(timeout)`` (an :class:`runtime.audio.AudioSource`) is read a short
    wait at a time, an empty chunk between, so a cancelled request never leaves a thread
    waiting on a device that went quiet."""
    if isinstance(source, AsyncIterable):
        async for chunk in source:
            yield np.asarray(chunk)
        return
    reader = getattr(source, "read", None)
    if callable(reader):

        def read() -> np.ndarray | None:
            found: np.ndarray | None = reader(LIVE_WAIT_S)
            return found

    else:
        iterator = iter(source)

        def read() -> np.ndarray | None:
            return next(iterator, None)

    while True:
        item = await asyncio.to_thread(read)
        if item is None:
            return
        yield np.asarray(item)
