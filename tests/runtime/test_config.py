"""Pipeline YAML -> PipelineConfig: the seed example, paths, and every validation rule."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from runtime.config import (
    BACKEND_PARSERS,
    EP_PROVIDERS,
    GRAPH_BACKEND,
    GraphBackendConfig,
    PipelineConfig,
    RouteConfig,
    SourceLocation,
    load_pipeline,
    parse_pipeline,
    parse_size,
    resolve_callable,
)
from runtime.errors import EXIT_USAGE, ConfigError

TESTS_DIR = Path(__file__).resolve().parents[1]

# Verbatim from the runtime spec ("Deploy a graph"); the test substitutes real paths.
SEED_YAML = """\
pipeline: my_registered_pipeline
async_chunk: false
stages:
  - stage_id: 0
    backend:
      name: external.graph.v1
      manifest: /absolute/path/to/bundle/manifest.json
      route:
        name: local-cpu
        interpreter: /absolute/path/to/worker/python
        worker: /absolute/path/to/worker_ort.py
        ep: cpu
        os_domain: posix
        max_io_bytes: 8388608
        min_fraction_on_target: 1.0
        allowed_providers: [CPUExecutionProvider]
    resource_budget:
      capacities: {machine:ram: 2147483648, wsl:quota: 1073741824}
      demands: {machine:ram: 536870912, wsl:quota: 536870912}
"""

TRANSFORM = "helpers.transforms:passthrough"


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory with a real manifest, worker file and interpreter, beside the pipeline."""
    monkeypatch.syspath_prepend(str(TESTS_DIR))
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    manifest = {
        "schema_version": 1,
        "component": "add",
        "files": {"graph.onnx": "0" * 64, "inputs.npz": "1" * 64},
        "metadata": {"graph_file": "graph.onnx", "example_inputs_file": "inputs.npz"},
    }
    (bundle / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    (tmp_path / "worker_ort.py").write_text("print('worker')\n", encoding="utf-8")
    (tmp_path / "worker").mkdir()
    (tmp_path / "worker" / "python").symlink_to(sys.executable)
    return tmp_path


def stage_text(k: int, *, transform: bool = True, extra: str = "", capacities: str = "") -> str:
    text = f"""\
  - stage_id: {k}
    backend:
      name: external.graph.v1
      manifest: bundle/manifest.json
      route:
        name: local-cpu
        interpreter: bundled
        worker: ort
        ep: cpu
        os_domain: posix
        max_io_bytes: 8MiB
    resource_budget:
      capacities: {capacities or "{machine:ram: 2GiB, wsl:quota: 1GiB}"}
      demands: {{machine:ram: 512MiB}}
"""
    if k > 0 and transform:
        text += f"    custom_process_input_func: {TRANSFORM}\n"
    return text + extra


def pipeline_text(count: int, *, head: str = "", extras: dict[int, str] | None = None) -> str:
    extras = extras or {}
    stages = "".join(stage_text(k, extra=extras.get(k, "")) for k in range(count))
    return f"pipeline: chain\nasync_chunk: false\n{head}stages:\n{stages}"


def line_of(text: str, needle: str, occurrence: int = 1) -> int:
    lines = [number for number, line in enumerate(text.splitlines(), 1) if needle in line]
    assert len(lines) >= occurrence, f"{needle!r} not in the text"
    return lines[occurrence - 1]


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


def test_seed_example_loads_verbatim_with_real_paths(files: Path) -> None:
    text = SEED_YAML.replace("/absolute/path/to", str(files))
    path = write(files, text)

    config = load_pipeline(path)

    assert config.pipeline == "my_registered_pipeline"
    assert config.async_chunk is False
    assert config.max_queued == 0
    assert config.source == path
    (stage,) = config.stages
    assert stage.stage_id == 0
    assert stage.name == "stage-0"
    assert stage.location == SourceLocation(str(path), 4)
    assert stage.engine_input_source == ()
    assert stage.final_output is True
    assert stage.custom_process_input_func is None
    backend = stage.backend
    assert isinstance(backend, GraphBackendConfig)
    assert backend.name == GRAPH_BACKEND
    assert backend.manifest == files / "bundle" / "manifest.json"
    route = backend.route
    assert route.name == "local-cpu"
    assert route.interpreter == str(files / "worker" / "python")
    assert route.worker == str(files / "worker_ort.py")
    assert (route.ep, route.os_domain, route.target_provider) == (
        "cpu",
        "posix",
        "CPUExecutionProvider",
    )
    assert route.max_io_bytes == 8388608
    assert route.min_fraction_on_target == 1.0
    assert route.allowed_providers == ("CPUExecutionProvider",)
    assert dict(route.env) == {}
    # The seed's unquoted flow-mapping keys contain colons; they must stay whole names.
    assert dict(config.capacities) == {"machine:ram": 2147483648, "wsl:quota": 1073741824}
    assert config.demands_by_stage() == {
        "stage-0": {"machine:ram": 536870912, "wsl:quota": 536870912}
    }


def test_relative_paths_resolve_against_the_pipeline_file_not_the_cwd(
    files: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (
        SEED_YAML.replace("/absolute/path/to/", "")
        .replace("worker/python", "./worker/python")
        .replace("stages:", "description: relative paths\nstages:")
    )
    path = write(files, text)
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))

    config = load_pipeline(path)

    route = config.stages[0].backend.route
    assert config.stages[0].backend.manifest == files / "bundle" / "manifest.json"
    assert route.worker == str(files / "worker_ort.py")
    assert Path(route.interpreter) == files / "worker" / "python"
    assert config.description == "relative paths"


