"""``omni-edge run PIPELINE --chat FILE.json``: a conversation through a real vLLM stage.

The tiny model ships no chat template, so the turns reach it in the plain ``role: content``
form; the request's record (``metrics.json``) holds that prompt, and ``--out`` keeps the
conversation with the reply, ready to be given back with ``--chat``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from runtime.cli import main
from runtime.errors import EXIT_OK
from tests.runtime.vllm.support import START_TIMEOUT_S

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(2 * START_TIMEOUT_S)]


def test_a_conversation_file_is_answered_and_kept_with_the_reply(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline = tmp_path / "chat.yaml"
    pipeline.write_text(
        f"""\
pipeline: chat
async_chunk: false
stages:
  - stage_id: 0
    backend:
      name: native.vllm.v1
      model: {tiny_model}
      engine: {{dtype: float32, max_model_len: 512, max_num_seqs: 1,
               kv_cache_memory_bytes: 32MiB, enforce_eager: true, seed: 0}}
      sampling: {{max_tokens: 6, min_tokens: 6, temperature: 0.0}}
      route: {{name: local-vllm, interpreter: env:vllm-cpu}}
    resource_budget:
      capacities: {{machine:ram: 8GiB}}
      demands: {{machine:ram: 3GiB}}
""",
        encoding="utf-8",
    )
    turns = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "the river"},
        {"role": "assistant", "content": "and the mountain"},
        {"role": "user", "content": "the mountain"},
    ]
    talk = tmp_path / "talk.json"
    talk.write_text(json.dumps({"messages": turns}), encoding="utf-8")
    out = tmp_path / "out"
    assert main(["run", str(pipeline), "--chat", str(talk), "--out", str(out)]) == EXIT_OK
    printed = capsys.readouterr().out
    (kept,) = out.glob("*.chat.json")
    request_id = kept.name.removesuffix(".chat.json")
    reply = (out / f"{request_id}.txt").read_text(encoding="utf-8")
    assert reply
    assert printed.rstrip("\n") == reply.rstrip("\n")
    assert json.loads(kept.read_text(encoding="utf-8")) == [
        *turns,
        {"role": "assistant", "content": reply},
    ]
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    (record,) = [entry for entry in metrics["requests"] if entry["request_id"] == request_id]
    assert record["prompts"] == {
        "stage-0": "system: Be brief.\nuser: the river\nassistant: and the mountain\n"
        "user: the mountain\nassistant:"
    }
    assert record["stages"][0]["tokens"] == 6
