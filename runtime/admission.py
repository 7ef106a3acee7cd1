"""Admission: every check a pipeline passes before anything loads, made in one place.

:func:`resolve` checks devices, bundles, routes, models and memory without starting a process
or reserving anything, and returns a frozen :class:`Resolution`: each stage's route, placement
and demands, and every :class:`Refusal`. ``plan`` reports all the refusals; loading raises the
first (:meth:`Resolution.raise_first`), so the two cannot disagree. A bundle is hashed once
per resolution, and a resolution handed to loading lends it its verified bundles.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Literal

from runtime.artifacts import BundleReport, VerifiedBundle, inspect_bundle
from runtime.backends.vllm_client import (
    DEFAULT_MEMORY_CONSTRAINT,
    engine_floor_bytes,
    engine_memory_constraint,
)
from runtime.config import GraphBackendConfig, LlmBackendConfig, RemoteLlmRoute
from runtime.contracts.manifest import MANIFEST_NAME
from runtime.devices import (
    DeviceSelection,
    Topology,
    check_route_device,
    discover_topology,
    free_shortfalls,
    load_selection,
    observed_free,
    route_domain,
)
from runtime.envs.manager import envs_root
from runtime.errors import (
    AdmissionRefused,
    ConfigError,
    DeviceExcluded,
    OmniError,
    UsageError,
)
from runtime.host import RouteError, current_os_domain, is_frozen, resolve_interpreter, worker_argv
from runtime.ledger import BudgetExplanation, explain_budget, format_bytes

if TYPE_CHECKING:
    from collections.abc import Mapping

    from runtime.config import LlmRouteConfig, PipelineConfig, RouteConfig, StageConfig
    from runtime.contracts.devices import DeviceDescriptor

__all__ = [
    "REMOTE_LLM_MODULE",
    "GraphPlacement",
    "LocalLlmPlacement",
    "Placement",
    "Refusal",
    "RefusalKind",
    "RemoteLlmPlacement",
    "Resolution",
    "StageResolution",
    "resolve",
]

#: The module that serves a remote language-model route (RemoteEndpoint, RemoteLlmStageClient).
REMOTE_LLM_MODULE: Final = "runtime.backends.remote_llm"

#: What a refusal is about: a device, a bundle, a route, a model's memory floor, a capacity.
RefusalKind = Literal["device", "bundle", "route", "model", "capacity"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a pipeline cannot load: ``error`` is what loading raises, ``text`` what ``plan``
    shows (the error's message after a prefix naming the device check or the stage)."""

    kind: RefusalKind
    error: OmniError
    stage: str | None = None
    prefix: str = ""

    @property
    def message(self) -> str:
        return str(self.error)

    @property
    def text(self) -> str:
        return f"{self.prefix}{self.message}"


@dataclass(frozen=True, slots=True)
class GraphPlacement:
    """A graph stage admitted: its verified bundle and the device it runs on."""

    bundle: VerifiedBundle
    device: DeviceDescriptor


@dataclass(frozen=True, slots=True)
class LocalLlmPlacement:
    """A local language-model stage admitted: the Python its route runs and its device."""

    python: Path
    device_id: str
    #: The ledger constraint its weights and KV cache live in (RAM, or the GPU's memory).
    memory: str = DEFAULT_MEMORY_CONSTRAINT


@dataclass(frozen=True, slots=True)
class RemoteLlmPlacement:
    """A remote language-model stage admitted: its client module exists, its API key was read."""

    api_key: str | None = field(default=None, repr=False)


Placement = GraphPlacement | LocalLlmPlacement | RemoteLlmPlacement


@dataclass(frozen=True, slots=True)
class StageResolution:
    """One stage as admission sees it; ``placement`` is None when the stage was refused."""

    name: str
    backend: str
    route: Mapping[str, Any]
    demands: Mapping[str, int]
    placement: Placement | None
    #: The device it would run on, where one was found (``name (physical id)``).
    device: str | None = None
    #: A graph stage's bundle as checked (every file's status), None for a model stage.
    bundle: BundleReport | None = None
    #: A language-model stage's model, as the pipeline names it.
    model: str | None = None


