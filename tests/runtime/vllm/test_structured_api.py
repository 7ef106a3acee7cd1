"""Structured output through the Python API: the built-in assistant's text demo
(``assets/pipelines/chat.yaml``) takes the sampling option ``structured_output`` (OpenAI's
``response_format`` object or a :class:`StructuredOutput`), and a schema the worker's grammar
compiler refuses raises :class:`StructuredOutputUnsupported` while the pipeline goes on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.api import Omni
from runtime.contracts.structured import StructuredOutput
from runtime.devices import DeviceSelection, discover_topology
from runtime.errors import StructuredOutputUnsupported
from runtime.ledger import ResourceLedger
from tests.runtime.vllm.support import START_TIMEOUT_S

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3 * START_TIMEOUT_S)]

CHAT_YAML = Path(__file__).resolve().parents[3] / "assets" / "pipelines" / "chat.yaml"
CAPITAL = {
    "type": "object",
    "properties": {
        "country": {"type": "string", "maxLength": 20},
        "capital": {"type": "string", "maxLength": 20},
    },
    "required": ["country", "capital"],
    "additionalProperties": False,
}


def _reply(omni: Omni, request: dict[str, object]) -> str:
    outputs = list(omni.generate(request))
    final = outputs[-1]
    assert final.finished
    return final.text or ""


def test_the_python_api_takes_structured_output(smollm2_model: Path) -> None:
    """One pipeline (vLLM loads once): OpenAI's shape and the value constrain the reply; an
    unsupported schema raises, names the keyword, and the pipeline goes on serving."""
    del smollm2_model  # made once per machine; the demo names it
    ledger = ResourceLedger(name="structured-test")
    with Omni(
        CHAT_YAML, ledger=ledger, topology=discover_topology(), selection=DeviceSelection()
    ) as omni:
        messages = [{"role": "user", "content": "What is the capital of Japan?"}]
        text = _reply(
            omni,
            {
                "messages": messages,
                "max_tokens": 80,
                "structured_output": {
                    "type": "json_schema",
                    "json_schema": {"name": "capital", "schema": CAPITAL},
                },
            },
        )
        assert set(json.loads(text)) == {"country", "capital"}, text
        value = StructuredOutput.json_object()
        text = _reply(omni, {"messages": messages, "max_tokens": 80, "structured_output": value})
        assert isinstance(json.loads(text), dict), text

        schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
        with pytest.raises(StructuredOutputUnsupported, match=r"at / uses uniqueItems"):
            _reply(
                omni,
                {
                    "text": "Three numbers.",
                    "max_tokens": 16,
                    "structured_output": StructuredOutput.json_schema("numbers", schema),
                },
            )
        answer = _reply(omni, {"text": "What is the capital of France?", "max_tokens": 24})
        assert "Paris" in answer
    assert ledger.snapshot().is_empty, ledger.snapshot().to_json()
