"""Streaming speech: the adapter that drives a voice's acoustic and decoder stages.

A request is text (or ``{"text": ...}``). :meth:`SpeechAdapter.prepare` normalizes, splits and
phonemizes it in the caller's thread (bad input raises :class:`SpeechInputError`), so every
utterance fits the acoustic bundle's largest bucket. :meth:`SpeechAdapter.run` then, per
utterance:

1. calls the acoustic stage once: phoneme ids zero-padded to the smallest fitting bucket ->
   latent frames ``z`` and the frame mask;
2. calls the decoder stage once per chunk of frames, following the chunk schedule (a short
   first chunk for early audio, then growing chunks; the last size repeats). Each call is one
   fixed window bucket with context frames on both sides, and only the samples of the kept
   frames are used, so the chunks join into what one whole decode gives (the export's
   validation and the tests hold the joins to ONNX Runtime's float noise, about 1e-5);
3. emits each chunk at once as an :class:`~runtime.engine.outputs.OmniRequestOutput` with
   ``finished=False`` and outputs ``pcm`` (float32, 1-D, mono), ``sample_rate``, ``chunk_index``
   (over the whole request), ``sentence_index`` and ``sentence_samples`` (the length of the
   utterance's whole audio, known from its frames once the acoustic call returned: players
   use it to plan their start, progress bars to draw).

With ``overlap_sentences``, the next utterance's acoustic call runs in its own worker while
this one decodes (started after this utterance's first chunk, so it never delays early audio).

The last output has ``finished=True``, an empty ``pcm`` (its ``chunk_index`` and
``sentence_index`` are the counts of chunks and utterances); its ``metrics`` hold
``time_to_first_audio_s`` (from the request's admission to the first chunk emitted),
``audio_seconds``, ``chunks``, ``sentences``, ``real_time_factor`` (wall time from admission to
the last chunk, over ``audio_seconds``), ``max_chunk_gap_s`` (longest wait between two emitted
chunks) and ``skipped`` (the text the voice did not speak, with reasons).

Adapter options (``adapter.options`` in the pipeline file):

``voice``
    The exported voice's name; the acoustic bundle must hold that voice (``metadata.voice_name``).
``schedule``
    Frames each decoder call keeps, in order, e.g. ``[16, 32, 64, 128]``; default: the decoder
    bundle's ``metadata.schedule``. Each size plus both context sides must fit the largest
    decoder bucket.
``scales``
    ``voice`` (the voice config's noise, length and noise-width scales), ``deterministic``
    (noise and noise width 0: the same text always gives the same audio) or a list of three
    non-negative numbers.
``sentence_silence_s``
    Silence added after every utterance but the last, in seconds (0 to 10).
``overlap_sentences``
    ``false`` (default) or ``true``: run the next utterance's acoustic call during this one's
    decoding. Off by default: on two shared cores the two workers then compete for the same
    cores, and no consistent gain showed (median real-time factor of six three-sentence
    requests: 0.54 with, 0.41 without; in a second run 0.86 with, 0.90 without); machines
    with idle cores may gain.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
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
OPTION_NAMES: Final = ("voice", "schedule", "scales", "sentence_silence_s", "overlap_sentences")
SCALES_KEYWORDS: Final = ("voice", "deterministic")
MAX_SENTENCE_SILENCE_S: Final = 10.0
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
    overlap_sentences: bool = False

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
        overlap = options.get("overlap_sentences", False)
        if not isinstance(overlap, bool):
            raise fail(
                "overlap_sentences", f"{overlap!r} is not a boolean; accepted: true or false"
            )
        return cls(
            voice=voice,
            schedule=schedule,
            scales=scales,
            sentence_silence_s=float(silence),
            overlap_sentences=overlap,
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
    chunks: int = 0
    samples: int = 0
    first_audio_at: float | None = None
    last_audio_at: float | None = None
    max_gap_s: float = 0.0

    def audio_emitted(self, samples: int) -> None:
        now = time.perf_counter()
        if self.first_audio_at is None:
            self.first_audio_at = now
        elif self.last_audio_at is not None:
            self.max_gap_s = max(self.max_gap_s, now - self.last_audio_at)
        self.last_audio_at = now
        self.chunks += 1
        self.samples += samples


class SpeechAdapter:
    """The pipeline program of a two-stage voice: acoustic stage 0, decoder stage 1."""

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
        self.sample_rate = voice.sample_rate
        self.samples_per_frame = settings.samples_per_frame
        self.max_ids = max(self.bundles.acoustic_settings.buckets)
        self._phonemizer = Phonemizer(voice)
        self._silence = np.zeros(round(self.options.sentence_silence_s * voice.sample_rate), "f4")

    # -- the program -------------------------------------------------------------------

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
        timeline = _Timeline(submitted_at=ctx.request.submitted_at)
        sentences = plan.sentences
        prefetched: asyncio.Task[CallResult] | None = None
        try:
            for index, utterance in enumerate(sentences):
                if prefetched is None:
                    latents = await self._acoustic(ctx, utterance)
                else:
                    latents = await prefetched
                    prefetched = None
                last = index == len(sentences) - 1
                z, mask = self._latents(latents, utterance)
                chunks = self.bundles.decoder_settings.plan(int(z.shape[2]), self.schedule)
                samples = chunks[-1].end * self.samples_per_frame
                if not last:
                    samples += self._silence.size
                for chunk in chunks:
                    decoded = await ctx.call(DECODER_STAGE, chunk_inputs(z, mask, chunk))
                    audio = decoded.outputs.get(_AUDIO_OUTPUT)
                    if audio is None or audio.size < chunk.keep_end:
                        raise ModelError(
                            f"{ctx.stage_name(DECODER_STAGE)} returned "
                            f"{'no audio' if audio is None else f'{audio.size} samples'} for a "
                            f"window of {chunk.bucket} frames; expected {_AUDIO_OUTPUT!r} with "
                            f"{chunk.bucket * self.samples_per_frame} samples"
                        )
                    pcm = np.array(
                        audio.reshape(-1)[chunk.keep_start : chunk.keep_end], dtype=np.float32
                    )
                    if chunk.index == len(chunks) - 1 and not last and self._silence.size:
                        pcm = np.concatenate([pcm, self._silence])
                    timeline.audio_emitted(pcm.size)
                    audio_chunk = AudioChunk(
                        pcm,
                        self.sample_rate,
                        chunk_index=timeline.chunks - 1,
                        sentence_index=index,
                        sentence_samples=samples,
                    )
                    await ctx.emit(audio_chunk.to_outputs(), stage=ctx.stage_name(DECODER_STAGE))
                    if chunk.index == 0 and not last and self.options.overlap_sentences:
                        # The next utterance's acoustic call overlaps this one's decoding.
                        prefetched = asyncio.ensure_future(
                            self._acoustic(ctx, sentences[index + 1])
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
            stage=ctx.stage_name(DECODER_STAGE),
            finished=True,
            metrics=self._metrics(timeline, plan),
        )

    async def _acoustic(self, ctx: RequestContext, utterance: Utterance) -> CallResult:
        inputs = acoustic_inputs(utterance.ids, self.bundles.acoustic_settings.buckets, self.scales)
        return await ctx.call(ACOUSTIC_STAGE, inputs)

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
            "skipped": [item.to_json() for item in plan.skipped],
        }
