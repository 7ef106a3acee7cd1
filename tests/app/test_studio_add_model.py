"""Add model… in the studio: an ONNX file made into one of My pipelines through the dialog,
then loaded and run in a real worker; refusals shown as the runtime words them, with nothing
left in the data folder; Cancel; the list kept across a restart; Remove."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from app.models import RunState
from tests.app.support import wait_state
from tests.helpers.onnx_graphs import make_add_graph, write_inputs

N = 8


def _made_root(tmp_path: Path) -> Path:
    """Where the studio keeps My pipelines in these tests (the ``user_dirs`` data folder)."""
    return tmp_path / "data" / "pipelines"


def _left(root: Path) -> list[str]:
    return sorted(entry.name for entry in root.iterdir()) if root.exists() else []


def _adder(tmp_path: Path) -> tuple[Path, Path, dict[str, np.ndarray]]:
    arrays = {
        "a": np.arange(N, dtype=np.float32),
        "b": np.full(N, 0.5, dtype=np.float32),
    }
    graph = make_add_graph(tmp_path / "models" / "adder.onnx", n=N)
    return graph, write_inputs(tmp_path / "models" / "adder-inputs.npz", arrays), arrays


def _open_dialog(window: Any) -> Any:
    window.add_model_action.trigger()
    dialog = window.my_pipelines.dialog
    assert dialog is not None
    assert dialog.isVisible()
    return dialog


def _add(qtbot: Any, window: Any, source: Path, **fields: Any) -> Any:
    """Add ``source`` through the dialog; returns the import's outcome."""
    dialog = _open_dialog(window)
    dialog.set_source(source)
    if "name" in fields:
        dialog.name_edit.setText(fields["name"])
    if "inputs" in fields:
        dialog.inputs_edit.setText(str(fields["inputs"]))
    with qtbot.waitSignal(window.my_pipelines.imports.finished, timeout=120_000) as done:
        qtbot.mouseClick(dialog.add_button, Qt.MouseButton.LeftButton)
    return done.args[0]


