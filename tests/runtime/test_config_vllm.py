"""``native.vllm.v1`` stages in pipeline YAML: the typed config, and every value it refuses.

No vLLM here: parsing only checks the file (model directories, interpreters, URLs), so these
tests are fast and run everywhere.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from types import MappingProxyType

import pytest

from runtime.config import (
    BACKEND_PARSERS,
    LLM_BACKEND,
    LlmBackendConfig,
    LlmRouteConfig,
    RemoteLlmRoute,
    load_pipeline,
    parse_pipeline,
)
from runtime.contracts.llm_messages import EngineArgs, SamplingSpec
from runtime.engine.program import TextProgram, load_program
from runtime.errors import EXIT_USAGE, ConfigError
from runtime.pipeline_input import TEXT_INPUT, example_text, input_kind

MiB = 1 << 20
REPO = Path(__file__).resolve().parents[2]
CHAT_SPEAK = REPO / "assets" / "pipelines" / "chat-speak.yaml"

LOCAL = """\
name: native.vllm.v1
model: tiny
engine:
  dtype: float32
  max_model_len: 2048
  max_num_seqs: 4
  kv_cache_memory_bytes: 64MiB
  enforce_eager: true
  seed: 7
sampling:
  max_tokens: 64
  min_tokens: 8
  temperature: 0.8
  top_p: 0.95
route:
  name: local-vllm
  interpreter: env:vllm-cpu
  worker: vllm
  os_domain: posix
  env: {VLLM_CPU_KVCACHE_SPACE: 1, HF_HUB_OFFLINE: "1"}
"""

REMOTE = """\
name: native.vllm.v1
engine:
  max_num_seqs: 2
sampling:
  max_tokens: 32
route:
  url: https://models.example.org:8443/v1/
  model: Qwen/Qwen2.5-0.5B-Instruct
  api_key_env: OMNI_TEST_API_KEY
  connect_timeout_s: 2.5
  read_timeout_s: 30
