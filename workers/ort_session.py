"""The ONNX Runtime core of the graph worker: verify, load, warm up, report placement, run.

The lifecycle is verify -> load -> warm up -> report placement -> serve. Every byte handed
to ONNX Runtime (graph and external weights) is the byte that was hashed, read once into
memory, so a file changed on disk after verification can never reach the session.

This module imports only the standard library, NumPy, ONNX Runtime and ``runtime.contracts``
so that it runs in a minimal worker environment.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import os
import posixpath
import stat
import tempfile
import threading
import time
import zipfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import onnxruntime as ort

from runtime.contracts.buffers import DescriptorError, DType
from runtime.contracts.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    ArtifactManifest,
    ManifestError,
    check_relative_path,
)
from runtime.contracts.messages import TensorSpec
from runtime.onnx_wire import WireError, external_data_locations
from workers.errors import WorkerError
from workers.ort_devices import (
    ORT_DEVICE_API,
    ORT_EXTENSION_ERRORS,
    DeviceApi,
    configure_providers,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from runtime.contracts.ep_device import AppliedDevice, EpDeviceRequest

__all__ = [
    "ASSIGNMENT_INFO_AVAILABLE",
    "CPU_PROVIDER",
    "MAX_BUCKETS",
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
#: Most input buckets a bundle may list in ``metadata.buckets`` (each is warmed up at load).
MAX_BUCKETS: Final = 16
#: Folder name prefix of the temporary profile used where assignment info is unavailable.
PROFILE_PREFIX: Final = "omni-edge-ort-profile-"
_ORT_ERRORS: Final = ORT_EXTENSION_ERRORS
#: The same, for the worker that runs calls (public name).
ORT_ERRORS: Final = _ORT_ERRORS

#: An ONNX Runtime older than 1.24 has no assignment API at all.
_PLACEMENT_ERRORS: Final[tuple[type[Exception], ...]] = (*_ORT_ERRORS, AttributeError)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def spec_of(name: str, array: np.ndarray) -> TensorSpec:
    """The wire description of an array: name, dtype and exact shape."""
    return TensorSpec(name, _dtype_of(array), tuple(int(dim) for dim in array.shape))


def spec_nbytes(spec: TensorSpec) -> int:
    """Bytes of a tensor with a fixed shape (every dimension an integer)."""
    return math.prod(_fixed_dims(spec)) * spec.dtype.itemsize


def describe_spec(spec: TensorSpec) -> str:
    """``float32[1, 1024]``: how errors show what a tensor is or must be."""
    return f"{spec.dtype.value}{list(spec.shape)}"


def _fixed_dims(spec: TensorSpec) -> tuple[int, ...]:
    dims = tuple(dim for dim in spec.shape if isinstance(dim, int))
    if len(dims) != len(spec.shape):
        raise ValueError(f"tensor {spec.name!r} has no fixed shape: {list(spec.shape)}")
    return dims


def _dtype_of(array: np.ndarray) -> DType:
    try:
        return DType.parse(array.dtype.name)
    except DescriptorError as exc:
        raise ValueError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class SizedAxis:
    """One axis a bundle lets calls size freely (``metadata.sized_axis``), between its
    smallest and largest warmed-up bucket. ``inputs`` names each input's axis (all the same
    length in a call); ``outputs`` gives each output dimension that follows it as
    ``(axis, scale, offset)``: ``size * scale + offset``, measured on the buckets at load."""

    inputs: Mapping[str, int]
    low: int
    high: int
    outputs: Mapping[str, tuple[int, int, int]]

    def bucket_for(self, arrays: Mapping[str, np.ndarray], like: Bucket) -> Bucket | None:
        """The bucket of ``arrays`` when they differ from ``like`` only along this axis, within
        its range; None otherwise."""
        size: int | None = None
        inputs: list[TensorSpec] = []
        for spec in like.inputs:
            array = arrays.get(spec.name)
            if array is None or array.dtype != _NUMPY_DTYPES[spec.dtype.value]:
                return None
            shape = tuple(int(dim) for dim in array.shape)
            axis = self.inputs.get(spec.name)
            if len(shape) != len(spec.shape):
                return None
            for index, (given, fixed) in enumerate(zip(shape, spec.shape, strict=True)):
                if index == axis:
                    if size is None:
                        size = given
                    elif given != size:
                        return None
                elif given != fixed:
                    return None
            inputs.append(TensorSpec(spec.name, spec.dtype, shape))
        if size is None or len(arrays) != len(like.inputs) or not self.low <= size <= self.high:
            return None
        outputs = []
        for spec in like.outputs:
            dims = list(_fixed_dims(spec))
            rule = self.outputs.get(spec.name)
            if rule is not None:
                axis, scale, offset = rule
                dims[axis] = size * scale + offset
            outputs.append(TensorSpec(spec.name, spec.dtype, tuple(dims)))
        return Bucket(tuple(inputs), tuple(outputs))


@dataclass(frozen=True, slots=True)
class Bucket:
    """The fixed input bucket (from the example inputs) and the outputs it produces.

    ``sized`` (on one bucket of a bundle that declares ``metadata.sized_axis``) also accepts
    inputs of any length along that axis within its range (see :class:`SizedAxis`)."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    sized: SizedAxis | None = None

    def __post_init__(self) -> None:
        for spec in (*self.inputs, *self.outputs):
            _fixed_dims(spec)

    @property
    def input_nbytes(self) -> int:
        return sum(spec_nbytes(spec) for spec in self.inputs)

    @property
    def output_nbytes(self) -> int:
        return sum(spec_nbytes(spec) for spec in self.outputs)

    @property
    def io_nbytes(self) -> int:
        return self.input_nbytes + self.output_nbytes

    def to_json(self) -> dict[str, Any]:
        return {
            "inputs": [spec.to_wire() for spec in self.inputs],
            "outputs": [spec.to_wire() for spec in self.outputs],
        }


