"""The graph-worker protocol: the typed messages a controller and a worker exchange.

Each message travels as one frame (see :mod:`.codec`): the frame ``kind`` names the
message and the frame ``body`` holds its fields. ``call`` and ``result`` frames also
carry one buffer per tensor, in the order of ``input_names`` / ``output_names``.

Controller to worker: ``load``, ``call``, ``cancel``, ``ack``, ``shutdown``.
Worker to controller: ``hello``, ``ready``, ``result``, ``error``, ``ack``, ``bye``.

Every field is required on the wire (``None`` is written as ``null``) except those added
to a message later, which have a default (a peer that predates them omits them); unknown
fields are refused, and every value is validated when a message is built, so a message that
exists is a valid one. Failures raise :class:`MessageError` naming the kind, the field
and what is accepted.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, Self, cast

from .buffers import DescriptorError, DType
from .ep_device import AppliedDevice, EpDeviceError, EpDeviceRequest, check_options
from .versions import KNOWN_FEATURES, Negotiated, negotiate

if TYPE_CHECKING:
    from .codec import Frame

#: Stable machine-readable codes carried by :class:`MessageError`.
MESSAGE_ERROR_CODES = frozenset(
    {
        "unknown_kind",  # no message has this kind
        "unexpected_kind",  # a known kind this receiver does not accept (wrong direction)
        "bad_body",  # the body is not an object
        "missing_field",  # a field is absent
        "unknown_field",  # a field this kind does not have
        "bad_field",  # a field has the wrong type or an out-of-range value
        "buffer_count",  # the frame's buffers do not match the message's tensor names
    }
)

PLACEMENT_METHODS = frozenset({"assignment_info", "profiling"})


class MessageError(ValueError):
    """A protocol message was rejected. ``code`` is one of :data:`MESSAGE_ERROR_CODES`."""

    def __init__(self, code: str, message: str) -> None:
        assert code in MESSAGE_ERROR_CODES, code
        super().__init__(f"{code}: {message}")
        self.code = code


def _bad(kind: str, field: str, value: object, accepted: str) -> NoReturn:
    raise MessageError(
        "bad_field", f"{kind}.{field} = {value!r:.80} is invalid; expected {accepted}"
    )


def _check_str(kind: str, field: str, value: object, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not empty and not value):
        _bad(kind, field, value, "a string" if empty else "a non-empty string")
    return value


def _check_int(kind: str, field: str, value: object, *, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        _bad(kind, field, value, f"an integer >= {minimum}")
    return value


def _check_float(
    kind: str, field: str, value: object, *, minimum: float = 0.0, maximum: float = math.inf
) -> float:
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not minimum <= value <= maximum
    ):
        bounds = f">= {minimum}" if maximum == math.inf else f"in [{minimum}, {maximum}]"
        _bad(kind, field, value, f"a finite number {bounds}")
    return float(value)


def _check_bool(kind: str, field: str, value: object) -> bool:
    if not isinstance(value, bool):
        _bad(kind, field, value, "true or false")
    return value


def _check_names(kind: str, field: str, value: object) -> tuple[str, ...]:
    accepted = "a list of distinct non-empty strings"
    if not isinstance(value, (list, tuple)):
        _bad(kind, field, value, accepted)
    if not all(isinstance(item, str) and item for item in value) or len(set(value)) != len(value):
        _bad(kind, field, value, accepted)
    return tuple(value)


def _set(message: object, field: str, value: object) -> None:
    # Normalising a field of a frozen dataclass (a list becomes a tuple) in __post_init__.
    object.__setattr__(message, field, value)


class Message:
    """Base of every protocol message: a frozen dataclass whose fields are its body."""

    __slots__ = ()

    KIND: ClassVar[str]

    @property
    def buffer_names(self) -> tuple[str, ...]:
        """The tensor names of the buffers that travel with this message, in frame order."""
        return ()

    def to_body(self) -> dict[str, Any]:
        """The JSON body of this message's frame."""
        return {
            field.name: _to_wire(getattr(self, field.name))
            for field in dataclasses.fields(self)  # type: ignore[arg-type]
        }

    @classmethod
    def from_body(cls, body: object) -> Self:
        """Parse and validate a frame body; raise :class:`MessageError` on any defect."""
        if not isinstance(body, Mapping):
            raise MessageError("bad_body", f"{cls.KIND} body must be a JSON object")
        names, required = _field_names(cast("type", cls))
        if body.keys() - names:
            unknown = sorted(set(body) - set(names))
            raise MessageError(
                "unknown_field", f"{cls.KIND} has no field(s) {unknown}; fields: {list(names)}"
            )
        if required - body.keys():
            missing = [name for name in names if name in required and name not in body]
            raise MessageError("missing_field", f"{cls.KIND} is missing field(s) {missing}")
        return cls(**body)


