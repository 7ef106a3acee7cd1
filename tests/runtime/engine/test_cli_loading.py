"""``omni-edge run`` says on stderr what it waits for while the stages load; stdout keeps the
streamed text and ``--json``."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from runtime.cli import main
from runtime.errors import EXIT_OK
from runtime.events import (
    LoadingStage,
    PipelineLoadFailed,
    PipelineLoading,
    PipelineReady,
    StageReady,
    StageStarting,
    StageWorkerUp,
)
from runtime.records import ExecutionPlan, StageRecord
from runtime.run_command import LoadReporter
from tests.helpers.voice import SPEAK_PIPELINE, export_once


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("omni-edge: ")]


def test_run_json_keeps_stdout_for_json_and_says_what_loads_on_stderr(
    demo_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("OMNI_EDGE_CONFIG_DIR", str(tmp_path / "config"))
    assert main(["run", str(demo_root / "pipelines" / "add.yaml"), "--json"]) == EXIT_OK
    captured = capsys.readouterr()
    summary = json.loads(captured.out)  # nothing but the JSON document
    assert summary["pipeline"] == "demo_add"
    lines = _lines(captured.err)
    assert lines[0] == "omni-edge: loading 1 stage(s): stage-0 · add (graph worker)"
    assert lines[1].startswith("omni-edge: loading: stage-0 · add (graph worker): ready ")
    assert lines[2].startswith("omni-edge: 1 stage(s) loaded in ")


@pytest.mark.model
def test_run_text_streams_stdout_and_reports_the_load_on_stderr(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    exported = export_once(tmp_path_factory)
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(exported.data_dir))
    monkeypatch.setenv("OMNI_EDGE_CONFIG_DIR", str(tmp_path / "config"))
    out = tmp_path / "out"
    arguments = ["run", str(SPEAK_PIPELINE), "--text", "Loading, then speaking.", "--out", str(out)]
    assert main(arguments) == EXIT_OK
    captured = capsys.readouterr()
    assert captured.out == ""  # a voice streams no text; the loading lines are not stdout's
    lines = _lines(captured.err)
    assert lines[0].startswith("omni-edge: loading 2 stage(s): ")
    assert "(graph worker)" in lines[0]
    ready = [line for line in lines if " ready " in line and line.startswith("omni-edge: loading:")]
    assert len(ready) == 2
    assert any(line.startswith("omni-edge: 2 stage(s) loaded in ") for line in lines)
    loaded = next(i for i, line in enumerate(lines) if "stage(s) loaded in" in line)
    assert any(line.startswith("omni-edge: request ") for line in lines[loaded:])


def test_the_reporter_names_the_stages_still_loading_and_their_seconds() -> None:
    written: list[str] = []
    ticked = threading.Event()

    def write(line: str) -> None:
        written.append(line)
        if line.startswith("loading: assistant"):
            ticked.set()

    reporter = LoadReporter(write, tick_s=0.01)
    try:
        stages = (LoadingStage("assistant", "vLLM worker"), LoadingStage("voice", "graph worker"))
        reporter(PipelineLoading(pipeline="chat-speak", stages=stages, at=0.0))
        reporter(StageStarting(stage="assistant", route="local-vllm", at=0.0))
        reporter(StageStarting(stage="voice", route="cpu", at=0.0))
        reporter(StageWorkerUp(stage="voice", pid=1, at=0.1))
        reporter(
            StageReady(stage="voice", record=StageRecord("voice", "graph"), elapsed_s=0.4, at=0.4)
        )
        # The ticker names what is still loading, with the seconds since the load began.
        assert ticked.wait(30)
        reporter(PipelineReady(pipeline="chat-speak", execution_plan=ExecutionPlan("chat-speak")))
    finally:
        reporter.close()
    assert written[0] == "loading 2 stage(s): assistant (vLLM worker), voice (graph worker)"
    assert written[1] == "loading: voice (graph worker): ready 0.4 s"
    tick = next(line for line in written if line.startswith("loading: assistant"))
    assert tick.startswith("loading: assistant (vLLM worker) starting worker… ")
    assert tick.endswith(" s")
    assert written[-1].startswith("2 stage(s) loaded in ")


def test_the_reporter_stops_ticking_when_the_load_fails() -> None:
    written: list[str] = []
    reporter = LoadReporter(written.append, tick_s=3600)
    stages = (LoadingStage("assistant", "vLLM worker"),)
    reporter(PipelineLoading(pipeline="chat", stages=stages))
    reporter(PipelineLoadFailed(pipeline="chat", message="refused"))
    reporter.close()  # returns at once: the failure ended the ticker
    assert written == ["loading 1 stage(s): assistant (vLLM worker)"]
