"""The language-model worker protocol: typed messages between a controller and a vLLM worker.

Same framing and rules as the graph protocol (:mod:`.messages`): one message per frame,
the frame ``kind`` names it, the ``body`` holds its fields, every field is required on
the wire (``None`` is ``null``), unknown fields are refused and every value is validated
when a message is built. These frames carry no buffers: token ids travel as JSON lists.

Controller to worker: ``llm_load``, ``generate``, ``abort``, ``stats``, ``shutdown``.
Worker to controller: ``hello``, ``llm_ready``, ``delta``, ``llm_stats``, ``llm_error``,
``bye``.

A request is named by ``request_id`` and ``epoch`` (see :class:`.ids.RequestKey`); every
``delta`` and request error echoes both, so a controller drops what belongs to an older
epoch. A request's deltas end with exactly one delta whose ``finished`` is true (an
aborted request ends with ``finish_reason`` ``"abort"``), or with one non-fatal
``llm_error`` naming it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final

from .messages import (
    ByeMessage,
    HelloMessage,
    Message,
    MessageError,
    ShutdownMessage,
    _bad,
    _check_float,
    _check_int,
    _check_str,
    _set,
)
from .structured import StructuredOutput

if TYPE_CHECKING:
    from .codec import Frame

__all__ = [
    "CONTROLLER_TO_LLM_WORKER",
    "DTYPES",
    "FASTEST",
    "FINISH_REASONS",
    "LLM_MESSAGE_TYPES",
    "LLM_WORKER_TO_CONTROLLER",
    "AbortMessage",
    "DeltaMessage",
    "EngineArgs",
    "GenerateMessage",
    "LlmErrorMessage",
    "LlmLoadMessage",
    "LlmReadyMessage",
    "LlmStatsMessage",
    "SamplingSpec",
    "StatsMessage",
    "cpu_flags",
    "decode_llm_message",
    "fastest_cpu_dtype",
]

#: The dtype a worker picks for its device: see :func:`fastest_cpu_dtype` (on a GPU, ``auto``).
FASTEST: Final = "fastest"
#: Weight and activation types a worker accepts (``auto``: the model's own).
DTYPES: Final = frozenset({"auto", "float32", "float16", "bfloat16", FASTEST})
#: Why a request stopped: a stop string or end of sequence, the token limit, or an abort.
FINISH_REASONS: Final = frozenset({"stop", "length", "abort"})
#: Largest integer a seed or token id may be (what JSON readers keep exact).
_MAX_SAFE_INT: Final = 2**53 - 1


def _check_opt_int(kind: str, field: str, value: object, *, minimum: int = 0) -> int | None:
    return None if value is None else _check_int(kind, field, value, minimum=minimum)


def _check_bool(kind: str, field: str, value: object) -> bool:
    if not isinstance(value, bool):
        _bad(kind, field, value, "true or false")
    return value


def _check_ints(kind: str, field: str, value: object, *, empty: bool = True) -> tuple[int, ...]:
    accepted = "a list of integers >= 0" + ("" if empty else " (at least one)")
    if not isinstance(value, (list, tuple)) or (not empty and not value):
        _bad(kind, field, value, accepted)
    for item in value:
        if not isinstance(item, int) or isinstance(item, bool) or not 0 <= item <= _MAX_SAFE_INT:
            _bad(kind, field, value, accepted)
    return tuple(value)


def _check_strs(kind: str, field: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(item, str) and item for item in value
    ):
        _bad(kind, field, value, "a list of non-empty strings")
    return tuple(value)


def _strict_mapping(where: str, wire: object, fields: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(wire, Mapping):
        raise MessageError("bad_field", f"{where} must be an object with fields {list(fields)}")
    unknown = sorted(set(wire) - set(fields))
    if unknown:
        raise MessageError(
            "unknown_field", f"{where} has no field(s) {unknown}; fields: {list(fields)}"
        )
    missing = [name for name in fields if name not in wire]
    if missing:
        raise MessageError("missing_field", f"{where} is missing field(s) {missing}")
    return wire


#: Field names per class: a streamed request encodes one message per delta.
_FIELDS: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(field.name for field in dataclasses.fields(cls))
    return names


@dataclass(frozen=True, slots=True)
class EngineArgs:
    """The engine arguments of one language-model stage (a subset of vLLM's).

    ``kv_cache_memory_bytes`` sizes the KV cache exactly; ``gpu_memory_utilization`` is
    vLLM's alternative (a fraction of device memory). At most one may be set; with
    neither, vLLM uses its default for the device. ``max_model_len`` None takes the
    model's own limit.
    """

    dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 8
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    enforce_eager: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        where = "engine_args"
        if self.dtype not in DTYPES:
            _bad(where, "dtype", self.dtype, f"one of {sorted(DTYPES)}")
        _check_opt_int(where, "max_model_len", self.max_model_len, minimum=1)
        _check_int(where, "max_num_seqs", self.max_num_seqs, minimum=1)
        _check_opt_int(where, "kv_cache_memory_bytes", self.kv_cache_memory_bytes, minimum=1)
        if self.gpu_memory_utilization is not None:
            value = _check_float(
                where, "gpu_memory_utilization", self.gpu_memory_utilization, maximum=1.0
            )
            if value <= 0.0:
                _bad(where, "gpu_memory_utilization", value, "a fraction in (0, 1]")
            _set(self, "gpu_memory_utilization", value)
            if self.kv_cache_memory_bytes is not None:
                _bad(
                    where,
                    "gpu_memory_utilization",
                    value,
                    "null when kv_cache_memory_bytes is set (give one of the two)",
                )
        _check_bool(where, "enforce_eager", self.enforce_eager)
        _check_int(where, "seed", self.seed)
        if self.seed > _MAX_SAFE_INT:
            _bad(where, "seed", self.seed, f"an integer in [0, {_MAX_SAFE_INT}]")

    def to_wire(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _field_names(type(self))}

    @classmethod
    def from_wire(cls, wire: object, where: str = "engine_args") -> EngineArgs:
        body = _strict_mapping(where, wire, _field_names(cls))
        return cls(**dict(body))


@dataclass(frozen=True, slots=True)
class SamplingSpec:
    """How to sample one request. ``temperature`` 0 is greedy.

    ``top_k`` 0 and ``top_p`` 1.0 disable those filters. ``seed`` makes random sampling
    repeatable per request. ``stop`` strings end the output (they are not included);
    ``ignore_eos`` keeps generating past the end-of-sequence token until ``max_tokens``.
    ``structured_output`` constrains the reply to JSON (see :mod:`.structured`); on the wire
    it is left out when null, so a body without it still reads.
    """

    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_tokens: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    structured_output: StructuredOutput | None = None

    def __post_init__(self) -> None:
        where = "sampling"
        _check_int(where, "max_tokens", self.max_tokens, minimum=1)
        _set(self, "temperature", _check_float(where, "temperature", self.temperature))
        top_p = _check_float(where, "top_p", self.top_p, maximum=1.0)
        if top_p <= 0.0:
            _bad(where, "top_p", top_p, "a number in (0, 1]")
        _set(self, "top_p", top_p)
        _check_int(where, "top_k", self.top_k)
        _check_int(where, "min_tokens", self.min_tokens)
        if self.min_tokens > self.max_tokens:
            _bad(where, "min_tokens", self.min_tokens, f"at most max_tokens={self.max_tokens}")
        _check_opt_int(where, "seed", self.seed)
        if self.seed is not None and self.seed > _MAX_SAFE_INT:
            _bad(where, "seed", self.seed, f"an integer in [0, {_MAX_SAFE_INT}]")
        _set(self, "stop", _check_strs(where, "stop", self.stop))
        _set(self, "stop_token_ids", _check_ints(where, "stop_token_ids", self.stop_token_ids))
        _check_bool(where, "ignore_eos", self.ignore_eos)
        structured: object = self.structured_output
        if structured is not None and not isinstance(structured, StructuredOutput):
            _set(
                self,
                "structured_output",
                StructuredOutput.from_wire(structured, f"{where}.structured_output"),
            )

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {}
        for name in _field_names(type(self)):
            value = getattr(self, name)
            if isinstance(value, StructuredOutput):
                wire[name] = value.to_wire()
            elif value is None and name == _OPTIONAL_SAMPLING:
                continue
            else:
                wire[name] = list(value) if isinstance(value, tuple) else value
        return wire

    @classmethod
    def from_wire(cls, wire: object, where: str = "sampling") -> SamplingSpec:
        if isinstance(wire, Mapping) and _OPTIONAL_SAMPLING not in wire:
            wire = {**wire, _OPTIONAL_SAMPLING: None}
        body = _strict_mapping(where, wire, _field_names(cls))
        return cls(**dict(body))


#: The sampling field a wire body may leave out (null).
_OPTIONAL_SAMPLING: Final = "structured_output"


class LlmMessage(Message):
    """Base of the language-model messages: nested values travel through ``to_wire``."""

    __slots__ = ()

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        for name in _field_names(type(self)):
            value = getattr(self, name)
            if isinstance(value, EngineArgs | SamplingSpec):
                body[name] = value.to_wire()
            elif isinstance(value, tuple):
                body[name] = list(value)
            else:
                body[name] = value
        return body


def _engine_args(value: object, where: str) -> EngineArgs:
    return value if isinstance(value, EngineArgs) else EngineArgs.from_wire(value, where)


def _sampling(value: object, where: str) -> SamplingSpec:
    return value if isinstance(value, SamplingSpec) else SamplingSpec.from_wire(value, where)


def _check_request(kind: str, request_id: object, epoch: object) -> None:
    _check_str(kind, "request_id", request_id)
    _check_int(kind, "epoch", epoch)


# Controller -> worker.


@dataclass(frozen=True, slots=True)
class LlmLoadMessage(LlmMessage):
    """Build the engine for the model in ``model_dir`` with ``engine_args``; answer ``llm_ready``."""

    KIND: ClassVar[str] = "llm_load"

    model_dir: str
    engine_args: EngineArgs

    def __post_init__(self) -> None:
        _check_str(self.KIND, "model_dir", self.model_dir)
        _set(self, "engine_args", _engine_args(self.engine_args, "llm_load.engine_args"))


@dataclass(frozen=True, slots=True)
class GenerateMessage(LlmMessage):
    """Start one request: exactly one of ``prompt`` (text) and ``prompt_token_ids``."""

    KIND: ClassVar[str] = "generate"

    request_id: str
    epoch: int
    prompt: str | None
    prompt_token_ids: tuple[int, ...] | None
    sampling: SamplingSpec

    def __post_init__(self) -> None:
        kind = self.KIND
        _check_request(kind, self.request_id, self.epoch)
        if (self.prompt is None) == (self.prompt_token_ids is None):
            _bad(
                kind,
                "prompt",
                self.prompt,
                "exactly one of prompt (a string) and prompt_token_ids (a list)",
            )
        if self.prompt is not None:
            _check_str(kind, "prompt", self.prompt, empty=True)
        if self.prompt_token_ids is not None:
            _set(
                self,
                "prompt_token_ids",
                _check_ints(kind, "prompt_token_ids", self.prompt_token_ids, empty=False),
            )
        _set(self, "sampling", _sampling(self.sampling, "generate.sampling"))


@dataclass(frozen=True, slots=True)
class AbortMessage(LlmMessage):
    """Abort a request inside the engine; it ends with a ``delta`` whose reason is ``abort``."""

    KIND: ClassVar[str] = "abort"

    request_id: str
    epoch: int

    def __post_init__(self) -> None:
        _check_request(self.KIND, self.request_id, self.epoch)


@dataclass(frozen=True, slots=True)
class StatsMessage(LlmMessage):
    """Ask for the worker's current memory and load; answered by ``llm_stats``."""

    KIND: ClassVar[str] = "stats"


# Worker -> controller.


@dataclass(frozen=True, slots=True)
class LlmReadyMessage(LlmMessage):
    """The engine is built and warmed up.

    ``max_num_seqs`` and ``max_model_len`` are the engine's effective limits;
    ``rss_bytes`` is the resident memory of the worker and every process it started (vLLM's
    engine runs in the worker itself, so ``processes`` is 1), ``pss_bytes`` the same with
    shared pages split between the processes that map them (what the tree really holds);
    ``engine_args`` are the arguments it was built with.
    """

    KIND: ClassVar[str] = "llm_ready"

    model: str
    vllm_version: str
    device: str
    max_num_seqs: int
    max_model_len: int
    rss_bytes: int
    pss_bytes: int
    processes: int
    load_s: float
    engine_args: EngineArgs

    def __post_init__(self) -> None:
        kind = self.KIND
        _check_str(kind, "model", self.model)
        _check_str(kind, "vllm_version", self.vllm_version)
        _check_str(kind, "device", self.device)
        _check_int(kind, "max_num_seqs", self.max_num_seqs, minimum=1)
        _check_int(kind, "max_model_len", self.max_model_len, minimum=1)
        _check_int(kind, "rss_bytes", self.rss_bytes)
        _check_int(kind, "pss_bytes", self.pss_bytes)
        _check_int(kind, "processes", self.processes, minimum=1)
        _set(self, "load_s", _check_float(kind, "load_s", self.load_s))
        _set(self, "engine_args", _engine_args(self.engine_args, "llm_ready.engine_args"))


@dataclass(frozen=True, slots=True)
class DeltaMessage(LlmMessage):
    """New output of one request: the text added and the token ids added since the last delta.

    The last delta of a request has ``finished`` true and a ``finish_reason``; earlier ones
    have ``finished`` false and ``finish_reason`` null. ``prompt_tokens`` is the prompt's
    length in tokens, sent with the last delta (optional: null or absent when unknown).
    """

    KIND: ClassVar[str] = "delta"

    request_id: str
    epoch: int
    text: str
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
    prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        kind = self.KIND
        _check_request(kind, self.request_id, self.epoch)
        _check_str(kind, "text", self.text, empty=True)
        _set(self, "token_ids", _check_ints(kind, "token_ids", self.token_ids))
        _check_bool(kind, "finished", self.finished)
        if self.finished:
            if self.finish_reason not in FINISH_REASONS:
                _bad(kind, "finish_reason", self.finish_reason, f"one of {sorted(FINISH_REASONS)}")
        elif self.finish_reason is not None:
            _bad(kind, "finish_reason", self.finish_reason, "null until the request is finished")
        _check_opt_int(kind, "prompt_tokens", self.prompt_tokens)


@dataclass(frozen=True, slots=True)
class LlmStatsMessage(LlmMessage):
    """The worker tree's resident memory (see ``llm_ready``) and how many requests its engine
    holds (waiting or running in vLLM's scheduler: an aborted request has left it)."""

    KIND: ClassVar[str] = "llm_stats"

    rss_bytes: int
    pss_bytes: int
    processes: int
    in_flight: int

    def __post_init__(self) -> None:
        _check_int(self.KIND, "rss_bytes", self.rss_bytes)
        _check_int(self.KIND, "pss_bytes", self.pss_bytes)
        _check_int(self.KIND, "processes", self.processes, minimum=1)
        _check_int(self.KIND, "in_flight", self.in_flight)


@dataclass(frozen=True, slots=True)
class LlmErrorMessage(LlmMessage):
    """A request failed (``request_id`` and ``epoch`` set) or the worker did (both null).

    ``fatal`` means the worker is exiting and must be replaced.
    """

    KIND: ClassVar[str] = "llm_error"

    request_id: str | None
    epoch: int | None
    code: str
    message: str
    fatal: bool

    def __post_init__(self) -> None:
        kind = self.KIND
        if (self.request_id is None) != (self.epoch is None):
            _bad(kind, "epoch", self.epoch, "null exactly when request_id is null")
        if self.request_id is not None:
            _check_request(kind, self.request_id, self.epoch)
        _check_str(kind, "code", self.code)
        _check_str(kind, "message", self.message, empty=True)
        _check_bool(kind, "fatal", self.fatal)


LLM_MESSAGE_TYPES: Final[Mapping[str, type[Message]]] = {
    cls.KIND: cls
    for cls in (
        LlmLoadMessage,
        GenerateMessage,
        AbortMessage,
        StatsMessage,
        ShutdownMessage,
        HelloMessage,
        LlmReadyMessage,
        DeltaMessage,
        LlmStatsMessage,
        LlmErrorMessage,
        ByeMessage,
    )
}

#: Kinds a language-model worker accepts from its controller.
CONTROLLER_TO_LLM_WORKER: Final = frozenset({"llm_load", "generate", "abort", "stats", "shutdown"})
#: Kinds a controller accepts from a language-model worker.
LLM_WORKER_TO_CONTROLLER: Final = frozenset(
    {"hello", "llm_ready", "delta", "llm_stats", "llm_error", "bye"}
)


def decode_llm_message(frame: Frame, accepted: frozenset[str] | None = None) -> Message:
    """Turn a decoded frame into its typed language-model message (no buffers allowed)."""
    cls = LLM_MESSAGE_TYPES.get(frame.kind)
    if cls is None:
        raise MessageError(
            "unknown_kind",
            f"unknown message kind {frame.kind!r}; known: {sorted(LLM_MESSAGE_TYPES)}",
        )
    if accepted is not None and frame.kind not in accepted:
        raise MessageError(
            "unexpected_kind",
            f"message kind {frame.kind!r} is not accepted here; accepted: {sorted(accepted)}",
        )
    message = cls.from_body(frame.body)
    if frame.buffers:
        raise MessageError(
            "buffer_count",
            f"{frame.kind} carries no buffers but its frame has {len(frame.buffers)}",
        )
    return message


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The instruction-set flags of this machine's first CPU (empty where not readable)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def fastest_cpu_dtype(flags: frozenset[str]) -> str:
    """What ``dtype: fastest`` means on a CPU with these flags: ``bfloat16`` with AVX-512 BF16
    and no AMX (measured on AMD EPYC with SmolLM2-135M: the same greedy answers as float32 in
    about half the time per token), ``float32`` elsewhere (on CPUs with AMX vLLM's bfloat16
    kernels answered wrongly; without AVX-512 BF16 bfloat16 is emulated)."""
    return "bfloat16" if "avx512_bf16" in flags and "amx_bf16" not in flags else "float32"