@dataclass(frozen=True, slots=True)
class Resolution:
    """The outcome of :func:`resolve`: admitted only when no check refused."""

    config: PipelineConfig
    #: The machine checked against (None when no stage needed one: remote stages only).
    machine: Topology | None
    #: The device selection checked against (None when no stage needed one).
    selection: DeviceSelection | None
    stages: tuple[StageResolution, ...]
    budget: BudgetExplanation
    warnings: tuple[str, ...] = ()
    refusals: tuple[Refusal, ...] = ()

    @property
    def admitted(self) -> bool:
        return not self.refusals

    def raise_first(self) -> None:
        """Raise the first refusal's error (what loading reports), if any."""
        if self.refusals:
            raise self.refusals[0].error

    def placements(self) -> tuple[Placement, ...]:
        """Every stage's placement, in stage order; raises the first refusal."""
        self.raise_first()
        found = tuple(stage.placement for stage in self.stages)
        assert all(placement is not None for placement in found), "admitted without placement"
        return tuple(placement for placement in found if placement is not None)

    @property
    def bundles(self) -> Mapping[Path, BundleReport]:
        """Each graph stage's bundle report by manifest path: what a later resolution of the
        same pipeline may reuse instead of hashing the files again."""
        return MappingProxyType(
            {
                stage.bundle.manifest_path: stage.bundle
                for stage in self.stages
                if stage.bundle is not None
            }
        )


def _where(config: PipelineConfig, stage: StageConfig, key: str) -> dict[str, Any]:
    return {
        "file": str(config.source) if config.source is not None else None,
        "line": stage.location.line,
        "key": f"stages[{stage.stage_id}].{key}",
    }


def _llm_route_json(backend: LlmBackendConfig) -> dict[str, Any]:
    route = backend.route
    if isinstance(route, RemoteLlmRoute):
        return {
            "name": backend.route_name,
            "url": route.url,
            "model": route.model,
            "api_key_env": route.api_key_env,
            "connect_timeout_s": route.connect_timeout_s,
            "read_timeout_s": route.read_timeout_s,
        }
    return {
        "name": route.name,
        "interpreter": route.interpreter,
        "worker": route.worker,
        "os_domain": route.os_domain,
    }


class _Machine:
    """The topology and selection admission checks against, found once and only when needed."""

    def __init__(self, topology: Topology | None, selection: DeviceSelection | None) -> None:
        self.topology = topology
        self.selection = selection

    def get(self) -> tuple[Topology, DeviceSelection]:
        if self.topology is None:
            self.topology = discover_topology()
        if self.selection is None:
            self.selection = load_selection()
        return self.topology, self.selection


class _Checks:
    """The refusals and warnings of one resolution, in the order loading meets them."""

    def __init__(self, config: PipelineConfig, machine: _Machine) -> None:
        self.config = config
        self.machine = machine
        self.refusals: list[Refusal] = []
        self.warnings: list[str] = []

    def refuse(
        self, kind: RefusalKind, error: OmniError, stage: str | None, prefix: str = ""
    ) -> None:
        self.refusals.append(Refusal(kind, error, stage, prefix))

    def device(
        self, stage: StageConfig, route: RouteConfig | LlmRouteConfig, what: str
    ) -> DeviceDescriptor | None:
        """The device ``route`` runs on, or None with a device refusal; warns of a device
        whose memory the stage demands nothing of."""
        topology, selection = self.machine.get()
        try:
            found = check_route_device(
                topology,
                selection,
                ep=route.ep,
                target_provider=route.target_provider,
                stage=stage.name,
                os_domain=route.os_domain,
                route=route.name,
            )
        except DeviceExcluded as exc:
            self.refuse("device", exc, stage.name, "device: ")
            return None
        charged = topology.charges(found.physical_id, route_domain(topology, route.os_domain))
        missing = [c for c in charged if c not in stage.resource_budget.demands]
        if missing:
            self.warnings.append(
                f"{stage.name} {what} {found.name}, which draws on {', '.join(charged)}, "
                f"but demands nothing of {', '.join(missing)}"
            )
        return found


def _graph_stage(
    checks: _Checks,
    stage: StageConfig,
    backend: GraphBackendConfig,
    known: dict[Path, BundleReport],
) -> StageResolution:
    device = checks.device(stage, backend.route, "runs on")
    report = _bundle_report(backend.manifest, known)
    for error in report.errors:
        checks.refuse("bundle", error, stage.name, f"{stage.name}: ")
    verified = report.verified() if report.ok else None
    placement = (
        GraphPlacement(verified, device) if verified is not None and device is not None else None
    )
    return StageResolution(
        name=stage.name,
        backend=backend.name,
        route=MappingProxyType(backend.route.to_json()),
        demands=MappingProxyType(dict(stage.resource_budget.demands)),
        placement=placement,
        device=None if device is None else f"{device.name} ({device.physical_id})",
        bundle=report,
    )


