"""Chat to speech: a language model's text, streamed into a voice sentence by sentence.

The pipeline has three stages: a language-model stage 0 (``native.vllm.v1``) and the voice's
acoustic and decoder graph stages 1 and 2 (as in ``assets/pipelines/speak.yaml``). For each
request :class:`ChatSpeakProgram`

1. streams the model's text: every delta goes out at once as a partial output whose
   :attr:`~runtime.engine.outputs.OmniRequestOutput.text` is the new text;
2. cuts the text into pieces as it grows (:class:`SentenceChunker`): whole sentences by the
   speech adapter's rule, short ones joined to the next, and a piece cut at a space once it
   reaches ``max_sentence_chars`` without a sentence end (a model that never ends a sentence,
   like the tiny test model, is still spoken);
3. hands each finished piece to the voice while generation goes on: the speech adapter
   (:class:`~runtime.adapters.tts.SpeechAdapter`) runs on stages 1 and 2 through a narrowed
   context, and its audio chunks go out as partial outputs (``pcm``, ``sample_rate``,
   ``chunk_index``, ``sentence_index``, ``sentence_samples``, numbered over the request).

Text partials and audio partials interleave in one stream. The final output has
``finished=True``, the whole text in ``text``, an empty ``pcm`` (its ``chunk_index`` and
``sentence_index`` are the counts of chunks and utterances) and ``metrics``: the language
model's (``tokens``, ``finish_reason``, ``time_to_first_token_s``, ``generation_s``,
``tokens_per_s``), ``time_to_first_text_s`` and ``time_to_first_audio_s`` (from the request's
admission), ``audio_seconds``, ``chunks``, ``sentences``, ``pieces`` (each piece handed to the
voice, with ``text_chars_at_handoff``: how much text existed then) and ``skipped``.

A request is text (the prompt), ``{"text": str, <sampling options>...}`` or a conversation,
``{"messages": [{"role", "content"}, ...], <sampling options>...}``, which the model's own
chat template renders (see :func:`~runtime.engine.program.parse_text_request`).

Adapter options (``adapter.options``): the speech adapter's (``voice``, ``schedule``,
``scales``, ``sentence_silence_s``, ``overlap_sentences``, ``windows``) and

``min_sentence_chars``
    A sentence shorter than this waits to be spoken with the next one (default 24).
``max_sentence_chars``
    Text without a sentence end is cut at the last space before this many characters
    (default 160).
``prompt_template``
    The prompt the model sees for a text request, with ``{text}`` where the request's text
    goes (default ``{text}``), e.g. a chat model's turn markers; or ``chat``: the text is the
    user's turn in the model's own chat template. A conversation is always rendered with the
    model's chat template.
``example_text``
    What the studio offers as an example request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from runtime.adapters.tts import OPTION_NAMES as SPEECH_OPTION_NAMES
from runtime.adapters.tts import SpeechAdapter
from runtime.adapters.tts_text import SpeechInputError, split_sentences
from runtime.config import GraphBackendConfig, LlmBackendConfig
from runtime.engine.outputs import AudioChunk
from runtime.engine.program import (
    CHAT_TEMPLATE,
    PROMPT_SLOT,
    TextRequest,
    parse_text_request,
    text_prompt,
)
from runtime.errors import ConfigError, ModelError
from runtime.pipeline_input import TEXT_INPUT

if TYPE_CHECKING:
    from collections.abc import Mapping

    from runtime.adapters.tts_text import SpeechPlan
    from runtime.config import PipelineConfig
    from runtime.engine.program import Emitted, RequestContext

__all__ = [
    "CHAT_OPTION_NAMES",
    "LLM_STAGE",
    "SPEECH_STAGE",
    "ChatOptions",
    "ChatOptionsError",
    "ChatSpeakProgram",
    "SentenceChunker",
]

LLM_STAGE: Final = 0
#: The first of the two speech stages (acoustic; the decoder follows).
SPEECH_STAGE: Final = 1
CHAT_OPTION_NAMES: Final = (
    "min_sentence_chars",
    "max_sentence_chars",
    "prompt_template",
    "example_text",
)
DEFAULT_MIN_SENTENCE_CHARS: Final = 24
DEFAULT_MAX_SENTENCE_CHARS: Final = 160
#: Bounds of ``max_sentence_chars``: long enough for a clause, short enough for early audio.
MAX_SENTENCE_CHARS_RANGE: Final = (16, 2000)
DEFAULT_EXAMPLE_TEXT: Final = "Tell me a short story about a river and a mountain."


class ChatOptionsError(ConfigError):
    """The chat-to-speech adapter's options or stages do not fit."""


