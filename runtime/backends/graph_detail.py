"""What a graph stage reports in ``execution_plan``, whichever client serves it: its record
(:class:`GraphStageDetail`), its arenas and the device it runs on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.backends.base import ReservationRecord, WorkerRecord
    from runtime.backends.graph_spec import GraphStageSpec
    from runtime.backends.placement import PlacementReport
    from runtime.contracts.ep_device import AppliedDevice
    from runtime.contracts.messages import TensorSpec


def device_record(spec: GraphStageSpec, applied: AppliedDevice | None) -> dict[str, Any]:
    """A graph stage's ``device`` entry of ``execution_plan``: the device admission chose and
    what the worker applied (the route's provider options are in its ``route`` entry)."""
    device = spec.device
    return {
        "requested": None
        if device is None
        else {
            "physical_id": device.physical_id,
            "name": device.name,
            "kind": device.kind.value,
            "vendor_id": device.vendor_id,
            "device_id": device.device_id,
        },
        "applied": None if applied is None else applied.to_wire(),
    }


@dataclass(frozen=True, slots=True)
class ArenaRecord:
    """The shared-memory arenas of a worker's calls: the controller's for inputs, the
    worker's for outputs."""

    inputs_bytes: int
    outputs_bytes: int

    def to_json(self) -> dict[str, int]:
        return {"inputs_bytes": self.inputs_bytes, "outputs_bytes": self.outputs_bytes}


@dataclass(frozen=True, slots=True)
class GraphStageDetail:
    """What a graph stage reports in ``execution_plan``, whichever client serves it."""

    spec: GraphStageSpec
    worker: WorkerRecord
    reservation: ReservationRecord | None
    placement: PlacementReport | None
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    load_s: float | None
    warmup_s: float | None
    worker_rss_bytes: int | None
    applied_intra_op_threads: int | None
    applied_allow_spinning: bool | None
    arenas: ArenaRecord | None
    usable: bool
    failure: str | None
    applied_device: AppliedDevice | None = None

    @property
    def route_name(self) -> str:
        return self.spec.route.name

    @property
    def model_dir(self) -> None:
        """A graph stage loads a bundle (its manifest is in the record), not a model folder."""
        return None

    @property
    def ep(self) -> str:
        return self.spec.route.ep

    def to_json(self) -> dict[str, Any]:
        bundle, route, threads = self.spec.bundle, self.spec.route, self.spec.threads
        return {
            "label": "B",
            "manifest": {
                "path": str(bundle.manifest_path),
                "identity": bundle.identity,
                "component": bundle.manifest.component,
            },
            "worker": self.worker.to_json(),
            "route": route.to_json(),
            "reservation": None if self.reservation is None else self.reservation.to_json(),
            "device": device_record(self.spec, self.applied_device),
            "placement": None if self.placement is None else self.placement.to_json(),
            "inputs": [spec.to_wire() for spec in self.inputs],
            "outputs": [spec.to_wire() for spec in self.outputs],
            "load_s": self.load_s,
            "warmup_s": self.warmup_s,
            "worker_rss_bytes": self.worker_rss_bytes,
            "threads": {
                **({} if threads is None else threads.to_json()),
                "applied_intra_op_threads": self.applied_intra_op_threads,
                "applied_allow_spinning": self.applied_allow_spinning,
            },
            "arenas": None if self.arenas is None else self.arenas.to_json(),
            "usable": self.usable,
            "failure": self.failure,
        }
