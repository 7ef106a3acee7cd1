"""Chat to speech without engines: cutting streamed text into pieces to speak, the adapter's
options, and the text requests a language-model pipeline takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.adapters.chat_speak import (
    ChatOptions,
    ChatOptionsError,
    ChatSpeakProgram,
    SentenceChunker,
)
from runtime.config import load_pipeline
from runtime.contracts.llm_messages import SamplingSpec
from runtime.engine.program import MAX_PROMPT_CHARS, parse_text_request, sampling_with
from runtime.errors import UsageError

REPO = Path(__file__).resolve().parents[3]
SPEAK = REPO / "assets" / "pipelines" / "speak.yaml"


def streamed(chunker: SentenceChunker, text: str, step: int) -> list[str]:
    pieces: list[str] = []
    for start in range(0, len(text), step):
        pieces.extend(chunker.feed(text[start : start + step]))
    return pieces + chunker.finish()


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_sentences_become_pieces_once_the_next_one_begins(step: int) -> None:
    text = "Hello there, friend! How are you today? I am fine. Thanks."
    assert streamed(SentenceChunker(12, 100), text, step) == [
        "Hello there, friend!",
        "How are you today?",
        "I am fine. Thanks.",  # "I am fine." is short: it waits for the next sentence
    ]


def test_a_piece_waits_for_the_next_sentence_to_begin() -> None:
    chunker = SentenceChunker(1, 100)
    assert chunker.feed("Stop here! ") == []
    assert chunker.feed("Go") == ["Stop here!"]
    assert chunker.finish() == ["Go"]
    assert chunker.finish() == []


def test_text_without_sentence_ends_is_cut_at_a_space_before_the_limit() -> None:
    words = "river mountain forest ocean desert valley island meadow harbor garden " * 3
    pieces = streamed(SentenceChunker(5, 40), words, 7)
    assert all(len(piece) <= 40 for piece in pieces)
    assert " ".join(pieces).split() == words.split()
    assert pieces[0] == "river mountain forest ocean desert"


def test_text_without_spaces_is_cut_at_the_limit() -> None:
    pieces = streamed(SentenceChunker(5, 16), "x" * 40, 5)
    assert pieces == ["x" * 16, "x" * 16, "x" * 8]


def test_line_breaks_end_sentences_and_blank_text_is_no_piece() -> None:
    assert streamed(SentenceChunker(1, 100), "first line\nsecond line\n", 2) == [
        "first line",
        "second line",
    ]
    assert streamed(SentenceChunker(1, 100), "  \n \n", 1) == []


def test_chunker_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="min_chars"):
        SentenceChunker(50, 10)


def test_options_default_and_pass_the_speech_options_through() -> None:
    options, speech = ChatOptions.parse(
        {"voice": "joe", "scales": "voice", "max_sentence_chars": 80}
    )
    assert options == ChatOptions(max_sentence_chars=80)
    assert speech == {"voice": "joe", "scales": "voice"}


@pytest.mark.parametrize(
    ("options", "key", "message"),
    [
        (
            {"voice": "joe", "colour": 1},
            "colour",
            "unknown option 'colour'; accepted: min_sentence",
        ),
        ({"max_sentence_chars": 8}, "max_sentence_chars", "from 16 to 2000"),
        ({"max_sentence_chars": True}, "max_sentence_chars", "from 16 to 2000"),
        ({"min_sentence_chars": 0}, "min_sentence_chars", "from 1 to max_sentence_chars (160)"),
        (
            {"min_sentence_chars": 100, "max_sentence_chars": 50},
            "min_sentence_chars",
            "from 1 to max_sentence_chars (50)",
        ),
        ({"prompt_template": "no slot"}, "prompt_template", "{text} exactly once"),
        ({"prompt_template": "{text}{text}"}, "prompt_template", "{text} exactly once"),
        ({"example_text": " "}, "example_text", "a non-empty string"),
    ],
)
def test_bad_options_name_the_option_and_what_is_accepted(
    options: dict[str, object], key: str, message: str
) -> None:
    with pytest.raises(ChatOptionsError, match=None) as info:
        ChatOptions.parse(options, file="p.yaml", line=3)
    assert info.value.key == f"adapter.options.{key}"
    assert (info.value.file, info.value.line) == ("p.yaml", 3)
    assert message in str(info.value)


def test_the_program_needs_a_language_model_then_two_voice_stages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for part in ("acoustic", "decoder"):
        manifest = tmp_path / "voices" / "joe" / part / "manifest.json"
        manifest.parent.mkdir(parents=True)
        manifest.write_text("{}", encoding="utf-8")
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(tmp_path))
    config = load_pipeline(SPEAK)
    with pytest.raises(ChatOptionsError, match=r"stages are \['graph', 'graph'\]") as info:
        ChatSpeakProgram(config, {"voice": "joe"})
    assert info.value.key == "stages"


def test_text_requests_are_text_or_text_with_sampling_options() -> None:
    defaults = SamplingSpec(max_tokens=64, min_tokens=16)
    request, extra = parse_text_request("Hi.", pipeline="p", defaults=defaults)
    assert (request.prompt, dict(request.sampling), extra) == ("Hi.", {}, {})
    request, _ = parse_text_request(
        {"text": "Hi.", "temperature": 0.0, "seed": 3}, pipeline="p", defaults=defaults
    )
    assert dict(request.sampling) == {"temperature": 0.0, "seed": 3}
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Name a river."},
    ]
    request, _ = parse_text_request(
        {"messages": conversation, "max_tokens": 8}, pipeline="p", defaults=defaults
    )
    assert request.messages is not None
    assert [message.to_json() for message in request.messages] == conversation
    assert (request.prompt, dict(request.sampling)) == ("Name a river.", {"max_tokens": 8})
    # A shorter answer than the default minimum makes the minimum give way.
    assert sampling_with(defaults, {"max_tokens": 4}, where="p").min_tokens == 4


@pytest.mark.parametrize(
    ("request_input", "message"),
    [
        (None, "takes text; got nothing"),
        (3, "takes text; got int"),
        ("", "the text is empty"),
        ("   ", "the text is empty"),
        ({"text": 5}, "the text is int"),
        ({"prompt": "Hi."}, "unknown key 'prompt'"),
        ({"max_tokens": 3}, "has no 'text' or 'messages'"),
        ({"text": "Hi.", "messages": [{"role": "user", "content": "Hi."}]}, "both 'text' and"),
        ({"messages": []}, "the messages are empty"),
        ({"messages": [{"role": "robot", "content": "Hi."}]}, "messages[0].role is 'robot'"),
        (
            {
                "messages": [
                    {"role": "user", "content": "Hi."},
                    {"role": "assistant", "content": "Yo"},
                ]
            },
            "the last message is the assistant's",
        ),
        ({"text": "Hi.", "max_tokens": 0}, "sampling.max_tokens"),
        ({"text": "Hi.", "top_p": 2}, "sampling.top_p"),
        ({"text": "Hi.", "stop": [""]}, "sampling.stop"),
        ("x" * (MAX_PROMPT_CHARS + 1), f"at most {MAX_PROMPT_CHARS}"),
    ],
)
def test_bad_text_requests_say_what_is_accepted(request_input: object, message: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_text_request(request_input, pipeline="p", defaults=SamplingSpec())
    assert message in str(info.value)
    assert str(info.value).startswith("pipeline p")


def test_unknown_sampling_options_are_named() -> None:
    with pytest.raises(UsageError, match="unknown sampling option 'beam_width'; accepted: max_"):
        sampling_with(SamplingSpec(), {"beam_width": 4}, where="stage-0")


@pytest.mark.parametrize("step", [1, 4])
def test_clauses_and_the_first_words_become_pieces_of_their_own(step: int) -> None:
    # Fed as a model writes it: a few characters at a time.
    text = (
        "The capital of France is Paris, which is a city in Europe. It has a tower; people love it."
    )
    assert streamed(SentenceChunker(16, 120, clause_chars=12, first_words=2), text, step) == [
        "The capital",
        "of France is Paris,",
        "which is a city in Europe.",
        "It has a tower;",
        "people love it.",
    ]
    # Without them, whole sentences.
    assert streamed(SentenceChunker(16, 120), text, step) == [
        "The capital of France is Paris, which is a city in Europe.",
        "It has a tower; people love it.",
    ]


def test_the_first_words_wait_for_a_word_to_end_and_repeat_words_are_counted() -> None:
    chunker = SentenceChunker(16, 120, first_words=3)
    assert chunker.feed("the the the") == []  # the third word may still be growing
    assert chunker.feed("se") == []
    assert chunker.feed(" cat") == ["the the these"]
    assert chunker.finish() == ["cat"]


def test_a_clause_limit_over_the_piece_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="clause_chars"):
        SentenceChunker(16, 120, clause_chars=121)
