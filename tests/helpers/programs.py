"""Pipeline programs the tests name as adapters (``tests.helpers.programs:Class``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from runtime.engine.program import ChainProgram

if TYPE_CHECKING:
    from collections.abc import Mapping

    from runtime.config import PipelineConfig


class WholeInputChain(ChainProgram):
    """The graph chain, but reading its input whole: a program that does not stream input."""

    kind: Final = "whole-input chain"  # type: ignore[misc]
    streams_input: Final = False  # type: ignore[misc]

    def __init__(self, config: PipelineConfig, options: Mapping[str, Any]) -> None:
        super().__init__(config)