@functools.cache
def _field_names(cls: type) -> tuple[tuple[str, ...], frozenset[str]]:
    """A message class's field names in order, and those without a default (required)."""
    fields = dataclasses.fields(cls)
    names = tuple(field.name for field in fields)
    required = frozenset(
        field.name
        for field in fields
        if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
    )
    return names, required


def _to_wire(value: object) -> object:
    if isinstance(value, tuple):
        return [_to_wire(item) for item in value]
    if isinstance(value, TensorSpec | EpDeviceRequest | AppliedDevice):
        return value.to_wire()
    if isinstance(value, Mapping):
        return dict(value)
    return value


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A graph input or output as the worker's session reports it.

    A dimension is an integer, a symbolic name, or ``None`` when it is unknown.
    """

    name: str
    dtype: DType
    shape: tuple[int | str | None, ...]

    def __post_init__(self) -> None:
        where = "tensor"
        _check_str(where, "name", self.name)
        if not isinstance(self.dtype, DType):
            _bad(where, "dtype", self.dtype, f"one of {', '.join(d.value for d in DType)}")
        if not isinstance(self.shape, (list, tuple)):
            _bad(where, "shape", self.shape, "a list of dimensions")
        for dim in self.shape:
            if dim is None or (isinstance(dim, str) and dim):
                continue
            if isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0:
                continue
            _bad(where, f"{self.name}.shape", self.shape, "integers >= 0, names or null")
        _set(self, "shape", tuple(self.shape))

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype.value, "shape": list(self.shape)}

    @classmethod
    def from_wire(cls, wire: object, where: str) -> TensorSpec:
        if not isinstance(wire, Mapping) or set(wire) != {"name", "dtype", "shape"}:
            _bad(where, "tensor", wire, "an object with exactly name, dtype and shape")
        try:
            dtype = DType.parse(wire["dtype"])
        except DescriptorError as exc:
            raise MessageError("bad_field", f"{where}: {exc}") from None
        return cls(wire["name"], dtype, wire["shape"])


def _check_specs(kind: str, field: str, value: object) -> tuple[TensorSpec, ...]:
    if not isinstance(value, (list, tuple)):
        _bad(kind, field, value, "a list of tensors")
    specs = tuple(
        item if isinstance(item, TensorSpec) else TensorSpec.from_wire(item, f"{kind}.{field}")
        for item in value
    )
    if len({spec.name for spec in specs}) != len(specs):
        _bad(kind, field, [spec.name for spec in specs], "distinct tensor names")
    return specs


# Controller -> worker.


@dataclass(frozen=True, slots=True)
class LoadMessage(Message):
    """Verify a bundle and load its graph on the listed providers, then warm it up."""

    KIND: ClassVar[str] = "load"

    manifest_path: str
    expected_identity: str
    providers: tuple[str, ...]
    allowed_providers: tuple[str, ...]
    target_provider: str
    max_io_bytes: int
    min_fraction_on_target: float
    shm_prefix: str | None
    #: ONNX Runtime's intra-op threads (0: its default, one per core) and whether they spin.
    intra_op_threads: int = 0
    allow_spinning: bool = True
    #: The controller reads binary headers: the worker may send its results with them.
    binary_headers: bool = False
    #: How long the worker may wait for the next call awake (polling its input) before it
    #: sleeps, when calls have been coming back to back (0: it always sleeps).
    spin_wait_us: int = 0
    #: The hardware device the stage was admitted on (None: ONNX Runtime's default device),
    #: the route's options for the target provider, and a plugin library providing it.
    device: EpDeviceRequest | None = None
    provider_options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    ep_library: str | None = None

    def __post_init__(self) -> None:
        kind = self.KIND
        _check_str(kind, "manifest_path", self.manifest_path)
        _check_bool(kind, "binary_headers", self.binary_headers)
        try:
            if self.device is not None:
                _set(self, "device", EpDeviceRequest.from_wire(self.device, f"{kind}.device"))
            _set(self, "provider_options", check_options(kind, self.provider_options))
        except EpDeviceError as exc:
            raise MessageError("bad_field", str(exc)) from None
        if self.ep_library is not None:
            _check_str(kind, "ep_library", self.ep_library)
        _check_int(kind, "intra_op_threads", self.intra_op_threads)
        _check_bool(kind, "allow_spinning", self.allow_spinning)
        _check_int(kind, "spin_wait_us", self.spin_wait_us)
        _check_str(kind, "expected_identity", self.expected_identity)
        _set(self, "providers", _check_names(kind, "providers", self.providers))
        if not self.providers:
            _bad(kind, "providers", self.providers, "at least one provider")
        _set(
            self,
            "allowed_providers",
            _check_names(kind, "allowed_providers", self.allowed_providers),
        )
        _check_str(kind, "target_provider", self.target_provider)
        if self.target_provider not in self.providers:
            _bad(
                kind,
                "target_provider",
                self.target_provider,
                f"one of providers {list(self.providers)}",
            )
        if self.target_provider not in self.allowed_providers:
            _bad(
                kind,
                "target_provider",
                self.target_provider,
                f"one of allowed_providers {list(self.allowed_providers)}",
            )
        _check_int(kind, "max_io_bytes", self.max_io_bytes, minimum=1)
        _set(
            self,
            "min_fraction_on_target",
            _check_float(kind, "min_fraction_on_target", self.min_fraction_on_target, maximum=1.0),
        )
        if self.shm_prefix is not None:
            _check_str(kind, "shm_prefix", self.shm_prefix)


@dataclass(frozen=True, slots=True)
class CallMessage(Message):
    """Run the graph once; one buffer per input travels with the frame."""

    KIND: ClassVar[str] = "call"

    call_id: int
    request_id: str
    epoch: int
    input_names: tuple[str, ...]

    def __post_init__(self) -> None:
        _check_int(self.KIND, "call_id", self.call_id)
        _check_str(self.KIND, "request_id", self.request_id)
        _check_int(self.KIND, "epoch", self.epoch)
        _set(self, "input_names", _check_names(self.KIND, "input_names", self.input_names))

    @property
    def buffer_names(self) -> tuple[str, ...]:
        return self.input_names

    def to_body(self) -> dict[str, Any]:
        # Sent once per call: spelled out rather than walked field by field.
        return {
            "call_id": self.call_id,
            "request_id": self.request_id,
            "epoch": self.epoch,
            "input_names": list(self.input_names),
        }


@dataclass(frozen=True, slots=True)
class CancelMessage(Message):
    """Stop the call with this id, if it is still running."""

    KIND: ClassVar[str] = "cancel"

    call_id: int

    def __post_init__(self) -> None:
        _check_int(self.KIND, "call_id", self.call_id)


@dataclass(frozen=True, slots=True)
class AckMessage(Message):
    """The consumer has copied the shared-memory buffer ``(owner, generation)``."""

    KIND: ClassVar[str] = "ack"

    owner: str
    generation: int

    def __post_init__(self) -> None:
        _check_str(self.KIND, "owner", self.owner)
        _check_int(self.KIND, "generation", self.generation)

    def to_body(self) -> dict[str, Any]:
        return {"owner": self.owner, "generation": self.generation}


@dataclass(frozen=True, slots=True)
class ShutdownMessage(Message):
    """Finish and exit; the worker answers ``bye``."""

    KIND: ClassVar[str] = "shutdown"


# Worker -> controller.


@dataclass(frozen=True, slots=True)
class HelloMessage(Message):
    """The worker's first frame: protocol, features and process identity."""

    KIND: ClassVar[str] = "hello"

    protocol_version: int
    required_features: tuple[str, ...]
    offered_features: tuple[str, ...]
    worker: str
    pid: int
    create_time: float
    generation: int

    def __post_init__(self) -> None:
        kind = self.KIND
        _check_int(kind, "protocol_version", self.protocol_version)
        _set(
            self,
            "required_features",
            _check_names(kind, "required_features", self.required_features),
        )
        _set(
            self, "offered_features", _check_names(kind, "offered_features", self.offered_features)
        )
        _check_str(kind, "worker", self.worker)
        _check_int(kind, "pid", self.pid, minimum=1)
        _set(self, "create_time", _check_float(kind, "create_time", self.create_time))
        _check_int(kind, "generation", self.generation)

    def negotiate(self, known: frozenset[str] = KNOWN_FEATURES) -> Negotiated:
        """Agree on version and features; raises ``FeatureError`` naming what is refused."""
        return negotiate(
            self.protocol_version, self.required_features, self.offered_features, known
        )


