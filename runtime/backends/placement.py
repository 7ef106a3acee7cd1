"""The placement report a graph worker sends after warm-up, and the gate that judges it.

A stage never silently runs somewhere other than its route declares: startup is refused
when a provider is absent, when nodes run on providers outside ``allowed_providers``, or
when the fraction of nodes on the target provider is below ``min_fraction_on_target``.
Reports always keep the real split, whatever the gate decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from runtime.errors import PlacementRefused

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from runtime.contracts.messages import ReadyMessage

__all__ = [
    "PlacementReport",
    "PlacementViolation",
    "check_provider_available",
    "gate_placement",
]

#: Reasons a :class:`PlacementViolation` carries.
PROVIDER_ABSENT: Final = "provider_absent"
OUTSIDE_ALLOWED: Final = "outside_allowed"
BELOW_MIN_FRACTION: Final = "below_min_fraction"
UNVERIFIED: Final = "unverified"


class PlacementViolation(PlacementRefused):
    """Startup refused by the placement gate. ``reason`` is one of the module's constants;
    ``report`` is the real split when one was measured."""

    def __init__(
        self, message: str, *, stage: str, reason: str, report: PlacementReport | None = None
    ) -> None:
        super().__init__(message)
        self.stage = stage
        self.reason = reason
        self.report = report


@dataclass(frozen=True, slots=True)
class PlacementReport:
    """Where a stage's nodes run (provider -> node count) and how that was measured."""

    counts: Mapping[str, int]
    total_nodes: int
    method: str
    target_provider: str

    def __post_init__(self) -> None:
        counts = dict(self.counts)
        for provider, count in counts.items():
            if not isinstance(provider, str) or not provider:
                raise ValueError(f"provider name {provider!r} must be a non-empty string")
            if type(count) is not int or count < 0:
                raise ValueError(f"node count {count!r} for {provider} must be an integer >= 0")
        if type(self.total_nodes) is not int or self.total_nodes < sum(counts.values()):
            raise ValueError(
                f"total_nodes {self.total_nodes!r} must be an integer of at least the sum of "
                f"the counts ({sum(counts.values())})"
            )
        object.__setattr__(self, "counts", MappingProxyType(dict(sorted(counts.items()))))

    @property
    def unplaced_nodes(self) -> int:
        """Nodes for which ONNX Runtime reported no provider."""
        return self.total_nodes - sum(self.counts.values())

    @property
    def fraction_on_target(self) -> float:
        if self.total_nodes == 0:
            return 0.0
        return self.counts.get(self.target_provider, 0) / self.total_nodes

    def split_text(self) -> str:
        """The real split, e.g. ``CPUExecutionProvider 3/4, DmlExecutionProvider 1/4``."""
        if not self.total_nodes:
            return "no nodes reported"
        parts = [
            f"{provider} {count}/{self.total_nodes}" for provider, count in self.counts.items()
        ]
        if self.unplaced_nodes:
            parts.append(f"no provider reported {self.unplaced_nodes}/{self.total_nodes}")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "counts": dict(self.counts),
            "total_nodes": self.total_nodes,
            "unplaced_nodes": self.unplaced_nodes,
            "method": self.method,
            "target_provider": self.target_provider,
            "fraction_on_target": self.fraction_on_target,
        }

    @classmethod
    def from_ready(cls, ready: ReadyMessage, *, target_provider: str) -> PlacementReport:
        """The report carried by a worker's ``ready`` message (already validated on receipt)."""
        return cls(
            counts=ready.placement,
            total_nodes=ready.total_nodes,
            method=ready.placement_method,
            target_provider=target_provider,
        )


def check_provider_available(provider: str, available: Sequence[str], stage: str) -> None:
    """Refuse a route whose provider this ONNX Runtime build does not offer."""
    if provider not in available:
        raise PlacementViolation(
            f"stage {stage}: execution provider {provider} is absent; available: "
            f"{', '.join(available) if available else 'none'}",
            stage=stage,
            reason=PROVIDER_ABSENT,
        )


def gate_placement(
    report: PlacementReport,
    *,
    allowed_providers: Sequence[str],
    target_provider: str,
    min_fraction_on_target: float = 1.0,
    stage: str,
) -> None:
    """Refuse startup when the measured placement violates the route; return None when it fits."""
    if not 0.0 < min_fraction_on_target <= 1.0:
        raise ValueError(
            f"min_fraction_on_target {min_fraction_on_target!r} is outside (0, 1]; "
            "accepted: a fraction above 0 and at most 1"
        )
    if report.total_nodes == 0:
        raise PlacementViolation(
            f"stage {stage}: placement is unverified: the worker reported no nodes "
            f"(method {report.method})",
            stage=stage,
            reason=UNVERIFIED,
            report=report,
        )
    if report.unplaced_nodes:
        raise PlacementViolation(
            f"stage {stage}: placement is unverified: ONNX Runtime reported no provider for "
            f"{report.unplaced_nodes} of {report.total_nodes} nodes; real split: "
            f"{report.split_text()}",
            stage=stage,
            reason=UNVERIFIED,
            report=report,
        )
    outside = {
        provider: count
        for provider, count in report.counts.items()
        if count and provider not in allowed_providers
    }
    if outside:
        used = ", ".join(f"{provider} ({count} nodes)" for provider, count in outside.items())
        raise PlacementViolation(
            f"stage {stage}: nodes run on providers outside allowed_providers "
            f"[{', '.join(allowed_providers)}]: {used}; real split: {report.split_text()}",
            stage=stage,
            reason=OUTSIDE_ALLOWED,
            report=report,
        )
    on_target = report.counts.get(target_provider, 0)
    fraction = on_target / report.total_nodes
    if fraction < min_fraction_on_target:
        raise PlacementViolation(
            f"stage {stage}: {on_target} of {report.total_nodes} nodes ({fraction:.3f}) run on "
            f"the target {target_provider}, below min_fraction_on_target "
            f"{min_fraction_on_target}; real split: {report.split_text()}",
            stage=stage,
            reason=BELOW_MIN_FRACTION,
            report=report,
        )
