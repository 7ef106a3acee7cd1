"""Structured output: a request's reply constrained to JSON, or to JSON matching a schema.

:class:`StructuredOutput` is the typed value that travels from the edge (the server's
``response_format``, the Python API's ``structured_output``) through the engine to the
language-model worker, inside :class:`~runtime.contracts.llm_messages.SamplingSpec`; the
worker hands it to vLLM's structured outputs. :func:`parse_response_format` reads OpenAI's
``response_format`` shape:

- ``{"type": "text"}``: no constraint (``None``);
- ``{"type": "json_object"}``: any JSON object;
- ``{"type": "json_schema", "json_schema": {"name": str, "schema": {...}, "strict": bool,
  "description": str}}``: JSON matching the schema.

Whether a schema's features can be honoured is the worker's to say (its grammar compiler
checks the schema before the request starts); everything here is the shape alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from .messages import MessageError, _bad

__all__ = [
    "JSON_OBJECT",
    "JSON_SCHEMA",
    "RESPONSE_FORMAT_TYPES",
    "TEXT",
    "UNSUPPORTED_STRUCTURED_OUTPUT",
    "ResponseFormatError",
    "StructuredOutput",
    "parse_response_format",
    "structured_option",
]

TEXT: Final = "text"
JSON_OBJECT: Final = "json_object"
JSON_SCHEMA: Final = "json_schema"
#: The ``type`` values of a ``response_format``.
RESPONSE_FORMAT_TYPES: Final = (TEXT, JSON_OBJECT, JSON_SCHEMA)
#: The keys of ``response_format.json_schema``.
JSON_SCHEMA_KEYS: Final = ("name", "schema", "strict", "description")
#: A schema's name, as OpenAI accepts it.
NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_WIRE_FIELDS: Final = ("kind", "schema", "name", "strict")
#: The ``llm_error`` code of a request whose constraint the worker's grammar compiler refused.
UNSUPPORTED_STRUCTURED_OUTPUT: Final = "unsupported_structured_output"


class ResponseFormatError(ValueError):
    """A ``response_format`` of the wrong shape; ``param`` is the field's path
    (``response_format.json_schema.name``) and the message says what is accepted."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """What a reply must be: any JSON object (``kind`` ``json_object``) or JSON matching
    ``schema`` (``json_schema``; the schema as JSON text, in its key order, which is the
    order the reply's properties come in). ``name`` and ``strict`` are the caller's, kept
    for reporting (the constraint is the schema either way)."""

    kind: str
    schema: str | None = None
    name: str | None = None
    strict: bool = False

    def __post_init__(self) -> None:
        where = "structured_output"
        if self.kind not in (JSON_OBJECT, JSON_SCHEMA):
            _bad(where, "kind", self.kind, f"{JSON_OBJECT!r} or {JSON_SCHEMA!r}")
        if not isinstance(self.strict, bool):
            _bad(where, "strict", self.strict, "true or false")
        if self.kind == JSON_OBJECT:
            if self.schema is not None or self.name is not None:
                _bad(where, "schema", self.schema, f"null for {JSON_OBJECT!r}")
            return
        if not isinstance(self.name, str) or not NAME_PATTERN.fullmatch(self.name):
            _bad(where, "name", self.name, "1 to 64 of a-z, A-Z, 0-9, _ and -")
        if not isinstance(self.schema, str):
            _bad(where, "schema", self.schema, "the schema as JSON text")
        try:
            parsed = json.loads(self.schema)
        except (json.JSONDecodeError, RecursionError):
            _bad(where, "schema", self.schema, "the schema as JSON text")
        if not isinstance(parsed, dict):
            _bad(where, "schema", self.schema, "a JSON object")

    @classmethod
    def json_object(cls) -> StructuredOutput:
        return cls(JSON_OBJECT)

    @classmethod
    def json_schema(
        cls, name: str, schema: Mapping[str, Any], *, strict: bool = False
    ) -> StructuredOutput:
        """JSON matching ``schema`` (a JSON Schema object)."""
        try:
            text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise MessageError(
                "bad_field", f"structured_output.schema is not JSON: {exc}"
            ) from None
        return cls(JSON_SCHEMA, text, name, strict)

    def schema_value(self) -> dict[str, Any] | None:
        """The schema as a JSON object (None for ``json_object``)."""
        return None if self.schema is None else dict(json.loads(self.schema))

    def to_response_format(self) -> dict[str, Any]:
        """OpenAI's ``response_format`` for this value."""
        if self.kind == JSON_OBJECT:
            return {"type": JSON_OBJECT}
        return {
            "type": JSON_SCHEMA,
            "json_schema": {
                "name": self.name,
                "schema": self.schema_value(),
                "strict": self.strict,
            },
        }

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind, "schema": self.schema, "name": self.name, "strict": self.strict}

    @classmethod
    def from_wire(cls, wire: object, where: str = "structured_output") -> StructuredOutput:
        if not isinstance(wire, Mapping):
            raise MessageError(
                "bad_field", f"{where} must be an object with fields {list(_WIRE_FIELDS)}"
            )
        unknown = sorted(set(wire) - set(_WIRE_FIELDS))
        if unknown:
            raise MessageError(
                "unknown_field", f"{where} has no field(s) {unknown}; fields: {list(_WIRE_FIELDS)}"
            )
        missing = [name for name in _WIRE_FIELDS if name not in wire]
        if missing:
            raise MessageError("missing_field", f"{where} is missing field(s) {missing}")
        return cls(wire["kind"], wire["schema"], wire["name"], wire["strict"])