def _bundle_report(manifest: Path, known: dict[Path, BundleReport]) -> BundleReport:
    """The bundle's report: one checked moments ago (by ``plan``, the studio's description of
    the same file, or an earlier stage of this pipeline), else the files hashed now."""
    for path in (manifest, manifest / MANIFEST_NAME):
        found = known.get(path.absolute())
        if found is not None:
            return found
    report = inspect_bundle(manifest)
    known[report.manifest_path] = report
    return report


def _llm_stage(
    checks: _Checks, stage: StageConfig, backend: LlmBackendConfig, env_dir: Path | None
) -> StageResolution:
    placement, device = _llm_placement(checks, stage, backend, env_dir)
    return StageResolution(
        name=stage.name,
        backend=backend.name,
        route=MappingProxyType(_llm_route_json(backend)),
        demands=MappingProxyType(dict(stage.resource_budget.demands)),
        placement=placement,
        device=None if device is None else f"{device.name} ({device.physical_id})",
        model=backend.model_label,
    )


def _llm_placement(
    checks: _Checks, stage: StageConfig, backend: LlmBackendConfig, env_dir: Path | None
) -> tuple[Placement | None, DeviceDescriptor | None]:
    """Where a language-model stage runs (None after its refusals, made in loading's order),
    and the device a local engine would run on."""
    config = checks.config
    route = backend.route
    if isinstance(route, RemoteLlmRoute):
        if importlib.util.find_spec(REMOTE_LLM_MODULE) is None:
            checks.refuse(
                "route",
                UsageError(
                    f"{stage.name}: remote language-model routes ({route.url}) need "
                    f"{REMOTE_LLM_MODULE}, which this installation does not have"
                ),
                stage.name,
            )
            return None, None
        if route.api_key_env is None:
            return RemoteLlmPlacement(), None
        api_key = os.environ.get(route.api_key_env)
        if not api_key:
            checks.refuse(
                "route",
                ConfigError(
                    f"{stage.name}: the environment variable {route.api_key_env} holds no API "
                    f"key; set it before starting the pipeline, or remove api_key_env for a "
                    "server without keys",
                    **_where(config, stage, "backend.route.api_key_env"),
                ),
                stage.name,
            )
            return None, None
        return RemoteLlmPlacement(api_key=api_key), None
    # A local engine runs on a device of this machine: checked like a graph stage's.
    device = checks.device(stage, route, "runs its engine on")
    here = current_os_domain()
    if route.os_domain != here:
        checks.refuse(
            "route",
            RouteError(
                f"{stage.name}: route {route.name} has os_domain {route.os_domain!r}, but a "
                f"language-model worker runs in the controller's own domain ({here!r}); "
                f"accepted: os_domain: {here} (graph stages may cross between Windows and WSL)",
                **_where(config, stage, "backend.route.os_domain"),
            ),
            stage.name,
        )
        return None, device
    frozen = is_frozen()
    python: Path | None = None
    try:
        argv = resolve_interpreter(
            route.interpreter,
            frozen=frozen,
            env_dir=envs_root() if env_dir is None else env_dir,
            os_domain=route.os_domain,
        )
        worker_argv(argv, route.worker, frozen=frozen)
    except RouteError as exc:
        checks.refuse(
            "route",
            RouteError(
                f"{stage.name}: {exc.detail}",
                **_where(config, stage, f"backend.route.{exc.key}"),
            ),
            stage.name,
        )
    else:
        python = Path(argv[0])
    if device is None:
        return None, None
    memory = engine_memory_constraint(route.ep, device.physical_id)
    if isinstance(backend.model, Path):
        floor = floor_refusal(config, stage, backend, backend.model, memory)
        if floor is not None:
            checks.refuse("model", floor, stage.name)
            return None, device
    if python is None:
        return None, device
    return LocalLlmPlacement(python=python, device_id=device.physical_id, memory=memory), device