"""


def pipeline(backend: str, *, extra_stage: str = "", head: str = "") -> str:
    return (
        f"pipeline: chat\nasync_chunk: false\n{head}stages:\n  - stage_id: 0\n    backend:\n"
        + textwrap.indent(backend, "      ")
        + "    resource_budget:\n"
        "      capacities: {machine:ram: 8GiB}\n"
        "      demands: {machine:ram: 3GiB}\n" + extra_stage
    )


def line_of(text: str, needle: str) -> int:
    lines = [number for number, line in enumerate(text.splitlines(), 1) if needle in line]
    assert lines, f"{needle!r} not in the text"
    return lines[0]


def write(directory: Path, text: str) -> Path:
    path = directory / "pipeline.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def refused(directory: Path, text: str, *, key: str, line: int) -> ConfigError:
    """Load ``text`` from a file and return the ConfigError, checking file, line and key."""
    path = write(directory, text)
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    error = info.value
    assert (error.file, error.line, error.key) == (str(path), line, key), str(error)
    assert str(error).startswith(f"{path}:{line}, key '{key}': ")
    assert error.exit_code == EXIT_USAGE
    return error


def model_dir(root: Path, name: str = "model") -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}", encoding="utf-8")
    return directory


def backend_of(path: Path) -> LlmBackendConfig:
    backend = load_pipeline(path).stages[0].backend
    assert isinstance(backend, LlmBackendConfig)
    return backend


# --- what loads ---------------------------------------------------------------------------


def test_the_backend_is_registered() -> None:
    assert LLM_BACKEND == "native.vllm.v1"
    assert LLM_BACKEND in BACKEND_PARSERS


def test_a_full_local_stage_is_typed(tmp_path: Path) -> None:
    backend = backend_of(write(tmp_path, pipeline(LOCAL)))
    assert backend.name == LLM_BACKEND
    assert backend.is_graph is False
    assert backend.model == "tiny"
    assert backend.model_label == "tiny"
    assert backend.engine_args == EngineArgs(
        dtype="float32",
        max_model_len=2048,
        max_num_seqs=4,
        kv_cache_memory_bytes=64 * MiB,
        enforce_eager=True,
        seed=7,
    )
    assert backend.sampling == SamplingSpec(
        max_tokens=64, min_tokens=8, temperature=0.8, top_p=0.95
    )
    assert backend.route == LlmRouteConfig(
        name="local-vllm",
        interpreter="env:vllm-cpu",
        worker="vllm",
        os_domain="posix",
        env=MappingProxyType({"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}),
    )
    assert not backend.remote
    assert backend.route_name == "local-vllm"


def test_defaults_fill_what_is_left_out(tmp_path: Path) -> None:
    backend = backend_of(write(tmp_path, pipeline("name: native.vllm.v1\nmodel: tiny\n")))
    assert backend.engine_args == EngineArgs()
    assert backend.sampling == SamplingSpec()
    assert backend.route == LlmRouteConfig()
    assert backend.route.interpreter == "env:vllm-cpu"
    assert backend.route.worker == "vllm"


def test_model_directories_resolve_absolute_relative_and_from_the_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    beside = model_dir(tmp_path, "models/beside")
    elsewhere = model_dir(tmp_path / "abs", "llama")
    data = tmp_path / "data"
    in_data = model_dir(data, "models/mine")
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(data))
    for written, expected in (
        ("models/beside", beside),
        ("./models/../models/beside", beside),
        (str(elsewhere), elsewhere),
        ("${data}/models/mine", in_data),
    ):
        backend = backend_of(
            write(tmp_path, pipeline(LOCAL.replace("model: tiny", f"model: {written}")))
        )
        assert backend.model == expected
        assert backend.model_label == str(expected)


def test_gpu_memory_utilization_instead_of_a_kv_cache_size(tmp_path: Path) -> None:
    text = pipeline(LOCAL.replace("kv_cache_memory_bytes: 64MiB", "gpu_memory_utilization: 0.5"))
    backend = backend_of(write(tmp_path, text))
    assert backend.engine_args.gpu_memory_utilization == 0.5
    assert backend.engine_args.kv_cache_memory_bytes is None


def test_a_route_may_name_a_python_and_a_worker_file(tmp_path: Path) -> None:
    (tmp_path / "py").symlink_to(sys.executable)
    (tmp_path / "my_worker.py").write_text("print('worker')\n", encoding="utf-8")
    text = pipeline(
        LOCAL.replace("interpreter: env:vllm-cpu", "interpreter: py").replace(
            "worker: vllm", "worker: my_worker.py"
        )
    )
    backend = backend_of(write(tmp_path, text))
    assert isinstance(backend.route, LlmRouteConfig)
    assert backend.route.interpreter == str(tmp_path / "py")
    assert backend.route.worker == str(tmp_path / "my_worker.py")


def test_a_remote_route_is_typed(tmp_path: Path) -> None:
    backend = backend_of(write(tmp_path, pipeline(REMOTE)))
    assert backend.route == RemoteLlmRoute(
        url="https://models.example.org:8443/v1",
        model="Qwen/Qwen2.5-0.5B-Instruct",
        api_key_env="OMNI_TEST_API_KEY",
        connect_timeout_s=2.5,
        read_timeout_s=30.0,
    )
    assert backend.remote
    assert backend.model is None
    assert backend.model_label == "Qwen/Qwen2.5-0.5B-Instruct"
    assert backend.route_name == "https://models.example.org:8443/v1"
    assert backend.engine_args.max_num_seqs == 2
    assert backend.sampling.max_tokens == 32


def test_a_remote_route_has_default_timeouts_and_no_key(tmp_path: Path) -> None:
    text = pipeline("name: native.vllm.v1\nroute: {url: 'http://127.0.0.1:8000', model: m}\n")
    backend = backend_of(write(tmp_path, text))
    assert backend.route == RemoteLlmRoute(url="http://127.0.0.1:8000", model="m")
    route = backend.route
    assert isinstance(route, RemoteLlmRoute)
    assert (route.api_key_env, route.connect_timeout_s, route.read_timeout_s) == (None, 5.0, 60.0)


def test_a_lone_language_model_stage_takes_text(tmp_path: Path) -> None:
    config = load_pipeline(write(tmp_path, pipeline(LOCAL)))
    assert input_kind(config) == TEXT_INPUT
    assert example_text(config) is None  # no adapter offers one
    program = load_program(config)
    assert isinstance(program, TextProgram)
    request = program.prepare({"text": "Hello", "max_tokens": 4, "stop": ["."]})
    assert (request.prompt, dict(request.sampling)) == ("Hello", {"max_tokens": 4, "stop": ["."]})


def test_the_chat_speak_demo_parses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's file as shipped (its voice manifests faked: parsing only checks they exist)."""
    for part in ("acoustic", "decoder"):
        manifest = tmp_path / "voices" / "joe" / part / "manifest.json"
        manifest.parent.mkdir(parents=True)
        manifest.write_text(json.dumps({}), encoding="utf-8")
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(tmp_path))
    config = load_pipeline(CHAT_SPEAK)
    assert config.adapter is not None
    assert config.adapter.name == "runtime.adapters.chat_speak:ChatSpeakProgram"
    llm, acoustic, decoder = (stage.backend for stage in config.stages)
    assert isinstance(llm, LlmBackendConfig)
    assert (llm.model, llm.route) == (
        "smollm2-135m-instruct",
        LlmRouteConfig(interpreter="env:vllm-cpu"),
    )
    # Greedy: the demo's answers do not change from run to run.
    assert llm.sampling.temperature == 0.0
    assert llm.engine_args.max_num_seqs >= 2
    assert [acoustic.is_graph, decoder.is_graph] == [True, True]
    assert input_kind(config) == TEXT_INPUT
    assert example_text(config) == "What is the capital of France?"


