"""Sentence embeddings: texts in, one vector per text out, from the built-in MiniLM encoder.

The pipeline's one graph stage is the encoder bundle (:mod:`runtime.adapters.embed_bundle`)
in an ONNX Runtime worker like every graph stage. :meth:`EmbeddingAdapter.prepare` checks the
request and tokenises it on the caller's thread (BERT's uncased WordPiece with the
``tokenizers`` library; each text cut to the model's 128 tokens); :meth:`EmbeddingAdapter.run`
calls the stage once per text (``[1, tokens]``, sized to the text) and emits one final output:
``embedding`` float32 ``[texts, 384]`` in the request's order, each row scaled to length 1
unless ``normalize`` is off (the graph's mean pooling alone is not normalised), with the
metrics ``prompt_tokens`` (the tokens embedded, after the cut), ``inputs`` and ``dimensions``.

A request is a string, a list of strings, or ``{"input": either, "dimensions": 384}``
(``dimensions`` optional). Refusals are :class:`EmbeddingInputError`, whose ``param`` names
the field (``input`` or ``dimensions``).

Adapter options (``adapter.options`` in the pipeline file): ``normalize`` (true),
``max_inputs`` (texts per request, 256), ``max_input_chars`` (characters per text, 16384:
the tokenizer's work is bounded before anything runs), ``example_text``.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from runtime.adapters.embed_bundle import (
    DIMENSIONS,
    EMBED_FORMAT,
    INPUTS,
    MAX_TOKENS,
    OUTPUT,
    load_tokenizer,
    model_inputs,
)
from runtime.errors import ConfigError, ModelError, UsageError

if TYPE_CHECKING:
    from runtime.config import PipelineConfig
    from runtime.engine.program import RequestContext

__all__ = [
    "EMBEDDING_OUTPUT",
    "EmbeddingAdapter",
    "EmbeddingBatch",
    "EmbeddingInputError",
    "EmbeddingOptionsError",
    "EmbeddingSettings",
    "normalized",
]

#: The final output's array of vectors.
EMBEDDING_OUTPUT: Final = "embedding"
OPTION_NAMES: Final = ("normalize", "max_inputs", "max_input_chars", "example_text")
DEFAULT_MAX_INPUTS: Final = 256
DEFAULT_MAX_INPUT_CHARS: Final = 16384
#: The bounds an option may be set within.
MAX_INPUTS_LIMIT: Final = 4096
MAX_INPUT_CHARS_LIMIT: Final = 1_000_000
_REQUEST_KEYS: Final = ("input", "dimensions")


class EmbeddingOptionsError(ConfigError):
    """The embedding adapter's options or stages are not usable."""


