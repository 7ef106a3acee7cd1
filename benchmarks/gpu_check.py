"""Check an NVIDIA GPU end to end and write ``benchmarks/results/gpu-check.json``.

``make gpu-check`` runs this. On a machine without an NVIDIA GPU it prints one line saying so
and exits 0, having installed nothing (``--probe``, which uses the standard library only, is
what the Makefile asks first). With a GPU it:

1. creates the managed environments ``ort-cuda`` (ONNX Runtime's CUDA build) and
   ``vllm-cuda`` (vLLM with CUDA), once; later runs reuse them;
2. runs the add and MLP-chain demos with every graph stage on ``CUDAExecutionProvider``: the
   placement gate at fraction 1.0 with no CPU provider allowed, the GPU's memory reserved
   (``machine:vram:<uuid>``), outputs compared with the same demo on the CPU;
3. runs chat-speak with its language-model stage on vLLM's CUDA build (the speech stages
   stay on the CPU);
4. writes what ran, on which device, with which provider options and placement, and every
   failure, into the results file. The exit status is 0 only when every check passed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "benchmarks" / "results" / "gpu-check.json"
PIPELINES = REPO_ROOT / "assets" / "pipelines"
CUDA = "CUDAExecutionProvider"
GRAPH_ENV = "ort-cuda"
LLM_ENV = "vllm-cuda"
#: GPU memory each stage reserves: a CUDA context and ONNX Runtime's arena for a small graph;
#: vLLM's context, the 135M model in bfloat16 and its 128 MiB KV cache, with headroom.
GRAPH_VRAM = "1GiB"
LLM_VRAM = "4GiB"
#: Exit status of ``--probe`` when there is no NVIDIA GPU (0 when there is one).
NO_GPU = 3
QUESTION = "What is the capital of France?"
RUN_TIMEOUT_S = 900.0
WSL_NVIDIA_SMI = Path("/usr/lib/wsl/lib/nvidia-smi")
_PROC_FIELD = re.compile(r"^([A-Za-z ]+):\s*(.*?)\s*$")


@dataclass(frozen=True, slots=True)
class NvidiaGpu:
    """One NVIDIA GPU as the driver reports it (``memory_mib`` None when unknown)."""

    name: str
    uuid: str
    driver: str | None = None
    memory_mib: int | None = None


def find_nvidia_gpus(
    *,
    proc: Path = Path("/proc"),
    which: Callable[[str], str | None] = shutil.which,
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
) -> tuple[NvidiaGpu, ...]:
    """The NVIDIA GPUs the driver shows: ``nvidia-smi`` where it is installed (on WSL in
    ``/usr/lib/wsl/lib``), else ``/proc/driver/nvidia/gpus``. Empty without a driver."""
    smi = which("nvidia-smi") or (str(WSL_NVIDIA_SMI) if WSL_NVIDIA_SMI.exists() else None)
    if smi is not None:
        try:
            listed = run(
                [
                    smi,
                    "--query-gpu=name,uuid,driver_version,memory.total",
                    "--format=csv,noheader,nounits",
                ],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            listed = None
        if listed is not None and listed.returncode == 0:
            gpus = [_smi_row(line) for line in listed.stdout.splitlines() if line.strip()]
            return tuple(gpu for gpu in gpus if gpu is not None)
    return _proc_gpus(proc / "driver" / "nvidia" / "gpus")


def _smi_row(line: str) -> NvidiaGpu | None:
    parts = [part.strip() for part in line.split(",")]
    if len(parts) != 4 or not parts[1].startswith("GPU-"):
        return None
    name, uuid, driver, memory = parts
    return NvidiaGpu(name, uuid, driver or None, int(memory) if memory.isdigit() else None)


def _proc_gpus(folder: Path) -> tuple[NvidiaGpu, ...]:
    gpus = []
    for information in sorted(folder.glob("*/information")):
        fields = {}
        for line in information.read_text(encoding="utf-8", errors="replace").splitlines():
            found = _PROC_FIELD.match(line)
            if found:
                fields[found.group(1).strip()] = found.group(2)
        if fields.get("GPU UUID", "").startswith("GPU-"):
            gpus.append(NvidiaGpu(fields.get("Model", "NVIDIA GPU"), fields["GPU UUID"]))
    return tuple(gpus)


def probe() -> int:
    """Say whether this machine has an NVIDIA GPU: 0 with one, :data:`NO_GPU` without."""
    gpus = find_nvidia_gpus()
    if not gpus:
        print(
            "gpu-check: no NVIDIA GPU on this machine (no GPU from nvidia-smi, none under "
            "/proc/driver/nvidia/gpus): nothing to check, nothing installed"
        )
        return NO_GPU
    for gpu in gpus:
        print(f"gpu-check: found {gpu.name} ({gpu.uuid})")
    return 0


# -- the pipelines the check runs -----------------------------------------------------------


def cuda_pipeline(
    source: Path,
    target: Path,
    *,
    gpu_uuid: str,
    vram_capacity: int,
    graphs_on_gpu: bool = True,
) -> Path:
    """``source`` with its graph stages on the CUDA provider in ``ort-cuda`` (``graphs_on_gpu``)
    and its language-model stages on vLLM's CUDA build, each reserving GPU memory; written to
    ``target``. Relative manifest paths are made absolute."""
    import yaml

    document = yaml.safe_load(source.read_text(encoding="utf-8"))
    vram = f"machine:vram:{gpu_uuid}"
    for stage in document["stages"]:
        backend = stage["backend"]
        budget = stage["resource_budget"]
        if backend["name"] == "external.graph.v1":
            manifest = str(backend["manifest"])
            if not manifest.startswith(("/", "${data}")):
                backend["manifest"] = str((source.parent / manifest).resolve())
            if not graphs_on_gpu:
                continue
            backend["route"].update(
                name="local-cuda",
                interpreter=f"env:{GRAPH_ENV}",
                ep="cuda",
                min_fraction_on_target=1.0,
                allowed_providers=[CUDA],
            )
            demand = GRAPH_VRAM
        else:
            route = backend.setdefault("route", {})
            route.update(name="local-vllm-cuda", interpreter=f"env:{LLM_ENV}", ep="cuda")
            demand = LLM_VRAM
        budget["capacities"][vram] = vram_capacity
        budget["demands"][vram] = demand
    # Every stage declares the same capacities, the GPU's included.
    capacities: dict[str, Any] = {}
    for stage in document["stages"]:
        capacities.update(stage["resource_budget"]["capacities"])
    for stage in document["stages"]:
        stage["resource_budget"]["capacities"] = dict(capacities)
    document["pipeline"] = f"{document['pipeline']}_cuda"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return target


# -- running ---------------------------------------------------------------------------------


def _cli(*args: str, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _stage_summaries(plan_file: Path) -> list[dict[str, Any]]:
    if not plan_file.is_file():
        return []
    plan = json.loads(plan_file.read_text(encoding="utf-8"))
    return [
        {
            "stage": stage.get("stage"),
            "backend": stage.get("backend"),
            "route": stage.get("route"),
            "device": stage.get("device"),
            "placement": stage.get("placement"),
            "load_s": stage.get("load_s"),
        }
        for stage in plan.get("stages", [])
    ]


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


def check_graph_demo(name: str, work: Path, gpu: NvidiaGpu, vram_capacity: int) -> dict[str, Any]:
    """Run demo ``name`` on the CPU (reference) and on CUDA, compare, and report."""
    source = PIPELINES / f"{name}.yaml"
    reference = work / f"{name}-cpu"
    cpu = _cli("run", str(source), "--out", str(reference))
    if cpu.returncode != 0:
        return {"name": name, "ok": False, "error": f"CPU reference failed: {_tail(cpu.stderr)}"}
    pipeline = cuda_pipeline(
        source, work / f"{name}-cuda.yaml", gpu_uuid=gpu.uuid, vram_capacity=vram_capacity
    )
    out = work / f"{name}-cuda"
    started = datetime.datetime.now(datetime.UTC)
    gpu_run = _cli(
        "run",
        str(pipeline),
        "--out",
        str(out),
        "--expect",
        str(reference / "outputs.npz"),
        "--rtol",
        "1e-4",
        "--atol",
        "1e-5",
    )
    elapsed = (datetime.datetime.now(datetime.UTC) - started).total_seconds()
    stages = _stage_summaries(out / "execution_plan.json")
    on_target = all(
        (stage.get("placement") or {}).get("fraction_on_target") == 1.0 for stage in stages
    )
    ok = gpu_run.returncode == 0 and bool(stages) and on_target
    return {
        "name": name,
        "ok": ok,
        "pipeline": str(pipeline),
        "exit_status": gpu_run.returncode,
        "wall_s": round(elapsed, 3),
        "matches_cpu": "matches --expect" in gpu_run.stdout,
        "stages": stages,
        "error": None if ok else _tail(gpu_run.stderr + gpu_run.stdout),
    }


def check_chat_speak(work: Path, gpu: NvidiaGpu, vram_capacity: int) -> dict[str, Any]:
    """Chat-speak with its language model on vLLM's CUDA build."""
    pipeline = cuda_pipeline(
        PIPELINES / "chat-speak.yaml",
        work / "chat-speak-cuda.yaml",
        gpu_uuid=gpu.uuid,
        vram_capacity=vram_capacity,
        graphs_on_gpu=False,
    )
    out = work / "chat-speak-cuda"
    started = datetime.datetime.now(datetime.UTC)
    run = _cli("run", str(pipeline), "--text", QUESTION, "--out", str(out))
    elapsed = (datetime.datetime.now(datetime.UTC) - started).total_seconds()
    replies = sorted(out.glob("*.txt")) if out.is_dir() else []
    reply = replies[0].read_text(encoding="utf-8") if replies else None
    ok = run.returncode == 0 and bool(reply) and bool(sorted(out.glob("*.wav")))
    return {
        "name": "chat-speak",
        "ok": ok,
        "pipeline": str(pipeline),
        "exit_status": run.returncode,
        "wall_s": round(elapsed, 3),
        "question": QUESTION,
        "reply": reply,
        "stages": _stage_summaries(out / "execution_plan.json"),
        "error": None if ok else _tail(run.stderr + run.stdout),
    }