# --- what is refused ----------------------------------------------------------------------

# (old text, new text, key under stages[0].backend, the line's needle, part of the message)
LOCAL_REFUSALS = [
    ("model: tiny\n", "", "model", "name: native.vllm.v1", "missing required key 'model'"),
    ("model: tiny", "model: ''", "model", "model:", "'tiny' (the tiny test model"),
    ("model: tiny", "model: 5", "model", "model:", "Hugging Face model directory"),
    ("model: tiny", "model: [a]", "model", "model:", "found a list"),
    ("model: tiny", "model: nowhere", "model", "model:", "does not exist"),
    ("model: tiny", "model: " + "x" * 5000, "model", "model:", "cannot be looked up"),
    ("dtype: float32", "dtype: int8", "engine.dtype", "dtype:", "one of auto, bfloat16"),
    ("max_model_len: 2048", "max_model_len: 0", "engine.max_model_len", "max_model_len", ">= 1"),
    ("max_num_seqs: 4", "max_num_seqs: four", "engine.max_num_seqs", "max_num_seqs", ">= 1"),
    ("max_num_seqs: 4", "max_num_seqs: 0", "engine.max_num_seqs", "max_num_seqs", ">= 1"),
    (
        "kv_cache_memory_bytes: 64MiB",
        "kv_cache_memory_bytes: lots",
        "engine.kv_cache_memory_bytes",
        "kv_cache",
        "'512MiB'",
    ),
    (
        "kv_cache_memory_bytes: 64MiB",
        "kv_cache_memory_bytes: 0",
        "engine.kv_cache_memory_bytes",
        "kv_cache",
        "below the minimum of 1",
    ),
    (
        "enforce_eager: true",
        "enforce_eager: true\n  gpu_memory_utilization: 0.9",
        "engine.gpu_memory_utilization",
        "gpu_memory_utilization",
        "not both",
    ),
    (
        "kv_cache_memory_bytes: 64MiB",
        "gpu_memory_utilization: 1.5",
        "engine.gpu_memory_utilization",
        "gpu_memory_utilization",
        "greater than 0 and at most 1",
    ),
    (
        "enforce_eager: true",
        "enforce_eager: yes please",
        "engine.enforce_eager",
        "enforce_eager",
        "true or false",
    ),
    ("seed: 7", "seed: -1", "engine.seed", "seed:", ">= 0"),
    ("seed: 7", f"seed: {2**53}", "engine.seed", "seed:", f"from 0 to {2**53 - 1}"),
    (
        "seed: 7",
        "seed: 7\n  block_size: 16",
        "engine.block_size",
        "block_size",
        "accepted keys: dtype",
    ),
    ("max_tokens: 64", "max_tokens: 0", "sampling.max_tokens", "max_tokens", ">= 1"),
    ("max_tokens: 64", "max_tokens: 2048", "sampling.max_tokens", "max_tokens", "from 1 to 2047"),
    ("min_tokens: 8", "min_tokens: 65", "sampling.min_tokens", "min_tokens", "above max_tokens 64"),
    ("temperature: 0.8", "temperature: -1", "sampling.temperature", "temperature", "from 0 to 100"),
    (
        "temperature: 0.8",
        "temperature: .nan",
        "sampling.temperature",
        "temperature",
        "from 0 to 100",
    ),
    ("temperature: 0.8", "temperature: hot", "sampling.temperature", "temperature", "a number"),
    ("top_p: 0.95", "top_p: 0", "sampling.top_p", "top_p", "greater than 0 and at most 1"),
    (
        "top_p: 0.95",
        "top_p: 0.95\n  top_k: 5",
        "sampling.top_k",
        "top_k",
        "accepted keys: max_tokens",
    ),
    ("name: local-vllm", "name: 'local vllm'", "route.name", "local vllm", "a route name"),
    (
        "interpreter: env:vllm-cpu",
        "interpreter: 'env:'",
        "route.interpreter",
        "interpreter",
        "env:NAME",
    ),
    (
        "interpreter: env:vllm-cpu",
        "interpreter: /no/python",
        "route.interpreter",
        "interpreter",
        "does not exist",
    ),
    ("worker: vllm", "worker: ort", "route.worker", "worker: ort", "a built-in worker (vllm)"),
    ("os_domain: posix", "os_domain: dos", "route.os_domain", "os_domain", "one of posix, windows"),
    ("env: {", "env: {1BAD: x, ", "route.env[1BAD]", "1BAD", "not an environment variable name"),
    (
        "worker: vllm",
        "worker: vllm\n  ep: dml",
        "route.ep",
        "ep: dml",
        "one of cpu, cuda",
    ),
    (
        "worker: vllm",
        "worker: vllm\n  allowed_providers: []",
        "route.allowed_providers",
        "allowed_providers",
        "accepted keys: name, interpreter",
    ),
    ("worker: vllm", "worker: vllm\n  model: m", "route.model", "model: m", "also needs url"),
    ("engine:\n", "engine: 3\n", "engine", "engine: 3", "found '3'"),
]


