"""A spoken conversation: microphone audio in, the assistant's spoken replies out, with
turn-taking and barge-in, as one duplex request.

Six stages: Silero VAD (0), the recogniser's encoder and decoder (1, 2), the language model
(3) and the voice's acoustic and decoder stages (4, 5). The caller feeds 16 kHz audio as it
comes (:class:`~runtime.conversation.VoiceFrame`, with how much of the reply it has played);
every 32 ms chunk is scored by the VAD stage on arrival and the
:class:`~runtime.adapters.turns.TurnDetector` says what it means:

- **Speech confirmed** (``min_speech_s`` voiced) starts a turn (``speech_started``).
- **A pause** (``speculate_s`` of silence: the first silent chunk) starts work on the speech so far, ahead of the turn's
  end: it is transcribed (``transcript_partial``), the reply generated, cut into clauses and
  spoken; everything it produces is held back. Speech resuming in the pause throws that work
  away (the language model's request is aborted in the engine, the voice stops between calls)
  and a later pause starts it again.
- **The turn's end** (``end_of_turn_s`` of silence; a pause of 250 ms inside a sentence stays
  well under the default) commits the work: ``turn_ended``, the final ``transcript``, then
  what was held and everything after it as it comes: ``reply_text`` deltas and ``reply_audio``
  chunks (an :class:`~runtime.outputs.AudioChunk` each), and ``reply_done``.
- **Barge-in.** Voice while a reply is being spoken or played (``barge_in``) tells the player to
  fade out and hold. A burst too short to be speech (a cough) lets it go on (``resumed``);
  confirmed speech cancels the reply's work as above and ends it (``interrupted``): the history
  keeps what had been played of it (from the frames' ``played_samples``), marked as
  interrupted, and the speech is the next turn.

Each output carries ``event`` and ``turn`` (read back with
:class:`~runtime.conversation.ConversationEvent`). The conversation's history is rendered with
the model's chat template, a system prompt first, the last ``max_history_turns`` exchanges after
it (:func:`prompt_messages`: of interrupted replies, only the last exchange's heard words). At
the end of input the final output has ``metrics``: every turn
(:class:`~runtime.conversation.VoiceTurn` as JSON, with its latency parts) and the counts of
barge-ins, resumes and interruptions.

Between frames the caller may feed a turn of its own: a :class:`~runtime.conversation.TextTurn`
(typed text, answered at once) or a :class:`~runtime.conversation.SpokenTurn` (speech the
caller says is a whole turn: transcribed and answered at once, for callers that detect turns
themselves); a reply in progress is made to its end first. :class:`~runtime.conversation.StopReply`
stops the reply being made or played (``interrupted``, as a barge-in would), and
:class:`~runtime.conversation.ConversationUpdate` replaces the system prompt or the turn-taking
settings for the rest of the conversation. The ``reply_done`` of a reply carries the language
model's ``tokens`` and ``prompt_tokens``.

A one-shot request (a clip, ``{"audio": samples, "sample_rate": Hz}``) runs the same
conversation over the clip, as fast as the stages go; nothing is played, so every reply counts
as heard.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from runtime.adapters import whisper
from runtime.adapters.chat_speak import SentenceChunker
from runtime.adapters.tts import OPTION_NAMES as SPEECH_OPTION_NAMES
from runtime.adapters.tts import SpeechAdapter
from runtime.adapters.tts_text import SpeechInputError
from runtime.adapters.turns import (
    TURN_OPTION_NAMES,
    BurstRejected,
    PauseReached,
    SpeechConfirmed,
    TurnDetector,
    TurnEnded,
    TurnSettings,
    VoiceOnset,
)
from runtime.adapters.vad import VadStream
from runtime.adapters.whisper import TranscribeAdapter
from runtime.adapters.whisper_mel import SAMPLE_RATE
from runtime.chat import ChatMessage
from runtime.config import GraphBackendConfig, LlmBackendConfig
from runtime.conversation import (
    BARGE_IN,
    INTERRUPTED,
    REPLY_AUDIO,
    REPLY_DONE,
    REPLY_TEXT,
    RESUMED,
    SPEECH_STARTED,
    TRANSCRIPT,
    TRANSCRIPT_PARTIAL,
    TURN_ENDED,
    ConversationUpdate,
    SpokenTurn,
    StopReply,
    TextTurn,
    TurnLatency,
    VoiceFrame,
    VoiceTurn,
)
from runtime.errors import ConfigError, ModelError, UsageError
from runtime.outputs import AudioChunk
from runtime.pipeline_input import AUDIO_INPUT

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence

    from runtime.adapters.tts_text import SpeechPlan
    from runtime.config import PipelineConfig
    from runtime.engine.inputs import InputStream
    from runtime.engine.program import Emitted, RequestContext, TextStream

__all__ = [
    "VOICE_OPTION_NAMES",
    "VoiceChatOptions",
    "VoiceChatOptionsError",
    "VoiceChatProgram",
    "prompt_messages",
]

VAD_STAGE: Final = 0
RECOGNISER_STAGE: Final = 1
LLM_STAGE: Final = 3
SPEECH_STAGE: Final = 4
DEFAULT_SYSTEM_PROMPT: Final = (
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face. You are talking "
    "with the user: answer in one or two short sentences."
)
VOICE_OPTION_NAMES: Final = (
    "system_prompt",
    "max_history_turns",
    "min_sentence_chars",
    "max_sentence_chars",
    "clause_chars",
    "first_words",
    "barge_in",
)
#: Audio kept before the current point while no turn is open (covers any pre-roll).
_IDLE_KEEP_S: Final = 2.0
#: Audio after the speech's end transcribed with it: the release of its last sound (a final
#: "s" the voice activity model no longer scores as speech).
_POST_ROLL_S: Final = 0.2


class VoiceChatOptionsError(ConfigError):
    """The voice-chat pipeline or its options are not usable."""


#: What a voice chat is fed: audio, or a turn, a stop or new settings of the caller's.
_Fed = VoiceFrame | TextTurn | SpokenTurn | StopReply | ConversationUpdate


class _ReplyStopped(Exception):
    """The reply was thrown away or interrupted: its work stops at the next output."""


@dataclass(frozen=True, slots=True)
class VoiceChatOptions:
    """The conversation's own options (the turn, recogniser and voice options are theirs)."""

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    max_history_turns: int = 8
    min_sentence_chars: int = 16
    max_sentence_chars: int = 120
    #: A clause of at least this many characters is spoken on its own.
    clause_chars: int = 12
    #: The reply's first piece is its first words: the voice starts on them.
    first_words: int = 2
    #: User speech during a reply interrupts it (off: the reply plays to its end).
    barge_in: bool = True

    @classmethod
    def parse(
        cls, options: Mapping[str, Any], *, file: str | None = None, line: int | None = None
    ) -> VoiceChatOptions:
        def fail(name: str, message: str) -> VoiceChatOptionsError:
            return VoiceChatOptionsError(
                message, file=file, line=line, key=f"adapter.options.{name}"
            )

        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        prompt = options.get("system_prompt", DEFAULT_SYSTEM_PROMPT)
        if not isinstance(prompt, str):
            raise fail("system_prompt", f"{prompt!r} is not text; accepted: a string")
        values["system_prompt"] = prompt
        for name, low, high in (
            ("max_history_turns", 0, 100),
            ("max_sentence_chars", 16, 2000),
            ("min_sentence_chars", 1, 2000),
            ("clause_chars", 0, 2000),
            ("first_words", 0, 50),
        ):
            value = options.get(name, defaults[name])
            if type(value) is not int or not low <= value <= high:
                raise fail(
                    name, f"{value!r} is not a count; accepted: an integer from {low} to {high}"
                )
            values[name] = value
        for name in ("min_sentence_chars", "clause_chars"):
            if values[name] > values["max_sentence_chars"]:
                raise fail(
                    name,
                    f"{values[name]} is more than max_sentence_chars "
                    f"({values['max_sentence_chars']}); accepted: at most that",
                )
        barge_in = options.get("barge_in", True)
        if not isinstance(barge_in, bool):
            raise fail("barge_in", f"{barge_in!r} is not a switch; accepted: true or false")
        values["barge_in"] = barge_in
        return cls(**values)


