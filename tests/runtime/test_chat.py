"""Conversations: messages checked at the edge, rendered with a model folder's chat
template, and what a request's record keeps of the prompt."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from runtime.chat import MAX_CHARS, MAX_MESSAGES, ChatMessage, ChatTemplate, parse_messages
from runtime.errors import UsageError
from runtime.metrics import MAX_RECORDED_PROMPT, recorded_prompt

if TYPE_CHECKING:
    from pathlib import Path

USER = {"role": "user", "content": "Hi."}


def test_messages_become_typed_turns() -> None:
    raw = [{"role": "system", "content": "Be brief."}, USER]
    assert parse_messages(raw, where="here") == (
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Hi."),
    )
    assert [message.to_json() for message in parse_messages(raw, where="here")] == raw


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (None, "the messages are NoneType"),
        ("Hi.", "the messages are str"),
        ([], "the messages are empty"),
        ([3], "messages[0] is int"),
        ([{"role": "user", "content": "Hi.", "mood": "x"}], "unknown key 'mood'"),
        ([{"content": "Hi."}], "messages[0].role is None; accepted: system, developer, user"),
        ([{"role": "user", "content": ["Hi."]}], "messages[0].content is list"),
        ([USER, {"role": "assistant", "content": "Hello."}], "the last message is the assistant's"),
        ([{"role": "user", "content": "  "}], "the last user message has no text"),
        ([USER] * (MAX_MESSAGES + 1), f"accepted: at most {MAX_MESSAGES}"),
        ([{"role": "user", "content": "x" * (MAX_CHARS + 1)}], f"at most {MAX_CHARS}"),
    ],
)
def test_bad_messages_name_the_entry_and_what_is_accepted(raw: object, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_messages(raw, where="--chat talk.json")
    assert str(caught.value).startswith("--chat talk.json: ")
    assert message in str(caught.value)


def test_a_model_folder_template_renders_every_turn(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<s>",
                "chat_template": "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n"
                "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}",
            }
        ),
        encoding="utf-8",
    )
    template = ChatTemplate.from_model_dir(tmp_path)
    turns = parse_messages(
        [USER, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye."}],
        where="here",
    )
    assert template.render(turns) == (
        "<|user|>Hi.\n<|assistant|>Hello.\n<|user|>Bye.\n<|assistant|>"
    )
    # A folder without a template (the tiny test model) gets one line per turn.
    assert ChatTemplate.from_model_dir(tmp_path / "none").render(turns) == (
        "user: Hi.\nassistant: Hello.\nuser: Bye.\nassistant:"
    )


def test_a_long_prompt_is_recorded_by_its_end() -> None:
    assert recorded_prompt("short") == "short"
    assert recorded_prompt([1, 2, 3]) is None
    long = "a" * MAX_RECORDED_PROMPT + "THE END"
    kept = recorded_prompt(long)
    assert kept is not None
    assert len(kept) == MAX_RECORDED_PROMPT
    assert kept.startswith("[...]")
    assert kept.endswith("THE END")


@pytest.mark.parametrize(
    ("config", "processor", "kept"),
    [
        # A Llama tokenizer says so: it adds the BOS, the rendered one is dropped.
        ({"add_bos_token": True}, None, False),
        ({"add_bos_token": False}, None, True),
        # A ChatML model (SmolLM2) whose BOS is its turn marker, added by nothing.
        ({}, {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A"}}]}, True),
        (
            {},
            {
                "type": "Sequence",
                "processors": [
                    {"type": "ByteLevel"},
                    {
                        "type": "TemplateProcessing",
                        "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}],
                    },
                ],
            },
            False,
        ),
        ({}, None, True),
    ],
)
def test_the_bos_is_dropped_only_where_the_tokenizer_adds_it(
    config: dict[str, object], processor: dict[str, object] | None, kept: bool, tmp_path: Path
) -> None:
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                **config,
                "bos_token": "<s>",
                "chat_template": "{{ bos_token }}[{{ messages[-1].content }}]",
            }
        ),
        encoding="utf-8",
    )
    if processor is not None:
        (tmp_path / "tokenizer.json").write_text(
            json.dumps({"post_processor": processor}), encoding="utf-8"
        )
    rendered = ChatTemplate.from_model_dir(tmp_path).render(parse_messages([USER], where="t"))
    assert rendered == ("<s>[Hi.]" if kept else "[Hi.]")
