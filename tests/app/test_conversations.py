"""Conversations without Qt: turns to chat messages, regeneration, and the JSON store with its
error paths (a file it cannot read is named with what is wrong, and left as it is)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.conversations import (
    FOLDER,
    Conversation,
    ConversationError,
    ConversationStore,
    ReplyDraft,
)


def two_turns() -> Conversation:
    conversation = Conversation.new("chat", "You answer briefly.", now=1000.0)
    conversation = conversation.with_user("What is the capital of France?", now=1001.0)
    conversation = conversation.with_reply("Paris.", prompt="<rendered 1>", now=1002.0)
    return conversation.with_user("And of Italy?", now=1003.0)


def test_messages_carry_the_system_prompt_and_every_turn_in_order() -> None:
    conversation = two_turns()
    assert conversation.request() == {
        "messages": [
            {"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And of Italy?"},
        ]
    }
    assert conversation.title == "What is the capital of France?"
    assert conversation.last_reply == "Paris."
    assert conversation.updated == 1003.0
    # No system prompt: no system message.
    assert conversation.with_system("  ").messages()[0].role == "user"


def test_failed_replies_are_not_sent_and_stopped_ones_are_sent_as_written() -> None:
    conversation = two_turns().with_reply("", "failed", error="the worker died")
    conversation = conversation.for_regeneration()
    assert conversation.turns[-1].content == "And of Italy?"
    stopped = conversation.with_reply("Rome is", "stopped").with_user("Go on.")
    roles = [(m.role, m.content) for m in stopped.messages()]
    assert roles[-3:] == [("user", "And of Italy?"), ("assistant", "Rome is"), ("user", "Go on.")]
    failed = conversation.with_reply("partial", "failed").with_user("Again?")
    assert "partial" not in [m.content for m in failed.messages()]


def test_regeneration_drops_the_last_reply_and_needs_a_user_turn() -> None:
    conversation = two_turns().with_reply("Rome.")
    again = conversation.for_regeneration()
    assert again.awaits_reply
    assert again.request()["messages"][-1] == {"role": "user", "content": "And of Italy?"}
    with pytest.raises(ValueError, match="no user turn"):
        Conversation.new("chat").for_regeneration()
    with pytest.raises(ValueError, match="does not end with a user turn"):
        conversation.request()
    with pytest.raises(ValueError, match="a reply follows a user turn"):
        conversation.with_reply("twice")
    with pytest.raises(ValueError, match="needs some text"):
        conversation.with_user("   ")


def test_a_draft_adds_deltas_and_takes_the_final_whole_text_and_prompt() -> None:
    draft = ReplyDraft("r1")
    draft.add("The capital ", finished=False)
    draft.add("is Paris.", finished=False)
    assert draft.text == "The capital is Paris."
    draft.add("The capital is Paris.", finished=True, prompt="user: hi\nassistant: ")
    assert (draft.text, draft.prompt, draft.finished, draft.chunks) == (
        "The capital is Paris.",
        "user: hi\nassistant: ",
        True,
        3,
    )


def test_the_store_saves_lists_reopens_and_deletes(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path / FOLDER)
    assert store.listing().conversations == ()
    first = two_turns().with_reply("Rome.", now=2000.0)
    second = Conversation.new("chat-speak", now=1500.0).with_user("Hello", now=1500.0)
    path = store.save(first)
    store.save(second)
    assert path == tmp_path / FOLDER / f"{first.id}.json"
    assert json.loads(path.read_text(encoding="utf-8"))["title"] == first.title
    listing = store.listing()
    assert listing.problems == ()
    assert [s.id for s in listing.conversations] == [first.id, second.id]  # newest first
    assert listing.conversations[0].turns == 4
    assert store.load(first.id) == first
    store.delete(first.id)
    assert [s.id for s in store.listing().conversations] == [second.id]
    with pytest.raises(ConversationError, match="no such conversation file"):
        store.delete(first.id)
    # Nothing but the conversation files: no temporary file left behind.
    assert sorted(p.name for p in (tmp_path / FOLDER).iterdir()) == [f"{second.id}.json"]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"{not json", r"is not JSON \(line 1, column 2: .*\); accepted: a conversation"),
        (b"\xff\xfe\x00", r"is not UTF-8 text"),
        (b'{"name": "a package.json"}', r"'kind' is None; accepted: a conversation the studio"),
        (b"[1, 2]", r"the file is list, not an object"),
        (
            b'{"kind": "omni-edge-conversation", "format": 2}',
            r"'format' is 2; accepted: 1 \(a file written by another version",
        ),
    ],
)
def test_a_file_the_store_cannot_read_is_named_and_left_as_it_is(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    store = ConversationStore(tmp_path)
    good = store.save(two_turns())
    bad = tmp_path / "notes.json"
    bad.write_bytes(content)
    listing = store.listing()
    assert [s.path for s in listing.conversations] == [good]
    assert len(listing.problems) == 1
    error = listing.problems[0]
    assert error.path == bad
    assert str(error).startswith(f"{bad}: ")
    assert "the file was left as it is" in str(error)
    with pytest.raises(ConversationError, match=problem):
        store.read(bad)
    assert bad.read_bytes() == content


def saved(conversation: Conversation) -> dict[str, object]:
    return json.loads(json.dumps(conversation.to_json()))


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"turns": "hello"}, r"'turns' is str 'hello'; accepted: a list of turns"),
        ({"turns": [{"role": "system", "content": "x"}]}, r"turns\[0\]\.role is str 'system'"),
        ({"turns": [{"role": "user", "content": 3}]}, r"turns\[0\]\.content is int 3"),
        (
            {"turns": [{"role": "assistant", "content": "", "status": "lost"}]},
            r"turns\[0\]\.status is str 'lost'; accepted: done, stopped, failed",
        ),
        ({"turns": [{"role": "user", "content": "", "mood": 1}]}, r"unknown key 'mood'"),
        ({"colour": "red"}, r"the file has unknown key 'colour'"),
        ({"pipeline": 3}, r"'pipeline' is int 3; accepted: a string"),
        ({"id": ""}, r"'id' is str ''; accepted: a non-empty string"),
        ({"updated": "yesterday"}, r"'updated' is str 'yesterday'; accepted: seconds"),
        ({"id": "../x"}, r"'id' is '../x'; accepted: letters, digits"),
    ],
)
def test_a_malformed_conversation_names_the_field_and_the_value(
    tmp_path: Path, change: dict[str, object], problem: str
) -> None:
    conversation = two_turns()
    document = {**saved(conversation), **change}
    path = tmp_path / f"{conversation.id}.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(ConversationError, match=problem) as caught:
        ConversationStore(tmp_path).load(conversation.id)
    assert caught.value.path == path
    assert path.read_text(encoding="utf-8") == json.dumps(document)


def test_a_file_under_another_name_and_bad_ids_are_refused(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    conversation = two_turns()
    (tmp_path / "copy.json").write_text(json.dumps(saved(conversation)), encoding="utf-8")
    with pytest.raises(ConversationError, match=r"is named 'copy.json'; accepted: "):
        store.read(tmp_path / "copy.json")
    for bad_id in ("../etc/passwd", "", "a/b", ".hidden"):
        with pytest.raises(ConversationError, match="is not a conversation id"):
            store.load(bad_id)


def test_a_save_that_fails_leaves_the_previous_version_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ConversationStore(tmp_path)
    first = two_turns()
    path = store.save(first)
    before = path.read_bytes()

    def refuse(source: str, target: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("app.conversations.os.replace", refuse)
    with pytest.raises(ConversationError, match="could not be written: No space left on device"):
        store.save(first.with_reply("Rome."))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
