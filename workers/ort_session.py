"""The ONNX Runtime core of the graph worker: verify, load, warm up, report placement, run.

The lifecycle is verify -> load -> warm up -> report placement -> serve; :func:`open_graph`
runs it from the parts, each a module of its own: :mod:`workers.ort_load` (verify and load
the bytes that were hashed), :mod:`workers.ort_placement` (the session on the route's
providers and device, and where its nodes run), :mod:`workers.ort_buckets` (input buckets,
warm-up and the call check) and :mod:`workers.ort_runner` (one cancellable call at a time).
Their public names are importable from here too.

This module and its parts import only the standard library, NumPy, ONNX Runtime,
``runtime.contracts``, ``runtime.onnx_wire`` and ``workers``, so that they run in a minimal
worker environment; the one exception is :mod:`runtime.host.locks`, imported only while an
accelerator is initialised (one process at a time takes a device).
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from runtime.contracts.messages import TensorSpec
from workers.errors import WorkerError
from workers.ort_buckets import (
    MAX_BUCKETS,
    Bucket,
    SizedAxis,
    bucket_inputs,
    bucket_shapes,
    check_call_inputs,
    describe_spec,
    sized_axis,
    spec_nbytes,
    spec_of,
    warm_up,
    warm_up_buckets,
)
from workers.ort_devices import ORT_DEVICE_API, ORT_EXTENSION_ERRORS, DeviceApi
from workers.ort_load import LoadedGraph, load_verified_graph
from workers.ort_placement import (
    ASSIGNMENT_INFO_AVAILABLE,
    CPU_PROVIDER,
    METHOD_ASSIGNMENT,
    METHOD_PROFILING,
    PROFILE_PREFIX,
    PlacementCounts,
    create_placed_session,
    create_session,
    placement_of,
)
from workers.ort_runner import CallOutcome, CancellableRunner, RunningCall

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    import onnxruntime as ort

    from runtime.contracts.ep_device import AppliedDevice, EpDeviceRequest

__all__ = [
    "ASSIGNMENT_INFO_AVAILABLE",
    "CPU_PROVIDER",
    "MAX_BUCKETS",
    "METHOD_ASSIGNMENT",
    "METHOD_PROFILING",
    "ORT_ERRORS",
    "PROFILE_PREFIX",
    "Bucket",
    "CallOutcome",
    "CancellableRunner",
    "LoadedGraph",
    "OpenedGraph",
    "PlacementCounts",
    "RunningCall",
    "SizedAxis",
    "TensorSpec",
    "WorkerError",
    "bucket_inputs",
    "bucket_shapes",
    "check_call_inputs",
    "create_placed_session",
    "create_session",
    "describe_spec",
    "load_verified_graph",
    "open_graph",
    "placement_of",
    "sized_axis",
    "spec_nbytes",
    "spec_of",
    "warm_up",
    "warm_up_buckets",
]

#: The errors ONNX Runtime raises, for the worker that runs calls.
ORT_ERRORS: Final = ORT_EXTENSION_ERRORS


@dataclass(frozen=True, slots=True)
class OpenedGraph:
    """A verified graph's session, warmed up on every bucket, and where its nodes run."""

    graph: LoadedGraph
    session: ort.InferenceSession
    buckets: tuple[Bucket, ...]
    placement: PlacementCounts
    load_s: float
    warmup_s: float
    device: AppliedDevice


def open_graph(
    manifest_path: str | Path,
    expected_identity: str,
    providers: Sequence[str],
    allowed_providers: Sequence[str],
    target_provider: str,
    *,
    max_io_bytes: int,
    intra_op_threads: int = 0,
    allow_spinning: bool = True,
    device: EpDeviceRequest | None = None,
    provider_options: Mapping[str, str] | None = None,
    ep_library: str | None = None,
    device_api: DeviceApi = ORT_DEVICE_API,
) -> OpenedGraph:
    """Verify, create the session, warm up every bucket and measure placement.

    Raises WorkerError, ``too_large`` when a bucket's inputs plus outputs exceed
    ``max_io_bytes``. The graph worker and the in-process client both load this way.
    """
    started = time.perf_counter()
    graph = load_verified_graph(manifest_path, expected_identity)
    shapes = bucket_shapes(graph.manifest, graph.example_inputs)
    with ExitStack() as stack:
        profile_prefix = None
        if not ASSIGNMENT_INFO_AVAILABLE:
            # The profile only lives until placement_of has read it.
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix=PROFILE_PREFIX))
            profile_prefix = Path(folder) / "ort"
        if device is not None and device.type != "cpu":
            # One process at a time initialises an accelerator (held through warm-up).
            _hold_device_lock(stack, device.physical_id)
        session, applied = create_placed_session(
            graph,
            providers,
            allowed_providers,
            target_provider,
            intra_op_threads=intra_op_threads,
            allow_spinning=allow_spinning,
            profile_prefix=profile_prefix,
            device=device,
            provider_options=provider_options,
            ep_library=ep_library,
            device_api=device_api,
        )
        loaded = time.perf_counter()
        buckets = warm_up_buckets(session, graph.example_inputs, shapes)
        sized = sized_axis(graph.manifest, buckets)
        if sized is not None:
            # The largest bucket carries the rule: sized calls are checked against its specs.
            widest = max(range(len(buckets)), key=lambda i: buckets[i].io_nbytes)
            buckets = tuple(
                dataclasses.replace(one, sized=sized) if i == widest else one
                for i, one in enumerate(buckets)
            )
        warmed = time.perf_counter()
        placement = placement_of(session)
    largest = max(buckets, key=lambda one: one.io_nbytes)
    if largest.io_nbytes > max_io_bytes:
        raise WorkerError(
            "too_large",
            f"the bucket's inputs plus outputs are {largest.io_nbytes} bytes; accepted: at "
            f"most max_io_bytes = {max_io_bytes} (raise it in the route)",
        )
    return OpenedGraph(
        graph, session, buckets, placement, loaded - started, warmed - loaded, applied
    )


def _hold_device_lock(stack: ExitStack, physical_id: str) -> None:
    from runtime.host.locks import DeviceLockTimeout, device_init_lock

    try:
        stack.enter_context(device_init_lock(physical_id))
    except (DeviceLockTimeout, OSError) as exc:
        raise WorkerError("session_failed", str(exc), subject=physical_id) from None
