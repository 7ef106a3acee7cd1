"""What a pipeline's requests are, known from its file before anything starts: text, a
mapping of tensors or audio (:func:`input_kind`), and the example request its adapter offers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from runtime.config import LlmBackendConfig, resolve_callable

if TYPE_CHECKING:
    from runtime.config import PipelineConfig

#: What a pipeline's requests are (``input_kind``): text, a mapping of tensors, or audio
#: (``{"audio": samples, "sample_rate": Hz}``).
TEXT_INPUT: Final = "text"
TENSOR_INPUT: Final = "tensors"
AUDIO_INPUT: Final = "audio"


def input_kind(config: PipelineConfig) -> str:
    """What the pipeline's requests are, known before anything starts: ``text``, ``tensors``
    or ``audio``.

    A graph chain takes tensors and a lone language model text; an adapter takes text unless
    its class says ``input_kind = "tensors"`` or ``"audio"``.
    """
    if config.adapter is None:
        first = config.stages[0].backend
        return TEXT_INPUT if isinstance(first, LlmBackendConfig) else TENSOR_INPUT
    factory = resolve_callable(
        config.adapter.name,
        file=str(config.source),
        line=config.adapter.line,
        key="adapter.name",
    )
    declared = getattr(factory, "input_kind", TEXT_INPUT)
    return declared if declared in (TENSOR_INPUT, AUDIO_INPUT) else TEXT_INPUT


def example_text(config: PipelineConfig) -> str | None:
    """The example request a pipeline's adapter offers: its ``example_text`` option, else its
    class's ``example_text``; None when it names neither or the pipeline has no adapter."""
    if config.adapter is None:
        return None
    factory = resolve_callable(
        config.adapter.name,
        file=str(config.source),
        line=config.adapter.line,
        key="adapter.name",
    )
    text = config.adapter.options.get("example_text") or getattr(factory, "example_text", None)
    return None if text is None else str(text)
