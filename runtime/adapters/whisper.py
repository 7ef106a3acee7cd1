"""Speech to text: the adapter that drives Whisper's encoder and decoder stages.

A request is audio: ``{"audio": samples, "sample_rate": rate}`` (samples 1-D, or
``[samples, channels]``; float or 16/32-bit integer PCM; any rate). :meth:`TranscribeAdapter.prepare`
checks it in the caller's thread, mixes it to mono, resamples it to 16 kHz with soxr and
computes the log-mel features of the whole audio (:mod:`runtime.adapters.whisper_mel`; the
normalisation uses the maximum over the whole audio, as faster-whisper does). A long file is
given as :class:`~runtime.adapters.whisper_stream.SpooledFeatures` instead
(:func:`~runtime.adapters.whisper_stream.spool_stream` computes them as the file is read, into
an anonymous temporary file of 32 KB a second): each window is read back from disk when its turn
comes, so memory stays that of one window however long the audio, and their ``on_progress`` is
told the seconds transcribed after every window. A streaming request's fed audio is spooled
the same way. No window is decoded before the whole audio is read, since its floor depends on
the maximum over all of it.
:meth:`TranscribeAdapter.run` then walks the features in windows of the encoder bundle's size
(``metadata.window_frames``: 3,000 frames, 30 s, for the ``encoder``/``decoder`` pair; 1,000,
10 s, for ``encoder-10s``/``decoder-10s``, meant for live conversation: its encoder call
costs about a third), faster-whisper's way for ``beam_size=1, temperature=0,
without_timestamps=True``:

1. one **encoder** call per window (the last window zero-padded after normalising): log-mel ->
   each decoder layer's cross-attention keys and values, held in the encoder worker's memory
   while the window decodes and handed to every decoder call;
2. one **decoder** call per position: the prompt (the previous windows' text after
   ``<|startofprev|>`` unless ``condition_on_previous_text`` is off, then
   ``<|startoftranscript|><|notimestamps|>``) and then each chosen token, with the key/value
   cache of the positions before (:class:`~runtime.adapters.whisper_decode.WindowDecode`:
   greedy, Whisper's suppression rules);
3. the window's text is emitted as one segment at once, timed from the window's position
   (start = its first frame, end = start + its frames, 10 ms each); a window the model calls
   silence (no-speech probability above 0.6 with an average log probability below -1) or
   whose text is blank emits nothing.

Each segment output has ``finished=False``, :attr:`~runtime.engine.outputs.OmniRequestOutput.text`
set to its text, and outputs ``tokens`` (int64), ``start_s``, ``end_s`` (float64 scalars) and
``segment_index``. The last output has ``finished=True``, the whole transcript as its text,
and ``metrics``: ``segments`` (start, end, text, tokens of each), ``audio_seconds``,
``windows``, ``decoder_steps``, ``real_time_factor`` (wall time from admission over the
audio's length), ``encoder_run_s``, ``decoder_run_s``.

Adapter options (``adapter.options``): ``model`` (the recogniser the bundles hold, e.g.
``tiny.en``), ``max_audio_s`` (the longest audio a request may bring, default 7,200 s),
``condition_on_previous_text`` (default true).

The bundles are made on first use, before the pipeline loads (its manifests must exist):
:func:`~runtime.adapters.whisper_export.export_missing_recognisers` exports the recognisers a
pipeline names under ``${data}/recognisers/`` from the installed model package (about ten
seconds, a progress line per step).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from runtime.adapters.whisper_decode import Segment, WindowDecode
from runtime.adapters.whisper_export import WhisperBundles, read_whisper_bundles, spoken_clip
from runtime.adapters.whisper_mel import (
    HOP_LENGTH,
    SAMPLE_RATE,
    PreparedAudio,
    log_mel,
)
from runtime.adapters.whisper_stream import SpooledFeatures
from runtime.config import GraphBackendConfig
from runtime.errors import ConfigError, ModelError, UsageError
from runtime.pipeline_input import AUDIO_INPUT

if TYPE_CHECKING:
    from runtime.config import PipelineConfig
    from runtime.engine.inputs import InputStream
    from runtime.engine.program import RequestContext

__all__ = [
    "DECODER_STAGE",
    "ENCODER_STAGE",
    "EXAMPLE_SENTENCE",
    "OPTION_NAMES",
    "AudioInputError",
    "PreparedAudio",
    "TranscribeAdapter",
    "TranscribeOptions",
    "TranscribeOptionsError",
    "to_mono_16k",
]

ENCODER_STAGE: Final = 0
DECODER_STAGE: Final = 1
OPTION_NAMES: Final = ("model", "max_audio_s", "condition_on_previous_text")
DEFAULT_MAX_AUDIO_S: Final = 7200.0
#: What the example request says (the bundled voice speaks it; see :meth:`TranscribeAdapter.prepare`).
EXAMPLE_SENTENCE: Final = "The quick brown fox jumps over the lazy dog."
#: Seconds per log-mel frame.
FRAME_S: Final = HOP_LENGTH / SAMPLE_RATE
#: Seconds per timestamp token.
_TIME_PRECISION: Final = 0.02
_ACCEPTED_REQUEST: Final = (
    "{'audio': samples (1-D, or [samples, channels]; float or int16/int32 PCM), "
    "'sample_rate': Hz (8,000 to 384,000)}"
)
_MIN_RATE: Final = 8_000
_MAX_RATE: Final = 384_000


class TranscribeOptionsError(ConfigError):
    """The transcription adapter's options or stages do not fit the recogniser's bundles."""


class AudioInputError(UsageError):
    """A transcription request's audio cannot be used; ``code`` is stable."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class TranscribeOptions:
    """The adapter's options, checked (see the module)."""

    model: str | None = None
    max_audio_s: float = DEFAULT_MAX_AUDIO_S
    condition_on_previous_text: bool = True

    @classmethod
    def parse(
        cls, options: Mapping[str, Any], *, file: str | None = None, line: int | None = None
    ) -> TranscribeOptions:
        def fail(name: str, message: str) -> TranscribeOptionsError:
            return TranscribeOptionsError(
                message, file=file, line=line, key=f"adapter.options.{name}"
            )

        unknown = sorted(set(options) - set(OPTION_NAMES))
        if unknown:
            raise fail(
                unknown[0],
                f"unknown transcription option {unknown[0]!r}; accepted: {', '.join(OPTION_NAMES)}",
            )
        model = options.get("model")
        if model is not None and (not isinstance(model, str) or not model.strip()):
            raise fail("model", f"{model!r} is not a model name; accepted: e.g. 'tiny.en'")
        limit = options.get("max_audio_s", DEFAULT_MAX_AUDIO_S)
        if (
            isinstance(limit, bool)
            or not isinstance(limit, (int, float))
            or not math.isfinite(limit)
            or limit <= 0
        ):
            raise fail("max_audio_s", f"{limit!r} is not a length; accepted: seconds above 0")
        condition = options.get("condition_on_previous_text", True)
        if not isinstance(condition, bool):
            raise fail(
                "condition_on_previous_text",
                f"{condition!r} is not a switch; accepted: true or false",
            )
        return cls(model, float(limit), condition)