@dataclass(slots=True)
class _Piece:
    """A piece of the reply handed to the voice, and where its audio lies in the reply's."""

    text: str
    start: int = 0
    end: int = 0


@dataclass(slots=True)
class _Reply:
    """The work of one turn: its transcript, the reply's text and audio (loop thread only)."""

    turn: int
    #: The turn's speech: input samples ``start`` to ``end``.
    start: int
    end: int
    committed: bool = False
    stopped: bool = False
    #: Everything made before the commit, in order: (outputs, text).
    held: list[tuple[dict[str, Any], str | None]] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    task: asyncio.Task[None] | None = None
    stream: TextStream | None = None
    user: str = ""
    text: str = ""
    pieces: list[_Piece] = field(default_factory=list)
    #: Reply audio samples emitted (committed) and made.
    samples: int = 0
    #: The language model's tokens: generated, and in the prompt (0 until reported).
    tokens: int = 0
    prompt_tokens: int = 0
    generating: bool = True
    done: bool = False
    ducked: bool = False
    #: When the turn's end was known (perf_counter) and its parts' times after it.
    committed_at: float | None = None
    transcribed_at: float | None = None
    first_clause_at: float | None = None
    first_audio_at: float | None = None
    end_of_turn_s: float = 0.0


class VoiceChatProgram:
    """The pipeline program of a spoken conversation (see the module)."""

    input_kind: Final = AUDIO_INPUT
    kind: Final = "voice-chat"
    #: Fed microphone audio as it comes; replies stream out while it goes on.
    streams_input: Final = True
    #: The recogniser runs while the model and the voice wait for its transcript: it gets
    #: every core (the thread plan's ``solo`` stages).
    solo_stages: Final = (RECOGNISER_STAGE, RECOGNISER_STAGE + 1)

    def __init__(self, config: PipelineConfig, options: Mapping[str, Any]) -> None:
        source = str(config.source) if config.source is not None else None
        line = config.adapter.line if config.adapter is not None else None
        accepted = (
            *VOICE_OPTION_NAMES,
            *TURN_OPTION_NAMES,
            *whisper.OPTION_NAMES,
            *SPEECH_OPTION_NAMES,
        )
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            raise VoiceChatOptionsError(
                f"unknown option {unknown[0]!r}; accepted: {', '.join(accepted)}",
                file=source,
                line=line,
                key=f"adapter.options.{unknown[0]}",
            )
        kinds = [
            "llm" if isinstance(stage.backend, LlmBackendConfig) else "graph"
            for stage in config.stages
        ]
        expected = ["graph", "graph", "graph", "llm", "graph", "graph"]
        if kinds != expected:
            raise VoiceChatOptionsError(
                "a voice chat drives six stages: the VAD bundle, the recogniser's encoder and "
                "decoder, a language model, and the voice's acoustic and decoder stages "
                f"({expected}); this pipeline's stages are {kinds}",
                file=source,
                line=line,
                key="stages",
            )
        assert all(
            isinstance(config.stages[i].backend, GraphBackendConfig) for i in (0, 1, 2, 4, 5)
        )
        self.config = config
        self.options = VoiceChatOptions.parse(options, file=source, line=line)
        self.turns = TurnSettings.parse(options, file=source, line=line)
        llm = config.stages[LLM_STAGE].backend
        assert isinstance(llm, LlmBackendConfig)
        adapter = config.adapter

        def part(first: int, last: int, names: tuple[str, ...]) -> PipelineConfig:
            kept = {k: v for k, v in options.items() if k in names}
            return dataclasses.replace(
                config,
                stages=config.stages[first:last],
                adapter=None if adapter is None else dataclasses.replace(adapter, options=kept),
            )

        recogniser_options = {k: v for k, v in options.items() if k in whisper.OPTION_NAMES}
        self.recogniser = TranscribeAdapter(
            part(RECOGNISER_STAGE, LLM_STAGE, whisper.OPTION_NAMES), recogniser_options
        )
        speech_options = {k: v for k, v in options.items() if k in SPEECH_OPTION_NAMES}
        self.speech = SpeechAdapter(
            part(SPEECH_STAGE, SPEECH_STAGE + 2, SPEECH_OPTION_NAMES), speech_options
        )
        # The model and the recogniser share the cores with the voice: one utterance at a time.
        self.speech.overlap = False
        self.sample_rate = self.speech.sample_rate
        #: The voice the replies are spoken with.
        self.voices = self.speech.voices

    def prepare(self, request_input: object) -> VoiceFrame:
        """A clip (``{"audio": samples, "sample_rate": Hz}``) -> one frame of 16 kHz audio."""
        if not isinstance(request_input, dict) or "audio" not in request_input:
            raise whisper.AudioInputError(
                f"pipeline {self.config.pipeline} takes a clip "
                "({'audio': samples, 'sample_rate': Hz}) or streaming input "
                "(submit(streaming=True), then feed 16 kHz samples or VoiceFrame values)",
                code="not_audio",
            )
        rate = request_input.get("sample_rate", SAMPLE_RATE)
        return VoiceFrame(whisper.to_mono_16k(request_input["audio"], rate))

    def prepare_chunk(self, chunk: object) -> _Fed:
        """A :class:`VoiceFrame`, or 16 kHz samples (a frame that reports no playback); a
        :class:`TextTurn`, :class:`SpokenTurn`, :class:`StopReply` or
        :class:`ConversationUpdate` as it is."""
        if isinstance(chunk, VoiceFrame | TextTurn | SpokenTurn | StopReply):
            return chunk
        if isinstance(chunk, ConversationUpdate):
            if chunk.turns is not None and not isinstance(chunk.turns, TurnSettings):
                raise UsageError(
                    f"a conversation update's turns is {type(chunk.turns).__name__}; accepted: "
                    "TurnSettings or None"
                )
            return chunk
        if isinstance(chunk, np.ndarray):
            return VoiceFrame(self.recogniser.prepare_chunk(chunk))
        raise UsageError(
            f"a voice chat is fed {type(chunk).__name__}; accepted: VoiceFrame values or 1-D "
            f"float32 samples at {SAMPLE_RATE} Hz, TextTurn, SpokenTurn, StopReply or "
            "ConversationUpdate"
        )

    async def run(self, ctx: RequestContext, prepared: VoiceFrame) -> None:
        async def one() -> AsyncIterator[_Fed]:
            yield prepared

        await _Conversation(self, ctx, played=False).run(one())

    async def run_streaming(self, ctx: RequestContext, chunks: InputStream) -> None:
        await _Conversation(self, ctx, played=True).run(chunks)


