"""Cutting a Piper/VITS voice graph at the latent into an acoustic and a decoder graph, and
the error every step of a voice export raises."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from runtime.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    import onnx

#: The inputs of a single-speaker VITS graph, which the acoustic half keeps.
ACOUSTIC_INPUTS: Final = ("input", "input_lengths", "scales")
#: Channels of the latent the decoder half takes.
LATENT_CHANNELS: Final = 192


class VoiceExportError(UsageError):
    """A voice cannot be exported: unknown name, package missing, unrecognized graph, or a
    validation that failed. ``code`` is stable; ``subject`` names what is at fault."""

    def __init__(self, message: str, *, code: str, subject: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.subject = subject


@dataclass(frozen=True, slots=True)
class VoiceCut:
    """Where a VITS graph is cut: the latent, the frame mask, and the audio output."""

    latent: str
    mask: str
    output: str


def find_cut(model: onnx.ModelProto) -> VoiceCut:
    """Find the latent and the only other tensor the decoder half needs (the frame mask)."""
    graph = model.graph
    initializers = {tensor.name for tensor in graph.initializer}
    inputs = tuple(value.name for value in graph.input if value.name not in initializers)
    if inputs != ACOUSTIC_INPUTS:
        raise VoiceExportError(
            f"the voice graph's inputs are {list(inputs)}; accepted: a single-speaker VITS "
            f"graph with inputs {list(ACOUSTIC_INPUTS)}",
            code="unrecognized_graph",
            subject="inputs",
        )
    if len(graph.output) != 1:
        raise VoiceExportError(
            f"the voice graph has {len(graph.output)} outputs; accepted: one audio output",
            code="unrecognized_graph",
            subject="outputs",
        )
    consumers: dict[str, list[int]] = {}
    producer: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for name in node.input:
            consumers.setdefault(name, []).append(index)
        for name in node.output:
            producer[name] = index
    noise = [i for i, node in enumerate(graph.node) if node.op_type == "RandomNormalLike"]
    if not noise:
        raise VoiceExportError(
            "the voice graph has no RandomNormalLike node; accepted: a VITS graph whose latent "
            "adds scaled noise",
            code="unrecognized_graph",
            subject="RandomNormalLike",
        )
    downstream = _forward_closure(graph, consumers, list(graph.node[noise[-1]].output))
    adds = sorted(i for i in downstream if graph.node[i].op_type == "Add")
    if not adds:
        raise VoiceExportError(
            "no Add follows the last RandomNormalLike node; accepted: a VITS graph",
            code="unrecognized_graph",
            subject=graph.node[noise[-1]].name,
        )
    latent = graph.node[adds[0]].output[0]
    decoder = _forward_closure(graph, consumers, [latent])
    boundary = sorted(
        {
            name
            for index in decoder
            for name in graph.node[index].input
            if name
            and name != latent
            and name not in initializers
            and producer.get(name) not in decoder
            and _depends_on_inputs(graph, producer, name, set(inputs))
        }
    )
    if len(boundary) != 1:
        raise VoiceExportError(
            f"the decoder half after {latent!r} needs {boundary or 'no'} besides the latent; "
            "accepted: exactly one more tensor (the frame mask)",
            code="unrecognized_graph",
            subject=latent,
        )
    return VoiceCut(latent=latent, mask=boundary[0], output=graph.output[0].name)


def _forward_closure(
    graph: onnx.GraphProto, consumers: Mapping[str, list[int]], start: list[str]
) -> set[int]:
    seen: set[int] = set()
    stack = list(start)
    while stack:
        for index in consumers.get(stack.pop(), ()):
            if index not in seen:
                seen.add(index)
                stack.extend(graph.node[index].output)
    return seen


def _depends_on_inputs(
    graph: onnx.GraphProto, producer: Mapping[str, int], name: str, inputs: set[str]
) -> bool:
    stack = [name]
    seen: set[str] = set()
    while stack:
        tensor = stack.pop()
        if tensor in inputs:
            return True
        if tensor in seen or tensor not in producer:
            continue
        seen.add(tensor)
        stack.extend(t for t in graph.node[producer[tensor]].input if t)
    return False


def cut_voice(model_path: Path, workdir: Path) -> tuple[Path, Path]:
    """Write ``acoustic.onnx`` and ``decoder.onnx`` (clean I/O names) into ``workdir``."""
    # Only the export needs onnx: the speech adapter and a frozen build that ships exported
    # bundles import this module without it.
    import onnx
    from onnx import shape_inference
    from onnx.utils import Extractor

    model = onnx.load(str(model_path))
    cut = find_cut(model)
    extractor = Extractor(shape_inference.infer_shapes(model))
    acoustic = extractor.extract_model(list(ACOUSTIC_INPUTS), [cut.latent, cut.mask])
    decoder = extractor.extract_model([cut.latent, cut.mask], [cut.output])
    _rename(acoustic, {cut.latent: "z", cut.mask: "mask"})
    _rename(decoder, {cut.latent: "z", cut.mask: "mask", cut.output: "audio"})
    frames: list[int | str] = ["batch", LATENT_CHANNELS, "frames"]
    mask: list[int | str] = ["batch", 1, "frames"]
    _set_io(acoustic.graph.output, {"z": frames, "mask": mask})
    _set_io(decoder.graph.input, {"z": frames, "mask": mask})
    _set_io(decoder.graph.output, {"audio": ["batch", 1, 1, "samples"]})
    paths = (workdir / "acoustic.onnx", workdir / "decoder.onnx")
    for part, path in zip((acoustic, decoder), paths, strict=True):
        onnx.checker.check_model(part)
        onnx.save(part, str(path))
    return paths


def _rename(model: onnx.ModelProto, mapping: Mapping[str, str]) -> None:
    graph = model.graph
    taken = {name for node in graph.node for name in (*node.input, *node.output)}
    clash = sorted(set(mapping.values()) & taken)
    if clash:
        raise VoiceExportError(
            f"the voice graph already uses the tensor name(s) {clash}",
            code="unrecognized_graph",
            subject=clash[0],
        )
    for node in graph.node:
        for index, name in enumerate(node.input):
            node.input[index] = mapping.get(name, name)
        for index, name in enumerate(node.output):
            node.output[index] = mapping.get(name, name)
    for value in (*graph.input, *graph.output, *graph.value_info):
        value.name = mapping.get(value.name, value.name)


def _set_io(values: Sequence[onnx.ValueInfoProto], shapes: Mapping[str, list[int | str]]) -> None:
    for value in values:
        dims = shapes.get(value.name)
        if dims is None:
            continue
        shape = value.type.tensor_type.shape
        del shape.dim[:]
        for dim in dims:
            entry = shape.dim.add()
            if isinstance(dim, int):
                entry.dim_value = dim
            else:
                entry.dim_param = dim
