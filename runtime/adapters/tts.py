"""Streaming speech: the adapter that drives a voice's acoustic and decoder stages.

A request is text (or ``{"text": ...}``). :meth:`SpeechAdapter.prepare` normalizes, splits and
phonemizes it in the caller's thread (bad input raises :class:`SpeechInputError`), so every
utterance fits the acoustic bundle's largest bucket. :meth:`SpeechAdapter.run` then, per
utterance:

1. calls the acoustic stage once: phoneme ids (as many as the utterance has on routes that
   accept dynamic shapes, else zero-padded to the smallest fitting bucket) -> latent frames
   ``z`` and the frame mask;
2. calls the decoder stage once per chunk of frames. Each call decodes a window: the chunk plus
   the voice's context frames on both sides (chosen at export by measuring the joins, see
   :mod:`runtime.adapters.voice_export`), sized to the chunk on routes that accept dynamic
   shapes, or padded to a fixed bucket on routes that need static shapes. Only the samples of
   the kept frames are used, so the chunks join into what one whole decode gives (to the SNR in
   the voice's validation record). Chunk sizes come from the schedule: its first size for
   early audio, then as many frames as the player's lead pays for (the audio emitted leads
   the time since the first chunk by at least :data:`GROW_MARGIN` times the measured time of
   that call's window), between the schedule's first and last sizes, and the whole rest of
   the utterance at once when the lead pays for it (its window has no right context): each
   join costs a window's context, so the fewer calls the less the decoder does beyond one
   whole decode. A first utterance of at most :data:`WHOLE_FRAMES` frames is decoded in one
   call: its first audio comes a little later, its last sooner. With ``deterministic`` scales
   the sizes follow the schedule in order (the last one repeating, a short rest going with
   the chunk before it), so the same text always gives the same samples;
3. emits each chunk at once as an :class:`~runtime.engine.outputs.OmniRequestOutput` with
   ``finished=False`` and outputs ``pcm`` (float32, 1-D, mono), ``sample_rate``, ``chunk_index``
   (over the whole request), ``sentence_index`` and ``sentence_samples`` (the length of the
   utterance's whole audio, known from its frames once the acoustic call returned: players
   use it to plan their start, progress bars to draw).

The next utterance's acoustic call runs while this one decodes (started after this utterance's
first chunk, so it never delays early audio) where the thread plan gives the two stages cores
of their own (:func:`runtime.backends.threads.plan_threads`, ``concurrent``); on fewer cores
the two workers would compete for the same ones, so the calls take turns.

The last output has ``finished=True``, an empty ``pcm`` (its ``chunk_index`` and
``sentence_index`` are the counts of chunks and utterances); its ``metrics`` hold
``time_to_first_audio_s`` (from the request's admission to the first chunk emitted),
``audio_seconds``, ``chunks``, ``sentences``, ``real_time_factor`` (wall time from admission to
the last chunk, over ``audio_seconds``), ``max_chunk_gap_s`` (longest wait between two emitted
chunks), ``skipped`` (the text the voice did not speak, with reasons), ``windows`` (``sized`` or
``buckets``), ``context``, ``overlap``, ``timing`` (where the request's time went: the acoustic
and decoder calls' model time and transport, the waits for the caller, the adapter's own work)
and ``steps`` (one entry per stage call: stage, sentence, frames, when it started (``started_s``
from admission, ``started_at`` on the controller's monotonic clock, which orders the calls of
requests that overlap), how long it waited for another request's call of the stage
(``queue_s``), its wall, model and transport time).

Adapter options (``adapter.options`` in the pipeline file):

``voice``
    The exported voice's name; the acoustic bundle must hold that voice (``metadata.voice_name``).
``schedule``
    Frames each decoder call keeps, in order of growth, e.g. ``[32, 64, 128, 256, 512]``;
    default: the decoder bundle's ``metadata.schedule``. Each size plus both context sides must
    fit the largest decoder bucket.
``scales``
    ``voice`` (the voice config's noise, length and noise-width scales), ``deterministic``
    (noise and noise width 0: the same text always gives the same audio) or a list of three
    non-negative numbers.
``sentence_silence_s``
    Silence added after every utterance but the last, in seconds (0 to 10).
``overlap_sentences``
    ``auto`` (default: as the thread plan allows), ``true`` (always) or ``false`` (never).
``windows``
    ``auto`` (default: per stage, the decoder's windows sized to the chunk and the acoustic
    call's ids sized to the utterance when that stage's bundle declares ``sized_axis`` and
    every provider its route allows accepts dynamic shapes, see
    :data:`SIZED_WINDOW_PROVIDERS`), ``sized`` (both stages) or ``buckets`` (both stages
    padded to their fixed buckets).
``concurrent_requests``
    How many requests the pipeline runs at once (1 to 8, default 1). With more than one, a
    request's acoustic call runs while another's decoder call runs (each stage still runs one
    call at a time, the requests' calls in arrival order); the thread plan gives the acoustic
    stage one thread (its calls run no faster on two) and the decoder every core, and no
    pool spins (:func:`runtime.backends.threads.plan_threads`, ``requests``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from runtime.adapters.tts_text import (
    Phonemizer,
    SpeechInputError,
    SpeechPlan,
    Utterance,
    prepare_speech,
)
from runtime.adapters.voice_bundles import VoiceBundles, read_voice_bundles
from runtime.adapters.voice_chunks import acoustic_inputs, chunk_inputs
from runtime.backends.threads import plan_threads
from runtime.config import GraphBackendConfig
from runtime.engine.outputs import AudioChunk
from runtime.errors import ConfigError, ModelError

if TYPE_CHECKING:
    from collections.abc import Callable

    from runtime.backends.base import CallResult
    from runtime.config import PipelineConfig
    from runtime.engine.program import RequestContext

__all__ = [
    "ACOUSTIC_STAGE",
    "DECODER_STAGE",
    "OPTION_NAMES",
    "SpeechAdapter",
    "SpeechOptions",
    "SpeechOptionsError",
]

ACOUSTIC_STAGE: Final = 0
DECODER_STAGE: Final = 1
OPTION_NAMES: Final = (
    "voice",
    "schedule",
    "scales",
    "sentence_silence_s",
    "overlap_sentences",
    "windows",
    "concurrent_requests",
)
SCALES_KEYWORDS: Final = ("voice", "deterministic")
WINDOW_KEYWORDS: Final = ("auto", "sized", "buckets")
#: Execution providers that run a graph on inputs of any length without recompiling it.
SIZED_WINDOW_PROVIDERS: Final = frozenset({"CPUExecutionProvider"})
#: A decoder call keeps as many frames as the player's lead pays for this many times over (at
#: the measured time per window frame). The lead counts from the first chunk, as if playback
#: started there; players start later, once their cushion is queued.
GROW_MARGIN: Final = 1.5
#: A decoder call's fixed cost, in window frames: measured on two cores, a 52-frame window took
#: about 35 ms and a 390-frame one 230 ms (0.57 ms per frame and about 5 ms per call). Without
#: it, the short first call would make every frame look dearer than it is, and the next
#: call smaller than the lead pays for.
CALL_FRAMES: Final = 10
#: An utterance of at most this many latent frames (1.49 s of audio at 22,050 Hz and 256
#: samples per frame) is decoded in one call, with no join: a first chunk and the rest would
#: decode the two windows' context and pay two calls' fixed cost (measured on two cores for
#: "Hello from the edge.", 105 frames: 165 window frames in two calls instead of 105 in one,
#: the whole audio about a third later), while one call still gives its first audio within
#: about 80 ms.
WHOLE_FRAMES: Final = 128
MAX_SENTENCE_SILENCE_S: Final = 10.0
#: The most requests a voice's pipeline may run at once (``concurrent_requests``).
MAX_CONCURRENT_REQUESTS: Final = 8
#: The decoder bundle's audio output.
_AUDIO_OUTPUT: Final = "audio"


class SpeechOptionsError(ConfigError):
    """The speech adapter's options or stages do not fit the voice bundles."""


