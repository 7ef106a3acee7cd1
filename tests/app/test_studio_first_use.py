"""First use without a terminal: Run on a pipeline whose language-model stage needs an
environment or the built-in assistant's model this machine lacks offers to make them, with a
progress bar over the steps and Cancel, instead of failing.

The environments here are made by real recipes (a virtual environment and Python steps run
by :func:`runtime.envs.create_env`) under the test's data folder; vLLM's own recipe would
download gigabytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from PySide6.QtCore import Qt

from app.first_use import setup_needs
from app.models import RunState
from runtime.config import SMOLLM2_MODEL
from runtime.envs import EnvRecipe, EnvStep, create_env, envs_root, list_envs
from runtime.models.marker import MARKER_NAME
from runtime.models.smollm2 import default_smollm2_dir
from tests.app.support import open_pipeline, wait_state

ENV = "studio-first-use"
VENV = EnvStep("create the virtual environment", "venv", ("--without-pip",))
CHECK = EnvStep("import check", "python", ("print('ok')",))
REPO_ROOT = Path(__file__).resolve().parents[2]


def _recipe(lines: int, pause_s: float) -> dict[str, EnvRecipe]:
    code = (
        "import time\n"
        f"for i in range({lines}):\n"
        "    print(f'working {i}', flush=True)\n"
        f"    time.sleep({pause_s})\n"
    )
    steps = (VENV, EnvStep("install the runtime", "python", (code,)), CHECK)
    return {ENV: EnvRecipe(ENV, "a studio test environment", steps)}


def _assistant(tmp_path: Path) -> Path:
    """A lone language-model stage on the built-in assistant, in environment ``ENV``."""
    document = {
        "pipeline": "assistant",
        "description": "The built-in assistant.",
        "async_chunk": False,
        "stages": [
            {
                "stage_id": 0,
                "backend": {
                    "name": "native.vllm.v1",
                    "model": SMOLLM2_MODEL,
                    "engine": {"max_model_len": 512, "kv_cache_memory_bytes": "64MiB"},
                    "sampling": {"max_tokens": 16, "temperature": 0.0},
                    "route": {"name": "local-vllm", "interpreter": f"env:{ENV}"},
                },
                "resource_budget": {
                    "capacities": {"machine:ram": "3GiB"},
                    "demands": {"machine:ram": "3GiB"},
                },
            }
        ],
    }
    path = tmp_path / "assistant.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def _made_envs(root: Path) -> list[str]:
    """What is under the environments' folder besides create_env's lock files."""
    found = sorted(entry.name for entry in root.iterdir()) if root.exists() else []
    return [name for name in found if not name.endswith(".lock")]


def _window_on(qtbot: Any, make_window: Any, pipeline: Path, recipes: dict[str, EnvRecipe]) -> Any:
    window = make_window()
    window.first_use.jobs.recipes = recipes
    open_pipeline(qtbot, window, pipeline)
    wait_state(qtbot, window, RunState.READY)
    return window


def test_the_demos_needs_are_read_from_their_files(tmp_path: Path) -> None:
    chat_speak = REPO_ROOT / "assets" / "pipelines" / "chat-speak.yaml"
    needs = setup_needs(chat_speak)  # the test's data folder: nothing made yet
    assert needs is not None
    assert (needs.env, needs.create_env, needs.model) == ("vllm-cpu", True, SMOLLM2_MODEL)
    assert needs.lines()[0].startswith("the vllm-cpu environment: ")
    assert needs.lines()[1].startswith(f"the built-in assistant {SMOLLM2_MODEL}: ")
    assert setup_needs(REPO_ROOT / "assets" / "pipelines" / "add.yaml") is None
    # A model folder with its record is there: only the environment is offered.
    folder = default_smollm2_dir()
    folder.mkdir(parents=True)
    (folder / MARKER_NAME).write_text("{}", encoding="utf-8")
    needs = setup_needs(chat_speak)
    assert needs is not None
    assert (needs.create_env, needs.model) == (True, None)


def test_run_offers_to_make_the_environment_then_runs(
    qtbot: Any, make_window: Any, tmp_path: Path
) -> None:
    recipes = _recipe(lines=3, pause_s=0.0)
    folder = default_smollm2_dir()
    folder.mkdir(parents=True)
    (folder / MARKER_NAME).write_text("{}", encoding="utf-8")
    window = _window_on(qtbot, make_window, _assistant(tmp_path), recipes)
    # A chat pipeline: Run sends the conversation view's turn once all is made.
    window.chat.composer.setPlainText("Hello.")
    window.run_action.trigger()
    dialog = window.first_use.dialog
    assert dialog is not None
    assert dialog.isVisible()
    assert window.chat.composer.toPlainText() == "Hello."
    assert f"the {ENV} environment" in dialog.needs_label.text()
    assert SMOLLM2_MODEL not in dialog.needs_label.text()
    assert window.bridge.state is RunState.READY  # nothing started
    # Opening it started no load either: first use asks before anything is made.
    assert not window.bridge.loading
    assert window.bridge.load_view is None
    assert window.bridge.ledger.snapshot().reservations == ()
    assert dialog.progress_bar.maximum() == 3

    steps: list[int] = []
    lines: list[str] = []
    window.first_use.jobs.step.connect(steps.append)
    window.first_use.jobs.progress.connect(lines.append)
    with qtbot.waitSignal(window.bridge.run_finished, timeout=120_000) as finished:
        qtbot.mouseClick(dialog.create_button, Qt.MouseButton.LeftButton)
    assert steps == [0, 1, 2, 3]
    assert "[2/3] install the runtime" in lines
    assert "    working 2" in lines
    assert [info.status for info in list_envs(recipes=recipes) if info.name == ENV] == ["ready"]
    assert window.first_use.dialog is None
    # The run went ahead once the environment was made; this test environment has neither
    # pip nor vLLM, so the stage cannot start, and the studio says so as for any failed load.
    outcome = finished.args[0]
    assert outcome.status == "failed"
    # It got past the environment: the stage's start ran that environment's Python.
    assert str(envs_root() / ENV / "bin" / "python") in outcome.message
    wait_state(qtbot, window, RunState.READY)


def test_cancel_while_the_environment_is_made_leaves_nothing(
    qtbot: Any, make_window: Any, tmp_path: Path
) -> None:
    recipes = _recipe(lines=2000, pause_s=0.05)
    window = _window_on(qtbot, make_window, _assistant(tmp_path), recipes)
    window.run_action.trigger()
    dialog = window.first_use.dialog
    assert dialog is not None
    assert SMOLLM2_MODEL in dialog.needs_label.text()
    jobs = window.first_use.jobs
    working: list[str] = []
    jobs.progress.connect(lambda line: working.append(line) if "working" in line else None)
    qtbot.mouseClick(dialog.create_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(working) >= 3, timeout=60_000)
    assert dialog.progress_bar.value() == 1
    with qtbot.waitSignal(jobs.finished, timeout=30_000) as done:
        qtbot.mouseClick(dialog.close_button, Qt.MouseButton.LeftButton)
    assert done.args[0].status == "cancelled"
    assert dialog.isVisible()
    assert dialog.step_label.text().startswith("Cancelled")
    # The step's process group was ended and the half-made environment removed.
    assert _made_envs(envs_root()) == []
    assert not default_smollm2_dir().exists()
    assert window.bridge.state is RunState.READY
    dialog.reject()
    qtbot.waitUntil(lambda: window.first_use.dialog is None, timeout=5_000)


def test_a_model_that_cannot_be_made_is_reported_in_the_offer(
    qtbot: Any, make_window: Any, tmp_path: Path
) -> None:
    recipes = _recipe(lines=1, pause_s=0.0)
    create_env(ENV, recipes=recipes)
    window = _window_on(qtbot, make_window, _assistant(tmp_path), recipes)
    window.run_action.trigger()
    dialog = window.first_use.dialog
    assert dialog is not None
    assert "environment" not in dialog.needs_label.text()
    assert f"the built-in assistant {SMOLLM2_MODEL}" in dialog.needs_label.text()
    with qtbot.waitSignal(window.first_use.jobs.finished, timeout=120_000) as done:
        qtbot.mouseClick(dialog.create_button, Qt.MouseButton.LeftButton)
    assert done.args[0].status == "failed"
    assert dialog.error_label.isVisible()
    # This environment has no pip: the conversion packages cannot be installed, and the
    # message names the command.
    assert "installing the conversion packages failed" in dialog.error_label.text()
    assert not default_smollm2_dir().exists()
    assert window.bridge.state is RunState.READY
    dialog.reject()


def test_closing_the_window_while_the_environment_is_made_leaves_nothing(
    qtbot: Any, make_window: Any, tmp_path: Path
) -> None:
    recipes = _recipe(lines=2000, pause_s=0.05)
    window = _window_on(qtbot, make_window, _assistant(tmp_path), recipes)
    window.run_action.trigger()
    dialog = window.first_use.dialog
    assert dialog is not None
    jobs = window.first_use.jobs
    working: list[str] = []
    jobs.progress.connect(lambda line: working.append(line) if "working" in line else None)
    qtbot.mouseClick(dialog.create_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: bool(working), timeout=60_000)
    with qtbot.waitSignal(window.bridge.shut_down, timeout=60_000):
        window.close()
    assert not jobs.busy
    assert _made_envs(envs_root()) == []


def test_sending_a_chat_turn_offers_first_and_keeps_the_text(
    qtbot: Any, make_window: Any, tmp_path: Path
) -> None:
    recipes = _recipe(lines=1, pause_s=0.0)
    window = _window_on(qtbot, make_window, _assistant(tmp_path), recipes)
    assert window.chat_mode
    window.chat.composer.setPlainText("What is the capital of France?")
    qtbot.mouseClick(window.chat.send_button, Qt.MouseButton.LeftButton)
    dialog = window.first_use.dialog
    assert dialog is not None
    assert dialog.isVisible()
    # Nothing was sent: the turn waits in the composer until what is missing is made.
    assert window.chat.composer.toPlainText() == "What is the capital of France?"
    assert window.chat.draft is None
    assert window.bridge.state is RunState.READY
    dialog.reject()
    qtbot.waitUntil(lambda: window.first_use.dialog is None, timeout=5_000)
