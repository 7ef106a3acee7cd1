"""The speech front end: normalization, sentence splitting, Piper-identical phoneme ids, and
every kind of bad input getting a clear result."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import TYPE_CHECKING

import pytest
from piper.phoneme_ids import phonemes_to_ids

from runtime.adapters.tts_text import (
    DEFAULT_MAX_IDS,
    MAX_TEXT_CHARS,
    SKIP_CHARACTER,
    SKIP_CONTROL,
    SKIP_EMOJI,
    SKIP_PHONEME,
    SKIP_SCRIPT,
    Phonemizer,
    SkippedText,
    SpeechInputError,
    VoiceConfig,
    VoiceConfigError,
    normalize_for_speech,
    normalize_text,
    prepare_speech,
    split_sentences,
)
from runtime.errors import UsageError

if TYPE_CHECKING:
    from pathlib import Path

    from piper import PiperVoice

#: Texts whose sentences and ids must equal Piper's own (its API on the raw text).
PIPER_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Mr. Smith went home. He slept.",
    'He said "Stop!" and left.',
    'He said "Stop!" Then he left.',
    "Really? yes.",
    "In 1990. 2000 was later.",
    "The U.S.A. is big. The end",
    "one\ntwo\n\nthree",
    "Dr. No lives on Elm St. in town. (Yes.) Right.",
    "It costs $5.50 today, e.g. this one; or that: the other \u2014 maybe.",
    "Hello world! How are you today?",
    "Wait... What? No.",
    "'Quoted.' Next sentence.",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9, 42% of 3.14 & more.",
)
#: A bound no healthy run comes near (20,000 characters take about 1 s on 2 shared cores).
BOUNDED_S = 20.0


# -- normalization -----------------------------------------------------------------------


def test_nfc_and_whitespace_collapse() -> None:
    assert normalize_text("  cafe\u0301 \t and\u00a0\u2003tea  \n") == "caf\u00e9 and tea"


def test_a_blank_line_is_a_paragraph_break() -> None:
    assert normalize_text("one\ntwo\n \n\nthree\u2029four") == "one two\nthree\nfour"


def test_control_characters_become_spaces_and_are_reported() -> None:
    result = normalize_for_speech("a\x00b\x07\x1bc d")
    assert result.text == "a b c d"
    assert result.skipped == (
        SkippedText("\x00", SKIP_CONTROL, "control characters are not spoken", 1),
        SkippedText("\x07\x1b", SKIP_CONTROL, "control characters are not spoken", 3),
    )


def test_invisible_format_characters_vanish_without_a_note() -> None:
    result = normalize_for_speech("zero\u200bwidth soft\u00adhyphen \u200eleft\ufeff")
    assert result.text == "zerowidth softhyphen left"
    assert result.skipped == ()


def test_emoji_are_skipped_with_their_offsets() -> None:
    result = normalize_for_speech(
        "Hi \U0001f44d\U0001f3fd there \u2764\ufe0f \U0001f468\u200d\U0001f469!"
    )
    assert result.text == "Hi there !"
    assert [(s.text, s.reason, s.offset) for s in result.skipped] == [
        ("\U0001f44d\U0001f3fd", SKIP_EMOJI, 3),
        ("\u2764\ufe0f \U0001f468\u200d\U0001f469", SKIP_EMOJI, 12),
    ]


def test_other_scripts_are_skipped_and_named() -> None:
    result = normalize_for_speech(
        "Hello \u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440, \u4f60\u597d world"
    )
    assert result.text == "Hello , world"
    assert [(s.text, s.reason) for s in result.skipped] == [
        ("\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440", SKIP_SCRIPT),
        ("\u4f60\u597d", SKIP_SCRIPT),
    ]
    assert "Cyrillic letters are not spoken" in result.skipped[0].detail
    assert "CJK letters are not spoken" in result.skipped[1].detail


def test_a_combining_mark_goes_with_its_letter() -> None:
    # Cyrillic "ж" with an acute (no precomposed form): the accent goes with the letter.
    result = normalize_for_speech("x \u0436\u0301 y a\u0301 \u0301z")
    assert result.text == "x y \u00e1 z"
    assert [s.text for s in result.skipped] == ["\u0436\u0301", "\u0301"]


def test_digits_of_other_scripts_become_ascii() -> None:
    assert normalize_text("\u0663 apples and \u096b pears") == "3 apples and 5 pears"


def test_unassigned_private_and_surrogate_code_points_are_skipped() -> None:
    result = normalize_for_speech("a\ue000b\udc80c\u0378d")
    assert result.text == "a b c d"
    assert [s.reason for s in result.skipped] == [SKIP_CHARACTER] * 3


def test_other_script_voices_speak_their_script() -> None:
    result = normalize_for_speech("\u043c\u0438\u0440 peace", scripts=("CYRILLIC",))
    assert result.text == "\u043c\u0438\u0440"
    assert result.skipped[0].text == "peace"


# -- sentence splitting ------------------------------------------------------------------


def test_sentences_end_where_espeak_ends_them() -> None:
    text = 'One. Two! three? "Four." Five... six. e.g. this. Mr. Seven\nEight'
    assert split_sentences(text, 1000) == [
        "One.",
        "Two!",
        "three?",
        '"Four."',
        "Five... six. e.g. this.",
        "Mr.",
        "Seven",
        "Eight",
    ]


def test_long_sentences_split_at_clauses_then_words_then_characters() -> None:
    text = "alpha beta, gamma delta; epsilon zeta eta theta iota kappa, " + "x" * 25 + "."
    pieces = split_sentences(text, 20)
    assert pieces == [
        "alpha beta,",
        "gamma delta;",
        "epsilon zeta eta",
        "theta iota kappa,",
        "x" * 13,
        "x" * 12 + ".",
    ]
    assert all(len(piece) <= 20 for piece in pieces)


def test_split_sentences_refuses_a_zero_limit() -> None:
    with pytest.raises(ValueError, match="max_length 0"):
        split_sentences("a", 0)


# -- phoneme ids -------------------------------------------------------------------------


@pytest.mark.parametrize("text", PIPER_TEXTS)
def test_phoneme_ids_equal_pipers(
    text: str, phonemizer: Phonemizer, piper_voice: PiperVoice
) -> None:
    expected = [tuple(piper_voice.phonemes_to_ids(s)) for s in piper_voice.phonemize(text)]
    assert phonemizer.ids(text) == expected
    plan = prepare_speech(text, phonemizer)
    assert [sentence.ids for sentence in plan.sentences] == expected
    assert [list(s.phonemes) for s in plan.sentences] == piper_voice.phonemize(text)


def test_ids_follow_the_voice_map_with_bos_pad_eos(phonemizer: Phonemizer) -> None:
    id_map = phonemizer.config.phoneme_id_map
    mapped = phonemizer.phoneme_ids(["h", "i"])
    assert mapped.ids == (
        *id_map["^"],
        *id_map["_"],
        *id_map["h"],
        *id_map["_"],
        *id_map["i"],
        *id_map["_"],
        *id_map["$"],
    )
    assert mapped.missing == ()


def test_phonemes_missing_from_the_map_are_reported(voice_config: VoiceConfig) -> None:
    id_map = {key: value for key, value in voice_config.phoneme_id_map.items() if key != "ə"}
    config = dataclasses.replace(voice_config, phoneme_id_map=id_map)
    phonemizer = Phonemizer(config)
    plan = prepare_speech("the banana", phonemizer)
    phonemes = list(plan.sentences[0].phonemes)
    assert "ə" in phonemes
    assert list(plan.sentences[0].ids) == phonemes_to_ids(
        phonemes, {k: list(v) for k, v in id_map.items()}
    )
    assert [s for s in plan.skipped if s.reason == SKIP_PHONEME] == [
        SkippedText(
            "ə", SKIP_PHONEME, "espeak-ng phoneme 'ə' is not in the voice's phoneme_id_map", None
        )
    ]


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "code", "words"),
    [
        ("", "empty", "empty"),
        (" \t\n\u00a0\u3000 ", "whitespace_only", "only whitespace"),
        ("\U0001f600\U0001f680 \u2764\ufe0f", "nothing_speakable", "skipped: emoji"),
        ("\u4f60\u597d\uff0c\u4e16\u754c", "nothing_speakable", "skipped: script"),
        ("\x00\x01\x02", "nothing_speakable", "skipped: control"),
        ("\u200b\u200d", "nothing_speakable", "nothing in the text"),
        (None, "not_text", "must be a string"),
        (b"bytes", "not_text", "got bytes"),
        ("a" * (MAX_TEXT_CHARS + 1), "too_long", f"at most {MAX_TEXT_CHARS}"),
    ],
    ids=["empty", "whitespace", "emoji", "cjk", "control", "invisible", "none", "bytes", "huge"],
)
def test_unspeakable_input_gets_a_clear_error(
    text: object, code: str, words: str, phonemizer: Phonemizer
) -> None:
    with pytest.raises(SpeechInputError) as caught:
        prepare_speech(text, phonemizer)
    assert caught.value.code == code
    assert words in str(caught.value)
    assert isinstance(caught.value, UsageError)


def test_mixed_input_speaks_what_it_can_and_reports_the_rest(phonemizer: Phonemizer) -> None:
    plan = prepare_speech("Hello \U0001f600 \u041c\u0438\u0440\x07 world.", phonemizer)
    assert plan.text == "Hello world."
    assert [sentence.text for sentence in plan.sentences] == ["Hello world."]
    assert [(s.reason, s.offset) for s in plan.skipped] == [
        (SKIP_EMOJI, 6),
        (SKIP_SCRIPT, 8),
        (SKIP_CONTROL, 11),
    ]
    json.dumps(plan.to_json())


@pytest.mark.parametrize("kind", ["prose", "no_punctuation", "digits", "one_word", "mixed_garbage"])
def test_twenty_thousand_characters_are_split_in_bounded_time(
    kind: str, phonemizer: Phonemizer
) -> None:
    words = "the quick brown fox jumps over seven lazy dogs while engineers measure".split()
    pieces = {
        "prose": " ".join(
            f"{w.capitalize()}." if i % 9 == 8 else w for i, w in enumerate(words * 400)
        ),
        "no_punctuation": " ".join(words * 400),
        "digits": "1234567890" * 2000,
        "one_word": "ab" * 10000,
        "mixed_garbage": "".join("a b,1.\U0001f600\u0416\n\x00"[i % 10] for i in range(20000)),
    }
    text = pieces[kind][:20000]
    assert len(text) == 20000
    started = time.perf_counter()
    plan = prepare_speech(text, phonemizer)
    elapsed = time.perf_counter() - started
    assert elapsed < BOUNDED_S
    assert len(plan.sentences) > 1
    assert max(len(sentence.ids) for sentence in plan.sentences) <= DEFAULT_MAX_IDS
    if kind in ("prose", "no_punctuation"):
        spoken = " ".join(sentence.text for sentence in plan.sentences)
        assert spoken.split() == plan.text.split()


def test_max_ids_sets_the_utterance_size(phonemizer: Phonemizer) -> None:
    text = "This sentence, which has several clauses, is split when the bucket is small."
    plan = prepare_speech(text, phonemizer, max_ids=40)
    assert len(plan.sentences) > 2
    assert all(len(sentence.ids) <= 40 for sentence in plan.sentences)
    with pytest.raises(ValueError, match="max_ids 4"):
        prepare_speech(text, phonemizer, max_ids=4)


# -- voice config ------------------------------------------------------------------------


def test_voice_config_reads_the_installed_voice(voice_config: VoiceConfig) -> None:
    assert voice_config.sample_rate == 22050
    assert voice_config.espeak_voice == "en-us"
    assert voice_config.scales == (0.667, 1.0, 0.8)
    assert voice_config.scripts == ("LATIN",)
    assert VoiceConfig.from_json(voice_config.to_json()) == voice_config


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (lambda doc: doc.update(phoneme_type="text"), "phoneme_type"),
        (lambda doc: doc.update(num_speakers=2), "num_speakers"),
        (lambda doc: doc["audio"].update(sample_rate=0), "audio.sample_rate"),
        (lambda doc: doc["espeak"].update(voice=""), "espeak.voice"),
        (lambda doc: doc["phoneme_id_map"].pop("^"), "phoneme_id_map"),
        (lambda doc: doc["phoneme_id_map"].update(a=[]), "phoneme_id_map"),
        (lambda doc: doc["inference"].update(noise_scale=-1), "inference.noise_scale"),
        (lambda doc: doc.pop("audio"), "audio"),
    ],
)
def test_bad_voice_configs_name_the_key(
    voice_config: VoiceConfig, tmp_path: Path, change: object, key: str
) -> None:
    doc = voice_config.to_json()
    assert callable(change)
    change(doc)
    path = tmp_path / "voice.onnx.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(VoiceConfigError) as caught:
        VoiceConfig.load(path)
    assert caught.value.key == key
    assert caught.value.file == str(path)


def test_an_unreadable_voice_config_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "voice.onnx.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(VoiceConfigError, match="cannot be read as UTF-8 JSON"):
        VoiceConfig.load(path)


def test_an_unknown_espeak_voice_is_a_clear_error(voice_config: VoiceConfig) -> None:
    phonemizer = Phonemizer(dataclasses.replace(voice_config, espeak_voice="xx-nowhere"))
    with pytest.raises(VoiceConfigError, match="espeak-ng has no voice 'xx-nowhere'"):
        phonemizer.phonemize("hello")
    # The shared espeak-ng still works for the real voice afterwards.
    assert Phonemizer(voice_config).ids("hello")
