"""The rules that hold across a pipeline's stages: ids in order, a linear chain with one
final output, the same capacities everywhere, handoffs that resolve, and language-model
stages that run alone unless an adapter drives them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from runtime.config.callables import CALLABLE_FORM, resolve_callable
from runtime.config.llm import LLM_BACKEND, LlmBackendConfig

if TYPE_CHECKING:
    from collections.abc import Mapping

    from runtime.config.pipeline import StageConfig
    from runtime.config.reader import ConfigItem, ConfigReader

_LEASES = "they need reference-counted consumer leases, which v1 does not support"


@dataclass(frozen=True, slots=True)
class ParsedStage:
    """A stage's configuration with the YAML items the rules point at when they fail."""

    config: StageConfig
    item: ConfigItem
    fields: Mapping[str, ConfigItem]
    capacity_items: Mapping[str, ConfigItem]


def check_stage_ids(reader: ConfigReader, stages: list[ParsedStage]) -> None:
    ids = [stage.config.stage_id for stage in stages]
    for index, stage in enumerate(stages):
        if stage.config.stage_id != index:
            item = stage.fields["stage_id"]
            reader.reject(
                item,
                f"stage ids must be contiguous from 0 and listed in order (0, 1, 2, ...); "
                f"found {ids}",
            )


def check_chain(reader: ConfigReader, stages: list[ParsedStage]) -> None:
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


def check_capacities(reader: ConfigReader, stages: list[ParsedStage]) -> None:
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


def check_async_chunk(
    reader: ConfigReader, stages: list[ParsedStage], async_chunk: bool, item: ConfigItem
) -> None:
    graphs = [stage.config.name for stage in stages if stage.config.backend.is_graph]
    if async_chunk and graphs:
        reader.reject(
            item,
            f"async_chunk must be false for a pipeline with graph stages ({', '.join(graphs)}): "
            "a graph stage consumes its inputs whole; accepted: false",
        )


def check_transforms(
    reader: ConfigReader, stages: list[ParsedStage], *, adapter_drives: bool
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


def check_llm_stages(
    reader: ConfigReader, stages: list[ParsedStage], *, adapter_drives: bool
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