class _Conversation:
    """One request's conversation (the request's loop only)."""

    def __init__(self, program: VoiceChatProgram, ctx: RequestContext, *, played: bool) -> None:
        self.program = program
        self.options = program.options
        self.ctx = ctx
        #: Whether the caller reports playback; otherwise every reply counts as heard.
        self.played = played
        self.vad = VadStream()
        self.detector = TurnDetector(program.turns)
        self.pre_roll = round(program.turns.pre_roll_s * SAMPLE_RATE)
        self.parts: list[np.ndarray] = []
        self.base = 0
        self.fed = 0
        self.turn = 0
        self.turns: list[VoiceTurn] = []
        #: The reply being worked on or played (committed), and the speculative one.
        self.reply: _Reply | None = None
        self.ahead: _Reply | None = None
        #: The latest playback report: (turn, samples played).
        self.report: tuple[int | None, int] = (None, 0)
        self.barge_ins = 0
        self.resumes = 0
        self.interruptions = 0
        self.discarded = 0
        self.last_stage = ctx.stage_name(ctx.stage_count - 1)

    # ----------------------------------------------------------------- input

    async def run(self, frames: AsyncIterator[_Fed]) -> None:
        ctx = self.ctx

        async def call(inputs: dict[str, np.ndarray]) -> Mapping[str, np.ndarray]:
            return (await ctx.call(VAD_STAGE, inputs)).outputs

        try:
            async for frame in frames:
                ctx.check_cancelled()
                if not isinstance(frame, VoiceFrame):
                    await self._instruction(frame)
                    continue
                if frame.reply is not None:
                    self.report = (frame.reply, frame.played_samples)
                self._keep(frame.pcm)
                for chunk in self.vad.chunks(frame.pcm):
                    self.vad.accept(chunk, await call(self.vad.inputs(chunk)))
                    for event in self.detector.push(self.vad.probability, chunk.size):
                        await self._on(event)
                self._forget_idle()
            for event in self.detector.finish():
                await self._on(event)
            if self.reply is not None and self.reply.task is not None:
                await asyncio.gather(self.reply.task, return_exceptions=True)
                self._check(self.reply)
            self._close_turn(self.reply)
        finally:
            for reply in (self.ahead, self.reply):
                if reply is not None:
                    await self._stop(reply)
        await ctx.emit(
            {"event": REPLY_DONE, "turn": self.turn},
            stage=self.last_stage,
            finished=True,
            text="",
            metrics={
                "turns": [turn.to_json() for turn in self.turns],
                "barge_ins": self.barge_ins,
                "resumes": self.resumes,
                "interruptions": self.interruptions,
                "discarded": self.discarded,
                "audio_seconds": self.fed / SAMPLE_RATE,
                "chunks": self.vad.chunks_scored,
            },
        )

    async def _instruction(
        self, fed: TextTurn | SpokenTurn | StopReply | ConversationUpdate
    ) -> None:
        if isinstance(fed, ConversationUpdate):
            if fed.system_prompt is not None:
                self.options = dataclasses.replace(self.options, system_prompt=fed.system_prompt)
            if isinstance(fed.turns, TurnSettings):
                self.detector.retune(fed.turns)
                self.pre_roll = round(fed.turns.pre_roll_s * SAMPLE_RATE)
        elif isinstance(fed, StopReply):
            reply = self.reply
            if reply is not None and self._playing(reply):
                await self._interrupt(reply)
                self.reply = None
        else:
            await self._typed_turn(fed)

    async def _typed_turn(self, fed: TextTurn | SpokenTurn) -> None:
        """The caller's own turn: the reply in progress is made to its end, then this one is
        answered at once (committed: nothing is held)."""
        if self.ahead is not None:
            self.discarded += 1
            await self._stop(self.ahead)
            self.ahead = None
        reply = self.reply
        if reply is not None:
            if reply.task is not None:
                await asyncio.gather(reply.task, return_exceptions=True)
                self._check(reply)
            self._close_turn(reply)
        self.turn += 1
        now = self.detector.position
        turn = _Reply(turn=self.turn, start=now, end=now, committed=True)
        turn.committed_at = time.perf_counter()
        self.reply = turn
        if isinstance(fed, TextTurn):
            turn.task = asyncio.ensure_future(self._work(turn, None, text=fed.text.strip()))
        else:
            turn.task = asyncio.ensure_future(self._work(turn, fed.pcm))

    def _keep(self, pcm: np.ndarray) -> None:
        self.parts.append(pcm)
        self.fed += pcm.size

    def _forget_idle(self) -> None:
        """With no turn open, keep only the last seconds scored (a turn's pre-roll)."""
        if not self.detector.in_turn and not self.detector.burst_open:
            self._trim(self.detector.position - round(_IDLE_KEEP_S * SAMPLE_RATE))

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

    async def _event(self, name: str, turn: int, *, t: int | None = None, **values: Any) -> None:
        outputs: dict[str, Any] = {"event": name, "turn": turn, **values}
        if t is not None:
            outputs["t"] = t / SAMPLE_RATE
        await self.ctx.emit(outputs, stage=self.ctx.stage_name(VAD_STAGE))

    # ----------------------------------------------------------------- turns

    def _playing(self, reply: _Reply | None) -> bool:
        """Whether ``reply`` is still being made or heard."""
        if reply is None or not reply.committed:
            return False
        if not reply.done:
            return True
        if not self.played:
            return False
        turn, played = self.report
        return turn != reply.turn or played < reply.samples

    async def _on(self, event: object) -> None:
        reply = self.reply
        # Nothing is played for a clip: its replies are heard whole, one after the other.
        barging = self.played and self.program.options.barge_in and self._playing(reply)
        if isinstance(event, VoiceOnset):
            if barging and reply is not None and not reply.ducked:
                reply.ducked = True
                self.barge_ins += 1
                await self._event(BARGE_IN, reply.turn, t=event.sample)
        elif isinstance(event, BurstRejected):
            if reply is not None and reply.ducked:
                reply.ducked = False
                self.resumes += 1
                await self._event(RESUMED, reply.turn, t=event.sample)
        elif isinstance(event, SpeechConfirmed):
            if self.ahead is not None:
                # The user went on: the work on the speech so far is stale.
                self.discarded += 1
                await self._stop(self.ahead)
                self.ahead = None
            if event.new_turn:
                if barging and reply is not None:
                    await self._interrupt(reply)
                elif reply is not None:
                    if reply.task is not None:
                        # Without barge-in the reply is made to its end first.
                        await asyncio.gather(reply.task, return_exceptions=True)
                        self._check(reply)
                    self._close_turn(reply)
                self.reply = None
                self.turn += 1
                self._trim(event.turn_start - self.pre_roll)
                await self._event(SPEECH_STARTED, self.turn, t=event.turn_start)
        elif isinstance(event, PauseReached):
            self.ahead = self._start_reply(event.start, event.end, event.sample)
        elif isinstance(event, TurnEnded):
            await self._end_turn(event)

    def _start_reply(self, start: int, end: int, now: int) -> _Reply:
        """Work on the turn's speech ``start`` to ``end``, known at sample ``now``."""
        reply = _Reply(turn=self.turn, start=start, end=end)
        post_roll = end + round(_POST_ROLL_S * SAMPLE_RATE)
        until = min(now, post_roll)
        audio = self._audio(start - self.pre_roll, until)
        # Work started at the first silent chunk has less silence after the speech than the
        # recogniser is given at the turn's end: silence pads it to the same post-roll, so the
        # early transcript is the one the turn's end would get.
        audio = np.concatenate([audio, np.zeros(max(0, post_roll - until), np.float32)])
        reply.task = asyncio.ensure_future(self._work(reply, audio))
        return reply

    async def _end_turn(self, event: TurnEnded) -> None:
        ahead, self.ahead = self.ahead, None
        if ahead is None or ahead.end != event.end or ahead.stopped:
            if ahead is not None:
                self.discarded += 1
                await self._stop(ahead)
            ahead = self._start_reply(event.start, event.end, event.sample)
        ahead.end_of_turn_s = (event.sample - event.end) / SAMPLE_RATE
        await self._event(TURN_ENDED, ahead.turn, t=event.end, start=event.start / SAMPLE_RATE)
        self.reply = ahead
        async with ahead.lock:
            ahead.committed = True
            ahead.committed_at = time.perf_counter()
            held, ahead.held = ahead.held, []
            for outputs, text in held:
                await self._emit_now(ahead, outputs, text)
        if ahead.task is not None and ahead.task.done():
            self._check(ahead)
        self._forget_idle()

    @staticmethod
    def _check(reply: _Reply) -> None:
        """Raise what ended the reply's work, unless it was stopped on purpose."""
        task = reply.task
        if task is None or not task.done() or task.cancelled() or reply.stopped:
            return
        error = task.exception()
        if error is not None and not isinstance(error, _ReplyStopped):
            raise error

    async def _stop(self, reply: _Reply) -> None:
        """Throw the reply's work away: abort its text request, stop its voice."""
        reply.stopped = True
        if reply.stream is not None:
            await reply.stream.aclose()
        if reply.task is not None:
            # Whatever the stopped work raises (the aborted text request says it was
            # aborted) ends with it; the request's own cancel is checked by the input loop.
            await asyncio.gather(reply.task, return_exceptions=True)

    async def _interrupt(self, reply: _Reply) -> None:
        played = self._heard_samples(reply)
        await self._stop(reply)
        self.interruptions += 1
        heard = _heard_text(reply, played)
        self._record(reply, heard, interrupted=True)
        await self._event(
            INTERRUPTED,
            reply.turn,
            t=self.detector.position,
            played_samples=played,
            samples=reply.samples,
        )

    def _heard_samples(self, reply: _Reply) -> int:
        if not self.played:
            return reply.samples
        turn, played = self.report
        return min(played, reply.samples) if turn == reply.turn else 0

    def _close_turn(self, reply: _Reply | None) -> None:
        """The turn is over: its reply goes into the history as heard."""
        if reply is None or not reply.committed or reply.stopped or not reply.user:
            return
        self._record(reply, reply.text, interrupted=False)

    def _record(self, reply: _Reply, heard: str, *, interrupted: bool) -> None:
        if not reply.user:
            return
        latency = None
        if reply.committed_at is not None:
            base = reply.committed_at

            def after(at: float | None) -> float:
                # Work done ahead of the turn's end was ready before it: earlier than the
                # end of turn, never before the speech ended.
                return max(0.0, reply.end_of_turn_s + (0.0 if at is None else at - base))

            latency = TurnLatency(
                end_of_turn=reply.end_of_turn_s,
                transcription=after(reply.transcribed_at),
                first_clause=after(reply.first_clause_at),
                first_audio=after(reply.first_audio_at),
            )
        self.turns.append(
            VoiceTurn(
                index=reply.turn,
                user=reply.user,
                reply=reply.text,
                heard=heard,
                interrupted=interrupted,
                latency=latency,
            )
        )

    def _messages(self, user: str) -> list[ChatMessage]:
        return prompt_messages(self.turns, self.options, user)

    # ----------------------------------------------------------------- one reply

    async def _out(self, reply: _Reply, outputs: dict[str, Any], text: str | None = None) -> None:
        """Emit the reply's output, or hold it until the turn's end commits the reply."""
        if reply.stopped:
            raise _ReplyStopped
        async with reply.lock:
            if reply.stopped:
                raise _ReplyStopped
            if not reply.committed:
                reply.held.append((outputs, text))
                return
            await self._emit_now(reply, outputs, text)

    async def _emit_now(self, reply: _Reply, outputs: dict[str, Any], text: str | None) -> None:
        now = time.perf_counter()
        event = outputs.get("event")
        if event == REPLY_AUDIO:
            reply.first_audio_at = reply.first_audio_at or now
        stage = self.ctx.stage_name(
            SPEECH_STAGE + 1
            if event == REPLY_AUDIO
            else LLM_STAGE
            if event in (REPLY_TEXT, REPLY_DONE)
            else RECOGNISER_STAGE + 1
        )
        await self.ctx.emit(outputs, stage=stage, text=text)

    async def _work(self, reply: _Reply, audio: np.ndarray | None, *, text: str = "") -> None:
        """Transcribe the turn's speech (or take the typed ``text``), then generate and speak
        the reply."""
        if audio is None:
            reply.user = text
        else:
            reply.user = (await self._transcribe(reply, audio)).strip()
        reply.transcribed_at = time.perf_counter()
        if reply.stopped:
            raise _ReplyStopped
        if not reply.committed:
            await self.ctx.emit(
                {"event": TRANSCRIPT_PARTIAL, "turn": reply.turn},
                stage=self.ctx.stage_name(RECOGNISER_STAGE + 1),
                text=reply.user,
            )
        await self._out(reply, {"event": TRANSCRIPT, "turn": reply.turn}, reply.user)
        if reply.user:
            await self._reply(reply)
        reply.generating = False
        reply.done = True
        await self._out(
            reply,
            {
                "event": REPLY_DONE,
                "turn": reply.turn,
                "samples": reply.samples,
                "tokens": reply.tokens,
                "prompt_tokens": reply.prompt_tokens,
            },
            reply.text,
        )

    async def _transcribe(self, reply: _Reply, audio: np.ndarray) -> str:
        recogniser = self.program.recogniser
        if audio.size == 0:
            return ""
        texts: list[str] = []

        async def emitted(output: Emitted) -> None:
            if reply.stopped:
                raise _ReplyStopped
            if not output.finished and output.text:
                texts.append(output.text)

        prepared = recogniser.prepare({"audio": audio, "sample_rate": SAMPLE_RATE})
        await recogniser.run(self.ctx.narrowed(RECOGNISER_STAGE, emitted), prepared)
        return "".join(texts)

    async def _reply(self, reply: _Reply) -> None:
        program = self.program
        options = program.options
        ctx = self.ctx
        pieces: asyncio.Queue[str | None] = asyncio.Queue()
        speaker = asyncio.ensure_future(self._speak(reply, pieces))
        chunker = SentenceChunker(
            options.min_sentence_chars,
            options.max_sentence_chars,
            clause_chars=options.clause_chars,
            first_words=options.first_words,
        )
        prompt = ctx.chat_prompt(LLM_STAGE, self._messages(reply.user))
        try:
            async with ctx.generate(LLM_STAGE, prompt) as stream:
                reply.stream = stream
                async for text in stream:
                    if reply.stopped:
                        raise _ReplyStopped
                    reply.tokens = stream.tokens
                    reply.prompt_tokens = stream.prompt_tokens or 0
                    reply.text += text
                    await self._out(reply, {"event": REPLY_TEXT, "turn": reply.turn}, text)
                    for piece in chunker.feed(text):
                        reply.first_clause_at = reply.first_clause_at or time.perf_counter()
                        pieces.put_nowait(piece)
                    if speaker.done():
                        break
                reply.tokens = stream.tokens
                reply.prompt_tokens = stream.prompt_tokens or 0
            if speaker.done():
                await speaker
            for piece in chunker.finish():
                reply.first_clause_at = reply.first_clause_at or time.perf_counter()
                pieces.put_nowait(piece)
            pieces.put_nowait(None)
            await speaker
        finally:
            reply.stream = None
            if not speaker.done():
                pieces.put_nowait(None)
                if not reply.stopped:
                    speaker.cancel()
            # Its outcome is the reply's (raised above) or moot once the reply stopped.
            await asyncio.gather(speaker, return_exceptions=True)

    async def _speak(self, reply: _Reply, pieces: asyncio.Queue[str | None]) -> None:
        """Speak each piece in turn on the voice's stages, as it arrives."""
        program = self.program
        speech = program.speech
        current: list[_Piece] = []

        async def forward(emitted: Emitted) -> None:
            if reply.stopped:
                raise _ReplyStopped
            if emitted.finished:
                return
            chunk = AudioChunk.from_outputs(emitted.outputs, source=f"{emitted.stage}'s output")
            if chunk is None:
                raise ModelError(f"{emitted.stage} emitted an output without 'pcm'")
            if not chunk.pcm.size:
                return
            piece = current[0]
            piece.end += chunk.pcm.size
            reply.samples += chunk.pcm.size
            await self._out(reply, {"event": REPLY_AUDIO, "turn": reply.turn, **chunk.to_outputs()})

        voice = self.ctx.narrowed(SPEECH_STAGE, forward)
        loop = asyncio.get_running_loop()
        while (text := await pieces.get()) is not None:
            if reply.stopped:
                raise _ReplyStopped
            try:
                plan: SpeechPlan = await loop.run_in_executor(None, speech.prepare, text)
            except SpeechInputError:
                continue
            piece = _Piece(text, reply.samples, reply.samples)
            reply.pieces.append(piece)
            current[:] = [piece]
            await speech.run(voice, plan)