def test_load_accepts_a_relative_file_name(files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(files, pipeline_text(1))
    monkeypatch.chdir(files)

    config = load_pipeline("pipeline.yaml")

    assert config.source == files / "pipeline.yaml"
    assert config.stages[0].backend.manifest == files / "bundle" / "manifest.json"


def test_parse_pipeline_needs_a_base_dir_for_relative_paths(files: Path) -> None:
    text = pipeline_text(1)
    with pytest.raises(ConfigError) as info:
        parse_pipeline(text, source="inline")
    assert info.value.file == "inline"
    assert info.value.key == "stages[0].backend.manifest"
    assert info.value.line == line_of(text, "manifest:")
    assert "use an absolute path" in str(info.value)

    config = parse_pipeline(text, base_dir=files)

    assert config.source is None
    assert config.stages[0].backend.manifest == files / "bundle" / "manifest.json"


def test_two_stage_chain_with_a_resolvable_transform(files: Path) -> None:
    config = load_pipeline(write(files, pipeline_text(2)))

    first, second = config.stages
    assert (first.engine_input_source, second.engine_input_source) == ((), (0,))
    assert (first.final_output, second.final_output) == (False, True)
    assert second.custom_process_input_func == TRANSFORM
    assert config.demands_by_stage() == {
        "stage-0": {"machine:ram": 512 * 2**20},
        "stage-1": {"machine:ram": 512 * 2**20},
    }
    assert dict(config.capacities) == {"machine:ram": 2 * 2**30, "wsl:quota": 2**30}
    transform = resolve_callable(TRANSFORM, file=None, line=None, key=None)
    assert transform({"y": [1, 2]}) == {"tensors": {"y": [1, 2]}}


def test_explicit_chain_keys_and_final_output_type_are_accepted(files: Path) -> None:
    text = pipeline_text(
        2,
        head="max_queued: 3\n",
        extras={
            0: "    engine_input_source: []\n    final_output: false\n",
            1: "    engine_input_source: [0]\n    final_output: true\n"
            "    final_output_type: tensors\n",
        },
    )

    config = load_pipeline(write(files, text))

    assert config.max_queued == 3
    assert config.stages[1].final_output_type == "tensors"
    assert config.stages[1].engine_input_source == (0,)


def test_route_options(files: Path) -> None:
    text = pipeline_text(1).replace(
        "        max_io_bytes: 8MiB\n",
        "        max_io_bytes: 8MiB\n"
        "        min_fraction_on_target: 0.9\n"
        "        allowed_providers: [CPUExecutionProvider]\n"
        "        env: {OMP_NUM_THREADS: 2, ORT_LOG: verbose}\n",
    )
    text = text.replace("interpreter: bundled", "interpreter: env:vllm-cpu")

    route = load_pipeline(write(files, text)).stages[0].backend.route

    assert route.interpreter == "env:vllm-cpu"
    assert route.min_fraction_on_target == 0.9
    assert dict(route.env) == {"OMP_NUM_THREADS": "2", "ORT_LOG": "verbose"}


def test_route_config_defaults_to_its_own_provider() -> None:
    route = RouteConfig("npu", "bundled", "ort", "vitisai", "windows", 1024)
    assert route.allowed_providers == ("VitisAIExecutionProvider",)
    assert route.target_provider == EP_PROVIDERS["vitisai"]
    with pytest.raises(ValueError, match="unknown ep 'npu'"):
        RouteConfig("npu", "bundled", "ort", "npu", "windows", 1024)


# --- document-level errors ------------------------------------------------------------


def test_yaml_syntax_error_names_the_line(files: Path) -> None:
    text = "pipeline: p\nasync_chunk: false\nstages:\n  - stage_id: [0\n"
    path = write(files, text)
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    assert info.value.file == str(path)
    assert info.value.line == 5
    assert "YAML syntax error" in str(info.value)


def test_duplicate_key_is_an_error(files: Path) -> None:
    text = pipeline_text(1).replace(
        "async_chunk: false\n", "async_chunk: false\nasync_chunk: true\n"
    )
    error = refused(files, text, key="async_chunk", line=3)
    assert "duplicate key 'async_chunk' (first given on line 2)" in str(error)


def test_duplicate_colon_key_in_a_flow_mapping_is_an_error(files: Path) -> None:
    text = pipeline_text(1, extras={}).replace(
        "demands: {machine:ram: 512MiB}", "demands: {machine:ram: 512MiB, machine:ram: 1MiB}"
    )
    error = refused(
        files,
        text,
        key="stages[0].resource_budget.demands.machine:ram",
        line=line_of(text, "demands"),
    )
    assert "duplicate key 'machine:ram'" in str(error)


@pytest.mark.parametrize(
    ("old", "new", "key", "needle"),
    [
        ("stages:", "stage: 1\nstages:", "stage", "stage: 1"),
        (
            "    resource_budget:",
            "    priority: 1\n    resource_budget:",
            "stages[0].priority",
            "priority",
        ),
        (
            "        ep: cpu",
            "        ep: cpu\n        device: 0",
            "stages[0].backend.route.device",
            "device",
        ),
        ("      route:", "      version: 2\n      route:", "stages[0].backend.version", "version"),
        (
            "      demands:",
            "      limits: {}\n      demands:",
            "stages[0].resource_budget.limits",
            "limits",
        ),
    ],
)
def test_unknown_keys_are_errors_listing_accepted_keys(
    files: Path, old: str, new: str, key: str, needle: str
) -> None:
    text = pipeline_text(1).replace(old, new, 1)
    error = refused(files, text, key=key, line=line_of(text, needle))
    assert "unknown key" in str(error)
    assert "accepted keys:" in str(error)


def test_missing_required_key_names_it(files: Path) -> None:
    text = pipeline_text(1).replace("        os_domain: posix\n", "")
    error = refused(
        files, text, key="stages[0].backend.route.os_domain", line=line_of(text, "name: local-cpu")
    )
    assert "missing required key 'os_domain'" in str(error)


@pytest.mark.parametrize(
    ("text", "key", "line", "fragment"),
    [
        ("", None, 1, "the pipeline is empty"),
        ("- 1\n- 2\n", None, 1, "expected a mapping with keys pipeline, async_chunk, stages"),
        ("pipeline: p\nasync_chunk: false\nstages: []\n", "stages", 3, "at least one stage"),
        (
            "pipeline: p\nasync_chunk: false\nstages: {a: 1}\n",
            "stages",
            3,
            "expected a non-empty list",
        ),
        ("pipeline: p q\nasync_chunk: false\nstages: []\n", "pipeline", 1, "a pipeline name"),
        ("pipeline: p\nasync_chunk: 0\nstages: []\n", "async_chunk", 2, "expected true or false"),
        (
            "pipeline: p\nasync_chunk: false\nmax_queued: -1\nstages: []\n",
            "max_queued",
            3,
            "an integer >= 0",
        ),
        (
            "pipeline: p\nasync_chunk: false\nmax_queued: yes\nstages: []\n",
            "max_queued",
            3,
            "an integer >= 0",
        ),
        ("pipeline: !custom p\nasync_chunk: false\nstages: []\n", "pipeline", 1, "cannot read 'p'"),
        ("? [a]\n: 1\n", None, 1, "keys must be plain names"),
    ],
)
def test_document_shape_errors(
    tmp_path: Path, text: str, key: str | None, line: int, fragment: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    assert (info.value.file, info.value.key, info.value.line) == (str(path), key, line)
    assert fragment in str(info.value)


def test_unreadable_characters_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not readable as YAML") as info:
        parse_pipeline("pipeline: \x07\n", source="inline")
    assert info.value.file == "inline"


def test_unreadable_and_non_utf8_files(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError, match="cannot read the pipeline file") as info:
        load_pipeline(missing)
    assert info.value.file == str(missing)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"pipeline: caf\xe9\n")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_pipeline(latin)


# --- backend and route ----------------------------------------------------------------


def test_unknown_backend_lists_the_registered_ones(files: Path) -> None:
    text = pipeline_text(1).replace("name: external.graph.v1", "name: external.graph.v9")
    error = refused(files, text, key="stages[0].backend.name", line=line_of(text, "graph.v9"))
    assert f"accepted: {', '.join(BACKEND_PARSERS)}" in str(error)


def test_backend_without_a_name(files: Path) -> None:
    text = pipeline_text(1).replace("      name: external.graph.v1\n", "")
    error = refused(files, text, key="stages[0].backend.name", line=line_of(text, "manifest:"))
    assert "external.graph.v1" in str(error)


def test_missing_manifest_is_named(files: Path) -> None:
    text = pipeline_text(1).replace("bundle/manifest.json", "bundle/missing.json")
    error = refused(files, text, key="stages[0].backend.manifest", line=line_of(text, "manifest:"))
    assert str(files / "bundle" / "missing.json") in str(error)
    assert "does not exist" in str(error)


def test_manifest_must_be_a_file(files: Path) -> None:
    text = pipeline_text(1).replace("bundle/manifest.json", "bundle")
    error = refused(files, text, key="stages[0].backend.manifest", line=line_of(text, "manifest:"))
    assert "is not a file" in str(error)


def test_unknown_ep_lists_the_accepted_ones(files: Path) -> None:
    text = pipeline_text(1).replace("ep: cpu", "ep: CUDA")
    error = refused(files, text, key="stages[0].backend.route.ep", line=line_of(text, "ep: CUDA"))
    assert "one of " + ", ".join(EP_PROVIDERS) in str(error)


def test_unknown_os_domain(files: Path) -> None:
    text = pipeline_text(1).replace("os_domain: posix", "os_domain: wsl")
    error = refused(files, text, key="stages[0].backend.route.os_domain", line=line_of(text, "wsl"))
    assert "one of posix, windows" in str(error)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ('"env:"', "names no valid environment"),
        ("env:a b", "names no valid environment"),
        ("missing/python", "does not exist"),
        ("p" * 300, "cannot be looked up"),
        ("worker_ort.py", "is not executable"),
        ("42", "expected 'bundled'"),
    ],
)
def test_bad_interpreter(files: Path, value: str, fragment: str) -> None:
    text = pipeline_text(1).replace("interpreter: bundled", f"interpreter: {value}")
    error = refused(
        files, text, key="stages[0].backend.route.interpreter", line=line_of(text, "interpreter")
    )
    assert fragment in str(error)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("onnx", "unknown worker 'onnx'; expected a built-in worker (ort, inprocess)"),
        ("workers/missing.py", "does not exist"),
        ("bundle/manifest.json", "is not a .py file"),
    ],
)
def test_bad_worker(files: Path, value: str, fragment: str) -> None:
    text = pipeline_text(1).replace("worker: ort", f"worker: {value}")
    error = refused(
        files, text, key="stages[0].backend.route.worker", line=line_of(text, "worker:")
    )
    assert fragment in str(error)


