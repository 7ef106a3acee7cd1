"""A language-model stage that cannot start is refused before any worker exists.

What the pipeline file alone cannot show is checked when the pipeline starts, before the
plan is reserved: the route's environment, the demand against the model's weights and KV
cache, the remote route's API key. No vLLM is needed: nothing gets as far as starting it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime.api import Omni
from runtime.backends.vllm_client import pinning_env
from runtime.config import LlmRouteConfig, load_pipeline
from runtime.contracts.devices import DeviceKind
from runtime.devices import (
    DeviceSelection,
    Topology,
    check_route_device,
    discover_topology,
    load_topology,
)
from runtime.engine.stage_runtime import StageRuntime
from runtime.errors import ConfigError, DeviceExcluded, UsageError
from runtime.events import Event, EventBus, StageStarting
from runtime.host import RouteError
from runtime.ledger import ResourceLedger
from runtime.planning import plan_pipeline

GiB = 1 << 30
TOPOLOGIES = Path(__file__).resolve().parents[3] / "assets" / "topologies"


def _pipeline(tmp_path: Path, backend: str, demand: str = "3GiB") -> Path:
    path = tmp_path / "llm.yaml"
    path.write_text(
        "pipeline: llm\nasync_chunk: false\nstages:\n  - stage_id: 0\n    backend:\n"
        f"{backend}"
        "    resource_budget:\n"
        "      capacities: {machine:ram: 64GiB}\n"
        f"      demands: {{machine:ram: {demand}}}\n",
        encoding="utf-8",
    )
    return path


def _refused(path: Path, error: type[Exception]) -> Exception:
    events = EventBus()
    recorded: list[Event] = []
    events.subscribe(recorded.append)
    ledger = ResourceLedger(name="refusals")
    with pytest.raises(error) as info:
        Omni(path, ledger=ledger, events=events)
    assert not [event for event in recorded if isinstance(event, StageStarting)]
    assert ledger.snapshot().is_empty
    return info.value


def test_a_missing_environment_names_the_route_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(tmp_path / "data"))
    path = _pipeline(
        tmp_path,
        "      name: native.vllm.v1\n      model: tiny\n"
        "      route: {interpreter: 'env:not-created'}\n",
    )
    error = _refused(path, RouteError)
    assert isinstance(error, RouteError)
    assert (error.file, error.line, error.key) == (
        str(path),
        4,
        "stages[0].backend.route.interpreter",
    )
    assert "omni-edge env create not-created" in str(error)


def test_a_demand_below_the_weights_and_kv_cache_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}", encoding="utf-8")
    with (model / "model.safetensors").open("wb") as weights:
        weights.truncate(2 * GiB)  # sparse: its size counts, not its disk
    path = _pipeline(
        tmp_path,
        "      name: native.vllm.v1\n      model: model\n"
        "      engine: {kv_cache_memory_bytes: 1GiB}\n"
        "      route: {interpreter: bundled}\n",
        demand="2GiB",
    )
    error = _refused(path, ConfigError)
    assert isinstance(error, ConfigError)
    assert (error.file, error.key) == (str(path), "stages[0].resource_budget.demands[machine:ram]")
    assert f"at least {3 * GiB} bytes" in str(error)


def test_a_remote_route_needs_its_api_key_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMNI_TEST_UNSET_KEY", raising=False)
    assert "OMNI_TEST_UNSET_KEY" not in os.environ
    path = _pipeline(
        tmp_path,
        "      name: native.vllm.v1\n"
        "      route: {url: 'http://127.0.0.1:9/v1', model: m, api_key_env: OMNI_TEST_UNSET_KEY}\n",
        demand="0",
    )
    error = _refused(path, ConfigError)
    assert isinstance(error, ConfigError)
    assert error.key == "stages[0].backend.route.api_key_env"
    assert "OMNI_TEST_UNSET_KEY holds no API key" in str(error)


def test_a_text_pipeline_has_no_example_tensors(tmp_path: Path) -> None:
    """Refused before start: ``Omni.example_inputs`` is for graph chains."""
    path = _pipeline(
        tmp_path,
        "      name: native.vllm.v1\n      model: tiny\n      route: {interpreter: bundled}\n",
    )
    runtime = StageRuntime(
        load_pipeline(path), ledger=ResourceLedger(name="examples"), events=EventBus()
    )
    with pytest.raises(UsageError, match="takes text, and has no example tensors"):
        runtime.example_inputs()


def _refused_on(path: Path, topology: Topology, selection: DeviceSelection) -> DeviceExcluded:
    events = EventBus()
    recorded: list[Event] = []
    events.subscribe(recorded.append)
    ledger = ResourceLedger(name="devices")
    with pytest.raises(DeviceExcluded) as info:
        Omni(path, ledger=ledger, events=events, topology=topology, selection=selection)
    assert not [event for event in recorded if isinstance(event, StageStarting)]
    assert ledger.snapshot().is_empty
    return info.value


def test_excluding_the_cpu_refuses_a_local_engine_before_anything_starts(tmp_path: Path) -> None:
    topology = discover_topology()
    cpu = next(device for device in topology.devices if device.kind is DeviceKind.CPU)
    excluded = DeviceSelection().exclude(topology, cpu.physical_id)
    path = _pipeline(tmp_path, "      name: native.vllm.v1\n      model: tiny\n")
    error = _refused_on(path, topology, excluded)
    assert f"({cpu.physical_id}) which is excluded by your device selection" in str(error)


def test_a_cuda_engine_needs_a_gpu_its_domain_reaches(tmp_path: Path) -> None:
    path = _pipeline(
        tmp_path,
        "      name: native.vllm.v1\n      model: tiny\n      route: {name: gpu-llm, ep: cuda}\n",
    )
    # This machine has no CUDA GPU.
    error = _refused_on(path, discover_topology(), DeviceSelection())
    assert "targets CUDAExecutionProvider, but no" in str(error)
    # A topology whose GPU is seen only from Windows refuses it to a WSL route.
    windows_gpu = load_topology(TOPOLOGIES / "cpu-dgpu.yaml")
    error = _refused_on(path, windows_gpu, DeviceSelection())
    assert "route gpu-llm has os_domain 'posix'" in str(error)
    assert "reached only from windows" in str(error)


def test_a_cuda_engine_is_pinned_to_the_gpu_admission_chose() -> None:
    topology = load_topology(TOPOLOGIES / "cpu-dgpu-wsl.yaml")
    gpu = check_route_device(
        topology,
        DeviceSelection(),
        ep="cuda",
        target_provider=LlmRouteConfig(ep="cuda").target_provider,
        stage="stage-0",
        os_domain="posix",
        route="gpu-llm",
    )
    assert gpu.kind is DeviceKind.DGPU
    assert pinning_env("cuda", gpu.physical_id) == {"CUDA_VISIBLE_DEVICES": gpu.physical_id}
    assert pinning_env("cpu", "CPU-x") == {}
    # The vllm-cuda environment implies ep: cuda; anything else ep: cpu.
    assert LlmRouteConfig(interpreter="env:vllm-cuda").ep == "cuda"
    assert LlmRouteConfig().ep == "cpu"


def test_a_local_engine_in_the_other_os_domain_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    path = _pipeline(
        tmp_path,
        "      name: native.vllm.v1\n      model: tiny\n"
        "      route: {name: windows-llm, os_domain: windows, interpreter: bundled}\n",
    )
    # A machine whose CPU both Windows and WSL reach: the device check passes.
    both = load_topology(TOPOLOGIES / "cpu-igpu-npu-dgpu-wsl.yaml")
    events = EventBus()
    recorded: list[Event] = []
    events.subscribe(recorded.append)
    ledger = ResourceLedger(name="domains")
    with pytest.raises(RouteError) as caught:
        Omni(path, ledger=ledger, events=events, topology=both, selection=DeviceSelection())
    assert caught.value.key == "stages[0].backend.route.os_domain"
    assert "route windows-llm has os_domain 'windows'" in str(caught.value)
    assert "accepted: os_domain: posix" in str(caught.value)
    assert not [event for event in recorded if isinstance(event, StageStarting)]
    assert ledger.snapshot().is_empty


def _cuda_pipeline(tmp_path: Path, demands: str) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}", encoding="utf-8")
    with (model / "model.safetensors").open("wb") as weights:
        weights.truncate(2 * GiB)  # sparse: its size counts, not its disk
    path = tmp_path / "gpu.yaml"
    path.write_text(
        "pipeline: gpu-llm\nasync_chunk: false\nstages:\n  - stage_id: 0\n    backend:\n"
        "      name: native.vllm.v1\n      model: model\n"
        "      engine: {kv_cache_memory_bytes: 1GiB}\n"
        "      route: {name: gpu-llm, ep: cuda, interpreter: bundled}\n"
        "    resource_budget:\n"
        f"      capacities: {{machine:ram: 64GiB, '{VRAM}': 24GiB}}\n"
        f"      demands: {{{demands}}}\n",
        encoding="utf-8",
    )
    return path


VRAM = "machine:vram:GPU-00000000-0000-4000-8000-000000000001"


def test_a_cuda_engine_charges_its_weights_and_kv_cache_to_the_gpus_memory(
    tmp_path: Path,
) -> None:
    topology = load_topology(TOPOLOGIES / "cpu-dgpu-wsl.yaml")
    # RAM alone does not hold a CUDA engine's weights: the GPU's memory must.
    path = _cuda_pipeline(tmp_path, "machine:ram: 3GiB")
    events = EventBus()
    ledger = ResourceLedger(name="cuda-refused")
    with pytest.raises(ConfigError) as caught:
        Omni(path, ledger=ledger, events=events, topology=topology, selection=DeviceSelection())
    assert ledger.snapshot().is_empty
    error = caught.value
    assert error.key == f"stages[0].resource_budget.demands[{VRAM}]"
    assert f"demands 0 bytes of {VRAM}, less than the weights" in str(error)
    assert f"at least {3 * GiB} bytes" in str(error)
    # Enough of the GPU's memory: admitted, and the engine's spec names that constraint.
    enough = tmp_path / "enough"
    enough.mkdir()
    path = _cuda_pipeline(enough, f"machine:ram: 2GiB, '{VRAM}': 4GiB")
    runtime = StageRuntime(
        load_pipeline(path),
        ledger=ResourceLedger(name="cuda"),
        events=EventBus(),
        topology=topology,
        selection=DeviceSelection(),
    )
    (found,) = runtime._resolve()
    assert getattr(found, "memory", None) == VRAM
    # The plan warns of a CUDA engine that demands nothing of its GPU's memory.
    warned = plan_pipeline(tmp_path / "gpu.yaml", topology=topology, selection=DeviceSelection())
    assert any(f"demands nothing of {VRAM}" in warning for warning in warned.warnings)
    planned = plan_pipeline(path, topology=topology, selection=DeviceSelection())
    assert not [warning for warning in planned.warnings if "demands nothing" in warning]