def prompt_messages(
    turns: Sequence[VoiceTurn], options: VoiceChatOptions, user: str
) -> list[ChatMessage]:
    """The model's messages for the user's next turn ``user``: the system prompt, then the
    last ``options.max_history_turns`` exchanges of ``turns``."""
    messages = [ChatMessage("system", options.system_prompt)] if options.system_prompt else []
    recent = turns[-options.max_history_turns :] if options.max_history_turns else []
    for index, turn in enumerate(recent):
        # The model sees what the user heard of its reply; an interrupted reply is marked in
        # the turn (VoiceTurn.interrupted), not in the text, which a small model would take as
        # a pattern to end its next replies with. Likewise the fragments of earlier
        # interrupted replies: a run of them teaches a small model to answer in one or two
        # words, so only the last exchange keeps its fragment (what the user just cut short).
        # Nothing heard: the user's turn stands alone.
        heard = turn.heard.strip()
        if turn.interrupted and index < len(recent) - 1:
            heard = ""
        messages.append(ChatMessage("user", turn.user))
        if heard:
            messages.append(ChatMessage("assistant", heard))
    messages.append(ChatMessage("user", user))
    return messages


def _heard_text(reply: _Reply, played: int) -> str:
    """The words of ``reply`` its listener heard in ``played`` samples: whole pieces, and the
    share of the piece being played (by its audio's length)."""
    words: list[str] = []
    for piece in reply.pieces:
        if played >= piece.end:
            words.extend(piece.text.split())
            continue
        if played > piece.start and piece.end > piece.start:
            share = (played - piece.start) / (piece.end - piece.start)
            split = piece.text.split()
            words.extend(split[: int(len(split) * share)])
        break
    return " ".join(words)