@pytest.mark.parametrize("value", ["0", "1.5", "true", "fast"])
def test_min_fraction_on_target_must_be_in_zero_one(files: Path, value: str) -> None:
    text = pipeline_text(1).replace(
        "max_io_bytes: 8MiB", f"max_io_bytes: 8MiB\n        min_fraction_on_target: {value}"
    )
    error = refused(
        files,
        text,
        key="stages[0].backend.route.min_fraction_on_target",
        line=line_of(text, "min_fraction"),
    )
    assert "greater than 0 and at most 1" in str(error)


@pytest.mark.parametrize(
    ("value", "key_suffix", "fragment"),
    [
        ("[]", "", "includes the route's own provider (CPUExecutionProvider)"),
        ("[DmlExecutionProvider]", "", "runs on CPUExecutionProvider, which is not allowed"),
        ("[CPUExecutionProvider, CPUExecutionProvider]", "[1]", "listed twice"),
        ("[cpu]", "[0]", "an ONNX Runtime provider name"),
        ("CPUExecutionProvider", "", "expected a non-empty list"),
    ],
)
def test_bad_allowed_providers(files: Path, value: str, key_suffix: str, fragment: str) -> None:
    text = pipeline_text(1).replace(
        "max_io_bytes: 8MiB", f"max_io_bytes: 8MiB\n        allowed_providers: {value}"
    )
    error = refused(
        files,
        text,
        key="stages[0].backend.route.allowed_providers" + key_suffix,
        line=line_of(text, "allowed_providers"),
    )
    assert fragment in str(error)


