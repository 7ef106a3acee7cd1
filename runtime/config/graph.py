"""Routes (where and how a stage's worker runs) and the graph backend, ``external.graph.v1``.

The interpreter, worker and environment fields of a route are shared with the
language-model backend's local route.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar, Final, Literal

from runtime.config.reader import ENV_VAR_RE, NAME_RE, ConfigItem, ConfigReader, describe

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping
    from pathlib import Path

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
        "webgpu": "WebGpuExecutionProvider",
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

_PROVIDER_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*ExecutionProvider$")
_OPTION_KEY_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.]*$")
_WINDOWS_ABSOLUTE_RE = re.compile(r"^[A-Za-z]:[\\/]")
#: Provider options whose value is a device index: an integer >= 0.
_INDEX_OPTIONS = frozenset({"device_id"})


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
    #: Options of the target provider (CUDA and DirectML ``device_id``, QNN ``backend_path``,
    #: VitisAI ``config_file``, OpenVINO ``device_type``...), as ONNX Runtime takes them.
    provider_options: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: A plugin execution-provider library the worker registers before creating the session.
    ep_library: str | None = None

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

    def to_json(self) -> dict[str, object]:
        """The route as ``plan`` and ``execution_plan`` show it (``env`` left out)."""
        return {
            "name": self.name,
            "interpreter": self.interpreter,
            "worker": self.worker,
            "ep": self.ep,
            "os_domain": self.os_domain,
            "max_io_bytes": self.max_io_bytes,
            "min_fraction_on_target": self.min_fraction_on_target,
            "allowed_providers": list(self.allowed_providers),
            "provider_options": dict(self.provider_options),
            "ep_library": self.ep_library,
        }


@dataclass(frozen=True, slots=True)
class GraphBackendConfig:
    """An ONNX graph stage run by an external worker (``external.graph.v1``)."""

    name: Literal["external.graph.v1"]
    manifest: Path
    route: RouteConfig
    is_graph: ClassVar[bool] = True


_ROUTE_REQUIRED = ("name", "interpreter", "worker", "ep", "os_domain", "max_io_bytes")
_ROUTE_OPTIONAL = (
    "min_fraction_on_target",
    "allowed_providers",
    "env",
    "provider_options",
    "ep_library",
)


def parse_route(
    reader: ConfigReader, item: ConfigItem, *, builtin_workers: Collection[str]
) -> RouteConfig:
    """A ``route`` section; ``builtin_workers`` are the worker names this backend accepts."""
    fields = reader.mapping(item, required=_ROUTE_REQUIRED, optional=_ROUTE_OPTIONAL)
    name = reader.string(
        fields["name"], expected="a route name (letters, digits, '_', '.', '-')", pattern=NAME_RE
    )
    interpreter = parse_interpreter(reader, fields["interpreter"])
    worker = parse_worker(reader, fields["worker"], builtin_workers)
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
        env = parse_env(reader, fields["env"])
    options: Mapping[str, str] = MappingProxyType({})
    if "provider_options" in fields:
        options = _parse_provider_options(reader, fields["provider_options"], target)
    ep_library = None
    if "ep_library" in fields:
        ep_library = _parse_ep_library(reader, fields["ep_library"])
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
        provider_options=options,
        ep_library=ep_library,
    )


def _parse_provider_options(
    reader: ConfigReader, item: ConfigItem, target: str
) -> Mapping[str, str]:
    expected = (
        f"a mapping of {target} option names to string or integer values, "
        "e.g. {device_id: 0} or {device_type: NPU}"
    )
    options: dict[str, str] = {}
    for name, entry in reader.entries(item, expected=expected).items():
        if not _OPTION_KEY_RE.match(name):
            reader.reject(
                entry,
                f"{name!r} is not a provider option name (letters, digits, '_' and '.', "
                "starting with a letter)",
            )
        value = reader.scalar(entry, "a string or an integer")
        if isinstance(value, bool) or not isinstance(value, str | int):
            reader.reject(
                entry,
                f"expected a string or an integer (quote other values); found {describe(value)}",
            )
        if name in _INDEX_OPTIONS and not str(value).isdigit():
            reader.reject(
                entry, f"{name} {value!r} is not a device index; expected an integer >= 0"
            )
        options[name] = str(value)
    return MappingProxyType(options)


def _parse_ep_library(reader: ConfigReader, item: ConfigItem) -> str:
    expected = (
        "the absolute path of a plugin execution-provider library as the worker sees it "
        "(a .so, .dll or .dylib file)"
    )
    text = reader.string(item, expected=expected)
    if not (text.startswith("/") or _WINDOWS_ABSOLUTE_RE.match(text)):
        reader.reject(item, f"{text!r} is not an absolute path; expected {expected}")
    if not text.lower().endswith((".so", ".dll", ".dylib")) and ".so." not in text:
        reader.reject(item, f"{text!r} is not a shared library; expected {expected}")
    return text


def parse_interpreter(reader: ConfigReader, item: ConfigItem) -> str:
    accepted = (
        f"'{BUNDLED_INTERPRETER}' (this application's own runtime), "
        f"'{ENV_INTERPRETER_PREFIX}NAME' (a managed worker environment), or the path of a "
        "Python executable, absolute or relative to the pipeline file"
    )
    text = reader.string(item, expected=accepted)
    if text == BUNDLED_INTERPRETER:
        return text
    if text.startswith(ENV_INTERPRETER_PREFIX):
        if not NAME_RE.match(text[len(ENV_INTERPRETER_PREFIX) :]):
            reader.reject(
                item,
                f"{text!r} names no valid environment (letters, digits, '_', '.', '-'); "
                f"expected {accepted}",
            )
        return text
    return str(reader.file_path(item, what="interpreter", executable=True))


def parse_worker(reader: ConfigReader, item: ConfigItem, builtin: Collection[str]) -> str:
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


def parse_env(reader: ConfigReader, item: ConfigItem) -> Mapping[str, str]:
    expected = "a mapping of environment variable names to string or integer values"
    env: dict[str, str] = {}
    for name, entry in reader.entries(item, expected=expected).items():
        if not ENV_VAR_RE.match(name):
            reader.reject(
                entry,
                f"{name!r} is not an environment variable name "
                "(letters, digits and '_', not starting with a digit)",
            )
        value = reader.scalar(entry, "a string or an integer")
        if isinstance(value, bool) or not isinstance(value, str | int):
            reader.reject(
                entry,
                f"expected a string or an integer (quote other values); found {describe(value)}",
            )
        env[name] = str(value)
    return MappingProxyType(env)


def parse_graph_backend(reader: ConfigReader, item: ConfigItem) -> GraphBackendConfig:
    fields = reader.mapping(item, required=("name", "manifest", "route"))
    reader.choice(fields["name"], (GRAPH_BACKEND,))
    manifest = reader.file_path(fields["manifest"], what="manifest")
    route = parse_route(reader, fields["route"], builtin_workers=GRAPH_WORKERS)
    return GraphBackendConfig(name=GRAPH_BACKEND, manifest=manifest, route=route)
