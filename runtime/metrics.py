"""What requests measured, as frozen values: one :class:`StageCallMetrics` per stage call,
a :class:`RequestMetrics` per finished request, a session's :class:`SessionMetrics`.

The engine records these as it runs; the session hands them on as they are, and their JSON
(``to_json()``, whose keys stay as they were) is written only where they leave the program:
``Omni.metrics()``, the outputs' ``metrics``, ``metrics.json``, the benchmarks' figures.
Standard library only, so every layer may hold them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = [
    "MAX_RECORDED_PROMPT",
    "GenerationMetrics",
    "RequestMetrics",
    "SessionMetrics",
    "StageCallMetrics",
    "StageTotals",
    "recorded_prompt",
]

#: The most characters of a prompt a request's record keeps (the end: the latest turns).
MAX_RECORDED_PROMPT: Final = 32_768
_CUT_MARK: Final = "[...]"


def recorded_prompt(prompt: object) -> str | None:
    """What a request's record keeps of ``prompt``: the text, or its end when it is long;
    None for token ids."""
    if not isinstance(prompt, str):
        return None
    if len(prompt) <= MAX_RECORDED_PROMPT:
        return prompt
    return _CUT_MARK + prompt[len(prompt) - MAX_RECORDED_PROMPT + len(_CUT_MARK) :]


@dataclass(frozen=True, slots=True)
class GenerationMetrics:
    """What a language-model call adds: tokens, how it ended, when its text began and ended.

    ``started_at`` and ``finished_at`` are ``time.perf_counter()`` instants: when the request
    entered the engine and when it finished.
    """

    tokens: int
    finish_reason: str | None
    time_to_first_token_s: float | None
    started_at: float
    finished_at: float
    #: The prompt text the stage was given (a conversation rendered with the model's chat
    #: template, say); its first part is dropped past :data:`MAX_RECORDED_PROMPT` characters.
    #: None for a prompt of token ids.
    prompt: str | None = None


@dataclass(frozen=True, slots=True)
class StageCallMetrics:
    """One stage call of a request.

    ``queue_s`` is the wait before the call (from submission for a request's first call),
    ``transfer_s`` the time outside the model. ``copied_bytes`` (graph calls) counts the
    tensor bytes copied on both sides of the pipe; ``generation`` is set for a language model.
    """

    stage: str
    queue_s: float
    run_s: float
    transfer_s: float
    bytes_in: int
    bytes_out: int
    copied_bytes: int | None = None
    generation: GenerationMetrics | None = None

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "stage": self.stage,
            "queue_s": self.queue_s,
            "run_s": self.run_s,
            "transfer_s": self.transfer_s,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
        }
        if self.copied_bytes is not None:
            document["copied_bytes"] = self.copied_bytes
        generation = self.generation
        if generation is not None:
            document.update(
                tokens=generation.tokens,
                finish_reason=generation.finish_reason,
                time_to_first_token_s=generation.time_to_first_token_s,
                started_at=generation.started_at,
                finished_at=generation.finished_at,
                prompt=generation.prompt,
            )
        return document


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    """A finished request: how it ended and its stage calls, in order."""

    request_id: str
    status: str
    stages: tuple[StageCallMetrics, ...]

    @property
    def prompts(self) -> dict[str, str]:
        """The prompt text each language-model stage was given, by stage name."""
        return {
            call.stage: call.generation.prompt
            for call in self.stages
            if call.generation is not None and call.generation.prompt is not None
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "status": self.status,
            "stages": [call.to_json() for call in self.stages],
            "prompts": self.prompts,
        }


@dataclass(frozen=True, slots=True)
class StageTotals:
    """One stage's calls over many requests, summed."""

    calls: int = 0
    queue_s: float = 0.0
    run_s: float = 0.0
    transfer_s: float = 0.0
    bytes_in: int = 0
    bytes_out: int = 0

    def plus(self, call: StageCallMetrics) -> StageTotals:
        return StageTotals(
            calls=self.calls + 1,
            queue_s=self.queue_s + call.queue_s,
            run_s=self.run_s + call.run_s,
            transfer_s=self.transfer_s + call.transfer_s,
            bytes_in=self.bytes_in + call.bytes_in,
            bytes_out=self.bytes_out + call.bytes_out,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "queue_s": self.queue_s,
            "run_s": self.run_s,
            "transfer_s": self.transfer_s,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
        }


@dataclass(frozen=True, slots=True)
class SessionMetrics:
    """A loaded pipeline's finished requests, in the order they ended, and each stage's
    calls summed over them."""

    pipeline: str
    requests: tuple[RequestMetrics, ...] = ()
    stages: Mapping[str, StageTotals] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, pipeline: str, requests: Iterable[RequestMetrics]) -> SessionMetrics:
        """The metrics of ``requests``, with the per-stage totals summed from their calls."""
        finished = tuple(requests)
        totals: dict[str, StageTotals] = {}
        for request in finished:
            for call in request.stages:
                totals[call.stage] = totals.get(call.stage, StageTotals()).plus(call)
        return cls(pipeline, finished, MappingProxyType(totals))

    def to_json(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "requests": [request.to_json() for request in self.requests],
            "stages": {stage: totals.to_json() for stage, totals in self.stages.items()},
        }
