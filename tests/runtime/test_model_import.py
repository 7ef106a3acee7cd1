"""The user's own models made into pipelines (``omni-edge pipeline new``): ONNX files run
in a real worker, model folders become chat pipelines, and every refusal names the file and
leaves nothing behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from runtime.api import Omni
from runtime.cli import main
from runtime.config import load_pipeline
from runtime.devices import DeviceSelection
from runtime.errors import EXIT_OK, EXIT_USAGE
from runtime.model_import import (
    CHAT,
    CHAT_SPEAK,
    GRAPH,
    LLM_BASE_DEMAND,
    ModelImportError,
    import_model,
    list_my_pipelines,
    read_record,
    remove_my_pipeline,
)
from tests.helpers.onnx_graphs import IR_VERSION, OPSET, make_add_graph, write_inputs


def _model(graph: onnx.GraphProto, opset: str = "") -> onnx.ModelProto:
    imports = [helper.make_opsetid("", OPSET)]
    if opset:
        imports.append(helper.make_opsetid(opset, 1))
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = IR_VERSION
    return model


def _dynamic_graph(path: Path) -> Path:
    """``y = x * 2`` over float32 [batch, 4] and ``n + 1`` over int64 [batch]."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "two"], ["y"]),
            helper.make_node("Add", ["n", "one"], ["m"]),
        ],
        "dynamic",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("n", TensorProto.INT64, ["batch"]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("m", TensorProto.INT64, ["batch"]),
        ],
        initializer=[
            helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
            helper.make_tensor("one", TensorProto.INT64, [], [1]),
        ],
    )
    onnx.save(_model(graph), str(path))
    return path


def _left(root: Path) -> list[str]:
    return sorted(entry.name for entry in root.iterdir()) if root.exists() else []


def test_an_onnx_file_becomes_a_pipeline_that_runs_in_a_worker(tmp_path: Path) -> None:
    root = tmp_path / "mine"
    made = import_model(_dynamic_graph(tmp_path / "scale.onnx"), root=root)
    assert (made.name, made.kind) == ("scale", GRAPH)
    assert made.pipeline == root / "scale" / "pipeline.yaml"
    assert read_record(root / "scale") == made
    config = load_pipeline(made.pipeline)
    assert config.pipeline == "scale"
    # The generated example inputs: dynamic dimensions became 1.
    with Omni(made.pipeline, selection=DeviceSelection()) as omni:
        outputs = omni.run()
        x = np.full((1, 4), 0.5, dtype=np.float32)
        again = omni.run({"x": x, "n": np.array([41], dtype=np.int64)})
        assert omni.execution_plan.stages[0].placement.fraction_on_target == 1.0
    assert outputs["y"].shape == (1, 4)
    assert outputs["m"].tolist() == [1]
    np.testing.assert_array_equal(again["y"], 2 * x)
    assert again["m"].tolist() == [42]
    assert list_my_pipelines(root) == [made]


def test_example_inputs_may_be_given(tmp_path: Path) -> None:
    graph = make_add_graph(tmp_path / "add.onnx", n=8)
    inputs = write_inputs(
        tmp_path / "ins.npz",
        {"a": np.arange(8, dtype=np.float32), "b": np.ones(8, dtype=np.float32)},
    )
    made = import_model(graph, name="my-add", inputs=inputs, root=tmp_path / "mine")
    with Omni(made.pipeline, selection=DeviceSelection()) as omni:
        assert omni.run()["c"].tolist() == [float(v) + 1 for v in range(8)]