@pytest.mark.parametrize(
    ("value", "key_suffix", "fragment"),
    [
        ("{1BAD: x}", "[1BAD]", "is not an environment variable name"),
        ("{DEBUG: yes}", "[DEBUG]", "expected a string or an integer"),
        ("[A]", "", "expected a mapping of environment variable names"),
    ],
)
def test_bad_route_env(files: Path, value: str, key_suffix: str, fragment: str) -> None:
    text = pipeline_text(1).replace(
        "max_io_bytes: 8MiB", f"max_io_bytes: 8MiB\n        env: {value}"
    )
    error = refused(
        files, text, key="stages[0].backend.route.env" + key_suffix, line=line_of(text, "env:")
    )
    assert fragment in str(error)


def test_max_io_bytes_must_be_positive(files: Path) -> None:
    text = pipeline_text(1).replace("max_io_bytes: 8MiB", "max_io_bytes: 0")
    error = refused(
        files, text, key="stages[0].backend.route.max_io_bytes", line=line_of(text, "max_io_bytes")
    )
    assert "below the minimum of 1" in str(error)


# --- sizes and the resource budget ----------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, 0),
        (2147483648, 2**31),
        (4096.0, 4096),
        ("1024", 1024),
        ("512MiB", 512 * 2**20),
        ("2GiB", 2 * 2**30),
        ("1.5GB", 1_500_000_000),
        ("100 MB", 100_000_000),
        ("4 KiB", 4096),
        ("3kB", 3000),
        ("7B", 7),
    ],
)
def test_parse_size_accepts_integers_and_units(value: object, expected: int) -> None:
    assert parse_size(value) == expected


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (True, "is a boolean"),
        (-1, "is negative"),
        (1.5, "not a whole number of bytes"),
        ("1.5B", "not a whole number of bytes"),
        ("0.1KiB", "not a whole number of bytes"),
        ("-2GiB", "is not a size"),
        ("2 GiBs", "unknown unit 'GiBs'"),
        ("2mb", "unknown unit 'mb'"),
        ("lots", "is not a size"),
        (None, "is not a size"),
        (float("inf"), "is not a number of bytes"),
        (2**63, "larger than"),
    ],
)
def test_parse_size_refuses_other_values(value: object, fragment: str) -> None:
    with pytest.raises(ValueError, match="512MiB") as info:
        parse_size(value)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("true", "True is a boolean"),
        ("-5", "-5 is negative"),
        ("1.25", "1.25 is not a whole number of bytes"),
        ("lots", "'lots' is not a size"),
        ("", "None is not a size"),
        ("[1]", "found a list"),
    ],
)
def test_bad_demand_sizes_name_the_value_and_accepted_forms(
    files: Path, value: str, fragment: str
) -> None:
    text = pipeline_text(1).replace(
        "demands: {machine:ram: 512MiB}", f"demands: {{machine:ram: {value}}}"
    )
    error = refused(
        files,
        text,
        key="stages[0].resource_budget.demands[machine:ram]",
        line=line_of(text, "demands"),
    )
    assert fragment in str(error)
    assert "'512MiB', '2GiB', '1.5GB' or '100 MB'" in str(error)


