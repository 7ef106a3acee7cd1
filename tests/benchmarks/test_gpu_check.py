"""``make gpu-check``: its no-GPU path for real, its GPU detection on recorded driver output,
and the CUDA pipelines it runs checked by ``plan`` against a machine described with a GPU."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from benchmarks.gpu_check import (
    RESULTS,
    NvidiaGpu,
    cuda_pipeline,
    find_nvidia_gpus,
)
from runtime.devices import DeviceSelection, load_topology
from runtime.planning import plan_pipeline

REPO_ROOT = Path(__file__).resolve().parents[2]
#: A machine described with a CUDA GPU that its WSL reaches.
GPU_TOPOLOGY = REPO_ROOT / "assets" / "topologies" / "cpu-dgpu-wsl.yaml"
GPU_UUID = "GPU-00000000-0000-4000-8000-000000000001"
GiB = 1 << 30

#: ``nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader,nounits``
#: on a machine with two GPUs.
SMI_OUTPUT = (
    "NVIDIA H200, GPU-3f1c2b7e-9a41-4c55-8e0d-1b2a3c4d5e6f, 570.124.06, 143771\n"
    "NVIDIA GeForce RTX 5090 Laptop GPU, GPU-5090a1b2-c3d4-4e5f-8a6b-7c8d9e0f1a2b, 576.02, 24463\n"
)
#: ``/proc/driver/nvidia/gpus/0000:01:00.0/information`` as the Linux driver writes it.
PROC_INFORMATION = (
    "Model: \t\t NVIDIA H200\nIRQ:   \t\t 154\nGPU UUID: \t GPU-3f1c2b7e-9a41-4c55-8e0d-1b2a3c4d5e6f\n"
    "Video BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
    "Bus Location: \t 0000:01:00.0\n"
)


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


@pytest.mark.skipif(bool(find_nvidia_gpus()), reason="this machine has an NVIDIA GPU")
def test_without_a_gpu_make_gpu_check_says_so_and_installs_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    venv_before = (REPO_ROOT / ".venv").exists()
    results_before = _digest(RESULTS)
    environment = dict(os.environ, OMNI_EDGE_DATA_DIR=str(data), MAKEFLAGS="")
    done = subprocess.run(
        ["make", "-s", "gpu-check"],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("gpu-check: no NVIDIA GPU on this machine"), done.stdout
    assert len(done.stdout.splitlines()) == 1
    # Nothing set up, created or written.
    assert not data.exists()
    assert (REPO_ROOT / ".venv").exists() == venv_before
    assert _digest(RESULTS) == results_before


def test_gpus_come_from_nvidia_smi(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, SMI_OUTPUT, "")

    gpus = find_nvidia_gpus(proc=tmp_path, which=lambda _name: "/usr/bin/nvidia-smi", run=run)
    assert gpus == (
        NvidiaGpu("NVIDIA H200", "GPU-3f1c2b7e-9a41-4c55-8e0d-1b2a3c4d5e6f", "570.124.06", 143771),
        NvidiaGpu(
            "NVIDIA GeForce RTX 5090 Laptop GPU",
            "GPU-5090a1b2-c3d4-4e5f-8a6b-7c8d9e0f1a2b",
            "576.02",
            24463,
        ),
    )
    assert calls[0][0] == "/usr/bin/nvidia-smi"


def test_without_nvidia_smi_the_driver_folder_is_read(tmp_path: Path) -> None:
    folder = tmp_path / "driver" / "nvidia" / "gpus" / "0000:01:00.0"
    folder.mkdir(parents=True)
    (folder / "information").write_text(PROC_INFORMATION, encoding="utf-8")
    gpus = find_nvidia_gpus(proc=tmp_path, which=lambda _name: None)
    assert gpus == (NvidiaGpu("NVIDIA H200", "GPU-3f1c2b7e-9a41-4c55-8e0d-1b2a3c4d5e6f"),)
    # A driver that lists no GPU, or no driver at all: none.
    assert find_nvidia_gpus(proc=tmp_path / "empty", which=lambda _name: None) == ()


@pytest.fixture(scope="module")
def demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo bundles built beside a copy of the demo pipelines."""
    root = tmp_path_factory.mktemp("demos")
    subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "assets" / "build_demos.py"),
            "--out",
            str(root / "bundles"),
        ],
        check=True,
        capture_output=True,
    )
    shutil.copytree(REPO_ROOT / "assets" / "pipelines", root / "pipelines")
    return root


@pytest.mark.parametrize("name", ["add", "mlp-chain"])
def test_the_cuda_demos_pass_plan_on_a_machine_with_a_cuda_gpu(
    demos: Path, tmp_path: Path, name: str
) -> None:
    pipeline = cuda_pipeline(
        demos / "pipelines" / f"{name}.yaml",
        tmp_path / f"{name}-cuda.yaml",
        gpu_uuid=GPU_UUID,
        vram_capacity=15 * GiB,
    )
    plan = plan_pipeline(
        pipeline, topology=load_topology(GPU_TOPOLOGY), selection=DeviceSelection()
    )
    assert plan.refusals == ()
    assert plan.warnings == ()
    for stage in plan.stages:
        assert stage.route["ep"] == "cuda"
        assert stage.route["interpreter"] == "env:ort-cuda"
        assert stage.route["allowed_providers"] == ["CUDAExecutionProvider"]
        assert stage.route["min_fraction_on_target"] == 1.0
        assert stage.device == f"Example discrete GPU ({GPU_UUID})"
        assert stage.demands[f"machine:vram:{GPU_UUID}"] == GiB


def test_chat_speak_moves_only_its_language_model_to_the_gpu(demos: Path, tmp_path: Path) -> None:
    pipeline = cuda_pipeline(
        demos / "pipelines" / "chat-speak.yaml",
        tmp_path / "chat-speak-cuda.yaml",
        gpu_uuid=GPU_UUID,
        vram_capacity=16 * GiB,
        graphs_on_gpu=False,
    )
    document = yaml.safe_load(pipeline.read_text(encoding="utf-8"))
    llm, acoustic, decoder = document["stages"]
    assert llm["backend"]["route"]["interpreter"] == "env:vllm-cuda"
    assert llm["backend"]["route"]["ep"] == "cuda"
    assert llm["resource_budget"]["demands"][f"machine:vram:{GPU_UUID}"] == "4GiB"
    for speech in (acoustic, decoder):
        assert speech["backend"]["route"]["ep"] == "cpu"
        assert f"machine:vram:{GPU_UUID}" not in speech["resource_budget"]["demands"]
        # Every stage declares the same capacities, the GPU's included.
        assert speech["resource_budget"]["capacities"] == llm["resource_budget"]["capacities"]
