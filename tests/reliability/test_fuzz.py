"""Fuzzing the three parsers that take outside input: frames, manifests and pipeline files.

Each property feeds generated input (valid documents, mutated ones and noise) through the
code the runtime really runs and accepts nothing but the parser's typed error:

* frames: a controller's channel reads a worker's stream (handshake, messages, arrays out
  of inline and shared-memory buffers) -> :class:`ProtocolError` or :class:`ChannelClosed`;
  with :class:`FrameLimits` of 64 KiB it never allocates more than four times that plus
  128 KiB (traced by ``tracemalloc``), however large a length a frame declares;
* manifests: the contract's parser, the controller's bundle verification and the worker's
  re-verification -> :class:`ManifestError`, :class:`VerificationError`,
  :class:`WorkerError`; whatever is accepted stays inside the bundle;
* pipeline files -> :class:`ConfigError`, with allocation linear in the file's size (no
  alias expansion).

The default profile runs 100 examples per property; ``HYPOTHESIS_PROFILE=slow`` runs
100,000 (``make slow``). Each property records how many examples it ran.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import struct
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from runtime.artifacts import verify_bundle
from runtime.config import parse_pipeline
from runtime.contracts import BufferDescriptor, DType, FrameLimits, encode_frame
from runtime.contracts.codec import MAGIC
from runtime.contracts.manifest import ArtifactManifest, ManifestError
from runtime.contracts.messages import WORKER_TO_CONTROLLER, ResultMessage
from runtime.errors import ConfigError, VerificationError
from runtime.transport.channel import ChannelClosed, FramedChannel, ProtocolError
from runtime.transport.handshake import expect_hello
from runtime.transport.shm import new_prefix
from tests.reliability.conftest import PROFILE
from tests.reliability.support import record
from workers.errors import WorkerError
from workers.ort_session import load_verified_graph

PREFIX = struct.Struct("<4sIQ")
LIMITS = FrameLimits(max_header_bytes=4096, max_buffers=8, max_total_bytes=64 << 10)
#: What reading a fuzzed stream may allocate: a frame at the limit, the arrays copied out of
#: it, its parsed header and the parser's own objects; never what a prefix declares.
FRAME_ALLOWANCE = 4 * LIMITS.max_total_bytes + (128 << 10)
#: What verifying a bundle may allocate: the manifest limit plus one hashing chunk.
MANIFEST_ALLOWANCE = 8 << 20
#: Parsing is slow under tracing: one pipeline example in this many is traced.
CONFIG_TRACE_EVERY = 10
#: What parsing a pipeline may allocate per byte of YAML, plus a fixed part.
CONFIG_BYTES_FACTOR = 400
CONFIG_FIXED_ALLOWANCE = 4 << 20

FUZZ = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@dataclass
class Examples:
    """Counts the examples a property ran and tracks its peak allocation."""

    target: str
    count: int = 0
    traced: int = 0
    peak_bytes: int = 0

    def measure(self, every: int = 1) -> _Measure:
        """Count one example; trace its allocations when it is one in ``every``."""
        self.count += 1
        return _Measure(self, traced=self.count % every == 0)


class _Measure:
    def __init__(self, examples: Examples, *, traced: bool) -> None:
        self.examples = examples
        self.traced = traced
        self.bytes = 0

    def __enter__(self) -> _Measure:
        # Traced only here: tracing Hypothesis's own work would slow every example down.
        if self.traced:
            tracemalloc.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self.traced:
            return
        self.bytes = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        self.examples.peak_bytes = max(self.examples.peak_bytes, self.bytes)
        self.examples.traced += 1


@pytest.fixture
def examples(request: pytest.FixtureRequest) -> Iterator[Examples]:
    counter = Examples(request.node.name.removeprefix("test_"))
    try:
        yield counter
    finally:
        report = getattr(request.node, "rep_call", None)
        record(
            "fuzz",
            target=counter.target,
            examples=counter.count,
            traced_examples=counter.traced,
            profile=PROFILE,
            peak_allocation_bytes=counter.peak_bytes,
            passed=bool(report is not None and report.passed),
        )


# -- frames ------------------------------------------------------------------------------

#: Characters that matter to parsers (separators, escapes, NUL, non-ASCII), drawn cheaply.
text = st.text(st.sampled_from("ab_.-/\\:%é\x00\x7f\u2028\U0001f600 \"'{}[]"), max_size=8)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(text, children, max_size=4),
    max_leaves=4,
)
names = st.text("abcxyz_", min_size=1, max_size=4)
SHM_PREFIX = new_prefix(os.getpid(), 424242)


small_ints = st.integers(-1, 5)
tensor_wires = st.fixed_dictionaries(
    {
        "name": names,
        "dtype": st.sampled_from([d.value for d in DType]) | text,
        "shape": st.lists(st.integers(-1, 8) | names | st.none(), max_size=3),
    }
)
#: Bodies of each kind that are valid before the mutations drawn after them.
BODIES: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "hello": st.fixed_dictionaries(
        {
            "protocol_version": st.integers(0, 3),
            "required_features": st.lists(st.sampled_from(["cancel", "shm-buffers", "x"])),
            "offered_features": st.just(["cancel", "shm-buffers"]),
            "worker": st.just("ort"),
            "pid": st.integers(-1, 2**31),
            "create_time": st.floats(0, 2e9),
            "generation": st.integers(0, 3),
        }
    ),
    "ready": st.fixed_dictionaries(
        {
            "placement": st.dictionaries(
                st.sampled_from(["CPUExecutionProvider", "X"]), small_ints, max_size=2
            ),
            "total_nodes": small_ints,
            "placement_method": st.sampled_from(["assignment_info", "profile", "?"]),
            "inputs": st.lists(tensor_wires, max_size=2),
            "outputs": st.lists(tensor_wires, max_size=2),
            "load_s": st.just(0.1),
            "warmup_s": st.just(0.1),
            "rss_bytes": st.integers(-1, 2**40),
        }
    ),
    "result": st.fixed_dictionaries(
        {
            "call_id": small_ints,
            "request_id": names,
            "epoch": small_ints,
            "run_s": st.floats(-1, 10),
        }
    ),
    "error": st.fixed_dictionaries(
        {
            "call_id": st.none() | small_ints,
            "code": names,
            "message": text,
            "fatal": st.booleans(),
        }
    ),
    "ack": st.fixed_dictionaries({"owner": names, "generation": st.integers(-1, 2**64)}),
}
mutations = st.lists(
    st.tuples(
        st.sampled_from(["replace", "delete", "add"]),
        st.sampled_from(
            [
                "call_id",
                "epoch",
                "output_names",
                "generation",
                "owner",
                "pid",
                "placement",
                "total_nodes",
                "inputs",
                "outputs",
                "protocol_version",
                "fatal",
                "code",
            ]
        ),
        json_values,
    ),
    max_size=2,
)


dtypes = st.sampled_from(DType)
#: Payload bytes: their values never matter to the parser, only their count.
fills = st.sampled_from([b"\x00", b"\xff", b"\x01\x80"])
shapes = st.lists(st.integers(0, 6), max_size=3).map(tuple)
locations = st.one_of(
    st.none(),
    st.none(),
    st.text("0123456789abcdef", min_size=1, max_size=16).map(lambda tail: SHM_PREFIX + tail),
    st.sampled_from(["oe-1-1-deadbeef-00", "../../etc/passwd", "x", "oe-" + "a" * 250]),
)


@st.composite
def buffer_parts(draw: st.DrawFn) -> tuple[BufferDescriptor, bytes | None]:
    dtype, shape, location = draw(dtypes), draw(shapes), draw(locations)
    descriptor = BufferDescriptor.for_array(
        "ort-1", draw(small_ints.filter(lambda n: n >= 0)), dtype, shape, location
    )
    if location is not None:
        return descriptor, None
    return descriptor, (draw(fills) * descriptor.nbytes)[: descriptor.nbytes]


frame_kinds = st.sampled_from([*sorted(WORKER_TO_CONTROLLER), "call", "load", "?"])


@st.composite
def worker_frames(draw: st.DrawFn) -> bytes:
    kind = draw(frame_kinds)
    buffers = draw(st.lists(buffer_parts(), max_size=2))
    body = dict(draw(BODIES[kind])) if kind in BODIES else {}
    if kind == "result":
        body["output_names"] = [f"t{index}" for index in range(len(buffers))]
    for action, field, value in draw(mutations):
        if action == "delete":
            body.pop(field, None)
        else:
            body[field if action == "replace" else field + "_extra"] = value
    try:
        return encode_frame(kind, body, buffers)
    except ValueError:
        # A body the encoder refuses (not JSON compliant) cannot be sent; send noise instead.
        return draw(st.binary(max_size=64))


stream_edits = st.lists(
    st.tuples(
        st.sampled_from(["flip", "insert", "cut", "declare"]),
        st.integers(0, 1 << 16),
        st.binary(min_size=1, max_size=24),
        st.integers(0, 2**32 - 1),
        st.sampled_from([0, 1 << 20, 1 << 40, 2**64 - 1]) | st.integers(0, 2**64 - 1),
    ),
    max_size=3,
)


@st.composite
def worker_streams(draw: st.DrawFn) -> bytes:
    stream = bytearray(b"".join(draw(st.lists(worker_frames(), min_size=1, max_size=3))))
    for action, position, noise, header, payload in draw(stream_edits):
        at = position % (len(stream) + 1)
        if action == "flip" and stream:
            stream[at % len(stream)] = noise[0]
        elif action == "insert":
            stream[at:at] = noise
        elif action == "cut":
            del stream[at:]
        else:
            stream[at:at] = PREFIX.pack(MAGIC, header, payload)
    return bytes(stream)


@FUZZ
@given(stream=worker_streams() | st.binary(max_size=256))
@example(stream=PREFIX.pack(MAGIC, 32, 1 << 40) + bytes(64))
@example(stream=PREFIX.pack(MAGIC, 2**32 - 1, 0))
def test_frames(examples: Examples, stream: bytes) -> None:
    channel = FramedChannel(
        io.BytesIO(stream),
        io.BytesIO(),
        name="fuzz",
        limits=LIMITS,
        shm_prefix=SHM_PREFIX,
        same_domain=True,
    )
    with examples.measure() as measured:
        try:
            expect_hello(channel, expected_generation=1, expected_pid=None, timeout_s=1.0)
        except (ProtocolError, ChannelClosed):
            pass
        try:
            while True:
                message, frame = channel.read_message(WORKER_TO_CONTROLLER)
                if isinstance(message, ResultMessage):
                    channel.arrays_from_frame(frame, message.output_names)
        except (ProtocolError, ChannelClosed):
            pass
    assert measured.bytes <= FRAME_ALLOWANCE, (
        f"{measured.bytes} bytes for a {len(stream)}-byte stream"
    )


# -- manifests ---------------------------------------------------------------------------

REAL_FILES = ("add.onnx", "inputs.npz", "sub/inner.bin")
PATH_PARTS = (
    "add.onnx",
    "inputs.npz",
    "sub",
    "inner.bin",
    "escape",
    "inner-link",
    "dir-escape",
    "missing.bin",
    "ADD.onnx",
    "..",
    ".",
    "",
    "C:",
    "\\",
    "%2e%2e",
    "\uff41dd.onnx",
    "a\x01b",
    "manifest.json",
)


@dataclass(frozen=True)
class Bundle:
    root: Path
    hashes: dict[str, str]

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"


@pytest.fixture
def bundle(tmp_path: Path, demo_root: Path) -> Bundle:
    """The add bundle with a subfolder, symlinks inside and out, and a file outside."""
    root = tmp_path / "bundle"
    shutil.copytree(demo_root / "bundles" / "add", root)
    (root / "sub").mkdir()
    (root / "sub" / "inner.bin").write_bytes(b"inner")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.bin").write_bytes(b"outside the bundle")
    (root / "escape").symlink_to(outside / "secret.bin")
    (root / "dir-escape").symlink_to(outside, target_is_directory=True)
    (root / "inner-link").symlink_to(root / "add.onnx")
    hashes = {
        name: hashlib.sha256((root / name).read_bytes()).hexdigest()
        for name in (*REAL_FILES, "escape", "inner-link")
    }
    hashes["dir-escape/secret.bin"] = hashes["escape"]
    return Bundle(root, hashes)


paths = st.one_of(
    st.sampled_from(REAL_FILES),
    st.lists(st.sampled_from(PATH_PARTS), min_size=1, max_size=3).map("/".join),
    st.sampled_from(["/etc/passwd", "../outside/secret.bin", "dir-escape/secret.bin"]),
    st.text(max_size=8),
)


@st.composite
def manifests(draw: st.DrawFn, hashes: dict[str, str]) -> bytes:
    files: dict[str, Any] = {}
    for path in draw(st.lists(paths, max_size=5)):
        files[path] = draw(
            st.sampled_from([hashes.get(path, "0" * 64)])
            | st.text("0123456789abcdefABCDEF", min_size=63, max_size=65)
            | json_values
        )
    metadata: dict[str, Any] = {
        "graph_file": draw(st.sampled_from(["add.onnx", *files]) if files else paths),
        "example_inputs_file": draw(st.sampled_from(["inputs.npz", *files]) if files else paths),
        "checkpoint_revision": "r",
        "precision": "float32",
        "layout": "l",
        "exporter": "e",
        "calibration": draw(st.sampled_from(["none", {"record": 1}]) | json_values),
        "validation": "v",
    }
    for key in draw(st.lists(st.sampled_from(sorted(metadata)), max_size=2)):
        metadata[key] = draw(json_values)
    document: dict[str, Any] = {
        "schema_version": draw(st.sampled_from([1, 1, 1, 2, "1", True])),
        "component": draw(st.sampled_from(["add", ""]) | text),
        "files": files,
        "metadata": metadata,
    }
    for key in draw(st.lists(st.sampled_from([*document, "extra"]), max_size=1)):
        document[key] = draw(json_values)
    raw = bytearray(json.dumps(document).encode())
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(raw)))
        raw[at:at] = draw(st.sampled_from([b",", b"{", b'"', b"\xff", b'"files": {}, ', b"]"]))
    return bytes(raw)


def _contained(root: Path, name: str) -> bool:
    return (root / name).resolve().is_relative_to(root.resolve())


@FUZZ
@given(data=st.data())
def test_manifests(examples: Examples, bundle: Bundle, data: st.DataObject) -> None:
    raw = data.draw(manifests(bundle.hashes))
    bundle.manifest.write_bytes(raw)
    with examples.measure() as measured:
        try:
            parsed = ArtifactManifest.from_bytes(raw)
        except ManifestError:
            parsed = None
        if parsed is not None:
            for name in parsed.files:
                assert not name.startswith("/"), name
                assert ".." not in name.split("/"), name
        try:
            verified = verify_bundle(bundle.manifest)
        except VerificationError:
            verified = None
        if verified is not None:
            assert parsed is not None
            assert all(_contained(bundle.root, name) for name in verified.manifest.files)
            try:
                loaded = load_verified_graph(bundle.manifest, verified.identity)
            except WorkerError:
                pass
            else:
                assert loaded.manifest.identity == verified.identity
    assert measured.bytes <= MANIFEST_ALLOWANCE


# -- pipeline files ----------------------------------------------------------------------

#: libyaml's emitter when PyYAML has it: generating is not what is being tested.
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
CALLABLES = (
    "runtime.adapters.tensor:mlp_handoff",
    "runtime.adapters.tensor:missing",
    "runtime.adapters.absent_module:f",
    "not a callable",
    "tests.helpers.transforms:passthrough",
)
SIZES = ("64KiB", "1GiB", "-1", "1e999", "0x10", "999999999999TiB", "12 parsecs", "", "0")
YAML_TOKENS = (
    "&a ",
    "*a",
    "!!python/object:os.system ",
    "!!python/name:os.system ",
    "!!binary ",
    "!!set ",
    "!!omap ",
    "!!timestamp ",
    "!!float ",
    "!!str ",
    "? ",
    ": ",
    "- ",
    "{",
    "}",
    "[",
    "]",
    "'",
    '"',
    "\t",
    "\n",
    "#",
    "%YAML 1.1\n",
    "---\n",
    "...\n",
    "<<: ",
    "\ufeff",
    "\x00",
    "\\",
    "|\n",
    ">\n",
    "~",
    ".nan",
    "2001-13-99",
    "0o777",
    "1_000",
    ", ",
)


@pytest.fixture(scope="module")
def pipeline_documents(demo_root: Path) -> list[Any]:
    """The demo pipelines as plain data, their bundle paths made absolute."""
    documents = []
    for name in ("add.yaml", "mlp-chain.yaml"):
        text = (demo_root / "pipelines" / name).read_text()
        documents.append(yaml.safe_load(text.replace("../bundles/", f"{demo_root}/bundles/")))
    # The add pipeline driven by an adapter, so the free-form adapter options get fuzzed too.
    documents.append(
        {
            **documents[0],
            "adapter": {
                "name": "runtime.adapters.tensor:mlp_handoff",
                "options": {"voice": "joe", "schedule": [16, 32], "scales": "voice"},
            },
        }
    )
    return documents


values = st.one_of(
    json_values,
    st.sampled_from(SIZES),
    st.sampled_from(CALLABLES),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**80), 2**80),
    st.lists(st.sampled_from(["CPUExecutionProvider", "CUDAExecutionProvider", ""]), max_size=3),
)


def _paths_in(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(node, dict):
        for key, child in node.items():
            yield from _paths_in(child, (*prefix, key))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from _paths_in(child, (*prefix, index))


@st.composite
def pipeline_texts(draw: st.DrawFn, documents: list[Any]) -> str:
    document = json.loads(json.dumps(draw(st.sampled_from(documents))))
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(list(_paths_in(document))))
        if not path:
            continue
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "replace" or not isinstance(parent, dict):
            parent[path[-1]] = draw(values)
        else:
            parent[draw(text)] = draw(values)
    source = yaml.dump(document, Dumper=DUMPER, sort_keys=False, allow_unicode=True)
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(source)))
        source = source[:at] + draw(st.sampled_from(YAML_TOKENS)) + source[at:]
    if draw(st.integers(0, 49)) == 0:
        # Deeper nesting costs PyYAML quadratic time; the hostile cases below go past the limit.
        depth = draw(st.sampled_from([10, 50, 150]))
        source += f"\nextra: {'[' * depth}{']' * depth}\n"
    return source


RECURSIVE_OPTIONS = (
    "pipeline: p\nasync_chunk: false\nstages: []\n"
    "adapter:\n  name: runtime.adapters.tensor:mlp_handoff\n  options: &a {k: *a}\n"
)
TAGGED_OPTIONS = (
    "pipeline: p\nasync_chunk: false\nstages: []\n"
    "adapter:\n  name: runtime.adapters.tensor:mlp_handoff\n"
    "  options: {k: !!python/name:os.system }\n"
)
#: Tags forced on values they cannot read: PyYAML raises AttributeError, KeyError, IndexError.
TAGGED_SCALAR = "pipeline: p\ndescription: !!timestamp not a time\nasync_chunk: false\nstages: []\n"
TAGGED_OPTION_VALUES = (
    "pipeline: p\nasync_chunk: false\nstages: []\n"
    "adapter:\n  name: runtime.adapters.tensor:mlp_handoff\n"
    "  options: {a: !!timestamp x, b: !!bool maybe, c: !!int ''}\n"
)
#: Deeper than PyYAML's composer can recurse (about 500 levels).
DEEP = "pipeline: p\nasync_chunk: false\nstages: " + "[" * 600 + "]" * 600 + "\n"
#: Nine levels of nine aliases: 387 million leaves if anything expanded them.
BILLION_LAUGHS = (
    "pipeline: p\nasync_chunk: false\nstages: []\n"
    "adapter:\n  name: runtime.adapters.tensor:mlp_handoff\n  options:\n"
    "    l0: &l0 [x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"    l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]\n" for n in range(1, 9))
)


@FUZZ
@given(data=st.data())
def test_pipeline_files(
    examples: Examples, demo_root: Path, pipeline_documents: list[Any], data: st.DataObject
) -> None:
    source = data.draw(pipeline_texts(pipeline_documents))
    _parse_typed(examples, source, demo_root, every=CONFIG_TRACE_EVERY)


@pytest.mark.parametrize(
    "source",
    [RECURSIVE_OPTIONS, TAGGED_OPTIONS, TAGGED_SCALAR, TAGGED_OPTION_VALUES, DEEP, BILLION_LAUGHS],
    ids=[
        "recursive-options",
        "tagged-options",
        "tagged-scalar",
        "tagged-option-values",
        "deep-nesting",
        "billion-laughs",
    ],
)
def test_pipeline_files_hostile_yaml(demo_root: Path, source: str) -> None:
    _parse_typed(Examples("pipeline_files_hostile_yaml"), source, demo_root)


def _parse_typed(examples: Examples, source: str, base: Path, *, every: int = 1) -> None:
    with examples.measure(every) as measured:
        try:
            parse_pipeline(source, source="fuzz.yaml", base_dir=base)
        except ConfigError:
            pass
    allowance = CONFIG_FIXED_ALLOWANCE + CONFIG_BYTES_FACTOR * len(source.encode())
    assert measured.bytes <= allowance, f"{measured.bytes} bytes for {len(source)} characters"
