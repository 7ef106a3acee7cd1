"""Streaming audio through the session: PCM fed as it comes to the voice activity adapter
(each chunk scored on arrival) and to the transcription adapter (features on arrival, the
transcript at end of input), each equal to the one-shot request."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import yaml

from runtime.adapters.transcribe_live import LiveTranscribeOptionsError
from runtime.adapters.vad import SpeechStarted, event_from_outputs
from runtime.adapters.vad_bundle import ensure_vad_bundle
from runtime.adapters.whisper import AudioInputError
from runtime.adapters.whisper_export import export_missing_recognisers, spoken_clips
from runtime.api import PipelineSession
from runtime.devices import DeviceSelection, discover_topology
from runtime.errors import RequestCancelled, UsageError
from tests.runtime.engine.support import wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator

    from runtime.api import RequestHandle

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parents[2]
TRANSCRIBE = REPO / "assets" / "pipelines" / "transcribe.yaml"
VAD = REPO / "tests" / "runtime" / "adapters" / "vad_pipeline.yaml"
RATE = 16_000
#: 32 ms at 16 kHz, as a microphone delivers it.
FRAME = 512
SENTENCE = "The meeting moved from Tuesday at nine to Thursday at half past two."


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A data folder holding the recogniser and the voice activity bundle."""
    root = tmp_path_factory.mktemp("audio-data")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMNI_EDGE_DATA_DIR", str(root))
        export_missing_recognisers(TRANSCRIBE, lambda line: None)
        ensure_vad_bundle(root / "vad" / "silero")
        yield root


