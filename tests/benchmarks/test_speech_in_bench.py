"""The speech-in bench's own arithmetic: the words compared, the word error rate, long clips."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.base import BenchOptions
from benchmarks.speech_in import BENCHMARK, RATE, long_clip, wer, word_errors, words
from benchmarks.suite import all_benchmarks, run_suite


def test_words_drop_case_and_punctuation_but_keep_numbers_whole() -> None:
    assert words("On March 3rd, 2021, Dr. Alvarez paid $42.50 at 6:45!") == [
        "on",
        "march",
        "3rd",
        "2021",
        "dr",
        "alvarez",
        "paid",
        "42.50",
        "at",
        "6:45",
    ]
    assert words("Don't stop -- well-known.") == ["don't", "stop", "well", "known"]


def test_word_errors_count_substitutions_insertions_and_deletions() -> None:
    assert word_errors(["a", "b", "c"], ["a", "b", "c"]) == 0
    assert word_errors(["a", "b", "c"], ["a", "x", "c"]) == 1
    assert word_errors(["a", "b", "c"], ["a", "c"]) == 1
    assert word_errors(["a", "b"], ["a", "b", "c", "d"]) == 2
    assert word_errors([], ["a"]) == 1
    assert wer(["The cat sat.", "Yes."], ["the cat sat", "no"]) == pytest.approx(1 / 4)


def test_a_long_clip_repeats_the_clips_with_pauses_to_the_length() -> None:
    clips = [np.ones(RATE, np.float32), np.full(RATE // 4, 2.0, np.float32)]
    clip = long_clip(clips, 5.0)
    assert clip.size == 5 * RATE
    assert clip[RATE] == 0.0  # the pause after the first clip
    assert clip[RATE + RATE // 2] == 2.0
    assert set(np.unique(clip)) == {0.0, 1.0, 2.0}


def test_the_suite_registers_it_and_quick_mode_skips_it_with_the_reason(tmp_path: object) -> None:
    assert BENCHMARK in all_benchmarks()
    assert BENCHMARK.quick_skip
    results = run_suite(quick=True, only=frozenset({"speech_in"}))
    for spec in BENCHMARK.specs:
        figure = results.figure(spec.key)
        assert figure.measurement is None
        assert figure.reason == BENCHMARK.quick_skip
    assert isinstance(BenchOptions(quick=True, workdir=tmp_path).count(3, 1), int)  # type: ignore[arg-type]
