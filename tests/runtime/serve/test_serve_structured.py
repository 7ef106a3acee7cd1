"""Structured output on chat completions from a real ``omni-edge serve`` of the bundled chat
demo (the built-in assistant, SmolLM2-135M-Instruct in vLLM's CPU build), through the
official ``openai`` client: ``response_format`` ``json_schema`` and ``json_object`` replies
parse and match their schemas, streamed or not; a schema the grammar compiler cannot honour
and a ``response_format`` of the wrong shape are 400s naming ``response_format``, and the
server goes on serving with the same worker and nothing in flight.

One server serves the module (vLLM starts in about half a minute).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import openai
import pydantic
import pytest

from tests.runtime.serve.support import API_KEY, REPO, ServeProcess, wait_until
from tests.runtime.vllm.support import START_TIMEOUT_S

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3 * START_TIMEOUT_S)]

MODEL = "chat"
MAX_TOKENS = 160

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "city": {"type": "string", "maxLength": 24},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
COLOURS = {
    "type": "object",
    "properties": {
        "colours": {
            "type": "array",
            "items": {"type": "string", "maxLength": 12},
            "minItems": 1,
            "maxItems": 4,
        }
    },
    "required": ["colours"],
    "additionalProperties": False,
}
MOOD = {
    "type": "object",
    "properties": {"sentiment": {"type": "string", "enum": ["positive", "negative", "neutral"]}},
    "required": ["sentiment"],
    "additionalProperties": False,
}
ORDER = {
    "type": "object",
    "properties": {
        "item": {"type": "string", "maxLength": 20},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string", "maxLength": 30},
                "city": {"type": "string", "maxLength": 20},
            },
            "required": ["street", "city"],
            "additionalProperties": False,
        },
        "express": {"type": "boolean"},
    },
    "required": ["item", "quantity", "address", "express"],
    "additionalProperties": False,
}
CAPITAL = {
    "type": "object",
    "properties": {
        "country": {"type": "string", "maxLength": 20},
        "capital": {"type": "string", "maxLength": 20},
    },
    "required": ["country", "capital"],
    "additionalProperties": False,
}
NUMBERS = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0, "maximum": 1000},
    "minItems": 2,
    "maxItems": 5,
}

#: (schema name, schema, the user's message): twenty extractions and answers.
CASES: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("person", PERSON, "Alice is 30 years old and lives in Paris. Give her as JSON."),
    ("person", PERSON, "Extract the person: Bob, aged 45, from Berlin."),
    ("person", PERSON, "My name is Chen, I am 22 and I live in Shanghai."),
    ("person", PERSON, "Record: Maria Lopez, 67, Madrid."),
    ("person", PERSON, "Omar (age 19) moved to Cairo last year."),
    ("colours", COLOURS, "List the colours of the French flag."),
    ("colours", COLOURS, "What colours is a rainbow made of? Give a few."),
    ("colours", COLOURS, "Name two colours of grass and sky."),
    ("mood", MOOD, "Classify the sentiment: I love this sunny day!"),
    ("mood", MOOD, "Classify the sentiment: The train was late and I missed my meeting."),
    ("mood", MOOD, "Classify the sentiment: The meeting is at three."),
    ("mood", MOOD, "Sentiment of: What a wonderful gift, thank you!"),
    ("order", ORDER, "Order 3 books to 12 High Street, London, express delivery."),
    ("order", ORDER, "I want 1 lamp sent to 5 Rue Verte in Lyon, no rush."),
    ("order", ORDER, "Ship 10 pens to 42 Main Road, Boston, as fast as possible."),
    ("capital", CAPITAL, "What is the capital of France?"),
    ("capital", CAPITAL, "What is the capital of Japan?"),
    ("capital", CAPITAL, "Which city is the capital of Italy?"),
    ("numbers", NUMBERS, "Give the first four even numbers."),
    ("numbers", NUMBERS, "List three numbers between 10 and 20."),
)


def schema_errors(value: object, schema: Mapping[str, Any], path: str = "$") -> list[str]:
    """Where ``value`` breaks ``schema`` (the subset of JSON Schema these tests use)."""
    errors: list[str] = []
    kind = schema.get("type")
    checks = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
    }
    if kind is not None and not checks[kind](value):
        return [f"{path}: {value!r} is not of type {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, str) and len(value) > schema.get("maxLength", len(value)):
        errors.append(f"{path}: longer than {schema['maxLength']}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value < schema.get("minimum", value) or value > schema.get("maximum", value):
            errors.append(
                f"{path}: {value} outside [{schema.get('minimum')}, {schema.get('maximum')}]"
            )
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
            errors.append(f"{path}: {len(value)} items")
        for index, item in enumerate(value):
            errors += schema_errors(item, schema.get("items", {}), f"{path}[{index}]")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        errors += [
            f"{path}: missing {key!r}" for key in schema.get("required", ()) if key not in value
        ]
        if schema.get("additionalProperties") is False:
            errors += [f"{path}: extra {key!r}" for key in value if key not in properties]
        for key, item in value.items():
            if key in properties:
                errors += schema_errors(item, properties[key], f"{path}.{key}")
    return errors


def test_the_validator_finds_what_breaks_a_schema() -> None:
    assert schema_errors({"name": "A", "age": 3, "city": "B"}, PERSON) == []
    assert schema_errors({"name": "A", "age": "3", "city": "B"}, PERSON) == [
        "$.age: '3' is not of type integer"
    ]
    assert schema_errors({"name": "A", "city": "B", "x": 1}, PERSON) == [
        "$: missing 'age'",
        "$: extra 'x'",
    ]
    assert schema_errors({"sentiment": "happy"}, MOOD) == [
        "$.sentiment: 'happy' is not one of ['positive', 'negative', 'neutral']"
    ]
    assert schema_errors([1], NUMBERS) == ["$: 1 items"]


@pytest.fixture(scope="module")
def server(smollm2_model: Path) -> Iterator[ServeProcess]:
    del smollm2_model  # made once per machine; the demo names it
    process = ServeProcess(
        [REPO / "assets" / "pipelines" / "chat.yaml"], start_timeout_s=START_TIMEOUT_S
    )
    try:
        yield process
    finally:
        status = process.stop()
        assert status == 130, "\n".join(process.stderr)
        assert not process.segments()


@pytest.fixture
def client(server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(autouse=True)
def settled(server: ServeProcess) -> Iterator[None]:
    """Each test leaves nothing in flight and the same worker process serving."""
    workers = server.workers()
    yield
    wait_until(lambda: server.pipelines()[MODEL]["in_flight"] == 0, "no request in flight", 30)
    assert server.workers() == workers


def _schema_format(name: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def _ask(client: openai.OpenAI, case: tuple[str, dict[str, Any], str]) -> tuple[str, str]:
    name, schema, prompt = case
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=MAX_TOKENS,
        response_format=_schema_format(name, schema),  # type: ignore[arg-type]
    )
    choice = reply.choices[0]
    return choice.message.content or "", choice.finish_reason


def test_twenty_schemas_every_reply_parses_and_matches(
    client: openai.OpenAI, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:  # the demo generates up to 4 requests at once
        replies = list(pool.map(lambda case: _ask(client, case), CASES))
    elapsed = time.perf_counter() - started
    failures = []
    for (name, schema, prompt), (text, finish) in zip(CASES, replies, strict=True):
        try:
            problems = schema_errors(json.loads(text), schema)
        except json.JSONDecodeError as exc:
            problems = [f"not JSON ({exc}; finish_reason {finish})"]
        if problems:
            failures.append(f"{name} {prompt!r} -> {text!r}: {problems}")
    with capsys.disabled():
        print(
            f"\nstructured output: {len(CASES) - len(failures)}/{len(CASES)} replies valid "
            f"in {elapsed:.1f} s; e.g. {replies[0][0]} {replies[8][0]} {replies[18][0]}"
        )
    assert not failures, "\n".join(failures)
    # The constraint shapes the reply around what the model reads and knows (a model this
    # small gets some wrong: the bars are below what it gets right).
    names = [json.loads(text)["name"] for text, _ in replies[:5]]
    found = [name for name, (_, _, prompt) in zip(names, CASES, strict=False) if name in prompt]
    assert len(found) >= 3, names
    capitals = [json.loads(text)["capital"] for text, _ in replies[15:18]]
    assert len({"Paris", "Tokyo", "Rome"} & set(capitals)) >= 2, capitals


def test_json_object_replies_parse_as_objects(client: openai.OpenAI) -> None:
    for prompt in (
        # Without a schema nothing bounds a string: these prompts get short objects.
        "Give a JSON object describing a cat with its name and age.",
        "Reply in JSON: what is 2 plus 2?",
        "Give a JSON object with the keys name and colour for a red apple.",
    ):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=MAX_TOKENS,
            response_format={"type": "json_object"},
        )
        text = reply.choices[0].message.content or ""
        assert reply.choices[0].finish_reason == "stop", text
        assert isinstance(json.loads(text), dict), text


def test_text_format_leaves_the_reply_free(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24,
        response_format={"type": "text"},
    )
    assert "Paris" in (reply.choices[0].message.content or "")


class Address(pydantic.BaseModel):
    street: str = pydantic.Field(max_length=30)
    city: str = pydantic.Field(max_length=20)


class Customer(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=24)
    tier: Literal["gold", "silver", "bronze"]
    address: Address


def test_the_clients_parse_helper_with_a_pydantic_model(client: openai.OpenAI) -> None:
    completion = client.chat.completions.parse(
        model=MODEL,
        messages=[
            {
                "role": "user",
                "content": "Anna is a gold customer living at 7 Elm Street, Oslo.",
            }
        ],
        max_tokens=MAX_TOKENS,
        response_format=Customer,
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Customer), completion.choices[0].message.content
    assert parsed.tier in ("gold", "silver", "bronze")


def test_a_streamed_reply_joins_into_valid_json(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Extract the person: Bob, aged 45, from Berlin."}],
        max_tokens=MAX_TOKENS,
        response_format=_schema_format("person", PERSON),  # type: ignore[arg-type]
        stream=True,
    )
    parts = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    assert len([part for part in parts if part]) > 1  # it did stream
    text = "".join(parts)
    assert schema_errors(json.loads(text), PERSON) == [], text


UNSUPPORTED = (
    # xgrammar has no uniqueItems: named with where it is.
    (
        {
            "type": "object",
            "properties": {
                "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
            },
        },
        r"/properties/tags uses uniqueItems",
    ),
    ({"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}}, r"multipleOf"),
    ({"type": "wibble"}, r'[Uu]nsupported type "wibble"'),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, r"missing"),
)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(
    ("schema", "named"), UNSUPPORTED, ids=["uniqueItems", "multipleOf", "type", "ref"]
)
def test_a_schema_the_compiler_cannot_honour_is_a_400(
    client: openai.OpenAI, schema: dict[str, Any], named: str, stream: bool
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Tags for a cat."}],
            max_tokens=16,
            response_format=_schema_format("thing", schema),  # type: ignore[arg-type]
            stream=stream,
        )
    error = caught.value
    assert error.status_code == 400
    assert error.param == "response_format"
    assert error.code == "unsupported_response_format"
    assert re.search(named, error.message), error.message
    # The server goes on serving.
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24,
        response_format=_schema_format("capital", CAPITAL),  # type: ignore[arg-type]
    )
    assert schema_errors(json.loads(reply.choices[0].message.content or ""), CAPITAL) == []


BAD_SHAPES = (
    ("json", "response_format", "accepted: an object whose 'type' is one of"),
    ({"type": "xml"}, "response_format.type", "accepted: 'text', 'json_object', 'json_schema'"),
    (
        {"type": "json_schema"},
        "response_format.json_schema",
        "'response_format.json_schema' is missing",
    ),
    (
        {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}},
        "response_format.json_schema.name",
        "1 to 64 of",
    ),
    (
        {"type": "json_schema", "json_schema": {"name": "a"}},
        "response_format.json_schema.schema",
        "is missing; accepted: a JSON Schema object",
    ),
    (
        {"type": "json_schema", "json_schema": {"name": "a", "schema": [1]}},
        "response_format.json_schema.schema",
        "is a JSON list",
    ),
    (
        {"type": "json_schema", "json_schema": {"name": "a", "schema": {}, "strict": "yes"}},
        "response_format.json_schema.strict",
        "accepted: true or false",
    ),
    (
        {"type": "json_object", "schema": {}},
        "response_format.schema",
        "unknown field 'schema'; accepted: type",
    ),
)


@pytest.mark.parametrize(("value", "param", "message"), BAD_SHAPES)
def test_a_response_format_of_the_wrong_shape_is_a_400(
    client: openai.OpenAI, value: object, param: str, message: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=8,
            response_format=value,  # type: ignore[arg-type]
        )
    assert caught.value.status_code == 400
    assert caught.value.param == param
    assert message in caught.value.message