@pytest.mark.parametrize(("old", "new", "key", "needle", "message"), LOCAL_REFUSALS)
def test_a_bad_local_value_names_file_line_key_and_what_is_accepted(
    tmp_path: Path, old: str, new: str, key: str, needle: str, message: str
) -> None:
    assert old in LOCAL
    backend = LOCAL.replace(old, new, 1)
    if old == "engine:\n":
        backend = backend.replace(
            backend[backend.index("  dtype") : backend.index("sampling:")], ""
        )
    text = pipeline(backend)
    error = refused(tmp_path, text, key=f"stages[0].backend.{key}", line=line_of(text, needle))
    assert message in str(error)


def test_a_directory_that_is_not_a_model_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "weights.bin").write_bytes(b"\0")
    for written, message in (
        ("empty", "has no config.json, so it is not a Hugging Face model directory"),
        ("weights.bin", "is not a directory"),
    ):
        text = pipeline(LOCAL.replace("model: tiny", f"model: {written}"))
        error = refused(tmp_path, text, key="stages[0].backend.model", line=line_of(text, "model:"))
        assert message in str(error)


def test_a_relative_model_needs_a_pipeline_file() -> None:
    text = pipeline(LOCAL.replace("model: tiny", "model: models/mine"))
    with pytest.raises(ConfigError, match="not read from a file; use an absolute path") as info:
        parse_pipeline(text)
    assert info.value.key == "stages[0].backend.model"


REMOTE_REFUSALS = [
    (
        "https://models.example.org:8443/v1/",
        "ftp://models.example.org/v1",
        "route.url",
        "scheme 'ftp'",
    ),
    (
        "https://models.example.org:8443/v1/",
        "models.example.org:8443/v1",
        "route.url",
        "expected an http or https base URL",
    ),
    ("https://models.example.org:8443/v1/", "'http://'", "route.url", "names no host"),
    ("https://models.example.org:8443/v1/", "http://h:99999/v1", "route.url", "is not a URL"),
    ("https://models.example.org:8443/v1/", "http://h:0/v1", "route.url", "port 0"),
    (
        "https://models.example.org:8443/v1/",
        "'http://h/v1?key=1'",
        "route.url",
        "a query or fragment",
    ),
    (
        "https://models.example.org:8443/v1/",
        "'http://h /v1'",
        "route.url",
        "spaces or control characters",
    ),
    (
        "https://models.example.org:8443/v1/",
        "8000",
        "route.url",
        "expected an http or https base URL",
    ),
    ("model: Qwen/Qwen2.5-0.5B-Instruct", "model: 'two words'", "route.model", "without spaces"),
    ("model: Qwen/Qwen2.5-0.5B-Instruct", "model: ''", "route.model", "the name of the model"),
    (
        "api_key_env: OMNI_TEST_API_KEY",
        "api_key_env: 1KEY",
        "route.api_key_env",
        "environment variable",
    ),
    (
        "connect_timeout_s: 2.5",
        "connect_timeout_s: 0",
        "route.connect_timeout_s",
        "above 0 and at most 3600",
    ),
    (
        "connect_timeout_s: 2.5",
        "connect_timeout_s: true",
        "route.connect_timeout_s",
        "above 0 and at most 3600",
    ),
    (
        "read_timeout_s: 30",
        "read_timeout_s: 4000",
        "route.read_timeout_s",
        "above 0 and at most 3600",
    ),
    ("read_timeout_s: 30", "read_timeout_s: soon", "route.read_timeout_s", "a number of seconds"),
    (
        "read_timeout_s: 30",
        "read_timeout_s: 30\n  retries: 3",
        "route.retries",
        "accepted keys: url, model",
    ),
    ("max_num_seqs: 2", "dtype: float16", "engine.dtype", "only engine.max_num_seqs"),
    ("max_num_seqs: 2", "max_num_seqs: 0", "engine.max_num_seqs", ">= 1"),
]