@dataclass(frozen=True, slots=True)
class SpeechOptions:
    """The speech adapter's options, checked (see the module's option list)."""

    voice: str
    schedule: tuple[int, ...] | None = None
    scales: tuple[float, float, float] | str = "voice"
    sentence_silence_s: float = 0.0
    overlap_sentences: bool | str = "auto"
    windows: str = "auto"
    concurrent_requests: int = 1

    @classmethod
    def parse(
        cls, options: Mapping[str, Any], *, file: str | None = None, line: int | None = None
    ) -> SpeechOptions:
        """Check ``adapter.options``; every failure names the option and what is accepted."""

        def fail(name: str, message: str) -> SpeechOptionsError:
            return SpeechOptionsError(message, file=file, line=line, key=f"adapter.options.{name}")

        unknown = sorted(set(options) - set(OPTION_NAMES))
        if unknown:
            raise fail(
                unknown[0],
                f"unknown speech option {unknown[0]!r}; accepted: {', '.join(OPTION_NAMES)}",
            )
        voice = options.get("voice")
        if not isinstance(voice, str) or not voice.strip():
            raise fail("voice", f"{voice!r} is not a voice name; accepted: e.g. 'joe'")
        schedule: tuple[int, ...] | None = None
        if "schedule" in options:
            raw = options["schedule"]
            if (
                not isinstance(raw, list)
                or not raw
                or not all(type(size) is int and size >= 1 for size in raw)
            ):
                raise fail(
                    "schedule",
                    f"{raw!r} is not a list of frame counts; accepted: positive integers, "
                    "e.g. [16, 32, 64, 128]",
                )
            schedule = tuple(raw)
        scales: tuple[float, float, float] | str = "voice"
        if "scales" in options:
            scales = _parse_scales(options["scales"], fail)
        silence = options.get("sentence_silence_s", 0.0)
        if (
            isinstance(silence, bool)
            or not isinstance(silence, (int, float))
            or not math.isfinite(silence)
            or not 0.0 <= silence <= MAX_SENTENCE_SILENCE_S
        ):
            raise fail(
                "sentence_silence_s",
                f"{silence!r} is not a silence length; accepted: seconds from 0 to "
                f"{MAX_SENTENCE_SILENCE_S:g}",
            )
        overlap = options.get("overlap_sentences", "auto")
        if not isinstance(overlap, bool) and overlap != "auto":
            raise fail(
                "overlap_sentences",
                f"{overlap!r} is not an overlap setting; accepted: auto, true or false",
            )
        windows = options.get("windows", "auto")
        if windows not in WINDOW_KEYWORDS:
            raise fail(
                "windows",
                f"{windows!r} is not a window setting; accepted: {', '.join(WINDOW_KEYWORDS)}",
            )
        requests = options.get("concurrent_requests", 1)
        if type(requests) is not int or not 1 <= requests <= MAX_CONCURRENT_REQUESTS:
            raise fail(
                "concurrent_requests",
                f"{requests!r} is not a request count; accepted: an integer from 1 to "
                f"{MAX_CONCURRENT_REQUESTS}",
            )
        return cls(
            voice=voice,
            schedule=schedule,
            scales=scales,
            sentence_silence_s=float(silence),
            overlap_sentences=overlap,
            windows=str(windows),
            concurrent_requests=requests,
        )