def test_an_onnx_file_added_through_the_dialog_loads_and_runs(
    qtbot: Any, make_window: Any, tmp_path: Path
) -> None:
    window = make_window()
    graph, inputs, arrays = _adder(tmp_path)
    lines: list[str] = []
    window.my_pipelines.imports.progress.connect(lines.append)
    dialog = _open_dialog(window)
    dialog.set_source(graph)
    # An ONNX file takes example inputs; speech is for language models.
    assert dialog.inputs_edit.isEnabled()
    assert not dialog.speak_check.isEnabled()
    assert "an ONNX file" in dialog.kind_label.text()
    dialog.name_edit.setText("my-adder")
    dialog.inputs_edit.setText(str(inputs))
    with qtbot.waitSignal(window.bridge.pipeline_opened, timeout=60_000) as opened:
        qtbot.mouseClick(dialog.add_button, Qt.MouseButton.LeftButton)
    made = _made_root(tmp_path) / "my-adder" / "pipeline.yaml"
    info = opened.args[0]
    assert info.path == made
    assert any(line.startswith("making a bundle of") for line in lines), lines
    assert any(line.startswith("made pipeline my-adder") for line in lines), lines
    qtbot.waitUntil(lambda: window.my_pipelines.dialog is None, timeout=5_000)
    item = window.pipelines.mine_item("my-adder")
    assert item is not None
    assert "ONNX graph, made from" in item.toolTip(0)

    wait_state(qtbot, window, RunState.READY)
    with qtbot.waitSignal(window.bridge.run_finished, timeout=60_000) as finished:
        window.run_action.trigger()
    assert finished.args[0].status == "completed", finished.args[0]
    results = window.output.tensors.results
    assert results is not None
    np.testing.assert_array_equal(results.arrays["c"], arrays["a"] + arrays["b"])
    assert window.output.tensors.table.item(0, 0).text() == "c"

    # A pipeline whose stages are loaded is not removed from under them.
    wait_state(qtbot, window, RunState.LOADED)
    window.pipelines.tree.setCurrentItem(window.pipelines.mine_item("my-adder"))
    assert window.pipelines.remove_button.isEnabled()
    assert not window.my_pipelines.remove("my-adder", confirm=False)
    assert "its stages are loaded" in window.banner.message.text()
    assert made.is_file()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("truncated", "cannot be read as an ONNX model"),
        ("text", "is not a model this accepts; accepted: an ONNX file (.onnx)"),
    ],
)
def test_a_file_that_is_not_a_model_is_refused_in_the_dialog_and_leaves_nothing(
    content: str, message: str, qtbot: Any, make_window: Any, tmp_path: Path
) -> None:
    window = make_window()
    if content == "truncated":
        whole = make_add_graph(tmp_path / "models" / "whole.onnx", n=4096).read_bytes()
        source = tmp_path / "models" / "broken.onnx"
        source.write_bytes(whole[: len(whole) // 2])
    else:
        source = tmp_path / "models" / "notes.txt"
        source.parent.mkdir()
        source.write_text("not a model", encoding="utf-8")
    outcome = _add(qtbot, window, source)
    assert outcome.status == "failed"
    dialog = window.my_pipelines.dialog
    assert dialog is not None
    assert dialog.isVisible()
    assert dialog.error_label.isVisible()
    text = dialog.error_label.text()
    assert str(source) in text
    assert message in text
    assert dialog.add_button.isEnabled()
    assert _left(_made_root(tmp_path)) == []
    assert window.pipelines.mine_item(source.stem) is None
    dialog.reject()
    qtbot.waitUntil(lambda: window.my_pipelines.dialog is None, timeout=5_000)


def test_cancel_keeps_nothing(qtbot: Any, make_window: Any, tmp_path: Path) -> None:
    window = make_window()
    graph, inputs, _arrays = _adder(tmp_path)
    dialog = _open_dialog(window)
    dialog.set_source(graph)
    dialog.inputs_edit.setText(str(inputs))
    imports = window.my_pipelines.imports
    with qtbot.waitSignal(imports.finished, timeout=60_000) as done:
        dialog.add_button.click()
        assert imports.busy
        assert dialog.close_button.text() == "Cancel"
        # Pressed before the import's outcome reaches the GUI: whatever step it was at, what
        # it began or made is removed.
        dialog.close_button.click()
        assert dialog.close_button.text() == "Cancelling…"
    assert done.args[0].status == "cancelled"
    assert not imports.busy
    assert dialog.isVisible()
    assert dialog.step_label.text().startswith("Cancelled")
    assert _left(_made_root(tmp_path)) == []
    assert window.pipelines.mine_item("adder") is None
    dialog.reject()


def test_my_pipelines_are_kept_across_a_restart_and_removed(
    qtbot: Any, make_window: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    window = make_window()
    graph, inputs, _arrays = _adder(tmp_path)
    assert _add(qtbot, window, graph, name="kept", inputs=inputs).status == "made"
    wait_state(qtbot, window, RunState.READY)
    with qtbot.waitSignal(window.bridge.shut_down, timeout=30_000):
        window.close()

    again = make_window()
    item = again.pipelines.mine_item("kept")
    assert item is not None
    made = _made_root(tmp_path) / "kept" / "pipeline.yaml"
    assert Path(item.data(0, Qt.ItemDataRole.UserRole)) == made
    # It opens from the list like a demo.
    with qtbot.waitSignal(again.bridge.pipeline_opened, timeout=30_000) as opened:
        again.pipelines.tree.itemClicked.emit(item, 0)
    assert opened.args[0].path == made

    asked: list[str] = []

    def answer(*args: Any, **_kwargs: Any) -> QMessageBox.StandardButton:
        asked.append(args[2])
        return QMessageBox.StandardButton.Yes

    monkeypatch.setattr(QMessageBox, "question", answer)
    again.pipelines.tree.setCurrentItem(item)
    qtbot.mouseClick(again.pipelines.remove_button, Qt.MouseButton.LeftButton)
    assert asked
    assert "Remove kept from My pipelines?" in asked[0]
    assert not made.parent.exists()
    assert again.pipelines.mine_item("kept") is None
    assert not again.pipelines.remove_button.isEnabled()


def test_a_model_folder_becomes_a_chat_pipeline_in_the_list(
    qtbot: Any, make_window: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "models" / "my-llama"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    data = np.zeros(16, dtype=np.float32).tobytes()
    header = json.dumps({"w": {"dtype": "F32", "shape": [16], "data_offsets": [0, len(data)]}})
    (folder / "model.safetensors").write_bytes(
        len(header).to_bytes(8, "little") + header.encode() + data
    )
    (folder / "tokenizer.json").write_text("{}", encoding="utf-8")
    window = make_window()
    dialog = _open_dialog(window)
    dialog.set_source(folder)
    assert "a Hugging Face model folder" in dialog.kind_label.text()
    assert dialog.speak_check.isEnabled()
    assert not dialog.inputs_edit.isEnabled()
    # What the dialog asks of the import: speech only for a language model, inputs only for
    # an ONNX file.
    dialog.inputs_edit.setText(str(tmp_path / "ignored.npz"))
    dialog.speak_check.setChecked(True)
    request = dialog.request()
    assert request is not None
    assert (request.source, request.inputs, request.speak) == (folder, None, True)
    dialog.speak_check.setChecked(False)
    dialog.inputs_edit.clear()
    with qtbot.waitSignal(window.bridge.pipeline_opened, timeout=60_000) as opened:
        qtbot.mouseClick(dialog.add_button, Qt.MouseButton.LeftButton)
    assert opened.args[0].path == _made_root(tmp_path) / "my-llama" / "pipeline.yaml"
    item = window.pipelines.mine_item("my-llama")
    assert item is not None
    assert item.toolTip(0).startswith(f"chat, made from {folder}")
    # The folder is referenced where it is, not copied.
    assert _left(_made_root(tmp_path) / "my-llama") == ["import.json", "pipeline.yaml"]


def test_closing_the_window_during_an_import_cancels_it_and_keeps_nothing(
    qtbot: Any, make_window: Any, tmp_path: Path
) -> None:
    window = make_window()
    graph, inputs, _arrays = _adder(tmp_path)
    dialog = _open_dialog(window)
    dialog.set_source(graph)
    dialog.inputs_edit.setText(str(inputs))
    dialog.add_button.click()
    imports = window.my_pipelines.imports
    assert imports.busy
    with qtbot.waitSignal(window.bridge.shut_down, timeout=60_000):
        window.close()
        # The window waits for the import to end before its runtime shuts down.
        assert window.bridge.state is not RunState.CLOSING
        assert imports.cancelling
    assert not imports.busy
    assert _left(_made_root(tmp_path)) == []