class EmbeddingInputError(UsageError):
    """A request the embedding adapter refuses; ``param`` names its field."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class EmbeddingSettings:
    """``normalize``: scale each vector to length 1 (as OpenAI's embeddings are);
    ``max_inputs``: texts per request; ``max_input_chars``: characters per text."""

    normalize: bool = True
    max_inputs: int = DEFAULT_MAX_INPUTS
    max_input_chars: int = DEFAULT_MAX_INPUT_CHARS

    @classmethod
    def parse(
        cls, options: Mapping[str, Any], *, file: str | None = None, line: int | None = None
    ) -> EmbeddingSettings:
        """Check ``adapter.options``; every failure names the option and what is accepted."""

        def fail(name: str, message: str) -> EmbeddingOptionsError:
            return EmbeddingOptionsError(
                message, file=file, line=line, key=f"adapter.options.{name}"
            )

        unknown = sorted(set(options) - set(OPTION_NAMES))
        if unknown:
            raise fail(
                unknown[0],
                f"unknown embedding option {unknown[0]!r}; accepted: {', '.join(OPTION_NAMES)}",
            )
        normalize = options.get("normalize", True)
        if not isinstance(normalize, bool):
            raise fail("normalize", f"normalize is {normalize!r}; accepted: true or false")
        values: dict[str, int] = {}
        for name, default, top in (
            ("max_inputs", DEFAULT_MAX_INPUTS, MAX_INPUTS_LIMIT),
            ("max_input_chars", DEFAULT_MAX_INPUT_CHARS, MAX_INPUT_CHARS_LIMIT),
        ):
            value = options.get(name, default)
            if type(value) is not int or not 1 <= value <= top:
                raise fail(name, f"{name} is {value!r}; accepted: an integer from 1 to {top}")
            values[name] = value
        return cls(normalize=normalize, **values)


@dataclass(frozen=True, slots=True)
class EmbeddingBatch:
    """A checked, tokenised request: each text's token ids (1-D int64), in order."""

    ids: tuple[np.ndarray, ...]

    @property
    def tokens(self) -> int:
        return sum(int(row.size) for row in self.ids)


def normalized(vectors: np.ndarray) -> np.ndarray:
    """Each row scaled to length 1 (float32)."""
    norms = np.linalg.norm(vectors.astype(np.float64), axis=1, keepdims=True)
    scaled: np.ndarray = (vectors / np.maximum(norms, 1e-12)).astype(np.float32)
    return scaled


def _accepted(settings: EmbeddingSettings) -> str:
    return (
        f"a non-empty string, or a list of 1 to {settings.max_inputs} non-empty strings, each "
        f"at most {settings.max_input_chars} characters"
    )


class EmbeddingAdapter:
    """The pipeline program of one sentence-encoder graph stage (stage 0)."""

    input_kind: Final = "text"
    kind: Final = "embedding"
    example_text: Final = "Embeddings place sentences of similar meaning close together."

    def __init__(self, config: PipelineConfig, options: Mapping[str, Any]) -> None:
        from runtime.artifacts import verify_bundle
        from runtime.config import GraphBackendConfig

        source = str(config.source) if config.source is not None else None
        line = config.adapter.line if config.adapter is not None else None
        self.config = config
        self.settings = EmbeddingSettings.parse(options, file=source, line=line)
        stage = config.stages[0]
        if len(config.stages) != 1 or not isinstance(stage.backend, GraphBackendConfig):
            raise EmbeddingOptionsError(
                "the embedding adapter drives exactly one graph stage (the sentence encoder's "
                f"bundle); this pipeline has {len(config.stages)} stage(s)",
                file=source,
                line=line,
                key="stages",
            )
        bundle = verify_bundle(stage.backend.manifest)
        metadata = bundle.manifest.metadata

        def refuse(problem: str) -> EmbeddingOptionsError:
            return EmbeddingOptionsError(
                f"{bundle.manifest_path} {problem}; accepted: a bundle made by "
                "runtime.adapters.embed_bundle.ensure_embedder",
                file=source,
                line=line,
                key="stages[0].backend.manifest",
            )

        if metadata.get("embed_format") != EMBED_FORMAT:
            raise refuse(
                f"is not a sentence encoder bundle of format {EMBED_FORMAT} (embed_format "
                f"{metadata.get('embed_format')!r})"
            )
        tokenizer_path = bundle.root.parent / str(metadata.get("tokenizer"))
        try:
            digest = hashlib.sha256(tokenizer_path.read_bytes()).hexdigest()
        except OSError as error:
            raise refuse(f"has no readable tokenizer beside it ({error})") from None
        if digest != metadata.get("tokenizer_sha256"):
            raise refuse(f"names a tokenizer that {tokenizer_path} is not (its sha256 differs)")
        if tuple(metadata.get("inputs", ())) != INPUTS or metadata.get("output") != OUTPUT:
            raise refuse(f"does not take {list(INPUTS)} and give {OUTPUT!r}")
        self.dimensions = int(metadata.get("dimensions", DIMENSIONS))
        self.max_tokens = int(metadata.get("max_tokens", MAX_TOKENS))
        self.tokenizer = load_tokenizer(tokenizer_path, max_tokens=self.max_tokens)

    # -- requests ----------------------------------------------------------------------

    def _texts(self, value: object) -> list[str]:
        settings = self.settings
        if isinstance(value, str):
            texts = [value]
        elif isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
            texts = list(value)
            if not texts:
                raise EmbeddingInputError(
                    f"'input' is an empty list; accepted: {_accepted(settings)}", param="input"
                )
            if len(texts) > settings.max_inputs:
                raise EmbeddingInputError(
                    f"'input' has {len(texts)} texts; accepted: at most "
                    f"{settings.max_inputs} per request",
                    param="input",
                )
        else:
            raise EmbeddingInputError(
                f"'input' is of type {type(value).__name__}; accepted: {_accepted(settings)}",
                param="input",
            )
        for index, text in enumerate(texts):
            where = "'input'" if isinstance(value, str) else f"'input[{index}]'"
            if not isinstance(text, str):
                raise EmbeddingInputError(
                    f"{where} is of type {type(text).__name__}; accepted: {_accepted(settings)} "
                    "(token-id arrays are not accepted)",
                    param="input",
                )
            if not text.strip():
                raise EmbeddingInputError(
                    f"{where} is empty or only whitespace; accepted: {_accepted(settings)}",
                    param="input",
                )
            if len(text) > settings.max_input_chars:
                raise EmbeddingInputError(
                    f"{where} has {len(text)} characters; accepted: at most "
                    f"{settings.max_input_chars} (the model reads the first "
                    f"{self.max_tokens} tokens)",
                    param="input",
                )
        return texts

    def prepare(self, request_input: Any) -> EmbeddingBatch:
        """The request checked and tokenised (each text cut to the model's tokens)."""
        value: object = request_input
        if isinstance(request_input, Mapping):
            unknown = sorted(set(map(str, request_input)) - set(_REQUEST_KEYS))
            if unknown or "input" not in request_input:
                problem = f"unknown key {unknown[0]!r}" if unknown else "no 'input'"
                raise EmbeddingInputError(
                    f"the request has {problem}; accepted: a mapping of 'input' and "
                    "optionally 'dimensions', a string, or a list of strings",
                    param=unknown[0] if unknown else "input",
                )
            dimensions = request_input.get("dimensions")
            if dimensions is not None and (
                type(dimensions) is not int or dimensions != self.dimensions
            ):
                raise EmbeddingInputError(
                    f"'dimensions' is {dimensions!r}; accepted: {self.dimensions} (the "
                    "model's size) or none",
                    param="dimensions",
                )
            value = request_input["input"]
        # One text at a time: encode_batch would start the tokenizer's thread pool in the
        # server's process, which then warns in every worker process started after it.
        return EmbeddingBatch(
            tuple(
                np.asarray(self.tokenizer.encode(text).ids, dtype=np.int64)
                for text in self._texts(value)
            )
        )

    async def run(self, ctx: RequestContext, batch: EmbeddingBatch) -> None:
        started = time.perf_counter()
        vectors = np.empty((len(batch.ids), self.dimensions), dtype=np.float32)
        run_s: list[float] = []
        for row, ids in enumerate(batch.ids):
            result = await ctx.call(0, model_inputs(ids))
            vector = result.outputs.get(OUTPUT)
            if vector is None or vector.shape != (1, self.dimensions):
                shape = None if vector is None else list(vector.shape)
                raise ModelError(
                    f"stage {ctx.stage_name(0)} gave {OUTPUT!r} of shape {shape}; expected "
                    f"[1, {self.dimensions}]"
                )
            vectors[row] = vector[0]
            run_s.append(result.run_s)
        if self.settings.normalize:
            vectors = normalized(vectors)
        metrics = {
            "prompt_tokens": batch.tokens,
            "inputs": len(batch.ids),
            "dimensions": self.dimensions,
            "normalized": self.settings.normalize,
            "call_run_s_p50": statistics.median(run_s),
            "wall_s": time.perf_counter() - started,
        }
        await ctx.emit(
            {EMBEDDING_OUTPUT: vectors}, stage=ctx.stage_name(0), finished=True, metrics=metrics
        )
