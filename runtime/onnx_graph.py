"""ONNX graphs read with ``onnx`` (without their external data), for making bundles: the
graph itself, every tensor it holds (initializers, sparse tensors, attribute tensors,
subgraphs, local functions) and the external-data files those tensors name.

``onnx`` takes seconds to import, so it is imported only when a graph is loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.errors import VerificationError

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

    import onnx

__all__ = ["external_locations", "load_graph", "model_tensors"]


def load_graph(graph_path: Path) -> onnx.ModelProto:
    """An ONNX file's graph (without its external data); VerificationError when it is none."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(graph_path), format="protobuf", load_external_data=False)
    except (OSError, DecodeError) as exc:
        raise VerificationError(
            f"{graph_path} cannot be read as an ONNX model ({exc}); accepted: an ONNX model file",
            code="bad_graph",
            subject=str(graph_path),
        ) from None
    if not isinstance(model, onnx.ModelProto) or not model.HasField("graph"):
        raise VerificationError(
            f"{graph_path} holds no ONNX graph; accepted: an ONNX model file",
            code="bad_graph",
            subject=str(graph_path),
        )
    return model


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    yield from _node_tensors(graph.node)


def _node_tensors(nodes: Sequence[onnx.NodeProto]) -> Iterator[onnx.TensorProto]:
    for node in nodes:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            for sparse in (
                *((attribute.sparse_tensor,) if attribute.HasField("sparse_tensor") else ()),
                *attribute.sparse_tensors,
            ):
                yield sparse.values
                yield sparse.indices
            if attribute.HasField("g"):
                yield from _graph_tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from _graph_tensors(subgraph)


def model_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        yield from _node_tensors(function.node)


def external_locations(model: onnx.ModelProto, graph_path: Path) -> tuple[str, ...]:
    """The distinct external-data locations ``model``'s tensors name, in order."""
    from onnx import external_data_helper

    seen: dict[str, None] = {}
    for tensor in model_tensors(model):
        if not external_data_helper.uses_external_data(tensor):
            continue
        try:
            location = str(external_data_helper.ExternalDataInfo(tensor).location)
        except ValueError as exc:
            raise VerificationError(
                f"{graph_path}: tensor {tensor.name!r} has malformed external data ({exc}); "
                "accepted: a location with non-negative offset and length",
                code="bad_graph",
                subject=tensor.name,
            ) from None
        seen.setdefault(location, None)
    return tuple(seen)
