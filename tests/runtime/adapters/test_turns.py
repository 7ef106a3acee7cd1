"""Turn-taking: the detector's rules on probabilities, and on the voice joe's speech scored by
Silero VAD (pauses of 250 ms inside sentences never end a turn; a cough never starts one)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort
import pytest
import soxr
from piper import SynthesisConfig

from runtime.adapters.turns import (
    BurstRejected,
    PauseReached,
    SpeechConfirmed,
    TurnDetector,
    TurnEnded,
    TurnOptionsError,
    TurnSettings,
    VoiceOnset,
)
from runtime.adapters.vad import VadStream
from runtime.adapters.vad_bundle import find_vad_model
from runtime.audio.levels import sound_span

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from piper import PiperVoice

    from runtime.adapters.turns import TurnEvent

RATE = 16000
CHUNK = 512
#: Pairs of phrases joined by a 250 ms pause: one sentence each.
PAUSED_SENTENCES = (
    ("I would like a cup of coffee,", "and a slice of lemon cake."),
    ("When you get to the station,", "turn left at the bakery."),
    ("Tell me about the weather", "in Paris tomorrow morning."),
    ("My favourite colour is blue,", "but I also like green."),
    ("Can you remind me", "to call my sister at five?"),
    ("What is the capital", "of France?"),
)


def push_all(detector: TurnDetector, values: Sequence[float]) -> list[TurnEvent]:
    return [event for value in values for event in detector.push(value, CHUNK)]


def chunks(seconds: float) -> int:
    return round(seconds * RATE / CHUNK)


def test_speech_pause_and_the_turns_end_on_probabilities() -> None:
    settings = TurnSettings(min_speech_s=0.1, speculate_s=0.1, end_of_turn_s=0.4)
    detector = TurnDetector(settings)
    events = push_all(detector, [0.0] * 5 + [0.9] * 10 + [0.1] * 20)
    kinds = [type(event) for event in events]
    assert kinds == [VoiceOnset, SpeechConfirmed, PauseReached, TurnEnded]
    onset, confirmed, pause, ended = events
    assert isinstance(onset, VoiceOnset)
    assert onset.sample == 5 * CHUNK
    assert isinstance(confirmed, SpeechConfirmed)
    # Confirmed once the voiced span reaches 0.1 s (4 chunks of 32 ms).
    assert confirmed.new_turn
    assert confirmed.turn_start == 5 * CHUNK
    assert confirmed.sample == 9 * CHUNK
    assert isinstance(pause, PauseReached)
    assert pause.end == 15 * CHUNK
    assert pause.sample - pause.end >= 0.1 * RATE
    assert isinstance(ended, TurnEnded)
    assert (ended.start, ended.end) == (5 * CHUNK, 15 * CHUNK)
    assert 0.4 * RATE <= ended.sample - ended.end < 0.4 * RATE + CHUNK
    assert not detector.in_turn


def test_a_short_burst_is_rejected_and_starts_nothing() -> None:
    detector = TurnDetector(TurnSettings(min_speech_s=0.25, burst_gap_s=0.2))
    events = push_all(detector, [0.9] * 4 + [0.1] * 10)
    assert [type(event) for event in events] == [VoiceOnset, BurstRejected]
    assert not detector.in_turn


def test_a_burst_in_a_pause_holds_the_turns_end_until_it_is_decided() -> None:
    settings = TurnSettings(min_speech_s=0.25, burst_gap_s=0.2, speculate_s=0.1, end_of_turn_s=0.4)
    detector = TurnDetector(settings)
    push_all(detector, [0.9] * 12)
    # 0.32 s of silence, then a voiced burst of 0.16 s that spans the turn's end.
    events = push_all(detector, [0.1] * 10 + [0.9] * 5)
    assert [type(event) for event in events] == [PauseReached, VoiceOnset]
    assert detector.in_turn
    # The burst is rejected, then the pause (counted from the speech) has ended the turn.
    events = push_all(detector, [0.1] * 7)
    assert [type(event) for event in events] == [BurstRejected, TurnEnded]
    ended = events[-1]
    assert isinstance(ended, TurnEnded)
    assert ended.end == 12 * CHUNK


@pytest.mark.parametrize("gap", [6, 8], ids=["inside-the-speech", "after-it"])
def test_speech_resuming_in_a_pause_continues_the_turn_and_speculates_again(gap: int) -> None:
    settings = TurnSettings(min_speech_s=0.1, burst_gap_s=0.2, speculate_s=0.1, end_of_turn_s=0.4)
    detector = TurnDetector(settings)
    push_all(detector, [0.9] * 10)
    events = push_all(detector, [0.1] * gap + [0.9] * 6 + [0.1] * 15)
    kinds = [type(event) for event in events]
    # A gap under burst_gap_s is inside the speech; a longer one makes a new burst (an onset).
    expected_onset = [VoiceOnset] if gap * CHUNK >= 0.2 * RATE else []
    assert kinds == [PauseReached, *expected_onset, SpeechConfirmed, PauseReached, TurnEnded]
    again = events[1 + len(expected_onset)]
    assert isinstance(again, SpeechConfirmed)
    assert not again.new_turn
    assert again.turn_start == 0
    ended = events[-1]
    assert isinstance(ended, TurnEnded)
    assert (ended.start, ended.end) == (0, (16 + gap) * CHUNK)


def test_the_release_threshold_keeps_a_wavering_chunk_voiced() -> None:
    detector = TurnDetector(TurnSettings(min_speech_s=0.1, end_of_turn_s=0.2))
    # 0.4 is under the threshold (0.5) but over the release (0.35): still voiced.
    events = push_all(detector, [0.9] * 4 + [0.4] * 10 + [0.1] * 8)
    ended = [event for event in events if isinstance(event, TurnEnded)]
    assert len(ended) == 1
    assert ended[0].end == 14 * CHUNK


def test_finish_ends_an_open_turn_and_rejects_an_open_burst() -> None:
    detector = TurnDetector(TurnSettings(min_speech_s=0.1))
    push_all(detector, [0.9] * 10)
    assert [type(event) for event in detector.finish()] == [TurnEnded]
    detector = TurnDetector(TurnSettings(min_speech_s=1.0))
    push_all(detector, [0.9] * 3)
    assert [type(event) for event in detector.finish()] == [BurstRejected]


def test_a_lone_voiced_chunk_is_no_onset_two_are() -> None:
    # A click or a trace of echo: one chunk over the threshold, then silence.
    detector = TurnDetector(TurnSettings(min_speech_s=0.25, burst_gap_s=0.2))
    events = push_all(detector, [0.1] * 3 + [0.9] + [0.1] * 10)
    assert [type(event) for event in events] == [BurstRejected]
    # Two chunks (64 ms, over onset_s 0.06): reported at the second, timed from the first.
    detector = TurnDetector(TurnSettings(min_speech_s=0.25, burst_gap_s=0.2))
    events = push_all(detector, [0.1] * 3 + [0.9])
    assert events == []
    events = detector.push(0.9, CHUNK)
    assert events == [VoiceOnset(3 * CHUNK)]
    # onset_s 0: the first voiced chunk is reported; a longer onset_s than min_speech_s is
    # reported with the confirmation.
    detector = TurnDetector(TurnSettings(onset_s=0.0))
    assert detector.push(0.9, CHUNK) == [VoiceOnset(0)]
    detector = TurnDetector(TurnSettings(onset_s=0.5, min_speech_s=0.1))
    kinds = [type(event) for event in push_all(detector, [0.9] * 4)]
    assert kinds == [VoiceOnset, SpeechConfirmed]


@pytest.mark.parametrize(
    ("options", "key", "accepted"),
    [
        ({"threshold": 1.5}, "threshold", "between 0 and 1"),
        ({"threshold": True}, "threshold", "between 0 and 1"),
        ({"end_of_turn_s": -1}, "end_of_turn_s", "seconds from 0 to 10"),
        ({"min_speech_s": "long"}, "min_speech_s", "seconds from 0 to 10"),
        ({"onset_s": 11}, "onset_s", "seconds from 0 to 10"),
        ({"threshold": 0.4, "neg_threshold": 0.6}, "neg_threshold", "at most threshold"),
        ({"speculate_s": 0.6, "end_of_turn_s": 0.5}, "speculate_s", "at most end_of_turn_s"),
    ],
)
def test_bad_options_name_the_key_and_what_is_accepted(
    options: dict[str, Any], key: str, accepted: str
) -> None:
    with pytest.raises(TurnOptionsError, match=accepted) as caught:
        TurnSettings.parse(options, file="voice.yaml", line=3)
    assert caught.value.key == f"adapter.options.{key}"
    assert "voice.yaml" in str(caught.value)


# -- on speech --------------------------------------------------------------------------------


def speech(voice: PiperVoice, text: str) -> np.ndarray:
    """The voice joe saying ``text`` at 16 kHz, trimmed to its sound (-40 dB frames)."""
    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    audio = np.concatenate([chunk.audio_float_array for chunk in voice.synthesize(text, config)])
    resampled = soxr.resample(audio, 22050, RATE).astype(np.float32)
    start, end = sound_span(resampled, RATE // 100)
    return resampled[start:end]


@pytest.fixture(scope="module")
def vad_session() -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(
        str(find_vad_model().path), options, providers=["CPUExecutionProvider"]
    )


def turns_of(session: ort.InferenceSession, clip: np.ndarray, settings: TurnSettings) -> list[Any]:
    def call(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        probability, state = session.run(["output", "stateN"], dict(inputs))
        return {"output": probability, "stateN": state}

    stream = VadStream()
    detector = TurnDetector(settings)
    events: list[Any] = []
    for chunk in stream.chunks(clip):
        stream.accept(chunk, call(stream.inputs(chunk)))
        events.extend(detector.push(stream.probability, chunk.size))
    events.extend(detector.finish())
    return events


@pytest.mark.model
def test_pauses_of_250_ms_inside_sentences_never_end_the_turn(
    vad_session: ort.InferenceSession, piper_voice: PiperVoice
) -> None:
    settings = TurnSettings()
    pause = np.zeros(round(0.25 * RATE), np.float32)
    lead = np.zeros(RATE, np.float32)
    for first, second in PAUSED_SENTENCES:
        before, after = speech(piper_voice, first), speech(piper_voice, second)
        clip = np.concatenate([lead, before, pause, after, lead])
        ended = [e for e in turns_of(vad_session, clip, settings) if isinstance(e, TurnEnded)]
        assert len(ended) == 1, (first, second, ended)
        last_voiced = lead.size + before.size + pause.size + after.size
        # The turn ends where the voice does (the model's release lags by a few chunks)...
        assert abs(ended[0].end - last_voiced) <= 0.15 * RATE
        # ... and is known end_of_turn_s later.
        assert ended[0].sample - ended[0].end == pytest.approx(
            settings.end_of_turn_s * RATE, abs=CHUNK
        )
    # The same phrases with a pause longer than end_of_turn_s are two turns (the test can fail).
    long_pause = np.zeros(round(0.9 * RATE), np.float32)
    first, second = PAUSED_SENTENCES[0]
    clip = np.concatenate(
        [lead, speech(piper_voice, first), long_pause, speech(piper_voice, second), lead]
    )
    ended = [e for e in turns_of(vad_session, clip, settings) if isinstance(e, TurnEnded)]
    assert len(ended) == 2


@pytest.mark.model
def test_a_cough_length_burst_of_speech_never_starts_a_turn(
    vad_session: ort.InferenceSession, piper_voice: PiperVoice
) -> None:
    voiced = speech(piper_voice, "Mm.")
    words = speech(piper_voice, "The quick brown fox jumps over the lazy dog.")
    short = words[RATE // 10 : RATE // 10 + round(0.15 * RATE)]
    lead = np.zeros(RATE, np.float32)
    for burst in (short, voiced[: round(0.2 * RATE)]):
        events = turns_of(vad_session, np.concatenate([lead, burst, lead]), TurnSettings())
        assert VoiceOnset in {type(e) for e in events}, "the burst must sound like speech"
        assert not any(isinstance(e, SpeechConfirmed | TurnEnded) for e in events)