def test_block_mapping_budget_with_quoted_keys(files: Path) -> None:
    text = pipeline_text(1).replace(
        "      capacities: {machine:ram: 2GiB, wsl:quota: 1GiB}\n",
        '      capacities:\n        "machine:ram": 2GiB\n        machine:vram:GPU-1: 4GiB\n',
    )
    config = load_pipeline(write(files, text))
    assert dict(config.capacities) == {"machine:ram": 2**31, "machine:vram:GPU-1": 2**32}


def test_capacity_keys_must_be_constraint_names(files: Path) -> None:
    text = pipeline_text(1).replace("{machine:ram: 2GiB, wsl:quota: 1GiB}", "{ram: 2GiB}")
    error = refused(
        files,
        text,
        key="stages[0].resource_budget.capacities[ram]",
        line=line_of(text, "capacities"),
    )
    assert "'ram' is not a constraint name" in str(error)
    assert "machine:ram, wsl:quota or machine:vram:<physical-id>" in str(error)


def test_capacities_must_not_be_empty(files: Path) -> None:
    text = (
        pipeline_text(1)
        .replace("{machine:ram: 2GiB, wsl:quota: 1GiB}", "{}")
        .replace("demands: {machine:ram: 512MiB}", "demands: {}")
    )
    error = refused(
        files, text, key="stages[0].resource_budget.capacities", line=line_of(text, "capacities")
    )
    assert "at least one capacity" in str(error)