def _parse_scales(
    raw: object, fail: Callable[[str, str], SpeechOptionsError]
) -> tuple[float, float, float] | str:
    if isinstance(raw, str) and raw in SCALES_KEYWORDS:
        return raw
    if (
        isinstance(raw, list)
        and len(raw) == 3
        and all(
            not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and v >= 0
            for v in raw
        )
        and raw[1] > 0
    ):
        return (float(raw[0]), float(raw[1]), float(raw[2]))
    raise fail(
        "scales",
        f"{raw!r} is not a scales setting; accepted: 'voice', 'deterministic' or "
        "[noise, length, noise_w] (non-negative numbers, length above 0)",
    )


@dataclass(slots=True)
class _Timeline:
    """What one request measured while it ran (loop thread only)."""

    submitted_at: float
    sample_rate: int
    chunks: int = 0
    samples: int = 0
    first_audio_at: float | None = None
    last_audio_at: float | None = None
    max_gap_s: float = 0.0
    steps: list[dict[str, Any]] = field(default_factory=list)
    waited_s: float = 0.0
    emit_s: float = 0.0

    def audio_emitted(self, samples: int) -> None:
        now = time.perf_counter()
        if self.first_audio_at is None:
            self.first_audio_at = now
        elif self.last_audio_at is not None:
            self.max_gap_s = max(self.max_gap_s, now - self.last_audio_at)
        self.last_audio_at = now
        self.chunks += 1
        self.samples += samples

    def lead_s(self) -> float:
        """How far the audio emitted runs ahead of a player that started at the first chunk."""
        if self.first_audio_at is None:
            return 0.0
        return self.samples / self.sample_rate - (time.perf_counter() - self.first_audio_at)

    def step(self, stage: str, started: float, result: CallResult, **fields: Any) -> None:
        wall = time.perf_counter() - started
        self.steps.append(
            {
                "stage": stage,
                **fields,
                "started_s": round(started - self.submitted_at, 6),
                # The controller's monotonic clock: orders the calls of requests that overlap.
                "started_at": round(started, 6),
                # Waiting for the stage while another request's call ran on it.
                "queue_s": round(max(0.0, wall - result.round_trip_s), 6),
                "wall_s": round(wall, 6),
                "run_s": round(result.run_s, 6),
                "transfer_s": round(result.transfer_s, 6),
            }
        )

    def timing(self, finished_at: float) -> dict[str, Any]:
        """Where the request's time went (see the module)."""

        def total(stage: str, key: str) -> float:
            return round(float(sum(s[key] for s in self.steps if s["stage"] == stage)), 6)

        windows = sum(s["window"] for s in self.steps if s["stage"] == "decoder")
        kept = sum(s["kept"] for s in self.steps if s["stage"] == "decoder")
        wall = finished_at - self.submitted_at
        return {
            "wall_s": round(wall, 6),
            "acoustic_calls": sum(1 for s in self.steps if s["stage"] == "acoustic"),
            "acoustic_run_s": total("acoustic", "run_s"),
            "acoustic_transfer_s": total("acoustic", "transfer_s"),
            "decoder_calls": sum(1 for s in self.steps if s["stage"] == "decoder"),
            "decoder_run_s": total("decoder", "run_s"),
            "decoder_transfer_s": total("decoder", "transfer_s"),
            "decoder_window_frames": windows,
            "decoder_kept_frames": kept,
            "decoder_work_ratio": round(windows / kept, 4) if kept else None,
            "emit_s": round(self.emit_s, 6),
            "adapter_s": round(max(0.0, wall - self.waited_s - self.emit_s), 6),
        }