def to_mono_16k(audio: object, sample_rate: object) -> np.ndarray:
    """``audio`` (1-D or ``[samples, channels]``; float or int16/int32 PCM) at ``sample_rate``
    -> 16 kHz mono float32 (channels averaged, soxr); AudioInputError otherwise."""
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)):
        raise AudioInputError(
            f"sample_rate is {sample_rate!r}; accepted: an integer rate in Hz", code="bad_rate"
        )
    rate = int(sample_rate)
    if not _MIN_RATE <= rate <= _MAX_RATE:
        raise AudioInputError(
            f"sample_rate {rate} Hz; accepted: {_MIN_RATE:,} to {_MAX_RATE:,} Hz", code="bad_rate"
        )
    array = np.asarray(audio)
    if array.dtype.kind == "i" and array.dtype.itemsize in (2, 4):
        scaled = array.astype(np.float32) / float(np.iinfo(array.dtype).max)
    elif array.dtype.kind == "f":
        scaled = array.astype(np.float32)
    else:
        raise AudioInputError(
            f"audio of dtype {array.dtype}; accepted: float, int16 or int32 samples",
            code="bad_samples",
        )
    if scaled.ndim == 2:
        scaled = scaled.mean(axis=1, dtype=np.float32)
    if scaled.ndim != 1:
        raise AudioInputError(
            f"audio of shape {list(array.shape)}; accepted: [samples] or [samples, channels]",
            code="bad_samples",
        )
    if scaled.size == 0:
        raise AudioInputError("the audio is empty; accepted: at least one sample", code="empty")
    if not np.all(np.isfinite(scaled)):
        raise AudioInputError(
            "the audio holds NaN or infinite samples; accepted: finite samples", code="bad_samples"
        )
    if rate == SAMPLE_RATE:
        return np.ascontiguousarray(scaled)
    import soxr

    return np.asarray(soxr.resample(scaled, rate, SAMPLE_RATE), dtype=np.float32)


