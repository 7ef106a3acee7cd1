"""``omni-edge devices`` and the device checks of ``plan``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.onnx_graphs import make_bundle

from runtime.cli import main

ROOT = Path(__file__).resolve().parents[2]
LAPTOP = ROOT / "assets" / "topologies" / "hx370-rtx5090-laptop.yaml"
CPU_WSL = ROOT / "assets" / "topologies" / "cpu-only-wsl.yaml"
TOPOLOGIES = ROOT / "assets" / "topologies"


@pytest.fixture(autouse=True)
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "config"
    monkeypatch.setenv("OMNI_EDGE_CONFIG_DIR", str(directory))
    return directory


def _devices_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["devices", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_this_machine_lists_the_cpu_with_machine_ram(capsys: pytest.CaptureFixture[str]) -> None:
    document = _devices_json(capsys)
    cpus = [d for d in document["devices"] if d["kind"] == "cpu"]
    assert len(cpus) == 1
    assert "machine:ram" in cpus[0]["memory_constraints"]
    assert document["constraints"]["machine:ram"]["capacity"] > 0


def test_laptop_topology_lists_four_kinds_and_dgpu_vram(
    capsys: pytest.CaptureFixture[str],
) -> None:
    document = _devices_json(capsys, "--topology", str(LAPTOP))
    kinds = {d["kind"]: d for d in document["devices"]}
    assert set(kinds) == {"cpu", "igpu", "npu", "dgpu"}
    dgpu = kinds["dgpu"]
    vram = [c for c in dgpu["memory_constraints"] if c.startswith("machine:vram:")]
    assert vram == [f"machine:vram:{dgpu['physical_id']}"]
    for kind in ("cpu", "igpu", "npu"):
        assert kinds[kind]["memory_constraints"] == ["machine:ram"]


def test_table_output_names_devices(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--topology", str(LAPTOP)]) == 0
    out = capsys.readouterr().out
    assert "RTX 5090" in out
    assert "machine:vram:" in out


def test_selection_persists(config_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    laptop = _devices_json(capsys, "--topology", str(LAPTOP))
    dgpu = next(d["physical_id"] for d in laptop["devices"] if d["kind"] == "dgpu")
    document = _devices_json(capsys, "--topology", str(LAPTOP), "--exclude", dgpu)
    assert dgpu not in document["selection"]["allowed"]
    saved = json.loads((config_dir / "devices.json").read_text())
    assert dgpu not in saved["allowed"]
    again = _devices_json(capsys, "--topology", str(LAPTOP))
    assert again["selection"]["allowed"] == document["selection"]["allowed"]
    restored = _devices_json(capsys, "--topology", str(LAPTOP), "--allow-all")
    assert restored["selection"]["allowed"] is None


def test_unknown_device_id_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--topology", str(LAPTOP), "--exclude", "GPU-nope"]) == 2
    assert "GPU-nope" in capsys.readouterr().err


def _cpu_pipeline(tmp_path: Path, extra_demands: str = "", os_domain: str = "posix") -> Path:
    manifest = make_bundle(tmp_path, kind="add")
    path = tmp_path / "p.yaml"
    path.write_text(
        f"""\
pipeline: device-check
async_chunk: false
stages:
  - stage_id: 0
    backend:
      name: external.graph.v1
      manifest: {manifest}
      route: {{name: cpu, interpreter: bundled, worker: ort, ep: cpu, os_domain: {os_domain},
              max_io_bytes: 1MiB}}
    resource_budget:
      capacities: {{machine:ram: 1GiB{", wsl:quota: 1GiB" if extra_demands else ""}}}
      demands: {{machine:ram: 64MiB{extra_demands}}}
"""
    )
    return path


def test_plan_refuses_a_route_on_an_excluded_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The laptop's topology is native Windows: its routes run in the windows domain.
    pipeline = _cpu_pipeline(tmp_path, os_domain="windows")
    laptop = _devices_json(capsys, "--topology", str(LAPTOP))
    cpu = next(d["physical_id"] for d in laptop["devices"] if d["kind"] == "cpu")
    others = [d["physical_id"] for d in laptop["devices"] if d["physical_id"] != cpu]
    code = main(["plan", str(pipeline), "--topology", str(LAPTOP), "--devices", ",".join(others)])
    assert code == 3
    out = capsys.readouterr().out
    assert f"({cpu}) which is excluded" in out
    assert "omni-edge devices --allow" in out


def test_plan_warns_about_the_wsl_double_charge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline = _cpu_pipeline(tmp_path)
    assert main(["plan", str(pipeline), "--topology", str(CPU_WSL), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert any("wsl:quota" in warning for warning in plan["warnings"])
    both = _cpu_pipeline(tmp_path / "both", extra_demands=", wsl:quota: 64MiB")
    assert main(["plan", str(both), "--topology", str(CPU_WSL), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert not any("demands nothing" in warning for warning in plan["warnings"])


def _dml_pipeline(tmp_path: Path, os_domain: str) -> Path:
    manifest = make_bundle(tmp_path, kind="add")
    path = tmp_path / f"dml-{os_domain}.yaml"
    path.write_text(
        f"""\