@dataclass(frozen=True, slots=True)
class ReadyMessage(Message):
    """The graph is loaded and warmed up; where its nodes actually run.

    ``placement`` counts nodes per provider; nodes with no reported provider are the
    difference to ``total_nodes``, which a placement gate treats as unverified.
    """

    KIND: ClassVar[str] = "ready"

    placement: Mapping[str, int]
    total_nodes: int
    placement_method: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    load_s: float
    warmup_s: float
    rss_bytes: int
    #: The session's intra-op threads and spinning as applied, and the output arena's size.
    intra_op_threads: int = 0
    allow_spinning: bool = True
    arena_bytes: int = 0
    #: The inputs of the largest bucket, in bytes (what the controller's arena must hold).
    max_input_bytes: int = 0
    #: The name of the worker's output arena (None without one).
    arena_name: str | None = None
    #: The execution-provider device and the options the session was created with.
    device: AppliedDevice | None = None

    def __post_init__(self) -> None:
        kind = self.KIND
        if not isinstance(self.placement, Mapping):
            _bad(kind, "placement", self.placement, "an object of provider: node count")
        for provider, count in self.placement.items():
            _check_str(kind, "placement", provider)
            _check_int(kind, f"placement[{provider!r}]", count)
        _set(self, "placement", dict(self.placement))
        _check_int(kind, "total_nodes", self.total_nodes)
        placed = sum(self.placement.values())
        if placed > self.total_nodes:
            _bad(
                kind,
                "placement",
                dict(self.placement),
                f"at most total_nodes={self.total_nodes} nodes",
            )
        if self.placement_method not in PLACEMENT_METHODS:
            _bad(
                kind,
                "placement_method",
                self.placement_method,
                f"one of {sorted(PLACEMENT_METHODS)}",
            )
        _set(self, "inputs", _check_specs(kind, "inputs", self.inputs))
        _set(self, "outputs", _check_specs(kind, "outputs", self.outputs))
        _set(self, "load_s", _check_float(kind, "load_s", self.load_s))
        _set(self, "warmup_s", _check_float(kind, "warmup_s", self.warmup_s))
        _check_int(kind, "rss_bytes", self.rss_bytes)
        _check_int(kind, "intra_op_threads", self.intra_op_threads)
        _check_bool(kind, "allow_spinning", self.allow_spinning)
        _check_int(kind, "arena_bytes", self.arena_bytes)
        _check_int(kind, "max_input_bytes", self.max_input_bytes)
        if self.arena_name is not None:
            _check_str(kind, "arena_name", self.arena_name)
        if self.device is not None:
            try:
                _set(self, "device", AppliedDevice.from_wire(self.device, f"{kind}.device"))
            except EpDeviceError as exc:
                raise MessageError("bad_field", str(exc)) from None


