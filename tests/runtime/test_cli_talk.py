"""``omni-edge talk``: what it refuses before anything loads (a conversation itself runs in
tests/runtime/vllm/test_voice_chat.py and the voice benchmark)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from runtime.cli import main
from runtime.errors import EXIT_USAGE
from tests.runtime.audio.conftest import alsa_null, thread_baseline

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["alsa_null", "thread_baseline"]


def test_a_pipeline_that_is_not_a_conversation_is_refused(
    alsa_null: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from runtime.assets import demo_pipeline

    assert main(["talk", str(demo_pipeline("add"))]) == EXIT_USAGE
    error = capsys.readouterr().err
    assert "pipeline demo_add is a graph pipeline" in error
    assert "accepted: a voice-chat pipeline" in error


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--seconds", "0"], "--seconds 0.0: accepted: a positive number of seconds"),
        (["no/such/pipeline.yaml"], "no such pipeline file"),
    ],
)
def test_bad_arguments_name_what_is_accepted(
    alsa_null: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main(["talk", *extra]) == EXIT_USAGE
    assert message in capsys.readouterr().err


def test_an_unknown_echo_canceller_is_refused_by_the_parser(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["talk", "--echo", "magic"])
    assert caught.value.code == 2
    assert "invalid choice: 'magic'" in capsys.readouterr().err


def test_an_unknown_microphone_is_reported_before_anything_loads(
    alsa_null: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["talk", "--input-device", "no such microphone"])
    assert code != 0
    error = capsys.readouterr().err
    assert "no such microphone" in error
    assert "loading" not in error