def _accepted_types() -> str:
    return ", ".join(repr(kind) for kind in RESPONSE_FORMAT_TYPES)


def parse_response_format(
    value: object, *, param: str = "response_format"
) -> StructuredOutput | None:
    """OpenAI's ``response_format`` -> a :class:`StructuredOutput` (None for ``text``), or
    :class:`ResponseFormatError` naming the field and what is accepted."""
    if not isinstance(value, Mapping):
        raise ResponseFormatError(
            f"'{param}' is {value!r:.80}; accepted: an object whose 'type' is one of "
            f"{_accepted_types()}",
            param,
        )
    kind = value.get("type")
    if kind not in RESPONSE_FORMAT_TYPES:
        raise ResponseFormatError(
            f"'{param}.type' is {kind!r:.80}; accepted: {_accepted_types()}", f"{param}.type"
        )
    accepted_keys = ("type", JSON_SCHEMA) if kind == JSON_SCHEMA else ("type",)
    unknown = sorted(str(key) for key in value if key not in accepted_keys)
    if unknown:
        raise ResponseFormatError(
            f"'{param}' of type {kind!r} has unknown field {unknown[0]!r}; accepted: "
            f"{', '.join(accepted_keys)}",
            f"{param}.{unknown[0]}",
        )
    if kind == TEXT:
        return None
    if kind == JSON_OBJECT:
        return StructuredOutput.json_object()
    where = f"{param}.{JSON_SCHEMA}"
    spec = value.get(JSON_SCHEMA)
    if not isinstance(spec, Mapping):
        raise ResponseFormatError(
            f"'{where}' is {'missing' if spec is None else repr(spec)[:80]}; accepted: "
            "{'name': str, 'schema': {...}, 'strict': bool}",
            where,
        )
    unknown = sorted(str(key) for key in spec if key not in JSON_SCHEMA_KEYS)
    if unknown:
        raise ResponseFormatError(
            f"'{where}' has unknown field {unknown[0]!r}; accepted: {', '.join(JSON_SCHEMA_KEYS)}",
            f"{where}.{unknown[0]}",
        )
    name = spec.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ResponseFormatError(
            f"'{where}.name' is {name!r:.80}; accepted: 1 to 64 of a-z, A-Z, 0-9, _ and -",
            f"{where}.name",
        )
    schema = spec.get("schema")
    if not isinstance(schema, Mapping):
        found = "missing" if schema is None else f"a JSON {type(schema).__name__}"
        raise ResponseFormatError(
            f"'{where}.schema' is {found}; accepted: a JSON Schema object", f"{where}.schema"
        )
    strict = spec.get("strict", False)
    if strict is None:
        strict = False
    if not isinstance(strict, bool):
        raise ResponseFormatError(
            f"'{where}.strict' is {strict!r:.80}; accepted: true or false", f"{where}.strict"
        )
    description = spec.get("description")
    if description is not None and not isinstance(description, str):
        raise ResponseFormatError(
            f"'{where}.description' is {description!r:.80}; accepted: a string",
            f"{where}.description",
        )
    try:
        return StructuredOutput.json_schema(name, schema, strict=strict)
    except MessageError as exc:
        raise ResponseFormatError(
            f"'{where}.schema' is not JSON ({exc}); accepted: a JSON Schema object",
            f"{where}.schema",
        ) from None


def structured_option(value: object) -> StructuredOutput | None:
    """The sampling option ``structured_output`` as the Python API takes it: a
    :class:`StructuredOutput`, OpenAI's ``response_format`` object, or None."""
    if value is None or isinstance(value, StructuredOutput):
        return value
    return parse_response_format(value, param="structured_output")
