"""Tensor specs and input buckets: what a graph accepts, how it is warmed up, and the check
that refuses a call whose inputs are not one of its buckets.

This module imports only the standard library, NumPy, ONNX Runtime, ``runtime.contracts``
and ``workers`` (errors, devices), so that it runs in a minimal worker environment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from runtime.contracts.buffers import DescriptorError, DType
from runtime.contracts.messages import TensorSpec
from workers.errors import WorkerError
from workers.ort_devices import ORT_EXTENSION_ERRORS

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    import onnxruntime as ort

    from runtime.contracts.manifest import ArtifactManifest

__all__ = [
    "MAX_BUCKETS",
    "Bucket",
    "SizedAxis",
    "bucket_inputs",
    "bucket_shapes",
    "check_call_inputs",
    "describe_spec",
    "dtype_of",
    "sized_axis",
    "spec_nbytes",
    "spec_of",
    "warm_up",
    "warm_up_buckets",
]

#: Most input buckets a bundle may list in ``metadata.buckets`` (each is warmed up at load).
MAX_BUCKETS: Final = 16
#: The NumPy dtype of each wire dtype's name (comparing dtypes costs less than their names).
_NUMPY_DTYPES: Final = {dtype.value: np.dtype(dtype.value) for dtype in DType}


def spec_of(name: str, array: np.ndarray) -> TensorSpec:
    """The wire description of an array: name, dtype and exact shape."""
    return TensorSpec(name, dtype_of(array), tuple(int(dim) for dim in array.shape))


def spec_nbytes(spec: TensorSpec) -> int:
    """Bytes of a tensor with a fixed shape (every dimension an integer)."""
    return math.prod(_fixed_dims(spec)) * spec.dtype.itemsize


def describe_spec(spec: TensorSpec) -> str:
    """``float32[1, 1024]``: how errors show what a tensor is or must be."""
    return f"{spec.dtype.value}{list(spec.shape)}"


def _fixed_dims(spec: TensorSpec) -> tuple[int, ...]:
    dims = tuple(dim for dim in spec.shape if isinstance(dim, int))
    if len(dims) != len(spec.shape):
        raise ValueError(f"tensor {spec.name!r} has no fixed shape: {list(spec.shape)}")
    return dims


def dtype_of(array: np.ndarray) -> DType:
    """The wire dtype of an array; ValueError naming it when the wire has none."""
    try:
        return DType.parse(array.dtype.name)
    except DescriptorError as exc:
        raise ValueError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class SizedAxis:
    """One axis a bundle lets calls size freely (``metadata.sized_axis``), between its
    smallest and largest warmed-up bucket. ``inputs`` names each input's axis (all the same
    length in a call); ``outputs`` gives each output dimension that follows it as
    ``(axis, scale, offset)``: ``size * scale + offset``, measured on the buckets at load."""

    inputs: Mapping[str, int]
    low: int
    high: int
    outputs: Mapping[str, tuple[int, int, int]]

    def bucket_for(self, arrays: Mapping[str, np.ndarray], like: Bucket) -> Bucket | None:
        """The bucket of ``arrays`` when they differ from ``like`` only along this axis, within
        its range; None otherwise."""
        size: int | None = None
        inputs: list[TensorSpec] = []
        for spec in like.inputs:
            array = arrays.get(spec.name)
            if array is None or array.dtype != _NUMPY_DTYPES[spec.dtype.value]:
                return None
            shape = tuple(int(dim) for dim in array.shape)
            axis = self.inputs.get(spec.name)
            if len(shape) != len(spec.shape):
                return None
            for index, (given, fixed) in enumerate(zip(shape, spec.shape, strict=True)):
                if index == axis:
                    if size is None:
                        size = given
                    elif given != size:
                        return None
                elif given != fixed:
                    return None
            inputs.append(TensorSpec(spec.name, spec.dtype, shape))
        if size is None or len(arrays) != len(like.inputs) or not self.low <= size <= self.high:
            return None
        outputs = []
        for spec in like.outputs:
            dims = list(_fixed_dims(spec))
            rule = self.outputs.get(spec.name)
            if rule is not None:
                axis, scale, offset = rule
                dims[axis] = size * scale + offset
            outputs.append(TensorSpec(spec.name, spec.dtype, tuple(dims)))
        return Bucket(tuple(inputs), tuple(outputs))


@dataclass(frozen=True, slots=True)
class Bucket:
    """The fixed input bucket (from the example inputs) and the outputs it produces.

    ``sized`` (on one bucket of a bundle that declares ``metadata.sized_axis``) also accepts
    inputs of any length along that axis within its range (see :class:`SizedAxis`)."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    sized: SizedAxis | None = None

    def __post_init__(self) -> None:
        for spec in (*self.inputs, *self.outputs):
            _fixed_dims(spec)

    @property
    def input_nbytes(self) -> int:
        return sum(spec_nbytes(spec) for spec in self.inputs)

    @property
    def output_nbytes(self) -> int:
        return sum(spec_nbytes(spec) for spec in self.outputs)

    @property
    def io_nbytes(self) -> int:
        return self.input_nbytes + self.output_nbytes

    def to_json(self) -> dict[str, Any]:
        return {
            "inputs": [spec.to_wire() for spec in self.inputs],
            "outputs": [spec.to_wire() for spec in self.outputs],
        }