@pytest.mark.parametrize(("old", "new", "key", "message"), REMOTE_REFUSALS)
def test_a_bad_remote_value_names_file_line_key_and_what_is_accepted(
    tmp_path: Path, old: str, new: str, key: str, message: str
) -> None:
    assert old in REMOTE
    text = pipeline(REMOTE.replace(old, new, 1))
    needle = new.splitlines()[-1].split(":")[0].strip() if "\n" in new else new
    error = refused(tmp_path, text, key=f"stages[0].backend.{key}", line=line_of(text, needle))
    assert message in str(error)


def test_credentials_in_a_url_are_refused_without_being_repeated(tmp_path: Path) -> None:
    text = pipeline(REMOTE.replace("https://models.example.org:8443/v1/", "http://me:s3cret@h/v1"))
    error = refused(tmp_path, text, key="stages[0].backend.route.url", line=line_of(text, "url:"))
    assert "route.api_key_env" in str(error)
    assert "s3cret" not in str(error)


def test_a_remote_route_needs_its_model_and_takes_no_local_model(tmp_path: Path) -> None:
    text = pipeline(REMOTE.replace("  model: Qwen/Qwen2.5-0.5B-Instruct\n", ""))
    error = refused(tmp_path, text, key="stages[0].backend.route.model", line=line_of(text, "url:"))
    assert "missing required key 'model'" in str(error)
    text = pipeline(REMOTE.replace("engine:", "model: tiny\nengine:"))
    error = refused(
        tmp_path, text, key="stages[0].backend.model", line=line_of(text, "model: tiny")
    )
    assert "serves the model it names in route.model" in str(error)


def test_an_unknown_backend_key_and_name(tmp_path: Path) -> None:
    text = pipeline(LOCAL + "manifest: m.json\n")
    error = refused(
        tmp_path, text, key="stages[0].backend.manifest", line=line_of(text, "manifest:")
    )
    assert "accepted keys: name, model, engine, sampling, route" in str(error)
    text = pipeline(LOCAL.replace("native.vllm.v1", "native.vllm.v2"))
    error = refused(tmp_path, text, key="stages[0].backend.name", line=line_of(text, "v2"))
    assert "accepted: external.graph.v1, native.vllm.v1" in str(error)


def test_a_language_model_stage_with_other_stages_needs_an_adapter(tmp_path: Path) -> None:
    second = (
        "  - stage_id: 1\n    backend:\n"
        + textwrap.indent(LOCAL, "      ")
        + "    resource_budget:\n"
        "      capacities: {machine:ram: 8GiB}\n"
        "      demands: {machine:ram: 3GiB}\n"
    )
    text = pipeline(LOCAL, extra_stage=second)
    error = refused(
        tmp_path, text, key="stages[0].backend.name", line=line_of(text, "name: native.vllm")
    )
    assert "a language-model stage alone" in str(error)
    assert "runtime.adapters.chat_speak:ChatSpeakProgram" in str(error)


@pytest.mark.parametrize(
    ("section", "key", "message"),
    [
        ("sampling: 3", "sampling", "expected a mapping with keys max_tokens"),
        ("route: [a]", "route", "expected a route mapping; found a list"),
        ("sampling: {min_tokens: -1}", "sampling.min_tokens", "an integer >= 0"),
    ],
)
def test_a_section_of_the_wrong_shape_is_refused(
    tmp_path: Path, section: str, key: str, message: str
) -> None:
    text = pipeline(f"name: native.vllm.v1\nmodel: tiny\n{section}\n")
    error = refused(
        tmp_path,
        text,
        key=f"stages[0].backend.{key}",
        line=line_of(text, section.split(":")[0] + ":"),
    )
    assert message in str(error)
