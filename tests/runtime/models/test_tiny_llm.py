"""The tiny model's cache logic, without torch (the build itself is covered by the vllm tests)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from runtime.models import tiny_llm
from runtime.models.tiny_llm import (
    MARKER_NAME,
    MODEL_VERSION,
    TinyModelError,
    corpus,
    default_tiny_model_dir,
    ensure_tiny_model,
    tiny_model_ready,
)


def _fake_model(directory: Path, *, version: int = MODEL_VERSION) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text('{"model_type": "llama"}')
    (directory / "model.safetensors").write_bytes(b"weights")
    files = {p.name: tiny_llm._sha256(p) for p in sorted(directory.iterdir())}
    marker = {"format": 1, "kind": "tiny-llama", "version": version, "files": files}
    (directory / MARKER_NAME).write_text(json.dumps(marker))
    return directory


def test_the_corpus_is_deterministic() -> None:
    first = corpus(200)
    assert first == corpus(200)
    assert first != corpus(200, seed=1)
    assert all(line[0].isupper() and line[-1] in ".?!" for line in first)


def test_a_complete_model_is_recognised_and_a_damaged_one_is_not(tmp_path: Path) -> None:
    model = _fake_model(tmp_path / "m")
    assert tiny_model_ready(model)
    (model / "model.safetensors").write_bytes(b"other weights")
    assert not tiny_model_ready(model)
    assert not tiny_model_ready(_fake_model(tmp_path / "old", version=MODEL_VERSION - 1))
    assert not tiny_model_ready(tmp_path / "absent")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / MARKER_NAME).write_text("not json")
    assert not tiny_model_ready(empty)


def test_a_ready_model_is_returned_without_running_anything(tmp_path: Path) -> None:
    model = _fake_model(tmp_path / "m")
    assert ensure_tiny_model(tmp_path / "no-such-python", out_dir=model) == model


def test_building_without_torch_fails_with_the_command_and_its_output(tmp_path: Path) -> None:
    target = tmp_path / "model"
    with pytest.raises(TinyModelError) as caught:
        ensure_tiny_model(Path(sys.executable), out_dir=target, timeout_s=120)
    text = str(caught.value)
    assert "runtime.models.tiny_llm --out" in text
    assert "No module named 'torch'" in text
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir()] == []


def test_a_missing_interpreter_is_named(tmp_path: Path) -> None:
    with pytest.raises(TinyModelError, match="cannot run"):
        ensure_tiny_model(tmp_path / "no-such-python", out_dir=tmp_path / "m")


def test_the_cache_lives_in_the_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(tmp_path))
    assert default_tiny_model_dir() == tmp_path / "models" / f"tiny-llama-v{MODEL_VERSION}"
