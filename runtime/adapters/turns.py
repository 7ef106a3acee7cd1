"""Turn-taking: per-chunk speech probabilities in, the moments a conversation acts on out.

:class:`TurnDetector` is pure (no I/O, no clock): it is fed Silero VAD's probability of each
32 ms chunk in order and returns frozen events, all timed in samples of the input stream:

:class:`VoiceOnset`
    A burst (chunks at or above ``threshold``) has been voiced for ``onset_s`` (by default
    two chunks: a lone voiced chunk, a click or a trace of the reply's echo, is not a
    burst yet); ``sample`` is where its first voiced chunk began. Nothing more is known: it
    may be a cough. A reply being spoken fades out here and holds.
:class:`BurstRejected`
    The burst fell silent (``burst_gap_s``) before its voiced span reached ``min_speech_s``:
    a cough, a click, a short "mm". A held reply resumes; a pause it fell into goes on as if
    it never happened.
:class:`SpeechConfirmed`
    The burst's voiced span reached ``min_speech_s``: the user speaks. Outside a turn this
    starts one (``turn_start`` is where its first voiced chunk began); inside a pause it
    continues the turn. During a reply it is a barge-in.
:class:`PauseReached`
    ``speculate_s`` of silence after confirmed speech: the speech so far (``end`` is where
    the silence began) is worth transcribing now, so that the reply is ready when the turn
    ends. More speech afterwards makes that work stale (a later ``SpeechConfirmed``).
:class:`TurnEnded`
    ``end_of_turn_s`` of silence after confirmed speech, with no burst pending: the turn is
    over. Its audio runs from ``start`` to ``end`` (where the silence began).

A chunk is silent under the release threshold (``neg_threshold``, by default ``threshold``
less 0.15, as Silero's own iterator does); between the two it changes nothing. The silence
that ends a turn is counted from the end of the last voiced chunk of confirmed speech, and a
burst still undecided holds the decision: a turn never ends while it might go on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from runtime.adapters.speech_options import (
    PROBABILITIES,
    check_settings,
    read_options,
    release_threshold,
)
from runtime.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "TURN_OPTION_NAMES",
    "BurstRejected",
    "PauseReached",
    "SpeechConfirmed",
    "TurnDetector",
    "TurnEnded",
    "TurnEvent",
    "TurnOptionsError",
    "TurnSettings",
    "VoiceOnset",
]

#: The options that are durations, in seconds.
_DURATIONS: Final = (
    "onset_s",
    "min_speech_s",
    "burst_gap_s",
    "speculate_s",
    "end_of_turn_s",
    "pre_roll_s",
)
TURN_OPTION_NAMES: Final = (*PROBABILITIES, *_DURATIONS)
#: Longest duration option accepted, in seconds.
MAX_DURATION_S: Final = 10.0


class TurnOptionsError(ConfigError):
    """A turn-taking option is not usable."""


@dataclass(frozen=True, slots=True)
class TurnSettings:
    """When the user speaks, pauses, and has finished (see the module)."""

    threshold: float = 0.5
    neg_threshold: float | None = None
    #: Voiced time a burst needs before it is reported (:class:`VoiceOnset`, where a reply
    #: being spoken fades out): a single voiced chunk is not enough. A burst confirmed as
    #: speech sooner (``min_speech_s`` shorter) is reported as it is confirmed.
    onset_s: float = 0.06
    #: Voiced span a burst needs to count as speech: shorter sounds never start a turn or
    #: interrupt a reply.
    min_speech_s: float = 0.25
    #: Silence that ends a burst not yet confirmed (gaps shorter than this stay inside it).
    burst_gap_s: float = 0.2
    #: Silence after which the speech so far is transcribed ahead of the turn's end (the
    #: first silent chunk: work for a pause the user speaks on after is thrown away).
    speculate_s: float = 0.03
    #: Silence that ends a turn. Pauses inside a sentence (250 ms) stay well under it.
    end_of_turn_s: float = 0.45
    #: Audio kept before a turn's first voiced chunk and transcribed with it.
    pre_roll_s: float = 0.3

    def __post_init__(self) -> None:
        check_settings(self, _DURATIONS, MAX_DURATION_S)
        if self.speculate_s > self.end_of_turn_s:
            raise ValueError(
                f"speculate_s ({self.speculate_s}) must be at most end_of_turn_s "
                f"({self.end_of_turn_s})"
            )

    @property
    def release(self) -> float:
        """The probability under which a chunk counts as silence."""
        return release_threshold(self.threshold, self.neg_threshold)

    @classmethod
    def parse(
        cls,
        options: Mapping[str, Any],
        *,
        file: str | None = None,
        line: int | None = None,
        prefix: str = "adapter.options.",
    ) -> TurnSettings:
        """Check the options named in :data:`TURN_OPTION_NAMES` (others are ignored); every
        failure names the option and what is accepted."""

        def fail(name: str, message: str) -> TurnOptionsError:
            return TurnOptionsError(message, file=file, line=line, key=f"{prefix}{name}")

        values = read_options(options, _DURATIONS, MAX_DURATION_S, fail)
        try:
            return cls(**values)
        except ValueError as exc:
            # The one-option checks passed: what is left is how two options relate.
            name = str(exc).split()[0]
            raise fail(name if name in TURN_OPTION_NAMES else "threshold", str(exc)) from None


@dataclass(frozen=True, slots=True)
class VoiceOnset:
    """A burst was voiced for ``onset_s``; its first voiced chunk begins at ``sample``."""

    sample: int


@dataclass(frozen=True, slots=True)
class BurstRejected:
    """The burst that began at ``onset`` ended before it was long enough to be speech."""

    onset: int
    sample: int


@dataclass(frozen=True, slots=True)
class SpeechConfirmed:
    """The burst that began at ``onset`` is speech; ``turn_start`` is where the turn began
    (``onset`` when this starts a turn); ``new_turn`` says whether it does."""

    onset: int
    sample: int
    turn_start: int
    new_turn: bool


@dataclass(frozen=True, slots=True)
class PauseReached:
    """Silence since ``end`` reached the speculation point; the turn's speech so far is
    ``start`` to ``end``."""

    start: int
    end: int
    sample: int


@dataclass(frozen=True, slots=True)
class TurnEnded:
    """The turn's speech ran from ``start`` to ``end``; the end was known at ``sample``."""

    start: int
    end: int
    sample: int