@dataclass(frozen=True, slots=True)
class ChatOptions:
    """The options this adapter adds to the speech adapter's (see the module)."""

    min_sentence_chars: int = DEFAULT_MIN_SENTENCE_CHARS
    max_sentence_chars: int = DEFAULT_MAX_SENTENCE_CHARS
    prompt_template: str = PROMPT_SLOT
    example_text: str = DEFAULT_EXAMPLE_TEXT

    @classmethod
    def parse(
        cls, options: Mapping[str, Any], *, file: str | None = None, line: int | None = None
    ) -> tuple[ChatOptions, dict[str, Any]]:
        """Check this adapter's options; return them and the speech adapter's (unchecked)."""

        def fail(name: str, message: str) -> ChatOptionsError:
            return ChatOptionsError(message, file=file, line=line, key=f"adapter.options.{name}")

        accepted = (*CHAT_OPTION_NAMES, *SPEECH_OPTION_NAMES)
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            raise fail(
                unknown[0], f"unknown option {unknown[0]!r}; accepted: {', '.join(accepted)}"
            )
        low, high = MAX_SENTENCE_CHARS_RANGE
        largest = options.get("max_sentence_chars", DEFAULT_MAX_SENTENCE_CHARS)
        if type(largest) is not int or not low <= largest <= high:
            raise fail(
                "max_sentence_chars",
                f"{largest!r} is not a length; accepted: an integer from {low} to {high}",
            )
        smallest = options.get("min_sentence_chars", DEFAULT_MIN_SENTENCE_CHARS)
        if type(smallest) is not int or not 1 <= smallest <= largest:
            raise fail(
                "min_sentence_chars",
                f"{smallest!r} is not a length; accepted: an integer from 1 to "
                f"max_sentence_chars ({largest})",
            )
        template = options.get("prompt_template", PROMPT_SLOT)
        if not isinstance(template, str) or (
            template != CHAT_TEMPLATE and template.count(PROMPT_SLOT) != 1
        ):
            raise fail(
                "prompt_template",
                f"{template!r} is not a prompt template; accepted: a string with {PROMPT_SLOT} "
                f"exactly once, where the request's text goes, or {CHAT_TEMPLATE!r} (the text "
                "as the user's turn in the model's chat template)",
            )
        example = options.get("example_text", DEFAULT_EXAMPLE_TEXT)
        if not isinstance(example, str) or not example.strip():
            raise fail("example_text", f"{example!r} is not text; accepted: a non-empty string")
        speech = {name: value for name, value in options.items() if name in SPEECH_OPTION_NAMES}
        return cls(smallest, largest, template, example), speech


