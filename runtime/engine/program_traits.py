"""What a pipeline's program declares about running its stages and requests, read by the
orchestrator for the thread plan and admission (each an optional attribute of the program:
stage ids, or a count)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.config import PipelineConfig

__all__ = ["concurrent_requests", "concurrent_stages", "single_thread_stages", "solo_stages"]


def concurrent_stages(program: object, config: PipelineConfig) -> tuple[str, ...]:
    """The names of the graph stages ``program`` may call at the same time for one request
    (its optional ``concurrent_stages`` attribute: stage ids); the thread plan splits the cores
    between them where they can each have their own (``runtime/backends/threads.py``)."""
    return _stage_names(program, config, "concurrent_stages")


def concurrent_requests(program: object) -> int:
    """How many requests ``program`` runs at once on a pipeline of graph stages only (its
    optional ``concurrent_requests`` attribute, default 1): their calls take each stage in
    turn (one call at a time per stage, in arrival order), so one request's call of a stage
    runs while another's calls a different stage."""
    count = getattr(program, "concurrent_requests", 1)
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 1 else 1


def single_thread_stages(program: object, config: PipelineConfig) -> tuple[str, ...]:
    """The names of the graph stages whose calls gain nothing from a second thread (the
    program's optional ``single_thread_stages`` attribute: stage ids); where its requests
    overlap, the thread plan gives them one and leaves the other cores to the other stages."""
    return _stage_names(program, config, "single_thread_stages")


def solo_stages(program: object, config: PipelineConfig) -> tuple[str, ...]:
    """The names of the graph stages ``program`` calls while its other stages wait (its
    optional ``solo_stages`` attribute: stage ids); the thread plan gives them every core
    even beside a language model (``runtime/backends/threads.py``)."""
    return _stage_names(program, config, "solo_stages")


def _stage_names(program: object, config: PipelineConfig, attribute: str) -> tuple[str, ...]:
    """The names of the stages whose ids the program's optional ``attribute`` lists."""
    ids = getattr(program, attribute, ())
    return tuple(config.stages[i].name for i in ids if 0 <= i < len(config.stages))
