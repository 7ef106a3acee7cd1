"""Create a session strictly on a route's providers and device, and report where its nodes
run (ONNX Runtime's EP graph assignment, or a profile where that API is missing).

This module imports only the standard library, ONNX Runtime and ``workers`` (errors, devices),
so that it runs in a minimal worker environment.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

import onnxruntime as ort

from workers.errors import WorkerError
from workers.ort_devices import (
    ORT_DEVICE_API,
    ORT_EXTENSION_ERRORS,
    DeviceApi,
    configure_providers,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from runtime.contracts.ep_device import AppliedDevice, EpDeviceRequest
    from workers.ort_load import LoadedGraph

__all__ = [
    "ASSIGNMENT_INFO_AVAILABLE",
    "CPU_PROVIDER",
    "METHOD_ASSIGNMENT",
    "METHOD_PROFILING",
    "PROFILE_PREFIX",
    "PlacementCounts",
    "create_placed_session",
    "create_session",
    "placement_of",
]

CPU_PROVIDER: Final = "CPUExecutionProvider"
#: ONNX Runtime >= 1.24 reports per-node placement without profiling.
ASSIGNMENT_INFO_AVAILABLE: Final = hasattr(
    ort.InferenceSession, "get_provider_graph_assignment_info"
)
METHOD_ASSIGNMENT: Final = "assignment_info"
METHOD_PROFILING: Final = "profiling"
_RECORD_ASSIGNMENT: Final = "session.record_ep_graph_assignment_info"
_DISABLE_CPU_FALLBACK: Final = "session.disable_cpu_ep_fallback"
_EXTERNAL_FOLDER: Final = "session.model_external_initializers_file_folder_path"
_ALLOW_SPINNING: Final = "session.intra_op.allow_spinning"
#: Pools stop spinning when a run ends (ONNX Runtime's ``session.force_spinning_stop``).
_SPIN_WITHIN_RUNS: Final = "session.force_spinning_stop"
#: Folder name prefix of the temporary profile used where assignment info is unavailable.
PROFILE_PREFIX: Final = "omni-edge-ort-profile-"

#: An ONNX Runtime older than 1.24 has no assignment API at all.
_PLACEMENT_ERRORS: Final[tuple[type[Exception], ...]] = (*ORT_EXTENSION_ERRORS, AttributeError)


def create_session(
    graph: LoadedGraph,
    providers: Sequence[str],
    allowed_providers: Sequence[str],
    target_provider: str,
    *,
    intra_op_threads: int = 0,
    allow_spinning: bool = True,
    profile_prefix: Path | None = None,
) -> ort.InferenceSession:
    """A session on ONNX Runtime's default device of the target provider (see
    :func:`create_placed_session`)."""
    session, _ = create_placed_session(
        graph,
        providers,
        allowed_providers,
        target_provider,
        intra_op_threads=intra_op_threads,
        allow_spinning=allow_spinning,
        profile_prefix=profile_prefix,
    )
    return session


def create_placed_session(
    graph: LoadedGraph,
    providers: Sequence[str],
    allowed_providers: Sequence[str],
    target_provider: str,
    *,
    intra_op_threads: int = 0,
    allow_spinning: bool = True,
    profile_prefix: Path | None = None,
    device: EpDeviceRequest | None = None,
    provider_options: Mapping[str, str] | None = None,
    ep_library: str | None = None,
    device_api: DeviceApi = ORT_DEVICE_API,
) -> tuple[ort.InferenceSession, AppliedDevice]:
    """Create a session from the verified bytes, strictly on the route's providers, and on
    the requested ``device`` with the route's ``provider_options`` (see
    :mod:`workers.ort_devices`); return it with the device and options applied.

    ``intra_op_threads`` sizes the pool (0: ONNX Runtime's default). With ``allow_spinning``
    its threads spin between the nodes of a run and stop when the run ends; without it they
    sleep whenever they are idle.

    CPU fallback is disabled when the CPU provider is not allowed, and ONNX Runtime's
    Python-side retry on the CPU is switched off. Placement is recorded as EP graph
    assignment info, or, when ``profile_prefix`` is given (required where ONNX Runtime lacks
    the assignment API), as a profile written there and read by :func:`placement_of`.
    """
    _check_route(providers, allowed_providers, target_provider)
    if profile_prefix is None and not ASSIGNMENT_INFO_AVAILABLE:
        raise WorkerError(
            "placement_unavailable",
            f"ONNX Runtime {ort.__version__} cannot report EP graph assignment; accepted: a "
            "profile_prefix, so that placement is read from a profile",
        )
    options = ort.SessionOptions()
    chosen = configure_providers(
        options,
        providers,
        target_provider,
        device=device,
        provider_options=provider_options,
        ep_library=ep_library,
        api=device_api,
    )
    if chosen.providers is not None:
        available = ort.get_available_providers()
        absent = [provider for provider in providers if provider not in available]
        if absent:
            raise WorkerError(
                "provider_absent",
                f"execution provider(s) {', '.join(absent)} are not available in this ONNX "
                f"Runtime build ({ort.__version__}); available: {', '.join(available)}",
                subject=absent[0],
            )
    options.intra_op_num_threads = intra_op_threads
    if allow_spinning:
        # Pool threads spin between the nodes of a run, never after it: once a run ends its
        # cores go to whoever takes the result (see runtime.backends.threads).
        options.add_session_config_entry(_SPIN_WITHIN_RUNS, "1")
    else:
        # Idle intra-op threads sleep instead of spinning on cores other work needs.
        options.add_session_config_entry(_ALLOW_SPINNING, "0")
    options.log_severity_level = 3
    if profile_prefix is None:
        options.add_session_config_entry(_RECORD_ASSIGNMENT, "1")
    else:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_prefix)
    if CPU_PROVIDER not in allowed_providers:
        options.add_session_config_entry(_DISABLE_CPU_FALLBACK, "1")
    # Weights resolve against the graph's folder; every external file is supplied from memory.
    options.add_session_config_entry(_EXTERNAL_FOLDER, str(graph.graph_dir))
    if graph.external_data:
        names = list(graph.external_data)
        buffers = [graph.external_data[name] for name in names]
        options.add_external_initializers_from_files_in_memory(
            names, buffers, [len(buffer) for buffer in buffers]
        )
    try:
        if chosen.providers is None:
            session = ort.InferenceSession(graph.graph_bytes, options)
        else:
            session = ort.InferenceSession(
                graph.graph_bytes,
                options,
                providers=list(chosen.providers),
                provider_options=[dict(one) for one in chosen.provider_options or ()],
            )
    except ORT_EXTENSION_ERRORS as exc:
        strict = (
            f" (CPU fallback is disabled: {CPU_PROVIDER} is not in allowed_providers "
            f"{list(allowed_providers)})"
            if CPU_PROVIDER not in allowed_providers
            else ""
        )
        raise WorkerError(
            "session_failed",
            f"ONNX Runtime could not create a session for {graph.manifest.graph_file!r} on "
            f"{list(providers)}{strict}: {exc}",
            subject=graph.manifest.graph_file,
        ) from None
    session.disable_fallback()
    dropped = [provider for provider in providers if provider not in session.get_providers()]
    if dropped:
        raise WorkerError(
            "provider_absent",
            f"ONNX Runtime did not register {', '.join(dropped)} for the session; registered: "
            f"{', '.join(session.get_providers())}",
            subject=dropped[0],
        )
    return session, _with_session_options(chosen.applied, session)


def _with_session_options(applied: AppliedDevice, session: ort.InferenceSession) -> AppliedDevice:
    """The applied options, with the values the session reports for its provider (ONNX
    Runtime fills in its defaults and normalises what it was given)."""
    reported = session.get_provider_options().get(applied.ep_name) or {}
    if not reported:
        return applied
    merged = {**applied.provider_options, **{str(k): str(v) for k, v in reported.items()}}
    return dataclasses.replace(applied, provider_options=merged)


def _check_route(
    providers: Sequence[str], allowed_providers: Sequence[str], target_provider: str
) -> None:
    if not providers:
        raise WorkerError(
            "bad_route", "the route names no execution provider; accepted: at least one"
        )
    if len(set(providers)) != len(providers):
        raise WorkerError(
            "bad_route", f"providers {list(providers)} repeat a name; accepted: each once"
        )
    if target_provider not in providers:
        raise WorkerError(
            "bad_route",
            f"target provider {target_provider!r} is not among the route's providers "
            f"{list(providers)}; accepted: one of them",
            subject=target_provider,
        )
    outside = [provider for provider in providers if provider not in allowed_providers]
    if outside:
        raise WorkerError(
            "bad_route",
            f"provider(s) {outside} are not in allowed_providers {list(allowed_providers)}; "
            "accepted: providers the route allows",
            subject=outside[0],
        )


@dataclass(frozen=True, slots=True)
class PlacementCounts:
    """Where the session's nodes run: provider -> node count, as ONNX Runtime reported it."""

    counts: Mapping[str, int]
    total: int
    method: str

    def to_json(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "total": self.total, "method": self.method}


def placement_of(source: ort.InferenceSession | str | Path) -> PlacementCounts:
    """Count nodes per provider from a session (assignment info or its profile) or a profile.

    A session created with ``profile_prefix`` ends its profiling here (after warm-up); the
    profile file it wrote is read and removed.
    """
    if isinstance(source, (str, Path)):
        return _placement_from_profile(Path(source))
    if source.get_session_options().enable_profiling:
        profile = Path(source.end_profiling())
        try:
            return _placement_from_profile(profile)
        finally:
            profile.unlink(missing_ok=True)
    try:
        subgraphs = source.get_provider_graph_assignment_info()
    except _PLACEMENT_ERRORS as exc:
        raise WorkerError(
            "placement_unavailable",
            f"ONNX Runtime {ort.__version__} reported no EP graph assignment ({exc}); accepted: "
            "a session made by create_session",
        ) from None
    counts: dict[str, int] = {}
    for subgraph in subgraphs:
        counts[subgraph.ep_name] = counts.get(subgraph.ep_name, 0) + len(subgraph.get_nodes())
    return _counts(counts, METHOD_ASSIGNMENT)


def _placement_from_profile(path: Path) -> PlacementCounts:
    try:
        events = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise WorkerError(
            "placement_unavailable",
            f"profile {path} cannot be read as JSON ({exc}); accepted: an ONNX Runtime profile",
            subject=str(path),
        ) from None
    if not isinstance(events, list):
        raise WorkerError(
            "placement_unavailable",
            f"profile {path} is not a list of events; accepted: an ONNX Runtime profile",
            subject=str(path),
        )
    nodes: dict[str, str] = {}
    for event in events:
        if not isinstance(event, dict) or event.get("cat") != "Node":
            continue
        args = event.get("args")
        name = event.get("name")
        if not isinstance(args, dict) or not isinstance(name, str):
            continue
        provider = args.get("provider")
        # Each node logs fence and kernel events; one key per node counts it once.
        key = str(args.get("node_index", name.removesuffix("_kernel_time")))
        if isinstance(provider, str) and provider:
            nodes[key] = provider
    counts: dict[str, int] = {}
    for provider in nodes.values():
        counts[provider] = counts.get(provider, 0) + 1
    if not counts:
        raise WorkerError(
            "placement_unavailable",
            f"profile {path} records no node with a provider; accepted: a profile written "
            "after at least one run",
            subject=str(path),
        )
    return _counts(counts, METHOD_PROFILING)


def _counts(counts: Mapping[str, int], method: str) -> PlacementCounts:
    ordered = dict(sorted(counts.items()))
    return PlacementCounts(
        counts=MappingProxyType(ordered), total=sum(ordered.values()), method=method
    )
