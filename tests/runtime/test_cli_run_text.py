"""``omni-edge run PIPELINE --text``: which pipelines take text, and a text run that speaks.

The refusals end before any stage starts. The runs use the speech demo (two ONNX Runtime
workers, no vLLM): its audio goes to ``DIR/<request>.wav``, or to an ALSA null device with
``--play``. The chat-to-speech run, whose text streams to stdout, is in
tests/runtime/vllm/test_chat_speak.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import soundfile

from runtime.cli import main
from runtime.errors import EXIT_OK, EXIT_USAGE
from runtime.run_command import _printable
from tests.helpers.voice import SPEAK_PIPELINE, assert_speech, export_once
from tests.runtime.audio.conftest import alsa_null

__all__ = ["alsa_null"]

REPO = Path(__file__).resolve().parents[2]
ADD = REPO / "assets" / "pipelines" / "add.yaml"
CHAT_SPEAK = REPO / "assets" / "pipelines" / "chat-speak.yaml"


@pytest.fixture
def fake_voice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data directory whose voice manifests exist (enough to parse chat-speak.yaml)."""
    for part in ("acoustic", "decoder"):
        manifest = tmp_path / "data" / "voices" / "joe" / part / "manifest.json"
        manifest.parent.mkdir(parents=True)
        manifest.write_text("{}", encoding="utf-8")
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


@pytest.fixture
def voice(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The session's exported voice as the user data directory; no saved device selection."""
    exported = export_once(tmp_path_factory)
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(exported.data_dir))
    monkeypatch.setenv("OMNI_EDGE_CONFIG_DIR", str(tmp_path_factory.mktemp("config")))
    return exported.data_dir


def test_text_for_a_tensor_pipeline_is_refused_before_anything_loads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", str(ADD), "--text", "Hello."]) == EXIT_USAGE
    error = capsys.readouterr().err
    assert "--text: pipeline demo_add takes tensors, not text" in error
    assert "--inputs X.npz" in error


@pytest.mark.usefixtures("fake_voice")
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ([], "pipeline chat-speak takes text; give it with --text"),
        (["--text", "Hi.", "--inputs", "x.npz"], "--inputs applies to tensor pipelines"),
        (["--text", "Hi.", "--expect", "x.npz"], "--expect applies to tensor pipelines"),
    ],
)
def test_a_text_pipeline_needs_text_and_only_text(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(CHAT_SPEAK), *arguments]) == EXIT_USAGE
    assert message in capsys.readouterr().err


@pytest.mark.usefixtures("fake_voice")
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read it"),
        ("{not json", "not JSON"),
        ('{"turns": []}', "unknown key 'turns'; accepted: 'messages'"),
        ("[]", "the messages are empty"),
        ('[{"role": "user", "content": 3}]', "messages[0].content is int; accepted: text"),
        ('{"messages": [{"role": "assistant", "content": "Hi."}]}', "is the assistant's"),
    ],
)
def test_a_bad_conversation_file_is_named_with_what_is_accepted(
    content: str | None, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "talk.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    assert main(["run", str(CHAT_SPEAK), "--chat", str(path)]) == EXIT_USAGE
    error = capsys.readouterr().err
    assert f"--chat {path}: " in error
    assert message in error


def test_a_conversation_is_for_text_pipelines_and_excludes_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "talk.json"
    path.write_text('[{"role": "user", "content": "Hi."}]', encoding="utf-8")
    assert main(["run", str(ADD), "--chat", str(path)]) == EXIT_USAGE
    assert "--chat: pipeline demo_add takes tensors, not text" in capsys.readouterr().err
    assert main(["run", str(ADD), "--chat", str(path), "--text", "Hi."]) == EXIT_USAGE
    assert "--text and --chat: give one request" in capsys.readouterr().err


def test_play_is_for_text_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(ADD), "--play"]) == EXIT_USAGE
    assert "--play applies to --text runs" in capsys.readouterr().err


@pytest.mark.usefixtures("fake_voice")
def test_out_must_be_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("x", encoding="utf-8")
    arguments = ["--text", "Hi.", "--out", str(tmp_path / "file")]
    assert main(["run", str(SPEAK_PIPELINE), *arguments]) == EXIT_USAGE
    assert "accepted: a folder" in capsys.readouterr().err


def test_model_text_cannot_drive_the_terminal() -> None:
    assert _printable("a\x1b[2Jb\nc\td\x07\x7f\u0085") == "a\ufffd[2Jb\nc\td\ufffd\ufffd\ufffd"


def test_a_speech_pipeline_run_with_text_writes_the_request_wav(
    voice: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    text = "The text goes in. The speech comes out!"
    assert main(["run", str(SPEAK_PIPELINE), "--text", text, "--out", str(out)]) == EXIT_OK
    captured = capsys.readouterr()
    assert captured.out == ""  # a voice streams no text
    (wav,) = out.glob("*.wav")
    request_id = wav.stem
    assert f"request {request_id}" in captured.err
    assert f"wrote {wav.name}, execution_plan.json, metrics.json in {out}" in captured.err
    audio, rate = soundfile.read(str(wav), dtype="float32")
    assert rate == 22050
    assert_speech(audio, rate)
    assert f"{audio.size / rate:.2f} s of audio" in captured.err
    assert not (out / f"{request_id}.txt").exists()
    plan = json.loads((out / "execution_plan.json").read_text(encoding="utf-8"))
    assert [stage["backend"] for stage in plan["stages"]] == ["external.graph.v1"] * 2
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    assert [request["request_id"] for request in metrics["requests"]] == [request_id]
    # Where the request's time went: every stage call, and the adapter's breakdown per step.
    (request,) = metrics["requests"]
    calls = request["stages"]
    program = request["program"]
    steps = program["steps"]
    # Calls of one stage run one at a time, so each stage's steps follow its calls in order.
    for stage, kind in (("stage-0", "acoustic"), ("stage-1", "decoder")):
        ours = [step["run_s"] for step in steps if step["stage"] == kind]
        engine = [call["run_s"] for call in calls if call["stage"] == stage]
        assert ours == pytest.approx(engine, abs=1e-5)
        assert ours
    timing = program["timing"]
    assert timing["acoustic_calls"] == 2
    assert timing["decoder_calls"] == program["chunks"] == len(steps) - 2
    assert timing["decoder_kept_frames"] * 256 == round(program["audio_seconds"] * 22050)
    for key in ("acoustic_run_s", "decoder_run_s", "decoder_transfer_s", "emit_s", "adapter_s"):
        assert 0 <= timing[key] < timing["wall_s"]


@pytest.mark.audio
@pytest.mark.usefixtures("voice")
def test_a_speech_pipeline_run_with_text_plays(
    alsa_null: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(SPEAK_PIPELINE), "--text", "Played, not kept.", "--play"]) == EXIT_OK
    error = capsys.readouterr().err
    assert " s of audio" in error
    assert "not kept" not in error
    assert not list(tmp_path.rglob("*.wav"))