def warm_up(session: ort.InferenceSession, example_inputs: Mapping[str, np.ndarray]) -> Bucket:
    """Run the example inputs once; return the bucket they define and the outputs it yields."""
    declared = [value.name for value in session.get_inputs()]
    missing = [name for name in declared if name not in example_inputs]
    unknown = [name for name in example_inputs if name not in declared]
    if missing or unknown:
        raise WorkerError(
            "bad_example_inputs",
            f"example inputs {sorted(example_inputs)} do not match the graph inputs {declared}"
            f" (missing {missing}, not graph inputs {unknown}); accepted: exactly one array "
            "per graph input",
            subject=(missing or unknown)[0],
        )
    try:
        results = session.run(None, dict(example_inputs))
    except ORT_EXTENSION_ERRORS as exc:
        raise WorkerError(
            "warmup_failed", f"the warm-up call with the example inputs failed: {exc}"
        ) from None
    outputs: list[TensorSpec] = []
    for value, result in zip(session.get_outputs(), results, strict=True):
        array = np.asarray(result)
        try:
            outputs.append(spec_of(value.name, array))
        except ValueError as exc:
            raise WorkerError(
                "warmup_failed", f"output {value.name!r}: {exc}", subject=value.name
            ) from None
    inputs = tuple(spec_of(name, example_inputs[name]) for name in declared)
    return Bucket(inputs=inputs, outputs=tuple(outputs))


def bucket_shapes(
    manifest: ArtifactManifest, example_inputs: Mapping[str, np.ndarray]
) -> tuple[dict[str, tuple[int, ...]], ...]:
    """The input buckets a bundle accepts: the example inputs' shapes first, then any other
    ``metadata.buckets`` entry (a list of ``{input name: shape}`` objects naming every example
    input, with the same ranks, and including the example's own shapes)."""
    example = {name: tuple(int(d) for d in array.shape) for name, array in example_inputs.items()}
    raw = manifest.metadata.get("buckets")
    if raw is None:
        return (example,)
    accepted = (
        f"a list of 1 to {MAX_BUCKETS} objects, each giving every input "
        f"{sorted(example)} a shape of positive integers of the example's rank, one of them "
        f"the example inputs' shapes {_shapes_text(example)}"
    )

    def refuse(detail: str) -> WorkerError:
        return WorkerError(
            "bad_manifest",
            f"metadata.buckets {detail}; accepted: {accepted}",
            subject="metadata.buckets",
        )

    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_BUCKETS:
        size = f"a list of {len(raw)}" if isinstance(raw, list) else type(raw).__name__
        raise refuse(f"is {size}")
    shapes: list[dict[str, tuple[int, ...]]] = []
    for position, entry in enumerate(raw):
        if not isinstance(entry, dict) or set(entry) != set(example):
            names = sorted(entry) if isinstance(entry, dict) else entry
            raise refuse(f"entry {position} names {names!r}")
        shape: dict[str, tuple[int, ...]] = {}
        for name, dims in entry.items():
            if (
                not isinstance(dims, list)
                or len(dims) != len(example[name])
                or not all(type(d) is int and d > 0 for d in dims)
            ):
                raise refuse(f"entry {position} gives {name!r} the shape {dims!r}")
            shape[name] = tuple(dims)
        if shape in shapes:
            raise refuse(f"entry {position} repeats {_shapes_text(shape)}")
        shapes.append(shape)
    if example not in shapes:
        raise refuse(f"does not list the example inputs' shapes {_shapes_text(example)}")
    return (example, *(shape for shape in shapes if shape != example))