def _stage_manifests(config: PipelineConfig, file: str | None, line: int | None) -> list[Path]:
    manifests = []
    for stage_id, role in ((ENCODER_STAGE, "encoder"), (DECODER_STAGE, "decoder")):
        stage = config.stages[stage_id] if stage_id < len(config.stages) else None
        if stage is None or not isinstance(stage.backend, GraphBackendConfig):
            raise TranscribeOptionsError(
                f"the transcription adapter needs the recogniser's {role} bundle as graph stage "
                f"{stage_id}; this pipeline has {len(config.stages)} stage(s)",
                file=file,
                line=line,
                key="stages",
            )
        manifests.append(Path(stage.backend.manifest))
    if len(config.stages) != 2:
        raise TranscribeOptionsError(
            f"the transcription adapter drives exactly two stages (encoder, decoder); this "
            f"pipeline has {len(config.stages)}",
            file=file,
            line=line,
            key="stages",
        )
    return manifests


class TranscribeAdapter:
    """The pipeline program of a Whisper recogniser: encoder stage 0, decoder stage 1."""

    input_kind: Final = AUDIO_INPUT
    kind: Final = "transcribe"
    #: A streaming request is fed 16 kHz PCM as it comes; its features are computed on arrival.
    streams_input: Final = True

    def __init__(self, config: PipelineConfig, options: Mapping[str, Any]) -> None:
        source = str(config.source) if config.source is not None else None
        line = config.adapter.line if config.adapter is not None else None
        self.config = config
        self.options = TranscribeOptions.parse(options, file=source, line=line)
        encoder, decoder = _stage_manifests(config, source, line)
        self.bundles: WhisperBundles = read_whisper_bundles(encoder, decoder)
        if self.options.model is not None and self.bundles.model_name != self.options.model:
            raise TranscribeOptionsError(
                f"model {self.options.model!r}, but {self.bundles.decoder.manifest_path} holds "
                f"{self.bundles.model_name!r}; accepted: the model the stages' bundles hold",
                file=source,
                line=line,
                key="adapter.options.model",
            )

    @property
    def max_audio_s(self) -> float:
        """The longest audio a request may bring (``adapter.options.max_audio_s``)."""
        return self.options.max_audio_s

    # -- the program -------------------------------------------------------------------

    def prepare(self, request_input: object) -> PreparedAudio | SpooledFeatures:
        """Audio (see the module) -> 16 kHz mono features; raises AudioInputError. No input
        (None) is the example request: :data:`EXAMPLE_SENTENCE` spoken by the bundled voice.
        Features already computed (:class:`PreparedAudio`, finished :class:`SpooledFeatures`)
        are checked and taken as they are."""
        if isinstance(request_input, (PreparedAudio, SpooledFeatures)):
            return self._checked_features(request_input)
        if request_input is None:
            # The example request (a run without input): the bundled voice speaking a sentence.
            request_input = {"audio": spoken_clip(EXAMPLE_SENTENCE), "sample_rate": SAMPLE_RATE}
        if not isinstance(request_input, Mapping) or set(map(str, request_input)) != {
            "audio",
            "sample_rate",
        }:
            found = (
                f"keys {sorted(map(str, request_input))}"
                if isinstance(request_input, Mapping)
                else type(request_input).__name__
            )
            raise AudioInputError(
                f"pipeline {self.config.pipeline} takes audio; got {found}; accepted: "
                f"{_ACCEPTED_REQUEST}",
                code="not_audio",
            )
        rate = request_input["sample_rate"]
        if isinstance(rate, np.ndarray) and rate.size == 1 and rate.dtype.kind in "iu":
            rate = int(rate.reshape(-1)[0])
        audio = to_mono_16k(request_input["audio"], rate)
        self._check_length(audio.size / SAMPLE_RATE)
        return PreparedAudio(audio.size, log_mel(audio, self.bundles.n_mels))

    def _check_length(self, seconds: float) -> None:
        if seconds > self.options.max_audio_s:
            raise AudioInputError(
                f"the audio is {seconds:.1f} s long; accepted: at most "
                f"{self.options.max_audio_s:g} s (adapter.options.max_audio_s)",
                code="too_long",
            )

    def _checked_features(
        self, features: PreparedAudio | SpooledFeatures
    ) -> PreparedAudio | SpooledFeatures:
        n_mels = self.bundles.n_mels
        if isinstance(features, SpooledFeatures):
            found = features.n_mels
            if features.closed or not features.finished:
                state = "closed" if features.closed else "not finished"
                raise AudioInputError(
                    f"pipeline {self.config.pipeline}: spooled features that are {state}; "
                    "accepted: features finished (spool_stream, or finish()) and still open",
                    code="bad_samples",
                )
        else:
            found = int(features.features.shape[0]) if features.features.ndim == 2 else -1
        if found != n_mels or features.samples <= 0:
            raise AudioInputError(
                f"pipeline {self.config.pipeline}: features of {found} mel bands and "
                f"{features.samples} samples; accepted: {n_mels} mel bands "
                f"({self.bundles.model_name}) of at least one sample",
                code="bad_samples",
            )
        self._check_length(features.seconds)
        return features

    def prepare_chunk(self, chunk: object) -> np.ndarray:
        """One chunk of a streaming request: samples at 16 kHz (1-D, or [samples, channels];
        float or int16/int32 PCM), or ``{"audio": samples, "sample_rate": 16000}`` -> 16 kHz
        mono float32 (a copy); AudioInputError otherwise."""
        audio, rate = chunk, SAMPLE_RATE
        if isinstance(chunk, Mapping):
            if set(map(str, chunk)) != {"audio", "sample_rate"}:
                raise AudioInputError(
                    f"pipeline {self.config.pipeline}: a chunk with keys "
                    f"{sorted(map(str, chunk))}; accepted: samples at {SAMPLE_RATE} Hz or "
                    f"{{'audio': samples, 'sample_rate': {SAMPLE_RATE}}}",
                    code="not_audio",
                )
            audio, rate = chunk["audio"], chunk["sample_rate"]
        if rate != SAMPLE_RATE:
            raise AudioInputError(
                f"pipeline {self.config.pipeline}: a chunk at {rate!r} Hz; accepted: "
                f"{SAMPLE_RATE} Hz (a stream is not resampled)",
                code="bad_rate",
            )
        if isinstance(audio, np.ndarray) and audio.size == 0:
            return np.zeros(0, np.float32)
        return np.array(to_mono_16k(audio, SAMPLE_RATE), dtype=np.float32, copy=True)

    async def run_streaming(self, ctx: RequestContext, chunks: InputStream) -> None:
        """Features computed as the chunks arrive, spooled to disk (memory stays that of one
        batch however long the input); the transcript once the input ends."""
        features = SpooledFeatures(self.bundles.n_mels)
        try:
            async for chunk in chunks:
                features.feed(chunk)
                if features.seconds > self.options.max_audio_s:
                    raise AudioInputError(
                        f"the audio fed reached {features.seconds:.1f} s; accepted: at most "
                        f"{self.options.max_audio_s:g} s (adapter.options.max_audio_s)",
                        code="too_long",
                    )
            if features.samples == 0:
                raise AudioInputError(
                    f"pipeline {self.config.pipeline}: the streaming request ended with no "
                    "audio; accepted: at least one sample fed before end_input()",
                    code="empty",
                )
            features.finish()
        except BaseException:
            features.close()
            raise
        await self.run(ctx, features)

    async def run(self, ctx: RequestContext, prepared: PreparedAudio | SpooledFeatures) -> None:
        """The windows in order (see the module); spooled features are closed at the end."""
        try:
            await self._transcribe(ctx, prepared)
        finally:
            if isinstance(prepared, SpooledFeatures):
                prepared.close()

    async def _transcribe(
        self, ctx: RequestContext, prepared: PreparedAudio | SpooledFeatures
    ) -> None:
        bundles = self.bundles
        rules = bundles.rules
        content = prepared.frames - 1
        report = prepared.report if isinstance(prepared, SpooledFeatures) else None
        cache = bundles.cache()
        decoder_name = ctx.stage_name(DECODER_STAGE)
        seek = 0
        history: list[int] = []
        segments: list[Segment] = []
        windows = steps = 0
        encoder_s = decoder_s = 0.0
        frames = bundles.window_frames
        while seek < content:
            size = min(frames, content - seek)
            # A spooled window is read back from disk here; the rest of the audio stays there.
            mel = prepared.window(seek, size, frames)
            encoded = await ctx.call(ENCODER_STAGE, {"mel": mel}, hold=True)
            encoder_s += encoded.run_s
            windows += 1
            try:
                names = bundles.cross_names()
                cross = {name: encoded.outputs[name] for name in names if name in encoded.outputs}
                if len(cross) != len(names):
                    raise ModelError(
                        f"{ctx.stage_name(ENCODER_STAGE)} returned {sorted(encoded.outputs)}; "
                        f"expected {', '.join(names)}"
                    )
                retained = tuple(cross)
                prompt = rules.prompt(history if self.options.condition_on_previous_text else ())
                window = WindowDecode.start(rules, prompt, cache)
                while True:
                    # The window's cross keys/values are copied into the decoder's input
                    # buffers once and sent again in place on every later step.
                    step = await ctx.call(
                        DECODER_STAGE, {**window.step_inputs(), **cross}, retain=retained
                    )
                    steps += 1
                    decoder_s += step.run_s
                    logits = step.outputs.get("logits")
                    new_kv = step.outputs.get("new_kv")
                    if logits is None or new_kv is None or new_kv.size != cache[0].size:
                        raise ModelError(
                            f"{decoder_name} returned {sorted(step.outputs)}; expected 'logits' "
                            f"and 'new_kv' of {cache[0].size} values"
                        )
                    if window.feed(logits, new_kv):
                        break
            finally:
                ctx.release(ENCODER_STAGE)
            result = window.result()
            start = seek * FRAME_S
            seek += size
            segment = None if result.is_silence else self._segment(result.tokens, start, size)
            if segment is not None and segment.start != segment.end and segment.text.strip():
                history.extend(segment.tokens)
                segments.append(segment)
                await ctx.emit(
                    {
                        "tokens": np.array(segment.tokens, dtype=np.int64),
                        "start_s": np.float64(segment.start),
                        "end_s": np.float64(segment.end),
                        "segment_index": np.int64(len(segments) - 1),
                    },
                    stage=decoder_name,
                    text=segment.text,
                )
            if report is not None:
                report(seek * FRAME_S if seek < content else prepared.seconds)
        wall = time.perf_counter() - ctx.request.submitted_at
        await ctx.emit(
            {"segment_index": np.int64(len(segments))},
            stage=decoder_name,
            finished=True,
            text="".join(segment.text for segment in segments),
            metrics={
                "segments": [segment.to_json() for segment in segments],
                "audio_seconds": prepared.seconds,
                "windows": windows,
                "decoder_steps": steps,
                "encoder_run_s": round(encoder_s, 6),
                "decoder_run_s": round(decoder_s, 6),
                "real_time_factor": wall / prepared.seconds if prepared.seconds else None,
                "model": bundles.model_name,
            },
        )

    def _segment(self, tokens: tuple[int, ...], start: float, frames: int) -> Segment:
        """A window's segment, timed as faster-whisper times one without timestamp pairs."""
        rules = self.bundles.rules
        duration = frames * FRAME_S
        stamps = [token for token in tokens if token >= rules.timestamp_begin]
        if stamps and stamps[-1] != rules.timestamp_begin:
            duration = (stamps[-1] - rules.timestamp_begin) * _TIME_PRECISION
        text = self.bundles.vocabulary.decode(tokens, eot=rules.eot)
        return Segment(start, start + duration, text, tokens)