def test_demands_may_only_name_declared_constraints(files: Path) -> None:
    text = pipeline_text(1).replace(
        "demands: {machine:ram: 512MiB}", "demands: {machine:ram: 512MiB, machine:vram:GPU-1: 1GiB}"
    )
    error = refused(
        files,
        text,
        key="stages[0].resource_budget.demands[machine:vram:GPU-1]",
        line=line_of(text, "demands"),
    )
    assert "declared constraints: machine:ram, wsl:quota" in str(error)


def with_stage_capacities(k: int, capacities: str) -> str:
    return "pipeline: chain\nasync_chunk: false\nstages:\n" + "".join(
        stage_text(i, capacities=capacities if i == k else "") for i in range(3)
    )


def test_a_capacity_value_that_differs_names_the_stage_and_constraint(files: Path) -> None:
    text = with_stage_capacities(2, "{machine:ram: 2GiB, wsl:quota: 2GiB}")
    error = refused(
        files,
        text,
        key="stages[2].resource_budget.capacities[wsl:quota]",
        line=line_of(text, "capacities", occurrence=3),
    )
    assert "stage-2 declares 'wsl:quota' as 2147483648, but stage-0 declares 1073741824" in str(
        error
    )


def test_a_missing_capacity_names_the_stage_and_constraint(files: Path) -> None:
    text = with_stage_capacities(1, "{machine:ram: 2GiB}")
    error = refused(
        files,
        text,
        key="stages[1].resource_budget.capacities[wsl:quota]",
        line=line_of(text, "resource_budget", occurrence=2) + 1,
    )
    assert "stage-1 does not declare capacity 'wsl:quota'" in str(error)


def test_an_extra_capacity_names_the_stage_and_constraint(files: Path) -> None:
    text = with_stage_capacities(1, "{machine:ram: 2GiB, wsl:quota: 1GiB, machine:vram:G: 1GiB}")
    error = refused(
        files,
        text,
        key="stages[1].resource_budget.capacities[machine:vram:G]",
        line=line_of(text, "capacities", occurrence=2),
    )
    assert "stage-1 declares capacity 'machine:vram:G', which stage-0 does not" in str(error)


# --- stage ids and the chain ----------------------------------------------------------


def test_stage_ids_must_be_contiguous_from_zero(files: Path) -> None:
    text = "pipeline: p\nasync_chunk: false\nstages:\n" + "".join(map(stage_text, (0, 2, 3)))
    error = refused(files, text, key="stages[1].stage_id", line=line_of(text, "stage_id: 2"))
    assert "contiguous from 0" in str(error)
    assert "found [0, 2, 3]" in str(error)


def test_stage_ids_must_be_listed_in_order(files: Path) -> None:
    text = "pipeline: p\nasync_chunk: false\nstages:\n" + stage_text(1) + stage_text(0)
    error = refused(files, text, key="stages[0].stage_id", line=line_of(text, "stage_id: 1"))
    assert "found [1, 0]" in str(error)


def test_fan_out_is_refused(files: Path) -> None:
    text = pipeline_text(3, extras={2: "    engine_input_source: [0]\n"})
    error = refused(
        files, text, key="stages[2].engine_input_source", line=line_of(text, "engine_input_source")
    )
    assert "fan-out" in str(error)
    assert "reference-counted consumer leases" in str(error)
    assert "accepted: [1]" in str(error)


def test_join_is_refused(files: Path) -> None:
    text = pipeline_text(3, extras={2: "    engine_input_source: [0, 1]\n"})
    error = refused(
        files, text, key="stages[2].engine_input_source", line=line_of(text, "engine_input_source")
    )
    assert "joins the outputs of stages [0, 1]" in str(error)
    assert "reference-counted consumer leases" in str(error)


@pytest.mark.parametrize(
    ("stage", "value", "fragment"),
    [
        (1, "[1]", "cannot consume stage 1: only an earlier stage"),
        (1, "[]", "stage 1 consumes no stage"),
        (0, "[1]", "stage 0 is the pipeline's entry"),
        (1, "[-1]", "an integer >= 0"),
        (1, "0", "a list of earlier stage ids"),
    ],
)
def test_engine_input_source_must_follow_the_chain(
    files: Path, stage: int, value: str, fragment: str
) -> None:
    text = pipeline_text(2, extras={stage: f"    engine_input_source: {value}\n"})
    key = f"stages[{stage}].engine_input_source" + ("[0]" if value == "[-1]" else "")
    error = refused(files, text, key=key, line=line_of(text, "engine_input_source"))
    assert fragment in str(error)