def _create_environments() -> tuple[dict[str, Any], list[str]]:
    from runtime.envs import create_env
    from runtime.errors import OmniError

    created: dict[str, Any] = {}
    failures: list[str] = []
    for name in (GRAPH_ENV, LLM_ENV):
        print(f"gpu-check: environment {name}", flush=True)
        try:
            info = create_env(name, progress=lambda line: print(f"  {line}", flush=True))
        except OmniError as exc:
            created[name] = {"ok": False, "error": str(exc)}
            failures.append(name)
            continue
        created[name] = {"ok": True, **info.to_json()}
    return created, failures


def _vram_capacity(gpu: NvidiaGpu) -> int:
    """The ceiling the pipelines declare for the GPU's memory: what is free on it now
    (NVML, through discovery), else its size as nvidia-smi reports it."""
    from runtime.devices import discover_topology

    topology = discover_topology()
    info = topology.constraints.get(f"machine:vram:{gpu.uuid}")
    if info is not None and (info.observed_free or info.capacity):
        return info.observed_free or info.capacity or 0
    if gpu.memory_mib is None:
        raise SystemExit(
            f"gpu-check: discovery does not list {gpu.uuid} (is nvidia-ml-py installed?) and "
            "nvidia-smi reported no memory size"
        )
    return gpu.memory_mib << 20