@dataclass(slots=True)
class _Pacer:
    """Chooses each decoder call's chunk size (see the module): after the short first chunk,
    the largest the player's lead pays for :data:`GROW_MARGIN` times over, between the
    schedule's first and last sizes; with ``adaptive`` off, the schedule in order."""

    schedule: tuple[int, ...]
    context_frames: int
    #: False: the schedule in order and no timing involved, so the chunks (and the float
    #: rounding at their joins) are the same on every run of the same text.
    adaptive: bool = True
    #: Frames a call keeps at most when it ends its utterance (no right context to decode):
    #: the largest size plus the right context; default: the largest size.
    largest_final: int | None = None
    margin: float = GROW_MARGIN
    #: A call's fixed cost, in window frames (see :data:`CALL_FRAMES`).
    call_frames: int = 0
    #: Utterances of at most this many frames are decoded in one call (see
    #: :data:`WHOLE_FRAMES`); 0: every utterance starts with the schedule's first size.
    whole_frames: int = 0
    level: int = 0
    seconds_per_frame: float | None = None

    def measured(self, window_frames: int, seconds: float) -> None:
        rate = seconds / max(1, window_frames + self.call_frames)
        previous = self.seconds_per_frame
        self.seconds_per_frame = rate if previous is None else 0.5 * (previous + rate)

    def _window(self, lead_s: float) -> float:
        """The longest window (frames) the lead pays for ``margin`` times over."""
        assert self.seconds_per_frame is not None
        return lead_s / (self.margin * max(self.seconds_per_frame, 1e-9)) - self.call_frames

    def next_size(self, lead_s: float, first: bool, remaining: int) -> int:
        """Frames the next call keeps, of the ``remaining`` frames of its utterance."""
        top = len(self.schedule) - 1
        if first:
            self.level = 0
            if self.adaptive and remaining <= self.whole_frames:
                return remaining
            return self.schedule[0]
        largest_final = max(self.schedule[-1], self.largest_final or 0)
        if not self.adaptive:
            self.level = min(self.level + 1, top)
            size = self.schedule[self.level]
            rest = remaining - size
            # A short rest goes with the chunk before it: one window's context fewer.
            if 0 < rest <= max(self.context_frames, size) and remaining <= self.schedule[-1]:
                return remaining
            return size
        if self.seconds_per_frame is None:
            return self.schedule[self.level]
        window = self._window(lead_s)
        size = int(min(max(window - self.context_frames, self.schedule[0]), self.schedule[-1]))
        final_window = remaining + self.context_frames // 2
        # The rest of the utterance in one call (its window has no right context) when the lead
        # pays for it; also when it leaves no more than a context's worth and the lead still
        # covers the call once: a call for that rest alone would cost about as much again.
        if remaining <= largest_final and (
            window >= final_window
            or (
                remaining - size <= self.context_frames
                and lead_s >= self.seconds_per_frame * (final_window + self.call_frames)
            )
        ):
            return remaining
        return min(size, remaining)