def test_multiple_final_outputs_are_refused(files: Path) -> None:
    text = pipeline_text(2, extras={0: "    final_output: true\n"})
    error = refused(files, text, key="stages[0].final_output", line=line_of(text, "final_output"))
    assert "multiple final outputs (stages [0, 1])" in str(error)
    assert "reference-counted consumer leases" in str(error)


def test_a_final_output_must_be_the_last_stage(files: Path) -> None:
    text = pipeline_text(2, extras={0: "    final_output: true\n", 1: "    final_output: false\n"})
    error = refused(files, text, key="stages[0].final_output", line=line_of(text, "final_output"))
    assert "stage 0 is the final output; accepted: exactly one terminal output" in str(error)


def test_a_pipeline_needs_a_final_output(files: Path) -> None:
    text = pipeline_text(1, extras={0: "    final_output: false\n"})
    error = refused(files, text, key="stages[0].final_output", line=line_of(text, "final_output"))
    assert "no stage is a final output" in str(error)


def test_final_output_type_only_on_the_final_stage(files: Path) -> None:
    text = pipeline_text(2, extras={0: "    final_output_type: audio\n"})
    error = refused(
        files, text, key="stages[0].final_output_type", line=line_of(text, "final_output_type")
    )
    assert "applies only to the final output stage" in str(error)


def test_async_chunk_must_be_false_with_graph_stages(files: Path) -> None:
    text = pipeline_text(1).replace("async_chunk: false", "async_chunk: true")
    error = refused(files, text, key="async_chunk", line=2)
    assert "async_chunk must be false" in str(error)
    assert "accepted: false" in str(error)


# --- stage transforms -----------------------------------------------------------------


def test_a_graph_stage_after_another_needs_a_transform(files: Path) -> None:
    text = (
        "pipeline: p\nasync_chunk: false\nstages:\n"
        + stage_text(0)
        + stage_text(1, transform=False)
    )
    error = refused(
        files, text, key="stages[1].custom_process_input_func", line=line_of(text, "stage_id: 1")
    )
    assert "stage-1 is a graph stage that follows stage 0" in str(error)
    assert "'module:function'" in str(error)


def test_stage_zero_takes_no_transform(files: Path) -> None:
    text = pipeline_text(1, extras={0: f"    custom_process_input_func: {TRANSFORM}\n"})
    error = refused(
        files, text, key="stages[0].custom_process_input_func", line=line_of(text, "custom_process")
    )
    assert "stage 0 takes the request's inputs directly" in str(error)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("helpers.transforms.passthrough", "is not of the form 'module:function'"),
        ("no_such_module_for_config:f", "module 'no_such_module_for_config' not found"),
        ("helpers.no_such_submodule:f", "module 'helpers.no_such_submodule' not found"),
        ("helpers.transforms:missing", "'helpers.transforms' has no attribute 'missing'"),
        (
            "helpers.transforms:passthrough.inner",
            "'helpers.transforms:passthrough' has no attribute 'inner'",
        ),
        ("os:sep", "'os:sep' is a str, which is not callable"),
    ],
)
def test_unresolvable_transform_in_a_pipeline(files: Path, spec: str, fragment: str) -> None:
    text = pipeline_text(2).replace(TRANSFORM, spec)
    error = refused(
        files, text, key="stages[1].custom_process_input_func", line=line_of(text, "custom_process")
    )
    assert fragment in str(error)
    assert "expected 'module:function'" in str(error)