@dataclass(frozen=True, slots=True)
class ResultMessage(Message):
    """A call finished; one buffer per output travels with the frame."""

    KIND: ClassVar[str] = "result"

    call_id: int
    request_id: str
    epoch: int
    output_names: tuple[str, ...]
    run_s: float
    #: Tensor bytes the worker copied for this call (0 when ONNX Runtime read its inputs in
    #: place and wrote its outputs straight into the worker's arena).
    copied_bytes: int = 0

    def __post_init__(self) -> None:
        _check_int(self.KIND, "call_id", self.call_id)
        _check_str(self.KIND, "request_id", self.request_id)
        _check_int(self.KIND, "epoch", self.epoch)
        _set(self, "output_names", _check_names(self.KIND, "output_names", self.output_names))
        _set(self, "run_s", _check_float(self.KIND, "run_s", self.run_s))
        _check_int(self.KIND, "copied_bytes", self.copied_bytes)

    @property
    def buffer_names(self) -> tuple[str, ...]:
        return self.output_names

    def to_body(self) -> dict[str, Any]:
        # Sent once per call: spelled out rather than walked field by field.
        return {
            "call_id": self.call_id,
            "request_id": self.request_id,
            "epoch": self.epoch,
            "output_names": list(self.output_names),
            "run_s": self.run_s,
            "copied_bytes": self.copied_bytes,
        }