class SpeechAdapter:
    """The pipeline program of a two-stage voice: acoustic stage 0, decoder stage 1."""

    kind: Final = "speech"

    def __init__(self, config: PipelineConfig, options: Mapping[str, Any]) -> None:
        source = str(config.source) if config.source is not None else None
        line = config.adapter.line if config.adapter is not None else None
        self.config = config
        self.options = SpeechOptions.parse(options, file=source, line=line)
        manifests = []
        for stage_id, role in ((ACOUSTIC_STAGE, "acoustic"), (DECODER_STAGE, "decoder")):
            stage = config.stages[stage_id] if stage_id < len(config.stages) else None
            if stage is None or not isinstance(stage.backend, GraphBackendConfig):
                raise SpeechOptionsError(
                    f"the speech adapter needs the {role} voice bundle as graph stage "
                    f"{stage_id}; this pipeline has {len(config.stages)} stage(s)",
                    file=source,
                    line=line,
                    key="stages",
                )
            manifests.append(stage.backend.manifest)
        if len(config.stages) != 2:
            raise SpeechOptionsError(
                f"the speech adapter drives exactly two stages (acoustic, decoder); this "
                f"pipeline has {len(config.stages)}",
                file=source,
                line=line,
                key="stages",
            )
        self.bundles: VoiceBundles = read_voice_bundles(manifests[0], manifests[1])
        held = self.bundles.acoustic.manifest.metadata.get("voice_name")
        if held != self.options.voice:
            raise SpeechOptionsError(
                f"voice {self.options.voice!r}, but {self.bundles.acoustic.manifest_path} holds "
                f"voice {held!r}; accepted: the voice the stages' bundles were exported from",
                file=source,
                line=line,
                key="adapter.options.voice",
            )
        settings = self.bundles.decoder_settings
        self.schedule = self.options.schedule or settings.schedule
        left, right = settings.context
        widest = max(settings.buckets)
        too_big = [size for size in self.schedule if size + left + right > widest]
        if too_big:
            raise SpeechOptionsError(
                f"chunk size {too_big[0]} with {left}+{right} context frames needs a window of "
                f"{too_big[0] + left + right} frames; accepted: sizes up to {widest - left - right} "
                f"(the decoder bundle's largest bucket is {widest})",
                file=source,
                line=line,
                key="adapter.options.schedule",
            )
        voice = self.bundles.voice
        scales = self.options.scales
        if scales == "voice":
            self.scales: tuple[float, float, float] = voice.scales
        elif scales == "deterministic":
            self.scales = (0.0, voice.length_scale, 0.0)
        else:
            assert not isinstance(scales, str)
            self.scales = scales
        #: Chunk sizes follow the player's lead; with deterministic scales they follow the
        #: schedule in order instead, so the same text gives the same samples every time.
        self.adaptive_chunks = scales != "deterministic" and self.scales[0] + self.scales[2] > 0
        self.sample_rate = voice.sample_rate
        self.samples_per_frame = settings.samples_per_frame
        sized: list[bool] = []
        for stage_id, bundle, declared in (
            (ACOUSTIC_STAGE, self.bundles.acoustic, self.bundles.acoustic_settings.sized),
            (DECODER_STAGE, self.bundles.decoder, settings.sized),
        ):
            route = config.stages[stage_id].backend
            assert isinstance(route, GraphBackendConfig)
            if self.options.windows == "sized" and not declared:
                raise SpeechOptionsError(
                    f"windows 'sized', but {bundle.manifest_path} declares no sized_axis; "
                    "accepted: 'buckets' or 'auto' (export the voice again)",
                    file=source,
                    line=line,
                    key="adapter.options.windows",
                )
            accepts = declared and set(route.route.allowed_providers) <= SIZED_WINDOW_PROVIDERS
            sized.append(
                accepts if self.options.windows == "auto" else self.options.windows == "sized"
            )
        #: Acoustic calls sized to the utterance (True) or its ids padded to the fixed buckets.
        self.sized_acoustic = sized[0]
        #: Decoder windows sized to each chunk (True) or padded to the fixed buckets.
        self.sized_windows = sized[1]
        overlap = self.options.overlap_sentences
        #: Stage ids this program may call at the same time (read by the engine's thread plan).
        self.concurrent_stages: tuple[int, ...] = (
            () if overlap is False else (ACOUSTIC_STAGE, DECODER_STAGE)
        )
        if overlap == "auto":
            names = [config.stages[i].name for i in self.concurrent_stages]
            plans = plan_threads(config, concurrent=names)
            self.overlap = all(plans[name].overlaps for name in names if name in plans)
        else:
            self.overlap = bool(overlap)
        #: Requests the pipeline runs at once (read by the engine's admission and thread
        #: plan); the acoustic stage gains nothing from a second thread (see the module).
        self.concurrent_requests: int = self.options.concurrent_requests
        self.single_thread_stages: tuple[int, ...] = (ACOUSTIC_STAGE,)
        self.max_ids = max(self.bundles.acoustic_settings.buckets)
        self._phonemizer = Phonemizer(voice)
        self._silence = np.zeros(round(self.options.sentence_silence_s * voice.sample_rate), "f4")

    # -- the program -------------------------------------------------------------------

    @property
    def voices(self) -> tuple[str, ...]:
        """The voices a request may ask for (this pipeline speaks with one)."""
        return (self.options.voice,)

    def prepare(self, request_input: object) -> SpeechPlan:
        """Text (or ``{"text": str}``) -> the utterances to speak; raises SpeechInputError.

        A :class:`SpeechPlan` made earlier (by this voice's ``prepare``, to check the input
        before the stages start) is taken as it is once its utterances fit the buckets."""
        if isinstance(request_input, SpeechPlan):
            if not request_input.sentences:
                raise SpeechInputError(
                    "a prepared plan has no utterances; accepted: text with words to speak",
                    code="nothing_speakable",
                )
            longest = max(len(sentence.ids) for sentence in request_input.sentences)
            if longest > self.max_ids:
                raise SpeechInputError(
                    f"a prepared plan has an utterance of {longest} phoneme ids; accepted: at "
                    f"most {self.max_ids} (prepare the text with this pipeline's adapter)",
                    code="does_not_fit",
                )
            return request_input
        text = request_input
        if isinstance(request_input, Mapping):
            extra = sorted(str(key) for key in request_input if key != "text")
            if extra or "text" not in request_input:
                raise SpeechInputError(
                    f"speech input mapping has keys {sorted(map(str, request_input))}; "
                    "accepted: {'text': str} or a string",
                    code="not_text",
                )
            text = request_input["text"]
        return prepare_speech(text, self._phonemizer, max_ids=self.max_ids)

    async def run(self, ctx: RequestContext, plan: SpeechPlan) -> None:
        timeline = _Timeline(submitted_at=ctx.request.submitted_at, sample_rate=self.sample_rate)
        settings = self.bundles.decoder_settings
        pacer = _Pacer(
            self.schedule,
            sum(settings.context),
            adaptive=self.adaptive_chunks,
            largest_final=max(settings.buckets) - settings.context[0],
            call_frames=CALL_FRAMES,
            whole_frames=WHOLE_FRAMES,
        )
        sentences = plan.sentences
        decoder_name = ctx.stage_name(DECODER_STAGE)
        prefetched: asyncio.Task[CallResult] | None = None
        try:
            for index, utterance in enumerate(sentences):
                waited = time.perf_counter()
                if prefetched is None:
                    latents = await self._acoustic(ctx, utterance, index, timeline)
                else:
                    latents = await prefetched
                    prefetched = None
                timeline.waited_s += time.perf_counter() - waited
                last = index == len(sentences) - 1
                z, mask = self._latents(latents, utterance)
                frames = int(z.shape[2])
                samples = frames * self.samples_per_frame
                if not last:
                    samples += self._silence.size
                start = 0
                chunk_index = 0
                while start < frames:
                    size = pacer.next_size(
                        timeline.lead_s(), first=timeline.chunks == 0, remaining=frames - start
                    )
                    chunk = settings.chunk(
                        chunk_index, start, size, frames, sized=self.sized_windows
                    )
                    started = time.perf_counter()
                    decoded = await ctx.call(DECODER_STAGE, chunk_inputs(z, mask, chunk))
                    elapsed = time.perf_counter() - started
                    timeline.waited_s += elapsed
                    pacer.measured(chunk.bucket, elapsed)
                    timeline.step(
                        "decoder",
                        started,
                        decoded,
                        sentence=index,
                        chunk=chunk_index,
                        window=chunk.bucket,
                        kept=chunk.kept_frames,
                    )
                    audio = decoded.outputs.get(_AUDIO_OUTPUT)
                    if audio is None or audio.size < chunk.keep_end:
                        raise ModelError(
                            f"{decoder_name} returned "
                            f"{'no audio' if audio is None else f'{audio.size} samples'} for a "
                            f"window of {chunk.bucket} frames; expected {_AUDIO_OUTPUT!r} with "
                            f"{chunk.bucket * self.samples_per_frame} samples"
                        )
                    pcm = np.array(
                        audio.reshape(-1)[chunk.keep_start : chunk.keep_end], dtype=np.float32
                    )
                    start = chunk.end
                    chunk_index += 1
                    if start >= frames and not last and self._silence.size:
                        pcm = np.concatenate([pcm, self._silence])
                    timeline.audio_emitted(pcm.size)
                    audio_chunk = AudioChunk(
                        pcm,
                        self.sample_rate,
                        chunk_index=timeline.chunks - 1,
                        sentence_index=index,
                        sentence_samples=samples,
                    )
                    emitting = time.perf_counter()
                    await ctx.emit(audio_chunk.to_outputs(), stage=decoder_name)
                    timeline.emit_s += time.perf_counter() - emitting
                    if chunk_index == 1 and not last and self.overlap:
                        # The next utterance's acoustic call overlaps this one's decoding.
                        prefetched = asyncio.ensure_future(
                            self._acoustic(ctx, sentences[index + 1], index + 1, timeline)
                        )
        finally:
            if prefetched is not None:
                prefetched.cancel()
                await asyncio.gather(prefetched, return_exceptions=True)
        closing = AudioChunk(
            np.zeros(0, dtype=np.float32),
            self.sample_rate,
            chunk_index=timeline.chunks,
            sentence_index=len(sentences),
            sentence_samples=0,
        )
        await ctx.emit(
            closing.to_outputs(),
            stage=decoder_name,
            finished=True,
            metrics=self._metrics(timeline, plan),
        )

    async def _acoustic(
        self, ctx: RequestContext, utterance: Utterance, index: int, timeline: _Timeline
    ) -> CallResult:
        inputs = acoustic_inputs(
            utterance.ids,
            self.bundles.acoustic_settings.buckets,
            self.scales,
            sized=self.sized_acoustic,
        )
        started = time.perf_counter()
        result = await ctx.call(ACOUSTIC_STAGE, inputs)
        timeline.step(
            "acoustic",
            started,
            result,
            sentence=index,
            ids=len(utterance.ids),
            bucket=int(inputs["input"].shape[1]),
        )
        return result

    def _latents(self, result: CallResult, utterance: Utterance) -> tuple[np.ndarray, np.ndarray]:
        z = result.outputs.get("z")
        mask = result.outputs.get("mask")
        if (
            z is None
            or mask is None
            or z.ndim != 3
            or mask.ndim != 3
            or z.shape[2] != mask.shape[2]
            or z.shape[2] < 1
        ):
            raise ModelError(
                f"the acoustic stage returned {sorted(result.outputs)} for {utterance.text[:40]!r}; "
                "expected z [1, channels, frames] and mask [1, 1, frames] with frames >= 1"
            )
        return z, mask

    def _metrics(self, timeline: _Timeline, plan: SpeechPlan) -> dict[str, Any]:
        audio_s = timeline.samples / self.sample_rate
        first = (
            None
            if timeline.first_audio_at is None
            else timeline.first_audio_at - timeline.submitted_at
        )
        synthesis_s = (
            None
            if timeline.last_audio_at is None
            else timeline.last_audio_at - timeline.submitted_at
        )
        return {
            "time_to_first_audio_s": first,
            "real_time_factor": None
            if synthesis_s is None or audio_s == 0
            else synthesis_s / audio_s,
            "audio_seconds": audio_s,
            "chunks": timeline.chunks,
            "sentences": len(plan.sentences),
            "max_chunk_gap_s": timeline.max_gap_s,
            "sample_rate": self.sample_rate,
            "scales": list(self.scales),
            "schedule": list(self.schedule),
            "context": list(self.bundles.decoder_settings.context),
            "windows": "sized" if self.sized_windows else "buckets",
            "acoustic_ids": "sized" if self.sized_acoustic else "buckets",
            "overlap": self.overlap,
            "skipped": [item.to_json() for item in plan.skipped],
            "timing": timeline.timing(
                timeline.last_audio_at
                if timeline.last_audio_at is not None
                else time.perf_counter()
            ),
            "steps": timeline.steps,
        }