pipeline: dml-check
async_chunk: false
stages:
  - stage_id: 0
    backend:
      name: external.graph.v1
      manifest: {manifest}
      route: {{name: igpu-dml, interpreter: bundled, worker: ort, ep: dml,
              os_domain: {os_domain}, max_io_bytes: 1MiB,
              allowed_providers: [DmlExecutionProvider, CPUExecutionProvider]}}
    resource_budget:
      capacities: {{machine:ram: 1GiB, wsl:quota: 1GiB}}
      demands: {{machine:ram: 64MiB, wsl:quota: 64MiB}}
"""
    )
    return path


def test_plan_refuses_a_route_whose_domain_cannot_reach_its_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topology = TOPOLOGIES / "cpu-igpu-npu-dgpu-wsl.yaml"
    # From WSL (os_domain posix) DirectML reaches no device: the integrated GPU is seen only
    # from Windows, and DirectML exists only in Windows builds of ONNX Runtime.
    posix = _dml_pipeline(tmp_path, "posix")
    assert main(["plan", str(posix), "--topology", str(topology)]) == 3
    out = capsys.readouterr().out
    assert "route igpu-dml has os_domain 'posix' and runs in the wsl domain" in out
    assert "DmlExecutionProvider runs only in the windows domain" in out
    assert "accepted: os_domain: windows for Example integrated GPU (PCI-0000:c4:00.0)" in out
    assert "REFUSED" in out
    # The same route from Windows is admitted, on the integrated GPU.
    windows = _dml_pipeline(tmp_path / "w", "windows")
    assert main(["plan", str(windows), "--topology", str(topology)]) == 0
    assert "Example integrated GPU" in capsys.readouterr().out


def test_a_windows_only_device_is_refused_to_a_posix_route_and_the_reverse() -> None:
    from runtime.devices import DeviceSelection, check_route_device, load_topology
    from runtime.errors import DeviceExcluded

    topology = load_topology(TOPOLOGIES / "cpu-igpu-npu-dgpu-wsl.yaml")
    with pytest.raises(DeviceExcluded, match=r"reached only from windows"):
        check_route_device(
            topology,
            DeviceSelection(),
            ep="vitisai",
            target_provider="VitisAIExecutionProvider",
            stage="stage-0",
            os_domain="posix",
            route="npu",
        )
    npu = check_route_device(
        topology,
        DeviceSelection(),
        ep="vitisai",
        target_provider="VitisAIExecutionProvider",
        stage="stage-0",
        os_domain="windows",
        route="npu",
    )
    assert npu.kind.value == "npu"
    # A device seen only from WSL is out of a Windows route's reach.
    machine = load_topology(CPU_WSL)
    with pytest.raises(DeviceExcluded, match=r"runs in the windows domain.*reached only from wsl"):
        check_route_device(
            machine,
            DeviceSelection(),
            ep="cpu",
            target_provider="CPUExecutionProvider",
            stage="stage-0",
            os_domain="windows",
            route="win-cpu",
        )


def test_plan_names_the_device_of_a_language_model_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline = tmp_path / "llm.yaml"
    pipeline.write_text(
        """\
pipeline: llm-device
async_chunk: false
stages:
  - stage_id: 0
    backend:
      name: native.vllm.v1
      model: tiny
      route: {name: gpu-llm, ep: cuda}
    resource_budget:
      capacities: {machine:ram: 8GiB, wsl:quota: 8GiB}
      demands: {machine:ram: 3GiB, wsl:quota: 3GiB}
""",
        encoding="utf-8",
    )
    topology = TOPOLOGIES / "cpu-dgpu-wsl.yaml"
    assert main(["plan", str(pipeline), "--topology", str(topology), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    (stage,) = document["stages"]
    assert stage["device"].startswith("Example discrete GPU (GPU-")
    gpu = stage["device"].split("(")[1].rstrip(")")
    listed = _devices_json(capsys, "--topology", str(topology))
    others = [d["physical_id"] for d in listed["devices"] if d["physical_id"] != gpu]
    code = main(["plan", str(pipeline), "--topology", str(topology), "--devices", ",".join(others)])
    assert code == 3
    assert f"({gpu}) which is excluded by your device selection" in capsys.readouterr().out