def sized_axis(manifest: ArtifactManifest, buckets: Sequence[Bucket]) -> SizedAxis | None:
    """The bundle's ``metadata.sized_axis`` (``{"inputs": {name: axis}}``), with its range and
    output rule measured on the warmed-up ``buckets``; None when the bundle declares none.

    Every bucket must differ from the others only along the named axes, and every output
    dimension that changes must follow the axis's length as ``size * scale + offset``
    (integers) on every bucket; otherwise the bundle is refused (``bad_manifest``)."""
    raw = manifest.metadata.get("sized_axis")
    if raw is None:
        return None
    accepted = (
        '{"inputs": {input name: axis}} naming graph inputs, with at least two buckets that '
        "differ only along those axes and outputs that follow them linearly"
    )

    def refuse(detail: str) -> WorkerError:
        return WorkerError(
            "bad_manifest",
            f"metadata.sized_axis {detail}; accepted: {accepted}",
            subject="metadata.sized_axis",
        )

    names = {spec.name: len(spec.shape) for spec in buckets[0].inputs}
    axes = raw.get("inputs") if isinstance(raw, dict) and set(raw) == {"inputs"} else None
    if (
        not isinstance(axes, dict)
        or not axes
        or not all(
            name in names and type(axis) is int and 0 <= axis < names[name]
            for name, axis in axes.items()
        )
    ):
        raise refuse(f"is {raw!r}")
    sizes: list[int] = []
    for bucket in buckets:
        lengths = {
            _fixed_dims(spec)[axes[spec.name]] for spec in bucket.inputs if spec.name in axes
        }
        if len(lengths) != 1:
            raise refuse(f"names axes of different lengths in bucket {bucket.to_json()}")
        sizes.append(next(iter(lengths)))
    if len(set(sizes)) < 2:
        raise refuse(f"has buckets of one length only ({sizes})")
    order = sorted(range(len(buckets)), key=lambda i: sizes[i])
    first, second = order[0], order[1]
    rules: dict[str, tuple[int, int, int]] = {}
    for position, spec in enumerate(buckets[first].outputs):
        others = _fixed_dims(buckets[second].outputs[position])
        for axis, dim in enumerate(_fixed_dims(spec)):
            if others[axis] == dim:
                continue
            scale, rest = divmod(others[axis] - dim, sizes[second] - sizes[first])
            if rest or spec.name in rules:
                raise refuse(f"output {spec.name!r} does not follow the axis linearly")
            rules[spec.name] = (axis, scale, dim - sizes[first] * scale)
    for bucket, size in zip(buckets, sizes, strict=True):
        for spec in bucket.outputs:
            rule = rules.get(spec.name)
            if rule is not None and _fixed_dims(spec)[rule[0]] != size * rule[1] + rule[2]:
                raise refuse(f"output {spec.name!r} does not follow the axis linearly")
    return SizedAxis(MappingProxyType(dict(axes)), min(sizes), max(sizes), MappingProxyType(rules))


def _shapes_text(shapes: Mapping[str, tuple[int, ...]]) -> str:
    return "{" + ", ".join(f"{name}: {list(dims)}" for name, dims in shapes.items()) + "}"