@dataclass(frozen=True, slots=True)
class LoadedGraph:
    """A bundle's graph, external weights and example inputs, read once and verified.

    ``external_data`` maps each location as the graph names it to that file's verified bytes.
    """

    manifest_path: Path
    manifest: ArtifactManifest
    graph_dir: Path
    graph_bytes: bytes
    external_data: Mapping[str, bytes]
    example_inputs: Mapping[str, np.ndarray]

    @property
    def identity(self) -> str:
        return self.manifest.identity

    @property
    def input_specs(self) -> tuple[TensorSpec, ...]:
        return tuple(spec_of(name, array) for name, array in self.example_inputs.items())


def load_verified_graph(manifest_path: str | Path, expected_identity: str) -> LoadedGraph:
    """Read a bundle's manifest, graph, external data and example inputs, checking every hash.

    The manifest's sha256 must equal ``expected_identity`` (what the controller verified);
    each file is read once and its in-memory bytes are hashed against the manifest.
    """
    path = Path(manifest_path).absolute()
    if path.is_dir():
        path = path / MANIFEST_NAME
    raw = _read_regular(path, MANIFEST_NAME, limit=MAX_MANIFEST_BYTES)
    actual = _sha256(raw)
    if actual != expected_identity:
        raise WorkerError(
            "hash_mismatch",
            f"{path}: manifest sha256 is {actual} but the controller verified "
            f"{expected_identity}; accepted: the exact manifest that was verified "
            "(the bundle changed after verification)",
            subject=MANIFEST_NAME,
        )
    try:
        manifest = ArtifactManifest.from_bytes(raw)
    except ManifestError as exc:
        raise WorkerError("bad_manifest", f"{path}: {exc}", subject=exc.subject) from None
    root = path.parent.resolve()
    graph_name = manifest.graph_file
    graph_bytes = _read_listed(path, root, manifest, graph_name)
    try:
        locations = external_data_locations(graph_bytes)
    except WireError as exc:
        raise WorkerError(
            "bad_graph",
            f"{path}: graph_file {graph_name!r} is not a readable ONNX model ({exc}); "
            "accepted: a serialized ONNX ModelProto",
            subject=graph_name,
        ) from None
    graph_dir = posixpath.dirname(graph_name)
    external: dict[str, bytes] = {}
    for location in locations:
        try:
            check_relative_path(location)
        except ManifestError as exc:
            raise WorkerError(
                "external_data_not_listed",
                f"{path}: graph_file {graph_name!r} references external data {location!r} "
                f"({exc}); accepted: a relative path inside the bundle",
                subject=location,
            ) from None
        name = posixpath.join(graph_dir, location) if graph_dir else location
        if name not in manifest.files:
            raise WorkerError(
                "external_data_not_listed",
                f"{path}: graph_file {graph_name!r} references external data {name!r}, which "
                "the manifest does not list; accepted: every external-data file listed with "
                "its sha256",
                subject=name,
            )
        external[location] = _read_listed(path, root, manifest, name)
    inputs_name = manifest.example_inputs_file
    examples = _load_examples(path, inputs_name, _read_listed(path, root, manifest, inputs_name))
    return LoadedGraph(
        manifest_path=path,
        manifest=manifest,
        graph_dir=root.joinpath(*PurePosixPath(graph_dir).parts),
        graph_bytes=graph_bytes,
        external_data=MappingProxyType(external),
        example_inputs=MappingProxyType(examples),
    )


