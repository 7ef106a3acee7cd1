"""The ``omni-edge`` command line: exit codes, messages and JSON shapes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.onnx_graphs import example_inputs, make_add_graph, make_bundle, write_inputs

from runtime.cli import main

PIPELINE = """\
pipeline: cli-test
async_chunk: false
stages:
  - stage_id: 0
    backend:
      name: external.graph.v1
      manifest: {manifest}
      route: {{name: cpu, interpreter: bundled, worker: ort, ep: cpu, os_domain: posix, max_io_bytes: 1MiB}}
    resource_budget:
      capacities: {{machine:ram: 1GiB}}
      demands: {{machine:ram: {demand0}}}
  - stage_id: 1
    backend:
      name: external.graph.v1
      manifest: {manifest}
      route: {{name: cpu, interpreter: bundled, worker: ort, ep: cpu, os_domain: posix, max_io_bytes: 1MiB}}
    custom_process_input_func: helpers.transforms:passthrough
    resource_budget:
      capacities: {{machine:ram: 1GiB}}
      demands: {{machine:ram: {demand1}}}
"""


def _flip_byte(path: Path, offset: int = 20) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return make_bundle(tmp_path, kind="add")


def _pipeline(tmp_path: Path, manifest: Path, demand0: str, demand1: str) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(PIPELINE.format(manifest=manifest, demand0=demand0, demand1=demand1))
    return path


def test_verify_good_bundle_exits_0(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(bundle)]) == 0
    out = capsys.readouterr().out
    assert "verified" in out
    assert "add.onnx" in out


def test_verify_flipped_byte_exits_3_naming_the_file(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _flip_byte(bundle.parent / "add.onnx")
    assert main(["verify", str(bundle)]) == 3
    captured = capsys.readouterr()
    assert "hash_mismatch" in captured.out
    assert "'add.onnx'" in captured.err


def test_verify_json_shape(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _flip_byte(bundle.parent / "inputs.npz", offset=40)
    assert main(["verify", str(bundle), "--json"]) == 3
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    statuses = {entry["name"]: entry["status"] for entry in report["files"]}
    assert statuses == {"add.onnx": "ok", "inputs.npz": "hash_mismatch"}
    assert report["errors"][0]["code"] == "hash_mismatch"
    assert report["errors"][0]["subject"] == "inputs.npz"


def test_verify_missing_manifest_exits_3(tmp_path: Path) -> None:
    assert main(["verify", str(tmp_path / "nothing")]) == 3


def test_plan_admitted(tmp_path: Path, bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pipeline = _pipeline(tmp_path, bundle, "256MiB", "256MiB")
    assert main(["plan", str(pipeline)]) == 0
    out = capsys.readouterr().out
    assert "machine:ram: capacity 1.0 GiB" in out
    assert "fits" in out


def test_plan_overcommit_across_two_stages_exits_3_naming_the_constraint(
    tmp_path: Path, bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline = _pipeline(tmp_path, bundle, "600MiB", "600MiB")
    assert main(["plan", str(pipeline)]) == 3
    out = capsys.readouterr().out
    assert "refused: admission: machine:ram needs 1.2 GiB for stage-0, stage-1" in out


def test_plan_json_shape(tmp_path: Path, bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pipeline = _pipeline(tmp_path, bundle, "600MiB", "600MiB")
    assert main(["plan", str(pipeline), "--json"]) == 3
    plan = json.loads(capsys.readouterr().out)
    assert plan["admitted"] is False
    assert [s["stage"] for s in plan["stages"]] == ["stage-0", "stage-1"]
    assert plan["stages"][0]["bundle"]["ok"] is True
    (ram,) = plan["budget"]["constraints"]
    assert ram["constraint"] == "machine:ram"
    assert ram["total"] == 1200 * 2**20
    assert ram["fits"] is False


def test_plan_refuses_a_tampered_bundle(
    tmp_path: Path, bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline = _pipeline(tmp_path, bundle, "1MiB", "1MiB")
    _flip_byte(bundle.parent / "add.onnx")
    assert main(["plan", str(pipeline)]) == 3
    assert "add.onnx" in capsys.readouterr().out


def test_plan_invalid_config_exits_2_with_line(
    tmp_path: Path, bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline = _pipeline(tmp_path, bundle, "1MiB", "-5")
    assert main(["plan", str(pipeline)]) == 2
    err = capsys.readouterr().err
    assert f"{pipeline}:20" in err
    assert "demands" in err


def test_bundle_create_then_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = make_add_graph(tmp_path / "src" / "add.onnx")
    inputs = write_inputs(tmp_path / "src" / "inputs.npz", example_inputs("add"))
    out = tmp_path / "bundle"
    code = main(
        [
            "bundle",
            "create",
            str(graph),
            "--inputs",
            str(inputs),
            "--out",
            str(out),
            "--component",
            "adder",
            "--meta",
            "checkpoint_revision=r1",
            "--json",
        ]
    )
    assert code == 0
    created = json.loads(capsys.readouterr().out)
    assert created["component"] == "adder"
    assert created["metadata"]["checkpoint_revision"] == "r1"
    assert main(["verify", str(out)]) == 0


def test_bundle_create_bad_meta_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph = make_add_graph(tmp_path / "add.onnx")
    inputs = write_inputs(tmp_path / "inputs.npz", example_inputs("add"))
    code = main(
        [
            "bundle",
            "create",
            str(graph),
            "--inputs",
            str(inputs),
            "--out",
            str(tmp_path / "b"),
            "--meta",
            "no-equals-sign",
        ]
    )
    assert code == 2
    assert "no-equals-sign" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_usage_error_exits_2() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["verify"])
    assert exc.value.code == 2


def test_console_script_exit_codes(bundle: Path) -> None:
    """The installed entry point maps a refusal to exit code 3 in a real process."""
    command = [sys.executable, "-m", "runtime.cli", "verify", str(bundle)]
    assert subprocess.run(command, capture_output=True, check=False).returncode == 0
    _flip_byte(bundle.parent / "add.onnx")
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 3
    assert "add.onnx" in result.stderr