class SentenceChunker:
    """Cuts streamed text into pieces to speak, as it arrives.

    A piece is a whole sentence (the speech adapter's rule: after ``!`` or ``?``, or a ``.``
    before an upper-case letter, or at a line break), known once the next one has begun;
    sentences shorter than ``min_chars`` are joined to the next. Text that reaches
    ``max_chars`` without a sentence end is cut at its last space before the limit (at the
    limit when it has none). With ``clause_chars``, a clause is a piece too: text of at least
    that many characters is cut after its last ``,``, ``;`` or ``:`` followed by a space, so
    that a voice can start on the first clause while the model writes the rest. With
    ``first_words``, the first piece is cut after that many words whatever follows them (the
    voice starts on the reply's first words). :meth:`finish` returns what is left at the end.
    """

    def __init__(
        self, min_chars: int, max_chars: int, *, clause_chars: int = 0, first_words: int = 0
    ) -> None:
        if not 1 <= min_chars <= max_chars:
            raise ValueError(f"need 1 <= min_chars ({min_chars}) <= max_chars ({max_chars})")
        if not 0 <= clause_chars <= max_chars:
            raise ValueError(f"need 0 <= clause_chars ({clause_chars}) <= max_chars ({max_chars})")
        self.min_chars = min_chars
        self.max_chars = max_chars
        self.clause_chars = clause_chars
        self.first_words = first_words
        self._open = ""
        self._pending = ""
        self._pieces = 0

    def feed(self, text: str) -> list[str]:
        """Add streamed text; return the pieces it completed, in order."""
        self._open += text
        pieces: list[str] = []
        found = split_sentences(self._open, max(1, len(self._open)))
        if len(found) > 1:
            position = 0
            for sentence in found[:-1]:
                position = self._open.index(sentence, position) + len(sentence)
                self._join(sentence, pieces)
            self._open = self._open[self._open.index(found[-1], position) :]
        while len(self._open) >= self.max_chars:
            cut = self._open.rfind(" ", 0, self.max_chars)
            if cut <= 0:
                cut = self.max_chars
            head, self._open = self._open[:cut].strip(), self._open[cut:].lstrip()
            self._join(head, pieces, force=True)
        if self.clause_chars:
            self._clauses(pieces)
        if self.first_words and not self._pieces and not pieces:
            self._first_words(pieces)
        self._pieces += len(pieces)
        return pieces

    def _first_words(self, pieces: list[str]) -> None:
        text = f"{self._pending} {self._open}" if self._pending else self._open
        # A word is complete once whitespace follows it: the last one may still be written.
        complete = [word for word in re.finditer(r"\S+(?=\s)", text)]
        if len(complete) < self.first_words:
            return
        last = complete[self.first_words - 1]
        pieces.append(" ".join(word.group() for word in complete[: self.first_words]))
        self._pending = ""
        self._open = text[last.end() :].lstrip()

    def _clauses(self, pieces: list[str]) -> None:
        text = self._pending + (" " if self._pending else "") + self._open
        if len(text.strip()) < self.clause_chars:
            return
        cut = max(self._open.rfind(mark) for mark in (", ", "; ", ": "))
        if cut < 0:
            return
        head = self._open[: cut + 1].strip()
        if len((self._pending + " " + head).strip()) < self.clause_chars:
            return
        self._open = self._open[cut + 2 :]
        self._join(head, pieces, force=True)

    def finish(self) -> list[str]:
        """The rest of the text as one last piece (nothing when only spaces are left)."""
        rest = " ".join(part for part in (self._pending, self._open.strip()) if part)
        self._pending = self._open = ""
        self._pieces += bool(rest)
        return [rest] if rest else []

    def _join(self, sentence: str, pieces: list[str], *, force: bool = False) -> None:
        if not sentence:
            return
        self._pending = f"{self._pending} {sentence}" if self._pending else sentence
        if force or len(self._pending) >= self.min_chars:
            pieces.append(self._pending)
            self._pending = ""


@dataclass(slots=True)
class _Progress:
    """One request's speech so far (loop thread only)."""

    submitted_at: float
    chunks: int = 0
    samples: int = 0
    utterances: int = 0
    first_text_at: float | None = None
    first_audio_at: float | None = None
    pieces: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[Mapping[str, Any]] = field(default_factory=list)