def check(out: Path, work: Path) -> int:
    gpus = find_nvidia_gpus()
    if not gpus:
        probe()
        return 0
    gpu = gpus[0]
    document: dict[str, Any] = {
        "schema": 1,
        "ran_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "gpus": [asdict(one) for one in gpus],
            "checked_gpu": gpu.uuid,
        },
    }
    environments, failed = _create_environments()
    document["environments"] = environments
    checks: list[dict[str, Any]] = []
    capacity = _vram_capacity(gpu)
    if GRAPH_ENV not in failed:
        for name in ("add", "mlp-chain"):
            print(f"gpu-check: {name} on {CUDA}", flush=True)
            checks.append(check_graph_demo(name, work, gpu, capacity))
    if LLM_ENV not in failed:
        print("gpu-check: chat-speak with vLLM on the GPU", flush=True)
        checks.append(check_chat_speak(work, gpu, capacity))
    document["checks"] = checks
    document["ok"] = not failed and len(checks) == 3 and all(one["ok"] for one in checks)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    for one in checks:
        print(f"gpu-check: {one['name']}: {'ok' if one['ok'] else 'FAILED'}")
    print(f"gpu-check: wrote {out}")
    return 0 if document["ok"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--probe", action="store_true", help="only say whether an NVIDIA GPU is present"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="the results file")
    parser.add_argument(
        "--work",
        type=Path,
        default=REPO_ROOT / "build" / "gpu-check",
        help="folder for the derived pipelines and the runs' outputs",
    )
    args = parser.parse_args(argv)
    if args.probe:
        return probe()
    return check(args.out, args.work)


if __name__ == "__main__":
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    sys.exit(main())
