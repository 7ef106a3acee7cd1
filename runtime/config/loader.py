"""Loading a pipeline: the YAML composed and walked into a ``PipelineConfig``.

``BACKEND_PARSERS`` is where a backend registers its section parser.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeAlias

import yaml

from runtime.config.callables import CALLABLE_FORM, resolve_callable
from runtime.config.graph import GRAPH_BACKEND, parse_graph_backend
from runtime.config.llm import LLM_BACKEND, parse_llm_backend
from runtime.config.pipeline import (
    AdapterConfig,
    BackendConfig,
    PipelineConfig,
    ResourceBudget,
    StageConfig,
)
from runtime.config.reader import NAME_RE, ConfigItem, ConfigReader, SourceLocation
from runtime.config.rules import (
    ParsedStage,
    check_async_chunk,
    check_capacities,
    check_chain,
    check_llm_stages,
    check_stage_ids,
    check_transforms,
)
from runtime.contracts.devices import is_constraint_name
from runtime.errors import ConfigError

_CONSTRAINT_FORMS = "constraint names such as machine:ram, wsl:quota or machine:vram:<physical-id>"

BackendParser: TypeAlias = Callable[[ConfigReader, ConfigItem], BackendConfig]

#: Backend section parsers by backend name; other backends register theirs here.
BACKEND_PARSERS: dict[str, BackendParser] = {
    GRAPH_BACKEND: parse_graph_backend,
    LLM_BACKEND: parse_llm_backend,
}


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
        pattern=NAME_RE,
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
    check_stage_ids(reader, stages)
    check_chain(reader, stages)
    check_capacities(reader, stages)
    check_async_chunk(reader, stages, async_chunk, fields["async_chunk"])
    check_transforms(reader, stages, adapter_drives=adapter is not None)
    check_llm_stages(reader, stages, adapter_drives=adapter is not None)
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


def _parse_stage(reader: ConfigReader, item: ConfigItem, index: int, count: int) -> ParsedStage:
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
            pattern=NAME_RE,
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
    return ParsedStage(config, item, fields, capacity_items)


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