def _bad_onnx(kind: str, path: Path) -> Path:
    if kind == "truncated":
        data = (make_add_graph(path.with_name("whole.onnx"), n=4096)).read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "text":
        path.write_text("not a model", encoding="utf-8")
    elif kind == "string-input":
        graph = helper.make_graph(
            [helper.make_node("Identity", ["s"], ["t"])],
            "strings",
            [helper.make_tensor_value_info("s", TensorProto.STRING, [1])],
            [helper.make_tensor_value_info("t", TensorProto.STRING, [1])],
        )
        onnx.save(_model(graph), str(path))
    elif kind == "unknown-op":
        graph = helper.make_graph(
            [helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")],
            "unknown",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        )
        onnx.save(_model(graph, "com.example"), str(path))
    return path


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("truncated", "cannot be read as an ONNX model"),
        ("text", "cannot be read as an ONNX model"),
        ("string-input", "input 's' is of type STRING; accepted: tensors of float"),
        ("unknown-op", "does not run in ONNX Runtime on the CPU with its example inputs"),
    ],
)
def test_a_bad_onnx_file_is_refused_by_name_and_leaves_nothing(
    kind: str, message: str, tmp_path: Path
) -> None:
    source = _bad_onnx(kind, tmp_path / "bad.onnx")
    root = tmp_path / "mine"
    with pytest.raises(ModelImportError) as caught:
        import_model(source, root=root)
    assert str(source) in str(caught.value)
    assert message in str(caught.value)
    assert _left(root) == []


def test_names_and_kinds_are_checked_before_anything_is_made(tmp_path: Path) -> None:
    root = tmp_path / "mine"
    graph = make_add_graph(tmp_path / "add.onnx", n=4)
    with pytest.raises(
        ModelImportError, match=re.escape("pipeline name '../x'; accepted: 1 to 64")
    ):
        import_model(graph, name="../x", root=root)
    with pytest.raises(ModelImportError, match="does not exist; accepted: an ONNX file"):
        import_model(tmp_path / "nothing.onnx", root=root)
    notes = tmp_path / "notes.txt"
    notes.write_text("hello", encoding="utf-8")
    with pytest.raises(ModelImportError, match="not a model this accepts; accepted: an ONNX"):
        import_model(notes, root=root)
    with pytest.raises(ModelImportError, match="speech is for language models"):
        import_model(graph, speak=True, root=root)
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGML" + bytes(64))
    with pytest.raises(ModelImportError, match="does not start like a GGUF file"):
        import_model(fake, root=root)
    assert _left(root) == []
    import_model(graph, root=root)
    with pytest.raises(ModelImportError, match="a pipeline named 'add' exists"):
        import_model(graph, root=root)
    assert _left(root) == ["add"]


def _safetensors(path: Path, *, truncate: bool = False) -> None:
    data = np.zeros(16, dtype=np.float32).tobytes()
    header = json.dumps(
        {"w": {"dtype": "F32", "shape": [16], "data_offsets": [0, len(data)]}}
    ).encode()
    blob = len(header).to_bytes(8, "little") + header + data
    path.write_bytes(blob[:-10] if truncate else blob)


