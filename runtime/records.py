"""What a loaded pipeline reports about itself: frozen records from the stages to the edges.

A started stage's client makes a :class:`StageRecord`; the engine gathers them into an
:class:`ExecutionPlan`; events, the studio and the API carry these values as they are, and
``to_json()`` runs only where they leave the program (the CLI's ``--json`` and
``execution_plan.json``, the server's responses, saved conversations). Standard library only,
so every layer may hold them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

__all__ = [
    "BACKEND_LABEL",
    "BACKEND_LABEL_MEANING",
    "ExecutionPlan",
    "Placement",
    "ReservationRecord",
    "StageDetail",
    "StageRecord",
    "WorkerRecord",
]

#: The label of a plan whose figures are the backend's execution of the listed stages.
BACKEND_LABEL: Final = "B"
BACKEND_LABEL_MEANING: Final = "backend execution of the listed stages, not complete-model (P)"


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """The process serving a stage: its pid, generation and command line."""

    pid: int | None
    generation: int
    argv: tuple[str, ...] = ()
    #: The stage runs in the controller's process (``pid`` is the controller's).
    in_process: bool = False

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "pid": self.pid,
            "generation": self.generation,
            "argv": list(self.argv),
        }
        if self.in_process:
            document["in_process"] = True
        return document


@dataclass(frozen=True, slots=True)
class ReservationRecord:
    """A stage's reservation in the ledger, while it holds one."""

    id: str
    amounts: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "amounts": dict(self.amounts)}


class Placement(Protocol):
    """Where a graph stage's nodes run (provider -> node count) and how that was measured."""

    @property
    def counts(self) -> Mapping[str, int]: ...

    @property
    def total_nodes(self) -> int: ...

    @property
    def method(self) -> str: ...

    @property
    def target_provider(self) -> str: ...

    @property
    def fraction_on_target(self) -> float: ...

    def to_json(self) -> dict[str, Any]: ...


class StageDetail(Protocol):
    """What one kind of stage reports beyond its name and backend (a frozen value).

    Every kind answers the common fields (None or empty where it has no such thing: a
    remote stage has no worker, a language-model stage no node placement); the rest of
    what it knows is in its ``to_json()``.
    """

    @property
    def route_name(self) -> str:
        """The route's name ("" where the stage's record names none)."""
        ...

    @property
    def ep(self) -> str:
        """The route's execution provider or device kind ("" where none)."""
        ...

    @property
    def worker(self) -> WorkerRecord | None: ...

    @property
    def reservation(self) -> ReservationRecord | None: ...

    @property
    def placement(self) -> Placement | None: ...

    @property
    def load_s(self) -> float | None: ...

    @property
    def warmup_s(self) -> float | None: ...

    @property
    def worker_rss_bytes(self) -> int | None: ...

    @property
    def usable(self) -> bool: ...

    @property
    def model_dir(self) -> Path | None:
        """The model folder a language-model stage loaded (None for other stages)."""
        ...

    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class StageRecord:
    """What a started stage reports about itself: one entry of the execution plan."""

    stage: str
    backend: str
    detail: StageDetail | None = None

    @property
    def route_name(self) -> str:
        return "" if self.detail is None else self.detail.route_name

    @property
    def ep(self) -> str:
        return "" if self.detail is None else self.detail.ep

    @property
    def worker(self) -> WorkerRecord | None:
        return None if self.detail is None else self.detail.worker

    @property
    def reservation(self) -> ReservationRecord | None:
        return None if self.detail is None else self.detail.reservation

    @property
    def placement(self) -> Placement | None:
        return None if self.detail is None else self.detail.placement

    @property
    def load_s(self) -> float | None:
        return None if self.detail is None else self.detail.load_s

    @property
    def warmup_s(self) -> float | None:
        return None if self.detail is None else self.detail.warmup_s

    @property
    def worker_rss_bytes(self) -> int | None:
        return None if self.detail is None else self.detail.worker_rss_bytes

    @property
    def usable(self) -> bool:
        """False once the stage failed or was retired (a record without detail is usable)."""
        return True if self.detail is None else self.detail.usable

    @property
    def model_dir(self) -> Path | None:
        return None if self.detail is None else self.detail.model_dir

    def to_json(self) -> dict[str, Any]:
        extra = {} if self.detail is None else self.detail.to_json()
        return {"stage": self.stage, "backend": self.backend, **extra}


@dataclass(frozen=True, slots=True)
class ExecutionPlan:
    """A loaded pipeline's stages as they were started: identity, workers, routes, placement.

    ``label`` says what its figures measure (``B``: the backend's execution of the listed
    stages); ``source`` is the pipeline file it was read from, if any.
    """

    pipeline: str
    label: str = BACKEND_LABEL
    label_meaning: str = BACKEND_LABEL_MEANING
    source: str | None = None
    stages: tuple[StageRecord, ...] = ()

    def stage(self, name: str) -> StageRecord:
        """The record of the stage called ``name``; KeyError names the stages there are."""
        for record in self.stages:
            if record.stage == name:
                return record
        known = ", ".join(record.stage for record in self.stages) or "none"
        raise KeyError(f"no stage {name!r} in the plan of {self.pipeline} (stages: {known})")

    @property
    def worker_pids(self) -> tuple[int, ...]:
        """The pids of the stages' worker processes (stages in the controller's left out)."""
        return tuple(
            worker.pid
            for worker in (record.worker for record in self.stages)
            if worker is not None and worker.pid is not None and not worker.in_process
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "label": self.label,
            "label_meaning": self.label_meaning,
            "source": self.source,
            "stages": [record.to_json() for record in self.stages],
        }