def bucket_inputs(
    example_inputs: Mapping[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, np.ndarray]:
    """Warm-up inputs of another bucket: each example array zero-padded (or cut) to its shape."""
    out: dict[str, np.ndarray] = {}
    for name, array in example_inputs.items():
        target = shapes[name]
        resized = np.zeros(target, dtype=array.dtype)
        overlap = tuple(slice(0, min(a, b)) for a, b in zip(array.shape, target, strict=True))
        resized[overlap] = array[overlap]
        out[name] = resized
    return out


def warm_up_buckets(
    session: ort.InferenceSession,
    example_inputs: Mapping[str, np.ndarray],
    shapes: Sequence[Mapping[str, tuple[int, ...]]],
) -> tuple[Bucket, ...]:
    """Warm up every bucket (see :func:`bucket_inputs`); the example's bucket comes first."""
    return tuple(
        warm_up(session, example_inputs if index == 0 else bucket_inputs(example_inputs, shape))
        for index, shape in enumerate(shapes)
    )


def _matching_bucket(arrays: Mapping[str, np.ndarray], buckets: Sequence[Bucket]) -> Bucket | None:
    for bucket in buckets:
        if all(
            spec.name in arrays and tuple(arrays[spec.name].shape) == spec.shape
            for spec in bucket.inputs
        ):
            return bucket
    return None


def check_call_inputs(
    arrays: Mapping[str, np.ndarray], bucket: Bucket | Sequence[Bucket], max_io_bytes: int
) -> Bucket:
    """Refuse a call unless its inputs are exactly one bucket and inputs + outputs fit.

    Returns the bucket the inputs match.
    """
    buckets = (bucket,) if isinstance(bucket, Bucket) else tuple(bucket)
    for candidate in buckets:
        # The common case, without building any message: the inputs are exactly one bucket.
        if len(arrays) == len(candidate.inputs) and all(
            (array := arrays.get(spec.name)) is not None
            and array.shape == spec.shape
            and array.dtype == _NUMPY_DTYPES[spec.dtype.value]
            for spec in candidate.inputs
        ):
            total = sum(int(arrays[spec.name].nbytes) for spec in candidate.inputs)
            if total + candidate.output_nbytes <= max_io_bytes:
                return candidate
            break
    for candidate in buckets:
        if candidate.sized is not None:
            sized = candidate.sized.bucket_for(arrays, candidate)
            if sized is not None:
                total = sum(int(arrays[spec.name].nbytes) for spec in sized.inputs)
                if total + sized.output_nbytes <= max_io_bytes:
                    return sized
    matched = _matching_bucket(arrays, buckets) if len(buckets) > 1 else None
    bucket = buckets[0] if matched is None else matched
    expected = {spec.name: spec for spec in bucket.inputs}
    accepted = " | ".join(
        ", ".join(f"{spec.name}: {describe_spec(spec)}" for spec in one.inputs) for one in buckets
    )
    unknown = [name for name in arrays if name not in expected]
    if unknown:
        raise WorkerError(
            "bad_input",
            f"input {unknown[0]!r} is not an input of this graph; accepted: {accepted}",
            subject=unknown[0],
        )
    missing = [name for name in expected if name not in arrays]
    if missing:
        raise WorkerError(
            "bad_input",
            f"input {missing[0]!r} is missing (given: {sorted(arrays)}); accepted: {accepted}",
            subject=missing[0],
        )
    for name, spec in expected.items():
        array = arrays[name]
        given = f"{array.dtype.name}{list(array.shape)}"
        if array.dtype.name != spec.dtype.value:
            raise WorkerError(
                "bad_input",
                f"input {name!r} has dtype {array.dtype.name} ({given}); accepted: "
                f"{spec.dtype.value} ({describe_spec(spec)})",
                subject=name,
            )
        if tuple(array.shape) != spec.shape:
            wanted = (
                f"exactly {list(spec.shape)}, the fixed bucket"
                if len(buckets) == 1
                else f"one of the fixed buckets ({accepted})"
            )
            rule = next((one.sized for one in buckets if one.sized is not None), None)
            if rule is not None:
                axes = ", ".join(f"{name} axis {axis}" for name, axis in rule.inputs.items())
                wanted += f", or any length from {rule.low} to {rule.high} along {axes}"
            raise WorkerError(
                "bad_input",
                f"input {name!r} has shape {list(array.shape)} ({given}); accepted: {wanted}",
                subject=name,
            )
    total = sum(int(arrays[name].nbytes) for name in expected) + bucket.output_nbytes
    if total > max_io_bytes:
        sizes = ", ".join(f"{name} {int(arrays[name].nbytes)}" for name in expected)
        raise WorkerError(
            "too_large",
            f"inputs ({sizes} bytes) plus outputs ({bucket.output_nbytes} bytes) are {total} "
            f"bytes; accepted: at most max_io_bytes = {max_io_bytes}",
            subject=bucket.inputs[0].name,
        )
    return bucket