def _read_regular(path: Path, subject: str, *, limit: int | None = None) -> bytes:
    try:
        with path.open("rb") as stream:
            info = os.fstat(stream.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise WorkerError(
                    "missing_file",
                    f"{path} is not a regular file; accepted: a regular file",
                    subject=subject,
                )
            if limit is not None and info.st_size > limit:
                raise WorkerError(
                    "bad_manifest",
                    f"{path} is {info.st_size} bytes; accepted: at most {limit}",
                    subject=subject,
                )
            return stream.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise WorkerError(
            "missing_file",
            f"{path} does not exist; accepted: a file present in the bundle",
            subject=subject,
        ) from None


def _read_listed(manifest_path: Path, root: Path, manifest: ArtifactManifest, name: str) -> bytes:
    target = root.joinpath(*PurePosixPath(name).parts).resolve()
    if not target.is_relative_to(root):
        raise WorkerError(
            "symlink_escape",
            f"{manifest_path}: file {name!r} resolves to {target}, outside the bundle; "
            "accepted: files inside the bundle directory",
            subject=name,
        )
    data = _read_regular(target, name)
    actual = _sha256(data)
    expected = manifest.files[name]
    if actual != expected:
        raise WorkerError(
            "hash_mismatch",
            f"{manifest_path}: file {name!r} as loaded has sha256 {actual} but the manifest "
            f"lists {expected}; accepted: the exact bytes the manifest was written for",
            subject=name,
        )
    return data


def _load_examples(manifest_path: Path, name: str, data: bytes) -> dict[str, np.ndarray]:
    accepted = "accepted: an .npz archive of plain numeric or boolean arrays (no pickle)"
    try:
        loaded = np.load(io.BytesIO(data), allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise WorkerError(
                "bad_example_inputs",
                f"{manifest_path}: example_inputs_file {name!r} is a single array, not an "
                f"archive of named arrays; {accepted}",
                subject=name,
            )
        with loaded:
            arrays = {key: np.asarray(loaded[key]) for key in loaded.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise WorkerError(
            "bad_example_inputs",
            f"{manifest_path}: example_inputs_file {name!r} cannot be loaded ({exc}); {accepted}",
            subject=name,
        ) from None
    if not arrays:
        raise WorkerError(
            "bad_example_inputs",
            f"{manifest_path}: example_inputs_file {name!r} holds no arrays; {accepted}",
            subject=name,
        )
    for key, array in arrays.items():
        try:
            _dtype_of(array)
        except ValueError as exc:
            raise WorkerError(
                "bad_example_inputs",
                f"{manifest_path}: example input {key!r} in {name!r}: {exc}",
                subject=key,
            ) from None
    return arrays


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
    except _ORT_ERRORS as exc:
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


def warm_up(session: ort.InferenceSession, example_inputs: Mapping[str, np.ndarray]) -> Bucket:
    """Run the example inputs once; return the bucket they define and the outputs it yields."""
    declared = [value.name for value in session.get_inputs()]
    missing = [name for name in declared if name not in example_inputs]
    unknown = [name for name in example_inputs if name not in declared]
    if missing or unknown:
        raise WorkerError(
            "bad_example_inputs",
            f"example inputs {sorted(example_inputs)} do not match the graph inputs {declared}"
            f" (missing {missing}, not graph inputs {unknown}); accepted: exactly one array "
            "per graph input",
            subject=(missing or unknown)[0],
        )
    try:
        results = session.run(None, dict(example_inputs))
    except _ORT_ERRORS as exc:
        raise WorkerError(
            "warmup_failed", f"the warm-up call with the example inputs failed: {exc}"
        ) from None
    outputs: list[TensorSpec] = []
    for value, result in zip(session.get_outputs(), results, strict=True):
        array = np.asarray(result)
        try:
            outputs.append(spec_of(value.name, array))
        except ValueError as exc:
            raise WorkerError(
                "warmup_failed", f"output {value.name!r}: {exc}", subject=value.name
            ) from None
    inputs = tuple(spec_of(name, example_inputs[name]) for name in declared)
    return Bucket(inputs=inputs, outputs=tuple(outputs))


def bucket_shapes(
    manifest: ArtifactManifest, example_inputs: Mapping[str, np.ndarray]
) -> tuple[dict[str, tuple[int, ...]], ...]:
    """The input buckets a bundle accepts: the example inputs' shapes first, then any other
    ``metadata.buckets`` entry (a list of ``{input name: shape}`` objects naming every example
    input, with the same ranks, and including the example's own shapes)."""
    example = {name: tuple(int(d) for d in array.shape) for name, array in example_inputs.items()}
    raw = manifest.metadata.get("buckets")
    if raw is None:
        return (example,)
    accepted = (
        f"a list of 1 to {MAX_BUCKETS} objects, each giving every input "
        f"{sorted(example)} a shape of positive integers of the example's rank, one of them "
        f"the example inputs' shapes {_shapes_text(example)}"
    )

    def refuse(detail: str) -> WorkerError:
        return WorkerError(
            "bad_manifest",
            f"metadata.buckets {detail}; accepted: {accepted}",
            subject="metadata.buckets",
        )

    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_BUCKETS:
        size = f"a list of {len(raw)}" if isinstance(raw, list) else type(raw).__name__
        raise refuse(f"is {size}")
    shapes: list[dict[str, tuple[int, ...]]] = []
    for position, entry in enumerate(raw):
        if not isinstance(entry, dict) or set(entry) != set(example):
            names = sorted(entry) if isinstance(entry, dict) else entry
            raise refuse(f"entry {position} names {names!r}")
        shape: dict[str, tuple[int, ...]] = {}
        for name, dims in entry.items():
            if (
                not isinstance(dims, list)
                or len(dims) != len(example[name])
                or not all(type(d) is int and d > 0 for d in dims)
            ):
                raise refuse(f"entry {position} gives {name!r} the shape {dims!r}")
            shape[name] = tuple(dims)
        if shape in shapes:
            raise refuse(f"entry {position} repeats {_shapes_text(shape)}")
        shapes.append(shape)
    if example not in shapes:
        raise refuse(f"does not list the example inputs' shapes {_shapes_text(example)}")
    return (example, *(shape for shape in shapes if shape != example))


def sized_axis(manifest: ArtifactManifest, buckets: Sequence[Bucket]) -> SizedAxis | None:
    """The bundle's ``metadata.sized_axis`` (``{"inputs": {name: axis}}``), with its range and
    output rule measured on the warmed-up ``buckets``; None when the bundle declares none.

    Every bucket must differ from the others only along the named axes, and every output
    dimension that changes must follow the axis's length as ``size * scale + offset``
    (integers) on every bucket; otherwise the bundle is refused (``bad_manifest``)."""
    raw = manifest.metadata.get("sized_axis")
    if raw is None:
        return None
    accepted = (
        '{"inputs": {input name: axis}} naming graph inputs, with at least two buckets that '
        "differ only along those axes and outputs that follow them linearly"
    )

    def refuse(detail: str) -> WorkerError:
        return WorkerError(
            "bad_manifest",
            f"metadata.sized_axis {detail}; accepted: {accepted}",
            subject="metadata.sized_axis",
        )

    names = {spec.name: len(spec.shape) for spec in buckets[0].inputs}
    axes = raw.get("inputs") if isinstance(raw, dict) and set(raw) == {"inputs"} else None
    if (
        not isinstance(axes, dict)
        or not axes
        or not all(
            name in names and type(axis) is int and 0 <= axis < names[name]
            for name, axis in axes.items()
        )
    ):
        raise refuse(f"is {raw!r}")
    sizes: list[int] = []
    for bucket in buckets:
        lengths = {
            _fixed_dims(spec)[axes[spec.name]] for spec in bucket.inputs if spec.name in axes
        }
        if len(lengths) != 1:
            raise refuse(f"names axes of different lengths in bucket {bucket.to_json()}")
        sizes.append(next(iter(lengths)))
    if len(set(sizes)) < 2:
        raise refuse(f"has buckets of one length only ({sizes})")
    order = sorted(range(len(buckets)), key=lambda i: sizes[i])
    first, second = order[0], order[1]
    rules: dict[str, tuple[int, int, int]] = {}
    for position, spec in enumerate(buckets[first].outputs):
        others = _fixed_dims(buckets[second].outputs[position])
        for axis, dim in enumerate(_fixed_dims(spec)):
            if others[axis] == dim:
                continue
            scale, rest = divmod(others[axis] - dim, sizes[second] - sizes[first])
            if rest or spec.name in rules:
                raise refuse(f"output {spec.name!r} does not follow the axis linearly")
            rules[spec.name] = (axis, scale, dim - sizes[first] * scale)
    for bucket, size in zip(buckets, sizes, strict=True):
        for spec in bucket.outputs:
            rule = rules.get(spec.name)
            if rule is not None and _fixed_dims(spec)[rule[0]] != size * rule[1] + rule[2]:
                raise refuse(f"output {spec.name!r} does not follow the axis linearly")
    return SizedAxis(MappingProxyType(dict(axes)), min(sizes), max(sizes), MappingProxyType(rules))


def _shapes_text(shapes: Mapping[str, tuple[int, ...]]) -> str:
    return "{" + ", ".join(f"{name}: {list(dims)}" for name, dims in shapes.items()) + "}"


def bucket_inputs(
    example_inputs: Mapping[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, np.ndarray]:
    """Warm-up inputs of another bucket: each example array zero-padded (or cut) to its shape."""
    out: dict[str, np.ndarray] = {}
    for name, array in example_inputs.items():
        target = shapes[name]
        resized = np.zeros(target, dtype=array.dtype)
        overlap = tuple(slice(0, min(a, b)) for a, b in zip(array.shape, target, strict=True))
        resized[overlap] = array[overlap]
        out[name] = resized
    return out


def warm_up_buckets(
    session: ort.InferenceSession,
    example_inputs: Mapping[str, np.ndarray],
    shapes: Sequence[Mapping[str, tuple[int, ...]]],
) -> tuple[Bucket, ...]:
    """Warm up every bucket (see :func:`bucket_inputs`); the example's bucket comes first."""
    return tuple(
        warm_up(session, example_inputs if index == 0 else bucket_inputs(example_inputs, shape))
        for index, shape in enumerate(shapes)
    )


def _matching_bucket(arrays: Mapping[str, np.ndarray], buckets: Sequence[Bucket]) -> Bucket | None:
    for bucket in buckets:
        if all(
            spec.name in arrays and tuple(arrays[spec.name].shape) == spec.shape
            for spec in bucket.inputs
        ):
            return bucket
    return None


#: The NumPy dtype of each wire dtype's name (comparing dtypes costs less than their names).
_NUMPY_DTYPES: Final = {dtype.value: np.dtype(dtype.value) for dtype in DType}


def check_call_inputs(
    arrays: Mapping[str, np.ndarray], bucket: Bucket | Sequence[Bucket], max_io_bytes: int
) -> Bucket:
    """Refuse a call unless its inputs are exactly one bucket and inputs + outputs fit.

    Returns the bucket the inputs match.
    """
    buckets = (bucket,) if isinstance(bucket, Bucket) else tuple(bucket)
    for candidate in buckets:
        # The common case, without building any message: the inputs are exactly one bucket.
        if len(arrays) == len(candidate.inputs) and all(
            (array := arrays.get(spec.name)) is not None
            and array.shape == spec.shape
            and array.dtype == _NUMPY_DTYPES[spec.dtype.value]
            for spec in candidate.inputs
        ):
            total = sum(int(arrays[spec.name].nbytes) for spec in candidate.inputs)
            if total + candidate.output_nbytes <= max_io_bytes:
                return candidate
            break
    for candidate in buckets:
        if candidate.sized is not None:
            sized = candidate.sized.bucket_for(arrays, candidate)
            if sized is not None:
                total = sum(int(arrays[spec.name].nbytes) for spec in sized.inputs)
                if total + sized.output_nbytes <= max_io_bytes:
                    return sized
    matched = _matching_bucket(arrays, buckets) if len(buckets) > 1 else None
    bucket = buckets[0] if matched is None else matched
    expected = {spec.name: spec for spec in bucket.inputs}
    accepted = " | ".join(
        ", ".join(f"{spec.name}: {describe_spec(spec)}" for spec in one.inputs) for one in buckets
    )
    unknown = [name for name in arrays if name not in expected]
    if unknown:
        raise WorkerError(
            "bad_input",
            f"input {unknown[0]!r} is not an input of this graph; accepted: {accepted}",
            subject=unknown[0],
        )
    missing = [name for name in expected if name not in arrays]
    if missing:
        raise WorkerError(
            "bad_input",
            f"input {missing[0]!r} is missing (given: {sorted(arrays)}); accepted: {accepted}",
            subject=missing[0],
        )
    for name, spec in expected.items():
        array = arrays[name]
        given = f"{array.dtype.name}{list(array.shape)}"
        if array.dtype.name != spec.dtype.value:
            raise WorkerError(
                "bad_input",
                f"input {name!r} has dtype {array.dtype.name} ({given}); accepted: "
                f"{spec.dtype.value} ({describe_spec(spec)})",
                subject=name,
            )
        if tuple(array.shape) != spec.shape:
            wanted = (
                f"exactly {list(spec.shape)}, the fixed bucket"
                if len(buckets) == 1
                else f"one of the fixed buckets ({accepted})"
            )
            rule = next((one.sized for one in buckets if one.sized is not None), None)
            if rule is not None:
                axes = ", ".join(f"{name} axis {axis}" for name, axis in rule.inputs.items())
                wanted += f", or any length from {rule.low} to {rule.high} along {axes}"
            raise WorkerError(
                "bad_input",
                f"input {name!r} has shape {list(array.shape)} ({given}); accepted: {wanted}",
                subject=name,
            )
    total = sum(int(arrays[name].nbytes) for name in expected) + bucket.output_nbytes
    if total > max_io_bytes:
        sizes = ", ".join(f"{name} {int(arrays[name].nbytes)}" for name in expected)
        raise WorkerError(
            "too_large",
            f"inputs ({sizes} bytes) plus outputs ({bucket.output_nbytes} bytes) are {total} "
            f"bytes; accepted: at most max_io_bytes = {max_io_bytes}",
            subject=bucket.inputs[0].name,
        )
    return bucket


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """How one call ended: outputs, or the error (code ``cancelled`` when terminated)."""

    outputs: Mapping[str, np.ndarray] | None
    error: WorkerError | None
    elapsed_s: float


class RunningCall:
    """A call submitted to a :class:`CancellableRunner`."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._outcome: CallOutcome | None = None

    def done(self) -> bool:
        return self._done.is_set()

    def outcome(self, timeout: float | None = None) -> CallOutcome:
        """Wait for the call to end; TimeoutError when it has not ended in ``timeout`` s."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the call did not end within {timeout} s")
        assert self._outcome is not None
        return self._outcome

    def wait(self, timeout: float | None = None) -> Mapping[str, np.ndarray]:
        """The outputs; raises the call's WorkerError (``cancelled``, ``model_error``)."""
        outcome = self.outcome(timeout)
        if outcome.error is not None:
            raise outcome.error
        assert outcome.outputs is not None
        return outcome.outputs

    def _finish(self, outcome: CallOutcome) -> None:
        self._outcome = outcome
        self._done.set()


class CancellableRunner:
    """Runs one call at a time on its own thread; :meth:`cancel` terminates it between nodes.

    ONNX Runtime checks ``RunOptions.terminate`` between node executions, so a cancelled call
    ends after the node it is running finishes.
    """

    def __init__(self, session: ort.InferenceSession, *, name: str = "ort-call") -> None:
        self._session = session
        self._name = name
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._active: RunningCall | None = None
        self._options: ort.RunOptions | None = None
        self._cancelled = False
        self._closed = False

    @property
    def busy(self) -> bool:
        with self._lock:
            return self._active is not None

    def submit(
        self,
        inputs: Mapping[str, np.ndarray],
        on_done: Callable[[CallOutcome], None] | None = None,
    ) -> RunningCall:
        """Start a call; ``on_done`` runs on the call's thread once it has ended."""
        call = RunningCall()
        with self._lock:
            if self._closed:
                raise WorkerError("busy", "the runner is closed; accepted: calls before close")
            if self._active is not None:
                raise WorkerError("busy", "a call is already running; accepted: one call at a time")
            options = ort.RunOptions()
            # A failed or cancelled call is reported as a value; ORT need not log it too.
            options.log_severity_level = 4
            self._active = call
            self._options = options
            self._cancelled = False
            thread = threading.Thread(
                target=self._run,
                args=(call, dict(inputs), options, on_done),
                name=self._name,
                daemon=True,
            )
            self._thread = thread
            thread.start()
        return call

    def run(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """Submit a call and wait for it; another thread may :meth:`cancel` it meanwhile."""
        return self.submit(inputs).wait()

    def cancel(self) -> bool:
        """Terminate the running call; False when no call was running."""
        with self._lock:
            if self._active is None or self._options is None:
                return False
            self._cancelled = True
            self._options.terminate = True
            return True

    def close(self, timeout: float = 10.0) -> None:
        """Cancel any running call and join its thread (idempotent)."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self.cancel()
        if thread is not None:
            thread.join(timeout)

    def _run(
        self,
        call: RunningCall,
        inputs: dict[str, np.ndarray],
        options: ort.RunOptions,
        on_done: Callable[[CallOutcome], None] | None,
    ) -> None:
        started = time.monotonic()
        outputs: dict[str, np.ndarray] | None = None
        error: WorkerError | None = None
        try:
            results = self._session.run(None, inputs, options)
            names = [value.name for value in self._session.get_outputs()]
            outputs = {
                name: np.asarray(result) for name, result in zip(names, results, strict=True)
            }
        except _ORT_ERRORS as exc:
            with self._lock:
                cancelled = self._cancelled
            if cancelled:
                error = WorkerError("cancelled", "the call was cancelled while it ran")
            else:
                error = WorkerError("model_error", f"ONNX Runtime failed the call: {exc}")
        outcome = CallOutcome(
            outputs=None if outputs is None else MappingProxyType(outputs),
            error=error,
            elapsed_s=time.monotonic() - started,
        )
        with self._lock:
            self._active = None
            self._options = None
        call._finish(outcome)
        if on_done is not None:
            on_done(outcome)
