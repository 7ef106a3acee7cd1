"""The conversation view on its own (real widgets, no runtime): what Send, Regenerate, Copy,
New, reopening and deleting do, and what the bridge's values do to the transcript.

The view is fed the values the bridge emits (``TextChunk``, ``RunOutcome``); the studio
tests with the real vLLM worker are in ``test_studio_chat.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtGui import QGuiApplication

from app.conversations import ConversationStore
from app.models import RunOutcome, RunState, TextChunk
from app.widgets.chat import ChatView


@pytest.fixture
def store(tmp_path: Path) -> ConversationStore:
    return ConversationStore(tmp_path / "conversations")


def make_view(qtbot: Any, store: ConversationStore) -> ChatView:
    view = ChatView(store)
    qtbot.addWidget(view)
    view.refresh_history()
    view.set_pipeline("chat")
    view.set_state(RunState.READY)
    view.show()
    return view


def reply(view: ChatView, qtbot: Any, request_id: str, parts: list[str], prompt: str) -> None:
    """Stream ``parts`` into the view as the bridge would, then finish the request."""
    view.set_state(RunState.RUNNING)
    view.run_started(request_id)
    for index, part in enumerate(parts):
        view.add_text(TextChunk(request_id, index, part, False))
    view.add_text(TextChunk(request_id, len(parts), "".join(parts), True, prompt))
    view.finished(RunOutcome(request_id, "completed"))
    view.set_state(RunState.LOADED)


def test_send_streams_the_reply_and_saves_each_turn(qtbot: Any, store: ConversationStore) -> None:
    view = make_view(qtbot, store)
    assert not view.stop_button.isEnabled()
    assert not view.regenerate_button.isEnabled()
    view.system_prompt.setPlainText("Answer in one sentence.")
    view.composer.setPlainText("What is the capital of France?")
    with qtbot.waitSignal(view.submit_requested) as sent:
        view.send_button.click()
    assert sent.args[0] == {
        "messages": [
            {"role": "system", "content": "Answer in one sentence."},
            {"role": "user", "content": "What is the capital of France?"},
        ]
    }
    assert view.composer.toPlainText() == ""
    assert not view.send_button.isEnabled()
    # The user turn is saved before any reply arrives.
    assert store.load(view.conversation.id).turns[-1].content == "What is the capital of France?"
    view.set_state(RunState.RUNNING)
    view.run_started("r1")
    assert view.stop_button.isEnabled()
    view.add_text(TextChunk("r1", 0, "The capital ", False))
    view.add_text(TextChunk("other", 0, "not this request", False))
    view.add_text(TextChunk("r1", 1, "is Paris.", False))
    qtbot.waitUntil(lambda: "The capital is Paris." in view.transcript.toPlainText())
    assert "not this request" not in view.transcript.toPlainText()
    view.add_text(TextChunk("r1", 2, "The capital is Paris.", True, "<prompt 1>"))
    view.finished(RunOutcome("r1", "completed"))
    view.set_state(RunState.LOADED)
    saved = store.load(view.conversation.id)
    assert [(t.role, t.content) for t in saved.turns] == [
        ("user", "What is the capital of France?"),
        ("assistant", "The capital is Paris."),
    ]
    assert saved.turns[-1].prompt == "<prompt 1>"
    assert view.prompts == ["<prompt 1>"]
    assert view.status.text() == "replied"
    assert view.send_button.isEnabled()
    assert view.regenerate_button.isEnabled()
    # Copy puts the last reply on the clipboard.
    assert view.copy_last_reply()
    assert QGuiApplication.clipboard().text() == "The capital is Paris."
    # The next turn carries the first through the messages.
    with qtbot.waitSignal(view.submit_requested) as sent:
        assert view.send("And of Italy?")
    assert [m["role"] for m in sent.args[0]["messages"]] == [
        "system",
        "user",
        "assistant",
        "user",
    ]


def test_regenerate_replaces_the_last_reply(qtbot: Any, store: ConversationStore) -> None:
    view = make_view(qtbot, store)
    view.send("Name a river.")
    reply(view, qtbot, "r1", ["The ", "Nile."], "p1")
    with qtbot.waitSignal(view.submit_requested) as sent:
        view.regenerate_button.click()
    assert sent.args[0]["messages"] == [{"role": "user", "content": "Name a river."}]
    assert view.conversation.awaits_reply
    reply(view, qtbot, "r2", ["The Danube."], "p2")
    assert [t.content for t in store.load(view.conversation.id).turns] == [
        "Name a river.",
        "The Danube.",
    ]


def test_stop_keeps_the_partial_reply_marked_stopped(qtbot: Any, store: ConversationStore) -> None:
    view = make_view(qtbot, store)
    view.send("Tell me a long story.")
    view.set_state(RunState.RUNNING)
    view.run_started("r1")
    view.add_text(TextChunk("r1", 0, "Once upon a time", False))
    with qtbot.waitSignal(view.stop_requested):
        view.stop_button.click()
    view.finished(RunOutcome("r1", "cancelled", "cancelled"))
    view.set_state(RunState.LOADED)
    turn = store.load(view.conversation.id).turns[-1]
    assert (turn.role, turn.content, turn.status) == ("assistant", "Once upon a time", "stopped")
    assert "stopped" in view.transcript.toPlainText()


def test_a_failed_reply_is_shown_with_its_error_and_a_refused_one_keeps_the_turn(
    qtbot: Any, store: ConversationStore
) -> None:
    view = make_view(qtbot, store)
    view.send("Hello?")
    view.finished(RunOutcome(None, "failed", "admission refused: machine:ram"))
    turn = view.conversation.turns[-1]
    assert (turn.status, turn.error) == ("failed", "admission refused: machine:ram")
    assert "admission refused" in view.transcript.toPlainText()
    view.send("Again?")
    view.submission_refused()
    assert view.conversation.turns[-1].content == "Again?"
    assert view.draft is None
    assert view.send_button.isEnabled()


def test_conversations_are_listed_reopened_after_a_restart_and_deleted(
    qtbot: Any, store: ConversationStore
) -> None:
    view = make_view(qtbot, store)
    view.system_prompt.setPlainText("Be brief.")
    view.send("First conversation")
    reply(view, qtbot, "r1", ["One."], "p1")
    first = view.conversation.id
    view.new_button.click()
    assert view.conversation.turns == ()
    view.send("Second conversation")
    reply(view, qtbot, "r2", ["Two."], "p2")
    assert view.history.count() == 2

    restarted = make_view(qtbot, store)
    assert restarted.history.count() == 2
    titles = [restarted.history.item(i).text().splitlines()[0] for i in range(2)]
    assert set(titles) == {"First conversation", "Second conversation"}
    row = next(i for i in range(2) if titles[i] == "First conversation")
    restarted.history.setCurrentRow(row)
    restarted.open_button.click()
    assert restarted.conversation.id == first
    assert restarted.system_prompt.toPlainText() == "Be brief."
    assert "One." in restarted.transcript.toPlainText()
    with qtbot.waitSignal(restarted.submit_requested) as sent:
        restarted.send("Continue")
    assert [m["content"] for m in sent.args[0]["messages"]] == [
        "Be brief.",
        "First conversation",
        "One.",
        "Continue",
    ]
    restarted.submission_refused()
    restarted.history.setCurrentRow(
        next(i for i in range(2) if restarted.history.item(i).text().startswith("First"))
    )
    asked: list[str] = []
    restarted.confirm_delete = lambda title: asked.append(title) or False
    restarted.delete_button.click()
    assert asked == ["First conversation"]
    assert restarted.history.count() == 2  # not confirmed: nothing deleted
    restarted.confirm_delete = lambda title: True
    restarted.delete_button.click()
    assert restarted.history.count() == 1
    assert not (store.folder / f"{first}.json").exists()
    assert restarted.conversation.turns == ()


def test_an_unreadable_file_is_named_once_and_left_as_it_is(
    qtbot: Any, store: ConversationStore
) -> None:
    store.folder.mkdir(parents=True)
    foreign = store.folder / "settings.json"
    foreign.write_text(json.dumps({"theme": "dark"}), encoding="utf-8")
    view = ChatView(store)
    qtbot.addWidget(view)
    with qtbot.waitSignal(view.problem) as problem:
        view.refresh_history()
    assert problem.args[0].kind == "warning"
    assert str(foreign) in problem.args[0].message
    assert "'kind' is None" in problem.args[0].message
    assert "settings.json" in view.history_note.text()
    with qtbot.assertNotEmitted(view.problem):
        view.refresh_history()
    assert json.loads(foreign.read_text(encoding="utf-8")) == {"theme": "dark"}
