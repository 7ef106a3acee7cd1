"""Structured output without a model: ``response_format`` parsed at the server's edge into a
typed :class:`StructuredOutput`, refused with a 400 naming the field; the value on the
worker protocol (left out when unset, so older bodies still read); the Python API's
``structured_output`` option; the remote route's request body; the runtime error's status."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runtime.backends.openai_wire import completion_body
from runtime.contracts.llm_messages import GenerateMessage, SamplingSpec
from runtime.contracts.messages import MessageError
from runtime.contracts.structured import (
    JSON_OBJECT,
    JSON_SCHEMA,
    ResponseFormatError,
    StructuredOutput,
    parse_response_format,
)
from runtime.engine.program import parse_text_request, sampling_with
from runtime.errors import StructuredOutputUnsupported, UsageError
from runtime.serve import ServeLimits
from runtime.serve.errors import ApiError, from_runtime_error
from runtime.serve.requests import parse_chat_request

LIMITS = ServeLimits(max_tokens=256)
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def _chat(response_format: object) -> dict[str, Any]:
    return {
        "model": "chat",
        "messages": [{"role": "user", "content": "Hi"}],
        "response_format": response_format,
    }


def test_a_json_schema_becomes_a_typed_value_in_the_sampling() -> None:
    chat = parse_chat_request(
        _chat({"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}),
        LIMITS,
    )
    structured = chat.sampling["structured_output"]
    assert isinstance(structured, StructuredOutput)
    assert (structured.kind, structured.name, structured.strict) == (JSON_SCHEMA, "person", False)
    assert structured.schema_value() == SCHEMA
    # The key order is the schema's: it is the order the reply's properties come in.
    assert list(json.loads(structured.schema or "")["properties"]) == ["name", "age"]
    with pytest.raises(AttributeError):
        structured.kind = JSON_OBJECT  # type: ignore[misc]


def test_json_object_text_and_strict() -> None:
    chat = parse_chat_request(_chat({"type": "json_object"}), LIMITS)
    assert chat.sampling["structured_output"] == StructuredOutput(JSON_OBJECT)
    assert "structured_output" not in parse_chat_request(_chat({"type": "text"}), LIMITS).sampling
    assert "structured_output" not in parse_chat_request(_chat(None), LIMITS).sampling
    strict = parse_response_format(
        {
            "type": "json_schema",
            "json_schema": {"name": "p", "schema": SCHEMA, "strict": True, "description": "d"},
        }
    )
    assert strict is not None
    assert strict.strict


@pytest.mark.parametrize(
    ("value", "param", "message"),
    [
        ("json_object", "response_format", "accepted: an object whose 'type' is one of"),
        ({}, "response_format.type", "'response_format.type' is None; accepted: 'text'"),
        (
            {"type": "yaml"},
            "response_format.type",
            "accepted: 'text', 'json_object', 'json_schema'",
        ),
        ({"type": "text", "json_schema": {}}, "response_format.json_schema", "accepted: type"),
        ({"type": "json_schema"}, "response_format.json_schema", "is missing"),
        ({"type": "json_schema", "json_schema": "x"}, "response_format.json_schema", "'x'"),
        (
            {"type": "json_schema", "json_schema": {"name": "p", "schema": {}, "extra": 1}},
            "response_format.json_schema.extra",
            "unknown field 'extra'; accepted: name, schema, strict, description",
        ),
        (
            {"type": "json_schema", "json_schema": {"schema": {}}},
            "response_format.json_schema.name",
            "is None; accepted: 1 to 64 of a-z",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "x" * 65, "schema": {}}},
            "response_format.json_schema.name",
            "1 to 64",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "p", "schema": "{}"}},
            "response_format.json_schema.schema",
            "is a JSON str; accepted: a JSON Schema object",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "p", "schema": {}, "strict": 1}},
            "response_format.json_schema.strict",
            "accepted: true or false",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "p", "schema": {}, "description": 3}},
            "response_format.json_schema.description",
            "accepted: a string",
        ),
    ],
)
def test_a_wrong_shape_is_a_400_naming_the_field(value: object, param: str, message: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_chat_request(_chat(value), LIMITS)
    assert caught.value.status == 400
    assert caught.value.param == param
    assert message in caught.value.message


def test_a_schema_that_is_not_json_is_refused() -> None:
    with pytest.raises(ResponseFormatError) as caught:
        parse_response_format(
            {"type": "json_schema", "json_schema": {"name": "p", "schema": {"x": float("nan")}}}
        )
    assert caught.value.param == "response_format.json_schema.schema"


def test_the_value_checks_itself() -> None:
    with pytest.raises(MessageError, match="kind"):
        StructuredOutput("regex")
    with pytest.raises(MessageError, match="schema"):
        StructuredOutput(JSON_OBJECT, "{}")
    with pytest.raises(MessageError, match="schema"):
        StructuredOutput(JSON_SCHEMA, "[1]", "p")
    with pytest.raises(MessageError, match="schema"):
        StructuredOutput(JSON_SCHEMA, "{", "p")
    with pytest.raises(MessageError, match="name"):
        StructuredOutput(JSON_SCHEMA, "{}", "a b")


def test_the_worker_protocol_carries_it_and_leaves_it_out_when_unset() -> None:
    spec = SamplingSpec(max_tokens=8, structured_output=StructuredOutput.json_schema("p", SCHEMA))
    message = GenerateMessage("r", 1, "hi", None, spec)
    body = json.loads(json.dumps(message.to_body()))
    assert body["sampling"]["structured_output"]["kind"] == JSON_SCHEMA
    assert GenerateMessage.from_body(body) == message
    plain = SamplingSpec(max_tokens=8).to_wire()
    assert "structured_output" not in plain
    assert SamplingSpec.from_wire(plain) == SamplingSpec(max_tokens=8)
    with pytest.raises(MessageError, match="structured_output"):
        SamplingSpec.from_wire({**plain, "structured_output": {"kind": JSON_OBJECT}})


def test_the_python_api_takes_the_openai_shape_or_the_value() -> None:
    defaults = SamplingSpec()
    request, _ = parse_text_request(
        {"text": "Hi", "structured_output": {"type": "json_object"}},
        pipeline="chat",
        defaults=defaults,
    )
    spec = sampling_with(defaults, request.sampling, where="chat")
    assert spec.structured_output == StructuredOutput(JSON_OBJECT)
    value = StructuredOutput.json_schema("p", SCHEMA)
    assert sampling_with(defaults, {"structured_output": value}, where="c").structured_output == (
        value
    )
    with pytest.raises(UsageError, match=r"chat: 'structured_output.type' is 'xml'"):
        parse_text_request(
            {"text": "Hi", "structured_output": {"type": "xml"}}, pipeline="chat", defaults=defaults
        )


def test_a_remote_route_sends_openais_response_format() -> None:
    spec = SamplingSpec(structured_output=StructuredOutput.json_schema("p", SCHEMA, strict=True))
    body = json.loads(completion_body("m", "hi", spec))
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "p", "schema": SCHEMA, "strict": True},
    }
    assert "response_format" not in json.loads(completion_body("m", "hi", SamplingSpec()))


def test_an_unsupported_schema_is_a_400_about_response_format() -> None:
    error = from_runtime_error(StructuredOutputUnsupported("llm: uniqueItems is not supported"))
    assert (error.status, error.param, error.code) == (
        400,
        "response_format",
        "unsupported_response_format",
    )
    assert error.body()["error"]["message"] == "llm: uniqueItems is not supported"