TurnEvent = VoiceOnset | BurstRejected | SpeechConfirmed | PauseReached | TurnEnded


class TurnDetector:
    """Chunk probabilities in order -> :data:`TurnEvent` values (see the module)."""

    def __init__(self, settings: TurnSettings | None = None, sample_rate: int = 16000) -> None:
        self.sample_rate = sample_rate
        self.retune(settings or TurnSettings())
        self._position = 0
        #: The open burst: where its first voiced chunk began, and its last voiced chunk's end.
        self._burst: int | None = None
        self._burst_end = 0
        #: Voiced samples in the open burst, and whether its onset was reported.
        self._burst_voiced = 0
        self._announced = False
        #: The turn: where it began, and where its confirmed speech last ended.
        self._turn: int | None = None
        self._speech_end = 0
        #: Confirmed speech is going on (no gap of burst_gap_s since its last voiced chunk).
        self._speaking = False
        #: Voiced by the hysteresis (at or over the threshold, until under the release).
        self._voiced = False
        self._speculated = False

    def retune(self, settings: TurnSettings) -> None:
        """Decide with ``settings`` from the next chunk on (what was heard stays as it is)."""
        self.settings = s = settings
        rate = self.sample_rate
        self._min_speech = round(s.min_speech_s * rate)
        self._burst_gap = round(s.burst_gap_s * rate)
        self._speculate = round(s.speculate_s * rate)
        self._onset = round(s.onset_s * rate)
        self._end_of_turn = round(s.end_of_turn_s * rate)

    @property
    def position(self) -> int:
        """Samples pushed so far."""
        return self._position

    @property
    def in_turn(self) -> bool:
        """True from a turn's first confirmed speech until it ends."""
        return self._turn is not None

    @property
    def burst_open(self) -> bool:
        """True while a burst is neither confirmed nor rejected."""
        return self._burst is not None

    def push(self, probability: float, samples: int) -> list[TurnEvent]:
        """One chunk's speech probability and its length; the events it completes."""
        begin = self._position
        end = begin + samples
        self._position = end
        s = self.settings
        events: list[TurnEvent] = []
        if probability >= s.threshold:
            self._voiced = True
        elif probability < s.release:
            self._voiced = False
        if self._voiced:
            if self._speaking:
                # Confirmed speech goes on (gaps under burst_gap_s stay inside it); work
                # started on a pause it ended is stale.
                self._speech_end = end
                if self._speculated:
                    self._speculated = False
                    assert self._turn is not None
                    events.append(SpeechConfirmed(begin, end, self._turn, new_turn=False))
            else:
                if self._burst is None:
                    self._burst = begin
                    self._burst_voiced = 0
                    self._announced = False
                self._burst_voiced += samples
                if not self._announced and (
                    self._burst_voiced >= self._onset or end - self._burst >= self._min_speech
                ):
                    self._announced = True
                    events.append(VoiceOnset(self._burst))
                self._burst_end = end
                if end - self._burst >= self._min_speech:
                    events.append(self._confirm(end))
        else:
            if self._speaking and end - self._speech_end >= self._burst_gap:
                self._speaking = False
            if self._burst is not None and end - self._burst_end >= self._burst_gap:
                events.append(BurstRejected(self._burst, end))
                self._burst = None
        if self._turn is not None and self._burst is None and not self._voiced:
            silence = end - self._speech_end
            if not self._speculated and silence >= self._speculate:
                self._speculated = True
                events.append(PauseReached(self._turn, self._speech_end, end))
            if silence >= self._end_of_turn:
                events.append(TurnEnded(self._turn, self._speech_end, end))
                self._turn = None
                self._speaking = False
        return events

    def _confirm(self, end: int) -> SpeechConfirmed:
        onset = self._burst
        assert onset is not None
        self._burst = None
        self._speaking = True
        new = self._turn is None
        turn = onset if self._turn is None else self._turn
        self._turn = turn
        self._speculated = False
        self._speech_end = end
        return SpeechConfirmed(onset, end, turn, new)

    def finish(self) -> list[TurnEvent]:
        """End of the stream: a turn still open ends where its speech ended."""
        events: list[TurnEvent] = []
        if self._burst is not None:
            events.append(BurstRejected(self._burst, self._position))
            self._burst = None
        if self._turn is not None:
            events.append(TurnEnded(self._turn, self._speech_end, self._position))
            self._turn = None
        self._speaking = False
        return events