def _model_folder(folder: Path, *, missing: str = "", truncate: bool = False) -> Path:
    folder.mkdir()
    if missing != "config":
        (folder / "config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    if missing != "weights":
        _safetensors(folder / "model.safetensors", truncate=truncate)
    if missing != "tokenizer":
        (folder / "tokenizer.json").write_text("{}", encoding="utf-8")
    return folder


@pytest.fixture
def voice_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data directory whose voice manifests exist (enough to parse a chat-speak file)."""
    for part in ("acoustic", "decoder"):
        manifest = tmp_path / "data" / "voices" / "joe" / part / "manifest.json"
        manifest.parent.mkdir(parents=True)
        manifest.write_text("{}", encoding="utf-8")
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


@pytest.mark.usefixtures("voice_data")
def test_a_model_folder_becomes_a_chat_or_chat_speak_pipeline(tmp_path: Path) -> None:
    folder = _model_folder(tmp_path / "my-model")
    root = tmp_path / "mine"
    chat = import_model(folder, root=root)
    assert (chat.name, chat.kind) == ("my-model", CHAT)
    config = load_pipeline(chat.pipeline)
    assert len(config.stages) == 1
    assert config.stages[0].backend.model == folder  # type: ignore[union-attr]
    # float32: vLLM's CPU kernels in bfloat16 answer wrongly on some CPUs; the demand covers
    # the weights loaded in float32 (twice a 16-bit folder) and as much again for loading.
    assert config.stages[0].backend.engine_args.dtype == "float32"  # type: ignore[union-attr]
    weights = (folder / "model.safetensors").stat().st_size
    assert config.stages[0].resource_budget.demands["machine:ram"] == LLM_BASE_DEMAND + 4 * weights
    assert config.adapter is not None
    assert config.adapter.options["prompt_template"] == "chat"
    spoken = import_model(folder, name="spoken", speak=True, root=root)
    assert spoken.kind == CHAT_SPEAK
    config = load_pipeline(spoken.pipeline)
    assert [type(stage.backend).__name__ for stage in config.stages] == [
        "LlmBackendConfig",
        "GraphBackendConfig",
        "GraphBackendConfig",
    ]
    assert config.adapter is not None
    assert config.adapter.name == "runtime.adapters.chat_speak:ChatSpeakProgram"
    assert config.adapter.options["prompt_template"] == "chat"
    assert [entry.name for entry in list_my_pipelines(root)] == ["my-model", "spoken"]
    # Removing a pipeline leaves the model folder it referenced.
    remove_my_pipeline("my-model", root)
    assert folder.is_dir()
    assert [entry.name for entry in list_my_pipelines(root)] == ["spoken"]
    with pytest.raises(ModelImportError, match=r"no pipeline named 'my-model'.*made here: spoken"):
        remove_my_pipeline("my-model", root)


@pytest.mark.parametrize(
    ("missing", "truncate", "message"),
    [
        ("config", False, "has no config.json"),
        ("weights", False, "has no *.safetensors weights"),
        ("tokenizer", False, "has no tokenizer"),
        ("", True, "is truncated: its tensors need"),
    ],
)
def test_an_incomplete_model_folder_is_refused(
    missing: str, truncate: bool, message: str, tmp_path: Path
) -> None:
    folder = _model_folder(tmp_path / "broken", missing=missing, truncate=truncate)
    root = tmp_path / "mine"
    with pytest.raises(ModelImportError) as caught:
        import_model(folder, root=root)
    assert message in str(caught.value)
    assert str(folder) in str(caught.value)
    assert _left(root) == []


def test_leftovers_and_bad_records_do_not_break_the_list(tmp_path: Path) -> None:
    root = tmp_path / "mine"
    made = import_model(make_add_graph(tmp_path / "add.onnx", n=4), root=root)
    # A partial folder of a process that is gone, and a pipeline whose record is damaged.
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    stale = root / f".x.partial-{gone.stdout.strip()}"
    stale.mkdir()
    damaged = root / "damaged"
    damaged.mkdir()
    (damaged / "import.json").write_text("{", encoding="utf-8")
    assert list_my_pipelines(root) == [made]
    assert not stale.exists()
    with pytest.raises(
        ModelImportError, match=re.escape("damaged/import.json is not a pipeline record")
    ):
        read_record(damaged)


def test_the_pipeline_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(tmp_path / "data"))
    graph = make_add_graph(tmp_path / "add.onnx", n=4)
    assert main(["pipeline", "new", str(graph), "--name", "adder", "--json"]) == EXIT_OK
    made = json.loads(capsys.readouterr().out)
    assert made["kind"] == GRAPH
    assert Path(made["pipeline"]) == tmp_path / "data" / "pipelines" / "adder" / "pipeline.yaml"
    assert main(["pipeline", "list"]) == EXIT_OK
    assert capsys.readouterr().out.startswith(f"adder\tgraph\t{made['pipeline']}")
    assert main(["run", made["pipeline"]]) == EXIT_OK
    assert "c: float32 [4]" in capsys.readouterr().out
    assert main(["pipeline", "new", str(graph), "--name", "adder"]) == EXIT_USAGE
    assert "a pipeline named 'adder' exists" in capsys.readouterr().err
    assert main(["pipeline", "remove", "adder"]) == EXIT_OK
    assert main(["pipeline", "list", "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out) == []
    assert not [p for p in (tmp_path / "data" / "pipelines").iterdir()]
    assert os.environ["OMNI_EDGE_DATA_DIR"] == str(tmp_path / "data")