def floor_refusal(
    config: PipelineConfig,
    stage: StageConfig,
    backend: LlmBackendConfig,
    model_dir: Path,
    memory: str,
) -> ConfigError | None:
    """The refusal of a stage whose demand on the memory its engine uses (the machine's RAM on
    the CPU, the GPU's own memory for CUDA) does not cover its weights plus its KV cache."""
    floor = engine_floor_bytes(model_dir, backend.engine_args)
    declared = stage.resource_budget.demands.get(memory, 0)
    if declared >= floor:
        return None
    held = (
        "about 1.5 GiB for the tiny model on the CPU"
        if memory == DEFAULT_MEMORY_CONSTRAINT
        else "CUDA's own context and vLLM's activations besides"
    )
    return ConfigError(
        f"{stage.name} demands {declared} bytes of {memory}, less than the weights of "
        f"{model_dir} plus the KV cache ({floor} bytes); accepted: a demand of at least "
        f"{floor} bytes (the worker holds more: {held})",
        **_where(config, stage, f"resource_budget.demands[{memory}]"),
    )


def _capacity_checks(
    checks: _Checks, budget: BudgetExplanation, capacities: Mapping[str, int] | None
) -> None:
    """Refuse demands above the pipeline's own declared capacities, or above the machine's
    (which every loaded pipeline shares); warn where a declared capacity exceeds what is free."""
    config = checks.config
    topology = checks.machine.topology
    source = topology.source if topology is not None else "this machine"
    # What the ledger already holds (loading passes it) overrides what the machine states.
    held = {**({} if topology is None else _stated_capacities(topology)), **(capacities or {})}
    if topology is not None:
        for name in config.capacities:
            if name not in topology.constraints:
                checks.warnings.append(
                    f"the pipeline declares {name}, which {topology.source} does not have"
                )
        for shortfall in free_shortfalls(config.capacities, observed_free(topology)):
            checks.warnings.append(
                f"{shortfall.constraint}: the declared capacity "
                f"{format_bytes(shortfall.capacity)} exceeds the {format_bytes(shortfall.free)} "
                "free now; loading may fail or swap"
            )
    for constraint in budget.constraints:
        askers = ", ".join(constraint.demands)
        stages = tuple(constraint.demands)
        if not constraint.fits:
            checks.refuse(
                "capacity",
                AdmissionRefused(
                    f"admission: {constraint.constraint} needs {format_bytes(constraint.total)} "
                    f"for {askers} but its declared capacity is "
                    f"{format_bytes(constraint.capacity)} "
                    f"(short by {format_bytes(-constraint.headroom)})",
                    constraint=constraint.constraint,
                    needed=constraint.total,
                    free=constraint.capacity,
                    stages=stages,
                ),
                None,
            )
            continue
        machine = held.get(constraint.constraint)
        if machine is not None and constraint.total > machine:
            checks.refuse(
                "capacity",
                AdmissionRefused(
                    f"admission: {constraint.constraint} needs {format_bytes(constraint.total)} "
                    f"for {askers} but the machine ({source}) has {format_bytes(machine)}",
                    constraint=constraint.constraint,
                    needed=constraint.total,
                    free=machine,
                    stages=stages,
                ),
                None,
            )


def _stated_capacities(topology: Topology) -> dict[str, int]:
    return {
        name: info.capacity
        for name, info in topology.constraints.items()
        if info.capacity is not None
    }


def resolve(
    config: PipelineConfig,
    machine: Topology | None = None,
    selection: DeviceSelection | None = None,
    *,
    capacities: Mapping[str, int] | None = None,
    env_dir: Path | None = None,
    bundles: Mapping[Path, BundleReport] | None = None,
) -> Resolution:
    """Every check a pipeline passes before anything loads, all refusals collected.

    ``machine`` and ``selection`` default to the machine found and the user's saved selection
    (found only when a stage runs locally). ``capacities`` is what memory constraints hold on
    the machine where already known (loading passes its ledger's); the others are the
    capacities ``machine`` states.
    ``env_dir`` holds the managed environments; ``bundles`` are reports of the same bundles
    checked moments ago (:attr:`Resolution.bundles`), reused instead of hashing again.
    """
    found = _Machine(machine, selection)
    checks = _Checks(config, found)
    known = {} if bundles is None else {path.absolute(): r for path, r in bundles.items()}
    stages: list[StageResolution] = []
    for stage in config.stages:
        backend = stage.backend
        if isinstance(backend, LlmBackendConfig):
            stages.append(_llm_stage(checks, stage, backend, env_dir))
        else:
            stages.append(_graph_stage(checks, stage, backend, known))
    budget = explain_budget(config.capacities, config.demands_by_stage())
    _capacity_checks(checks, budget, capacities)
    return Resolution(
        config=config,
        machine=found.topology,
        selection=found.selection,
        stages=tuple(stages),
        budget=budget,
        warnings=tuple(checks.warnings),
        refusals=tuple(checks.refusals),
    )