@pytest.fixture(scope="module")
def clip() -> np.ndarray:
    """Half a second of silence, the sentence spoken by the bundled voice, a second of it."""
    (speech,) = spoken_clips([SENTENCE])
    return np.concatenate(
        (np.zeros(RATE // 2, np.float32), speech, np.zeros(RATE, np.float32))
    ).astype(np.float32)


@pytest.fixture
def options() -> dict[str, Any]:
    return {"topology": discover_topology(), "selection": DeviceSelection()}


def _frames(audio: np.ndarray) -> list[np.ndarray]:
    return [audio[begin : begin + FRAME] for begin in range(0, audio.size, FRAME)]


def _transcript(handle: RequestHandle) -> tuple[str, list[int]]:
    tokens: list[int] = []
    text = None
    for output in handle:
        if output.finished:
            text = output.text
        else:
            tokens.extend(int(token) for token in output.outputs["tokens"])
    assert text is not None
    return text, tokens


def test_transcription_fed_frame_by_frame_equals_the_one_shot_request(
    data_dir: Path, clip: np.ndarray, options: dict[str, Any]
) -> None:
    with PipelineSession(TRANSCRIBE, **options) as session:
        assert session.kind == "transcribe"
        assert session.streams_input
        one_shot = _transcript(session.submit({"audio": clip, "sample_rate": RATE}))
        assert "Tuesday" in one_shot[0]

        handle = session.submit(streaming=True)
        for frame in _frames(clip):
            handle.feed(frame)
        handle.end_input()
        assert _transcript(handle) == one_shot

        # int16 PCM in the documented mapping is the same audio, scaled.
        handle = session.submit(streaming=True)
        pcm = np.round(clip * 32767).astype(np.int16)
        handle.feed({"audio": pcm, "sample_rate": RATE})
        handle.end_input()
        assert "Tuesday" in _transcript(handle)[0]


def test_transcription_stream_errors_and_cancel(
    data_dir: Path, clip: np.ndarray, options: dict[str, Any]
) -> None:
    with PipelineSession(TRANSCRIBE, **options) as session:
        handle = session.submit(streaming=True)
        with pytest.raises(AudioInputError, match="a chunk at 44100 Hz; accepted: 16000 Hz"):
            handle.feed({"audio": clip, "sample_rate": 44100})
        with pytest.raises(AudioInputError, match=r"a chunk with keys \['pcm'\]"):
            handle.feed({"pcm": clip})
        with pytest.raises(AudioInputError, match="dtype <U1"):
            handle.feed(np.array(["a"]))
        handle.end_input()
        with pytest.raises(AudioInputError, match="ended with no audio"):
            handle.next(30)
        wait_until(lambda: len(session.metrics().requests) == 1, "the failed request")

        # Cancelled mid-input: the request ends cancelled; the stages take the next one.
        handle = session.submit(streaming=True)
        for frame in _frames(clip)[:20]:
            handle.feed(frame)
        assert handle.cancel()
        with pytest.raises(RequestCancelled):
            handle.next(30)
        assert session.usable
        assert session.metrics().requests[-1].status == "cancelled"


def test_voice_activity_scores_each_fed_chunk_as_it_arrives(
    data_dir: Path, clip: np.ndarray, options: dict[str, Any]
) -> None:
    def events(handle: RequestHandle) -> list[tuple[type, float]]:
        found = []
        for output in handle:
            event = event_from_outputs(output.outputs)
            if event is not None:
                found.append((type(event), event.t))
        return found

    with PipelineSession(VAD, **options) as session:
        assert session.kind == "vad"
        whole = events(session.submit({"audio": clip, "sample_rate": RATE}))
        assert len(whole) == 2

        handle = session.submit(streaming=True)
        frames = _frames(clip)
        # The start of speech comes out while input is still being fed.
        for frame in frames[: int(1.5 * RATE) // FRAME]:
            handle.feed(frame)
        first = handle.next(30)
        assert first is not None
        started = event_from_outputs(first.outputs)
        assert isinstance(started, SpeechStarted)
        handle.acknowledge(first)
        for frame in frames[int(1.5 * RATE) // FRAME :]:
            handle.feed(frame)
        handle.end_input()
        assert [(SpeechStarted, started.t), *events(handle)] == whole

        handle = session.submit(streaming=True)
        with pytest.raises(UsageError, match="a chunk of dtype int16"):
            handle.feed(np.zeros(FRAME, np.int16))
        handle.close(wait=True)


LIVE = REPO / "tests" / "runtime" / "adapters" / "transcribe_live_pipeline.yaml"
SECOND = "Why would anyone leave the oven on overnight?"


def test_live_transcription_transcribes_each_segment_as_it_ends(
    data_dir: Path, clip: np.ndarray, options: dict[str, Any]
) -> None:
    (second,) = spoken_clips([SECOND])
    audio = np.concatenate((clip, second, np.zeros(RATE, np.float32))).astype(np.float32)
    with PipelineSession(LIVE, **options) as session:
        assert (session.kind, session.input_kind) == ("transcribe-live", "audio")
        assert session.streams_input
        handle = session.submit(streaming=True)
        frames = _frames(audio)
        # Feed up to a second after the first sentence: its text comes out before the rest.
        first_part = (clip.size + RATE // 2) // FRAME
        for frame in frames[:first_part]:
            handle.feed(frame)
        first = handle.next(60)
        assert first is not None
        assert not first.finished
        assert "Tuesday" in str(first.text)
        assert float(first.outputs["start_s"]) >= 0.1
        handle.acknowledge(first)
        for frame in frames[first_part:]:
            handle.feed(frame)
        handle.end_input()
        rest = []
        final = None
        for output in handle:
            if output.finished:
                final = (output.text, dict(output.metrics))
            else:
                rest.append(output.text)
        assert final is not None
        text, metrics = final
        assert "oven" in str(text)
        assert "Tuesday" in str(text)
        assert len(metrics["speech"]) == 2
        assert metrics["audio_seconds"] == pytest.approx(audio.size / RATE)
        # The second sentence's segment is timed in the whole stream, after the first.
        assert metrics["segments"][-1]["start"] > clip.size / RATE - 0.5

        # A clip runs the same way in one request.
        outputs = list(session.submit({"audio": audio, "sample_rate": RATE}))
        assert outputs[-1].text == text


def test_live_transcription_options_and_stages_are_checked(data_dir: Path, tmp_path: Path) -> None:
    document = yaml.safe_load(LIVE.read_text(encoding="utf-8"))
    document["adapter"]["options"]["beam"] = 5
    bad = tmp_path / "options.yaml"
    bad.write_text(yaml.safe_dump(document), encoding="utf-8")
    with pytest.raises(LiveTranscribeOptionsError, match="unknown option 'beam'; accepted: "):
        PipelineSession(bad)

    document = yaml.safe_load(TRANSCRIBE.read_text(encoding="utf-8"))
    document["adapter"] = {"name": "runtime.adapters.transcribe_live:LiveTranscribeAdapter"}
    two = tmp_path / "two.yaml"
    two.write_text(yaml.safe_dump(document), encoding="utf-8")
    with pytest.raises(LiveTranscribeOptionsError, match="drives three graph stages"):
        PipelineSession(two)