class ChatSpeakProgram:
    """The pipeline program of chat to speech: language model 0, acoustic 1, decoder 2."""

    input_kind: Final = TEXT_INPUT
    kind: Final = "chat-speak"
    example_text: Final = DEFAULT_EXAMPLE_TEXT

    def __init__(self, config: PipelineConfig, options: Mapping[str, Any]) -> None:
        source = str(config.source) if config.source is not None else None
        line = config.adapter.line if config.adapter is not None else None
        self.config = config
        self.options, speech_options = ChatOptions.parse(options, file=source, line=line)
        kinds = [
            "llm" if isinstance(stage.backend, LlmBackendConfig) else "graph"
            for stage in config.stages
        ]
        if kinds != ["llm", "graph", "graph"]:
            raise ChatOptionsError(
                f"chat to speech drives a language-model stage 0 and the voice's acoustic and "
                f"decoder graph stages 1 and 2; this pipeline's stages are {kinds}",
                file=source,
                line=line,
                key="stages",
            )
        backend = config.stages[LLM_STAGE].backend
        assert isinstance(backend, LlmBackendConfig)
        assert all(isinstance(stage.backend, GraphBackendConfig) for stage in config.stages[1:])
        self.sampling = backend.sampling
        adapter = config.adapter
        speech_config = dataclasses.replace(
            config,
            stages=config.stages[SPEECH_STAGE:],
            adapter=None
            if adapter is None
            else dataclasses.replace(adapter, options=speech_options),
        )
        self.speech = SpeechAdapter(speech_config, speech_options)
        if self.speech.options.overlap_sentences == "auto":
            # The language model shares the cores with the speech stages (plan_threads), so
            # the thread plan gives them no cores of their own to overlap on.
            self.speech.overlap = False
        self.sample_rate = self.speech.sample_rate

    def prepare(self, request_input: object) -> TextRequest:
        """Text, ``{"text": str, ...}`` or ``{"messages": [...], ...}`` -> a checked request."""
        request, _ = parse_text_request(
            request_input, pipeline=self.config.pipeline, defaults=self.sampling
        )
        return request

    async def run(self, ctx: RequestContext, request: TextRequest) -> None:
        progress = _Progress(submitted_at=ctx.request.submitted_at)
        pieces: asyncio.Queue[str | None] = asyncio.Queue()
        speaker = asyncio.ensure_future(self._speak(ctx, pieces, progress))
        llm = ctx.stage_name(LLM_STAGE)
        chunker = SentenceChunker(self.options.min_sentence_chars, self.options.max_sentence_chars)
        prompt = text_prompt(ctx, LLM_STAGE, request, self.options.prompt_template)
        try:
            async with ctx.generate(LLM_STAGE, prompt, **request.sampling) as stream:
                async for text in stream:
                    if progress.first_text_at is None:
                        progress.first_text_at = time.perf_counter()
                    await ctx.emit({}, stage=llm, text=text)
                    for piece in chunker.feed(text):
                        self._hand_off(pieces, progress, piece, len(stream.text))
                    if speaker.done():
                        break
            if speaker.done():
                # The voice failed (or the stream ended it): its error is the request's.
                await speaker
            for piece in chunker.finish():
                self._hand_off(pieces, progress, piece, len(stream.text))
            pieces.put_nowait(None)
            await speaker
        finally:
            if not speaker.done():
                speaker.cancel()
            await asyncio.gather(speaker, return_exceptions=True)
        closing = AudioChunk(
            np.zeros(0, dtype=np.float32),
            self.sample_rate,
            chunk_index=progress.chunks,
            sentence_index=progress.utterances,
            sentence_samples=0,
        )
        await ctx.emit(
            closing.to_outputs(),
            stage=ctx.stage_name(SPEECH_STAGE + 1),
            finished=True,
            text=stream.text,
            metrics=self._metrics(progress, stream.metrics()),
        )

    @staticmethod
    def _hand_off(
        pieces: asyncio.Queue[str | None], progress: _Progress, piece: str, chars: int
    ) -> None:
        progress.pieces.append(
            {
                "text": piece,
                "text_chars_at_handoff": chars,
                "handed_off_s": time.perf_counter() - progress.submitted_at,
            }
        )
        pieces.put_nowait(piece)

    async def _speak(
        self, ctx: RequestContext, pieces: asyncio.Queue[str | None], progress: _Progress
    ) -> None:
        """Speak each piece in turn on the voice's stages, as it arrives."""
        base = 0

        async def forward(emitted: Emitted) -> None:
            if emitted.finished:
                return
            chunk = AudioChunk.from_outputs(emitted.outputs, source=f"{emitted.stage}'s output")
            if chunk is None:
                raise ModelError(f"{emitted.stage} emitted an output without 'pcm'")
            # Renumbered over the whole request.
            chunk = dataclasses.replace(
                chunk,
                chunk_index=progress.chunks,
                sentence_index=base + (chunk.sentence_index or 0),
            )
            progress.chunks += 1
            if chunk.pcm.size:
                progress.samples += chunk.pcm.size
                if progress.first_audio_at is None:
                    progress.first_audio_at = time.perf_counter()
            await ctx.emit({**emitted.outputs, **chunk.to_outputs()}, stage=emitted.stage)

        voice = ctx.narrowed(SPEECH_STAGE, forward)
        loop = asyncio.get_running_loop()
        while (piece := await pieces.get()) is not None:
            try:
                # espeak-ng phonemizes off the loop, which keeps streaming text meanwhile.
                plan: SpeechPlan = await loop.run_in_executor(None, self.speech.prepare, piece)
            except SpeechInputError as exc:
                progress.skipped.append({"text": piece, "reason": exc.code, "detail": str(exc)})
                continue
            progress.skipped.extend(item.to_json() for item in plan.skipped)
            await self.speech.run(voice, plan)
            base += len(plan.sentences)
            progress.utterances = base

    def _metrics(self, progress: _Progress, text: Mapping[str, Any]) -> dict[str, Any]:
        def since_admission(at: float | None) -> float | None:
            return None if at is None else at - progress.submitted_at

        return {
            **text,
            "time_to_first_text_s": since_admission(progress.first_text_at),
            "time_to_first_audio_s": since_admission(progress.first_audio_at),
            "audio_seconds": progress.samples / self.sample_rate,
            "chunks": progress.chunks,
            "sentences": progress.utterances,
            "sample_rate": self.sample_rate,
            "pieces": list(progress.pieces),
            "skipped": list(progress.skipped),
        }
