"""Live transcription: voice activity cuts the audio fed to a request into speech segments,
and each segment is transcribed as soon as it ends.

A pipeline of three graph stages: the Silero VAD bundle (stage 0), then the recogniser's
encoder and decoder (stages 1 and 2, as :class:`~runtime.adapters.whisper.TranscribeAdapter`
drives them). A request is streaming (``session.submit(streaming=True)``): the caller feeds
16 kHz PCM as it comes (``feed``), each chunk is scored by the VAD stage on arrival, and when
speech ends its audio (from the start's pre-roll to the end) is transcribed on the other two
stages; its text goes out at once. At end of input speech still open is closed and
transcribed, and the final output carries the whole transcript. A one-shot request (a clip,
``{"audio": samples, "sample_rate": Hz}``) runs the same way over the clip.

Outputs: each transcribed piece as the transcription adapter's segment outputs (``tokens``,
``start_s``, ``end_s`` in seconds of the whole stream, ``segment_index``; the text in
:attr:`~runtime.engine.outputs.OmniRequestOutput.text`); the final output has the whole
transcript and ``metrics``: ``speech`` (each speech segment's start and end), ``segments``,
``audio_seconds``, ``chunks`` (VAD calls).

Adapter options: the voice activity adapter's (``threshold``, ``neg_threshold``,
``min_speech_s``, ``min_silence_s``, ``pre_roll_s``) and the transcription adapter's
(``model``, ``max_audio_s`` per speech segment, ``condition_on_previous_text``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from runtime.adapters import vad, whisper
from runtime.adapters.vad import SpeechEnded, SpeechStarted, VadAdapter, VadStream
from runtime.adapters.whisper import TranscribeAdapter
from runtime.adapters.whisper_mel import SAMPLE_RATE
from runtime.errors import ConfigError
from runtime.pipeline_input import AUDIO_INPUT

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

    from runtime.config import PipelineConfig
    from runtime.engine.inputs import InputStream
    from runtime.engine.program import Emitted, RequestContext

__all__ = ["LiveTranscribeAdapter", "LiveTranscribeOptionsError"]

VAD_STAGE: Final = 0
#: The recogniser's stages start here (its encoder, then its decoder).
RECOGNISER_STAGE: Final = 1
#: Audio kept before the current point while no speech is open (covers any pre-roll).
_IDLE_KEEP_S: Final = vad.MAX_DURATION_S + 1.0


class LiveTranscribeOptionsError(ConfigError):
    """The live transcription pipeline or its options are not usable."""


class LiveTranscribeAdapter:
    """The pipeline program of live transcription: VAD stage 0, encoder 1, decoder 2."""

    input_kind: Final = AUDIO_INPUT
    kind: Final = "transcribe-live"
    #: Fed 16 kHz PCM as it comes; VAD per chunk on arrival, a segment transcribed as it ends.
    streams_input: Final = True

    def __init__(self, config: PipelineConfig, options: Mapping[str, Any]) -> None:
        source = str(config.source) if config.source is not None else None
        line = config.adapter.line if config.adapter is not None else None
        unknown = sorted(set(options) - {*vad.OPTION_NAMES, *whisper.OPTION_NAMES})
        if unknown:
            raise LiveTranscribeOptionsError(
                f"unknown option {unknown[0]!r}; accepted: "
                f"{', '.join((*vad.OPTION_NAMES, *whisper.OPTION_NAMES))}",
                file=source,
                line=line,
                key=f"adapter.options.{unknown[0]}",
            )
        if len(config.stages) != 3:
            raise LiveTranscribeOptionsError(
                "live transcription drives three graph stages (the VAD bundle, the "
                f"recogniser's encoder and decoder); this pipeline has {len(config.stages)}",
                file=source,
                line=line,
                key="stages",
            )
        self.config = config
        vad_options = {k: v for k, v in options.items() if k in vad.OPTION_NAMES}
        recogniser_options = {k: v for k, v in options.items() if k in whisper.OPTION_NAMES}
        # Each part checks its own stages and options, as it does in a pipeline of its own.
        self.vad = VadAdapter(dataclasses.replace(config, stages=config.stages[:1]), vad_options)
        self.recogniser = TranscribeAdapter(
            dataclasses.replace(config, stages=config.stages[1:]), recogniser_options
        )

    @property
    def max_audio_s(self) -> float:
        """The longest speech segment a request may bring."""
        return self.recogniser.options.max_audio_s

    def prepare(self, request_input: object) -> np.ndarray:
        """A clip (``{"audio": samples, "sample_rate": Hz}``) -> 16 kHz mono float32."""
        if not isinstance(request_input, dict) or "audio" not in request_input:
            raise whisper.AudioInputError(
                f"pipeline {self.config.pipeline} takes a clip "
                "({'audio': samples, 'sample_rate': Hz}) or streaming input "
                "(submit(streaming=True), then feed 16 kHz samples)",
                code="not_audio",
            )
        rate = request_input.get("sample_rate", SAMPLE_RATE)
        return whisper.to_mono_16k(request_input["audio"], rate)

    def prepare_chunk(self, chunk: object) -> np.ndarray:
        """One chunk of 16 kHz PCM (see :meth:`TranscribeAdapter.prepare_chunk`)."""
        return self.recogniser.prepare_chunk(chunk)

    async def run(self, ctx: RequestContext, prepared: np.ndarray) -> None:
        async def one() -> AsyncIterator[np.ndarray]:
            yield prepared

        await self._transcribe(ctx, one())

    async def run_streaming(self, ctx: RequestContext, chunks: InputStream) -> None:
        await self._transcribe(ctx, chunks)

    async def _transcribe(self, ctx: RequestContext, chunks: AsyncIterator[np.ndarray]) -> None:
        stream = VadStream(self.vad.settings)
        live = _Segments(self, ctx)

        async def call(inputs: dict[str, np.ndarray]) -> Mapping[str, np.ndarray]:
            return (await ctx.call(VAD_STAGE, inputs)).outputs

        async for chunk in chunks:
            ctx.check_cancelled()
            live.keep(chunk)
            # VAD on arrival; each ended segment is transcribed before more audio is scored.
            for event in await stream.arun(chunk, call):
                await live.on(event)
        for event in await stream.arun(np.zeros(0, np.float32), call, last=True):
            await live.on(event)
        await live.finish(stream.chunks_scored)


class _Segments:
    """One request's audio since the open segment (or the last seconds) and its segments."""

    def __init__(self, adapter: LiveTranscribeAdapter, ctx: RequestContext) -> None:
        self.adapter = adapter
        self.ctx = ctx
        self.parts: list[np.ndarray] = []
        #: The absolute sample index of ``parts``' first sample.
        self.base = 0
        self.fed = 0
        self.open_from: int | None = None
        self.speech: list[list[float]] = []
        self.segments: list[dict[str, Any]] = []
        self.texts: list[str] = []

    def keep(self, chunk: np.ndarray) -> None:
        self.parts.append(chunk)
        self.fed += chunk.size
        if self.open_from is None:
            # No speech open: only the last seconds can become a segment's pre-roll.
            self._trim(self.fed - round(_IDLE_KEEP_S * SAMPLE_RATE))

    def _audio(self, start: int, end: int) -> np.ndarray:
        joined = np.concatenate(self.parts) if self.parts else np.zeros(0, np.float32)
        self.parts = [joined]
        return joined[max(0, start - self.base) : max(0, end - self.base)]

    def _trim(self, start: int) -> None:
        if start <= self.base:
            return
        joined = np.concatenate(self.parts) if self.parts else np.zeros(0, np.float32)
        self.parts = [joined[start - self.base :]]
        self.base = start

    async def on(self, event: object) -> None:
        if isinstance(event, SpeechStarted):
            self.open_from = max(0, round(event.pcm_t * SAMPLE_RATE))
            self._trim(self.open_from)
        elif isinstance(event, SpeechEnded) and self.open_from is not None:
            start, self.open_from = self.open_from, None
            self.speech.append([event.started, event.t])
            await self._segment(start, event.sample)
            self._trim(self.fed - round(_IDLE_KEEP_S * SAMPLE_RATE))

    async def _segment(self, start: int, end: int) -> None:
        audio = self._audio(start, end)
        if audio.size == 0:
            return
        recogniser = self.adapter.recogniser
        prepared = recogniser.prepare({"audio": audio, "sample_rate": SAMPLE_RATE})
        offset = start / SAMPLE_RATE
        ctx = self.ctx

        async def emitted(output: Emitted) -> None:
            if output.finished:
                return
            outputs = dict(output.outputs)
            begin = float(outputs["start_s"]) + offset
            finish = float(outputs["end_s"]) + offset
            outputs.update(
                start_s=np.float64(begin),
                end_s=np.float64(finish),
                segment_index=np.int64(len(self.segments)),
            )
            text = output.text or ""
            self.segments.append({"start": begin, "end": finish, "text": text})
            self.texts.append(text)
            await ctx.emit(outputs, stage=output.stage, text=text)

        await recogniser.run(ctx.narrowed(RECOGNISER_STAGE, emitted), prepared)

    async def finish(self, chunks: int) -> None:
        ctx = self.ctx
        await ctx.emit(
            {"segment_index": np.int64(len(self.segments))},
            stage=ctx.stage_name(ctx.stage_count - 1),
            finished=True,
            text="".join(self.texts),
            metrics={
                "speech": self.speech,
                "segments": self.segments,
                "audio_seconds": self.fed / SAMPLE_RATE,
                "chunks": chunks,
            },
        )