@dataclass(frozen=True, slots=True)
class ErrorMessage(Message):
    """Something failed: a call (``call_id``) or the worker itself (``call_id`` null).

    ``fatal`` means the worker is exiting and must be replaced.
    """

    KIND: ClassVar[str] = "error"

    call_id: int | None
    code: str
    message: str
    fatal: bool

    def __post_init__(self) -> None:
        if self.call_id is not None:
            _check_int(self.KIND, "call_id", self.call_id)
        _check_str(self.KIND, "code", self.code)
        _check_str(self.KIND, "message", self.message, empty=True)
        if not isinstance(self.fatal, bool):
            _bad(self.KIND, "fatal", self.fatal, "true or false")


@dataclass(frozen=True, slots=True)
class ByeMessage(Message):
    """The worker's last frame before it exits cleanly."""

    KIND: ClassVar[str] = "bye"


MESSAGE_TYPES: Mapping[str, type[Message]] = {
    cls.KIND: cls
    for cls in (
        LoadMessage,
        CallMessage,
        CancelMessage,
        AckMessage,
        ShutdownMessage,
        HelloMessage,
        ReadyMessage,
        ResultMessage,
        ErrorMessage,
        ByeMessage,
    )
}

#: Kinds a worker accepts from its controller.
CONTROLLER_TO_WORKER = frozenset({"load", "call", "cancel", "ack", "shutdown"})
#: Kinds a controller accepts from its worker.
WORKER_TO_CONTROLLER = frozenset({"hello", "ready", "result", "error", "ack", "bye"})


def decode_message(frame: Frame, accepted: frozenset[str] | None = None) -> Message:
    """Turn a decoded frame into its typed message.

    ``accepted`` restricts the kinds this receiver takes (its direction). The number of
    buffers must match the message's tensor names.
    """
    cls = MESSAGE_TYPES.get(frame.kind)
    if cls is None:
        raise MessageError(
            "unknown_kind", f"unknown message kind {frame.kind!r}; known: {sorted(MESSAGE_TYPES)}"
        )
    if accepted is not None and frame.kind not in accepted:
        raise MessageError(
            "unexpected_kind",
            f"message kind {frame.kind!r} is not accepted here; accepted: {sorted(accepted)}",
        )
    message = cls.from_body(frame.body)
    if len(frame.buffers) != len(message.buffer_names):
        raise MessageError(
            "buffer_count",
            f"{frame.kind} names {len(message.buffer_names)} tensor(s) "
            f"but its frame carries {len(frame.buffers)} buffer(s)",
        )
    return message
