"""``POST /v1/embeddings``: OpenAI's request checked at the edge, the vectors answered.

The body is JSON: ``model`` (a served embedding pipeline), ``input`` (a string or a list of
strings; token-id arrays are refused, since the pipeline tokenises text itself),
``encoding_format`` (``float``, the default, or ``base64``: each vector's little-endian
float32 bytes, as OpenAI sends them), ``dimensions`` (the model's own size or absent: the
vectors are not shortened) and ``user`` (accepted and ignored). Every other field is refused.

What the texts may be (not empty, how many, how long) and the model's size are the
pipeline's to say (:class:`runtime.adapters.embed.EmbeddingAdapter`); its refusal is a 400
naming the field. The answer is ``{"object": "list", "data": [{"object": "embedding",
"index", "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}``, in the
order of ``input``.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from runtime.adapters.embed import EMBEDDING_OUTPUT
from runtime.errors import ModelError
from runtime.serve.errors import invalid

if TYPE_CHECKING:
    from runtime.serve.registry import Submitted

EMBEDDING_FIELDS: Final = ("model", "input", "encoding_format", "dimensions", "user")
ENCODING_FORMATS: Final = ("float", "base64")
_ACCEPTED_INPUT: Final = "a string or a list of strings"


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    """A checked ``/v1/embeddings`` body."""

    model: str
    #: The texts, or the one text when ``input`` was a string.
    input: str | tuple[str, ...]
    encoding_format: str
    dimensions: int | None

    def pipeline_input(self) -> dict[str, Any]:
        """What the embedding pipeline is given."""
        texts = self.input if isinstance(self.input, str) else list(self.input)
        if self.dimensions is None:
            return {"input": texts}
        return {"input": texts, "dimensions": self.dimensions}


@dataclass(frozen=True, slots=True)
class Embeddings:
    """The pipeline's answer: one vector a text (float32 ``[texts, dimensions]``), in order,
    and the tokens it read."""

    vectors: np.ndarray
    prompt_tokens: int


def _is_token_ids(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(item, int) and not isinstance(item, bool) for item in value
    )


def _input(value: object) -> str | tuple[str, ...]:
    if isinstance(value, str):
        return value
    if _is_token_ids(value) and isinstance(value, list) and value:
        raise invalid(
            f"'input' is a list of token ids; accepted: {_ACCEPTED_INPUT} (the pipeline "
            "tokenises text itself)",
            param="input",
            code="unsupported_input",
        )
    if not isinstance(value, list):
        raise invalid(f"'input' is {_json_type(value)}; accepted: {_ACCEPTED_INPUT}", param="input")
    for index, item in enumerate(value):
        if isinstance(item, str):
            continue
        if _is_token_ids(item):
            raise invalid(
                f"'input[{index}]' is a list of token ids; accepted: {_ACCEPTED_INPUT} (the "
                "pipeline tokenises text itself)",
                param="input",
                code="unsupported_input",
            )
        raise invalid(
            f"'input[{index}]' is {_json_type(item)}; accepted: {_ACCEPTED_INPUT}",
            param="input",
        )
    return tuple(value)


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return "a string"


def parse_embedding_request(document: Any) -> EmbeddingRequest:
    """The decoded JSON body -> the checked request, or a 400 naming the field, the value and
    what is accepted."""
    if not isinstance(document, dict):
        raise invalid(
            f"the body is {_json_type(document)}; accepted: a JSON object with 'model' and 'input'",
            param=None,
        )
    unknown = sorted(set(document) - set(EMBEDDING_FIELDS))
    if unknown:
        raise invalid(
            f"unknown field {unknown[0]!r}; accepted: {', '.join(EMBEDDING_FIELDS)}",
            param=unknown[0],
            code="unknown_field",
        )
    model = document.get("model")
    if not isinstance(model, str) or not model:
        raise invalid(
            f"'model' is {model!r}; accepted: the name of a served embedding pipeline "
            "(GET /v1/models)",
            param="model",
            code="missing_field" if "model" not in document else "invalid_value",
        )
    if "input" not in document:
        raise invalid(
            f"the field 'input' is missing; accepted: {_ACCEPTED_INPUT}",
            param="input",
            code="missing_field",
        )
    texts = _input(document["input"])
    encoding_format = document.get("encoding_format", "float")
    if encoding_format not in ENCODING_FORMATS:
        raise invalid(
            f"'encoding_format' is {encoding_format!r}; accepted: {', '.join(ENCODING_FORMATS)}",
            param="encoding_format",
        )
    dimensions = document.get("dimensions")
    if dimensions is not None and (type(dimensions) is not int or dimensions < 1):
        raise invalid(
            f"'dimensions' is {dimensions!r}; accepted: the model's size (a positive integer) "
            "or none",
            param="dimensions",
        )
    user = document.get("user")
    if user is not None and not isinstance(user, str):
        raise invalid(f"'user' is {_json_type(user)}; accepted: a string", param="user")
    return EmbeddingRequest(model, texts, str(encoding_format), dimensions)


async def collect_embeddings(submitted: Submitted) -> Embeddings:
    """The vectors once the request has finished (copied: the output is acknowledged after)."""
    final = None
    while (output := await submitted.next()) is not None:
        if output.finished:
            final = output
    vectors = None if final is None else final.outputs.get(EMBEDDING_OUTPUT)
    if final is None or not isinstance(vectors, np.ndarray) or vectors.ndim != 2:
        raise ModelError(f"the pipeline gave no {EMBEDDING_OUTPUT!r} array of vectors")
    tokens = final.metrics.get("prompt_tokens")
    return Embeddings(
        np.array(vectors, dtype=np.float32, copy=True), tokens if isinstance(tokens, int) else 0
    )


def _encoded(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    values: list[float] = vector.astype(np.float64).tolist()
    return values


def embeddings_body(request: EmbeddingRequest, embeddings: Embeddings) -> dict[str, Any]:
    """OpenAI's answer: a list of embeddings in the order of ``input``, and the usage."""
    data = [
        {
            "object": "embedding",
            "index": index,
            "embedding": _encoded(vector, request.encoding_format),
        }
        for index, vector in enumerate(embeddings.vectors)
    ]
    tokens = embeddings.prompt_tokens
    return {
        "object": "list",
        "data": data,
        "model": request.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