def test_resolve_callable_reports_failing_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config_needs_dep.py").write_text("import config_absent_dependency\n")
    (tmp_path / "config_bad_syntax.py").write_text("def broken(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    where = {"file": "p.yaml", "line": 7, "key": "stages[1].custom_process_input_func"}

    with pytest.raises(ConfigError) as info:
        resolve_callable("config_needs_dep:f", **where)
    assert "importing module 'config_needs_dep' failed" in str(info.value)
    assert "config_absent_dependency" in str(info.value)
    assert (info.value.file, info.value.line) == ("p.yaml", 7)

    (tmp_path / "config_bad_import.py").write_text("from os import config_no_such_name\n")
    with pytest.raises(ConfigError, match="importing module 'config_bad_import' failed"):
        resolve_callable("config_bad_import:f", **where)

    with pytest.raises(ConfigError, match="'config_bad_syntax' has a syntax error at line 1"):
        resolve_callable("config_bad_syntax:broken", **where)

    assert resolve_callable("os.path:join", **where) is os.path.join


def test_pipeline_config_is_immutable(files: Path) -> None:
    config: PipelineConfig = load_pipeline(write(files, pipeline_text(1)))
    with pytest.raises(AttributeError):
        config.pipeline = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.stages[0].resource_budget.capacities["machine:ram"] = 1  # type: ignore[index]


ADAPTER_HEAD = """\
adapter:
  name: helpers.transforms:passthrough
  options:
    voice: joe
    schedule: [16, 32]
"""


def test_adapter_section_is_parsed_and_its_stages_need_no_transform(files: Path) -> None:
    text = "pipeline: chain\nasync_chunk: false\n" + ADAPTER_HEAD + "stages:\n"
    text += stage_text(0) + stage_text(1, transform=False)
    config = load_pipeline(write(files, text))
    assert config.adapter is not None
    assert config.adapter.name == "helpers.transforms:passthrough"
    assert config.adapter.options == {"voice": "joe", "schedule": [16, 32]}
    assert config.adapter.line == 4
    assert config.stages[1].custom_process_input_func is None


def test_adapter_that_does_not_resolve_names_the_line(files: Path) -> None:
    head = ADAPTER_HEAD.replace("helpers.transforms:passthrough", "helpers.transforms:missing")
    text = "pipeline: chain\nasync_chunk: false\n" + head + "stages:\n" + stage_text(0)
    error = refused(files, text, key="adapter.name", line=4)
    assert "missing" in str(error)


def test_adapter_options_must_be_a_mapping(files: Path) -> None:
    head = "adapter:\n  name: helpers.transforms:passthrough\n  options: [1, 2]\n"
    text = "pipeline: chain\nasync_chunk: false\n" + head + "stages:\n" + stage_text(0)
    refused(files, text, key="adapter.options", line=5)


def test_data_placeholder_names_the_user_data_directory(
    files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    (data / "voices").mkdir(parents=True)
    (files / "bundle" / "manifest.json").rename(data / "voices" / "manifest.json")
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(data))
    text = pipeline_text(1).replace("bundle/manifest.json", "${data}/voices/manifest.json")
    config = load_pipeline(write(files, text))
    assert config.stages[0].backend.manifest == data / "voices" / "manifest.json"


# --- provider options and plugin libraries ------------------------------------------------


def _with_route_lines(lines: str) -> str:
    return pipeline_text(1).replace(
        "        max_io_bytes: 8MiB\n", f"        max_io_bytes: 8MiB\n{lines}"
    )


def test_provider_options_and_an_ep_library_are_read(files: Path) -> None:
    text = _with_route_lines(
        "        provider_options: {device_id: 1, device_type: NPU}\n"
        "        ep_library: /opt/ort-plugins/libonnxruntime_providers_openvino_plugin.so\n"
    )
    (stage,) = load_pipeline(write(files, text)).stages
    route = stage.backend.route
    assert dict(route.provider_options) == {"device_id": "1", "device_type": "NPU"}
    assert route.ep_library == "/opt/ort-plugins/libonnxruntime_providers_openvino_plugin.so"


@pytest.mark.parametrize(
    ("lines", "key", "needle"),
    [
        (
            "        provider_options: {device_id: first}\n",
            "stages[0].backend.route.provider_options[device_id]",
            "device_id 'first' is not a device index; expected an integer >= 0",
        ),
        (
            "        provider_options: {device_id: -1}\n",
            "stages[0].backend.route.provider_options[device_id]",
            "is not a device index",
        ),
        (
            "        provider_options: {enable: true}\n",
            "stages[0].backend.route.provider_options[enable]",
            "expected a string or an integer",
        ),
        (
            "        provider_options: {'bad key': x}\n",
            "stages[0].backend.route.provider_options[bad key]",
            "is not a provider option name",
        ),
        (
            "        ep_library: plugins/openvino.so\n",
            "stages[0].backend.route.ep_library",
            "'plugins/openvino.so' is not an absolute path",
        ),
        (
            "        ep_library: /opt/plugins/readme.txt\n",
            "stages[0].backend.route.ep_library",
            "is not a shared library",
        ),
    ],
)
def test_bad_provider_options_and_libraries_are_named(
    files: Path, lines: str, key: str, needle: str
) -> None:
    text = _with_route_lines(lines)
    error = refused(files, text, key=key, line=line_of(text, lines.strip().split(":")[0]))
    assert needle in str(error)
