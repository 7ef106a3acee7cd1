"""Voice activity: the Silero bundle, the detector's rules on the voice joe's speech, the stage in
a real ONNX Runtime worker against a NumPy re-implementation of the package's own wrapper, and
the state carried from call to call."""

from __future__ import annotations

import importlib.metadata
import os
import textwrap
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort
import psutil
import pytest
import soxr
from piper import SynthesisConfig

from runtime.adapters import vad_bundle
from runtime.adapters.vad import (
    SpeechDetector,
    SpeechEnded,
    SpeechStarted,
    VadAdapter,
    VadOptionsError,
    VadSettings,
    VadStream,
    event_from_outputs,
    to_mono_16k,
)
from runtime.adapters.vad_bundle import (
    VadModelMissing,
    ensure_vad_bundle,
    find_vad_model,
    initial_state,
    model_inputs,
)
from runtime.api import Omni
from runtime.config import load_pipeline
from runtime.errors import ConfigError, UsageError
from tests.runtime.engine.support import process_gone, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from pathlib import Path

    from piper import PiperVoice

    from runtime.adapters.vad import VadEvent

pytestmark = pytest.mark.model

RATE = 16000
VOICE_RATE = 22050
PIPELINE = os.path.join(os.path.dirname(__file__), "vad_pipeline.yaml")
#: Speech starts within this of where the voice's sound starts (chunks are 32 ms).
START_TOLERANCE_S = 0.1
#: Speech ends within this of where its sound ends: the model's release lags by a few chunks.
END_TOLERANCE_S = 0.2
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Seven hundred and twelve people visited Oslo on Tuesday.",
    "Please call me back when you arrive.",
)


# -- clips spoken by the voice ----------------------------------------------------------------


def speech(voice: PiperVoice, text: str) -> np.ndarray:
    """The voice joe saying ``text`` (deterministic), at 16 kHz, trimmed to its sound."""
    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    audio = np.concatenate([chunk.audio_float_array for chunk in voice.synthesize(text, config)])
    resampled = soxr.resample(audio, VOICE_RATE, RATE).astype(np.float32)
    first, last = sound_span(resampled)
    return resampled[first:last]


def sound_span(audio: np.ndarray) -> tuple[int, int]:
    """First and last sample of the 10 ms frames louder than -40 dB of the loudest frame."""
    frame = RATE // 100
    frames = audio[: audio.size // frame * frame].reshape(-1, frame)
    rms = np.sqrt(np.mean(frames.astype(np.float64) ** 2, axis=1))
    loud = np.flatnonzero(rms > rms.max() * 0.01)
    return int(loud[0] * frame), int((loud[-1] + 1) * frame)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * RATE), np.float32)


def layout(*parts: np.ndarray | float) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """Join speech arrays and silences (floats, in seconds); return the clip and the spans."""
    pieces: list[np.ndarray] = []
    spans: list[tuple[float, float]] = []
    at = 0
    for part in parts:
        piece = silence(part) if isinstance(part, float) else part
        if not isinstance(part, float):
            spans.append((at / RATE, (at + piece.size) / RATE))
        pieces.append(piece)
        at += piece.size
    return np.concatenate(pieces), spans


@pytest.fixture(scope="module")
def sentences(piper_voice: PiperVoice) -> list[np.ndarray]:
    return [speech(piper_voice, text) for text in SENTENCES]


@pytest.fixture(scope="module")
def session() -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(
        str(find_vad_model().path), options, providers=["CPUExecutionProvider"]
    )


def session_call(session: ort.InferenceSession) -> Any:
    def call(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        probability, state = session.run(["output", "stateN"], dict(inputs))
        return {"output": probability, "stateN": state}

    return call


def detect(
    session: ort.InferenceSession, clip: np.ndarray, settings: VadSettings | None = None
) -> tuple[list[VadEvent], VadStream]:
    stream = VadStream(settings, keep_probabilities=True)
    return stream.run(clip, session_call(session), last=True), stream


def segments(events: Sequence[VadEvent]) -> list[tuple[float, float]]:
    ended = [event for event in events if isinstance(event, SpeechEnded)]
    return [(event.started, event.t) for event in ended]


def reference_probabilities(session: ort.InferenceSession, audio: np.ndarray) -> np.ndarray:
    """silero_vad's ``OnnxWrapper.audio_forward`` at 16 kHz in NumPy: the state and the last 64
    samples of each call's input carried to the next, the last chunk padded with zeros."""
    padded = np.pad(audio, (0, -audio.size % 512))
    state = np.zeros((2, 1, 128), np.float32)
    context = np.zeros((1, 64), np.float32)
    out = []
    for begin in range(0, padded.size, 512):
        x = np.concatenate([context, padded[None, begin : begin + 512]], axis=1)
        probability, state = session.run(
            None, {"input": x, "state": state, "sr": np.array(16000, dtype=np.int64)}
        )
        context = x[..., -64:]
        out.append(probability)
    return np.concatenate(out, axis=1).reshape(-1)


# -- the bundle ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("vad-data")
    ensure_vad_bundle(root / "vad" / "silero")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMNI_EDGE_DATA_DIR", str(root))
        yield root


def test_the_bundle_is_the_wheels_graph_verified_and_made_once(tmp_path: Path) -> None:
    source = find_vad_model()
    assert source.path.name == "silero_vad.onnx"
    assert source.path.stat().st_size > 2_000_000
    lines: list[str] = []
    bundle = ensure_vad_bundle(tmp_path / "silero", progress=lines.append)
    assert len(lines) == 1
    assert "silero-vad==" in lines[0]
    assert bundle.manifest.files[bundle.manifest.graph_file] == source.sha256
    metadata = bundle.manifest.metadata
    assert (metadata["sample_rate"], metadata["chunk_samples"]) == (16000, 512)
    assert metadata["checkpoint_revision"] == source.revision
    assert 0.0 <= metadata["validation"]["example_probability"] <= 1.0
    again: list[str] = []
    assert ensure_vad_bundle(tmp_path / "silero", progress=again.append).identity == bundle.identity
    assert again == [], "a bundle that verifies is not made again"
    # A damaged bundle is made again, and nothing is left beside it.
    (tmp_path / "silero" / "inputs.npz").write_bytes(b"damaged")
    assert ensure_vad_bundle(tmp_path / "silero").identity == bundle.identity
    assert sorted(path.name for path in tmp_path.iterdir()) == ["silero"]


def test_a_missing_wheel_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vad_bundle, "PACKAGE", "silero-vad-not-installed")
    with pytest.raises(VadModelMissing, match=r"pip install --no-deps silero-vad-not-installed"):
        ensure_vad_bundle(tmp_path / "silero")
    assert not (tmp_path / "silero").exists()


class _ChangedFile(importlib.metadata.PathDistribution):
    """The installed wheel's record, but its model file located at a changed copy."""

    def __init__(self, real: importlib.metadata.Distribution, changed: Path) -> None:
        super().__init__(real._path)  # type: ignore[attr-defined]
        self._changed = changed

    def locate_file(self, path: Any) -> Any:
        if str(path) == vad_bundle.MODEL_FILE:
            return self._changed
        return super().locate_file(path)


def test_a_changed_model_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    changed = tmp_path / "silero_vad.onnx"
    data = bytearray(find_vad_model().path.read_bytes())
    data[-1] ^= 0xFF
    changed.write_bytes(bytes(data))
    real = importlib.metadata.distribution("silero-vad")
    monkeypatch.setattr(
        importlib.metadata, "distribution", lambda name: _ChangedFile(real, changed)
    )
    with pytest.raises(VadModelMissing, match="does not match the sha256"):
        find_vad_model()


# -- the settings -----------------------------------------------------------------------------


def test_default_settings() -> None:
    settings = VadSettings.parse({})
    assert settings == VadSettings()
    assert (settings.threshold, settings.release) == (0.5, pytest.approx(0.35))
    assert VadSettings.parse({"threshold": 0.1}).release == 0.01
    assert VadSettings.parse({"threshold": 0.6, "neg_threshold": 0.2}).release == 0.2


@pytest.mark.parametrize(
    ("options", "key", "accepted"),
    [
        ({"threshold": 1.5}, "threshold", "between 0 and 1"),
        ({"threshold": True}, "threshold", "between 0 and 1"),
        ({"neg_threshold": "low"}, "neg_threshold", "between 0 and 1"),
        ({"threshold": 0.4, "neg_threshold": 0.45}, "neg_threshold", "at most the threshold"),
        ({"min_speech_s": -1}, "min_speech_s", "seconds from 0 to 30"),
        ({"min_silence_s": float("nan")}, "min_silence_s", "seconds from 0 to 30"),
        ({"pre_roll_s": 31}, "pre_roll_s", "seconds from 0 to 30"),
        ({"hangover": 0.5}, "hangover", "accepted: threshold, neg_threshold"),
    ],
)
def test_bad_settings_name_the_key(options: dict[str, Any], key: str, accepted: str) -> None:
    with pytest.raises(VadOptionsError, match=accepted) as error:
        VadSettings.parse(options, file="vad.yaml", line=9)
    assert error.value.key == f"adapter.options.{key}"
    assert str(error.value).startswith(f"vad.yaml:9, key 'adapter.options.{key}'")


def test_settings_come_from_the_pipeline_file(data_dir: Path, tmp_path: Path) -> None:
    text = open(PIPELINE, encoding="utf-8").read()
    config = load_pipeline(PIPELINE)
    assert config.adapter is not None
    adapter = VadAdapter(config, dict(config.adapter.options))
    assert adapter.settings == VadSettings(0.5, None, 0.25, 0.5, 0.3)
    broken = tmp_path / "vad.yaml"
    broken.write_text(text.replace("min_silence_s: 0.5", "min_silence_s: long"), encoding="utf-8")
    config = load_pipeline(broken)
    assert config.adapter is not None
    with pytest.raises(ConfigError, match=r"vad\.yaml:\d+, key 'adapter.options.min_silence_s'"):
        VadAdapter(config, dict(config.adapter.options))


def test_a_bundle_that_is_not_the_vad_is_refused(data_dir: Path, tmp_path: Path) -> None:
    from tests.helpers.onnx_graphs import make_bundle

    other = make_bundle(tmp_path / "add")
    text = open(PIPELINE, encoding="utf-8").read()
    path = tmp_path / "vad.yaml"
    path.write_text(text.replace("${data}/vad/silero/manifest.json", str(other)), encoding="utf-8")
    config = load_pipeline(path)
    assert config.adapter is not None
    with pytest.raises(VadOptionsError, match="is not a voice activity bundle") as error:
        VadAdapter(config, dict(config.adapter.options))
    assert error.value.key == "stages[0].backend.manifest"


# -- the detector on the voice's speech -------------------------------------------------------


def test_speech_starts_and_ends_where_the_voice_does(
    session: ort.InferenceSession, sentences: list[np.ndarray]
) -> None:
    clip, spans = layout(1.0, sentences[0], 1.5, sentences[1], 0.9, sentences[2], 1.0)
    events, _ = detect(session, clip)
    found = segments(events)
    print("spoken", spans, "found", found)
    assert len(found) == len(spans)
    for (start, end), (t_start, t_end) in zip(spans, found, strict=True):
        assert abs(t_start - start) <= START_TOLERANCE_S
        assert abs(t_end - end) <= END_TOLERANCE_S
    assert [type(event) for event in events] == [SpeechStarted, SpeechEnded] * 3
    for event in events:
        if isinstance(event, SpeechStarted):
            # Recognised once min_speech of it was heard, not later than a chunk past that.
            assert 0.25 <= event.detected_at - event.t <= 0.25 + 0.032 + 1e-9
        else:
            # The hangover: silence of min_silence_s (to the chunk) before the end is declared.
            assert 0.5 <= event.detected_at - event.t <= 0.5 + 0.032 + 1e-9


def test_the_start_event_carries_the_pre_roll(
    session: ort.InferenceSession, sentences: list[np.ndarray]
) -> None:
    clip, _ = layout(1.0, sentences[0], 1.0)
    events, _ = detect(session, clip, VadSettings(pre_roll_s=0.4))
    start = events[0]
    assert isinstance(start, SpeechStarted)
    assert start.pcm_t == pytest.approx(start.t - 0.4)
    first, last = round(start.pcm_t * RATE), round(start.detected_at * RATE)
    np.testing.assert_array_equal(start.pcm, clip[first:last])
    assert not start.pcm.flags.writeable


def test_a_250_ms_pause_inside_a_sentence_does_not_end_speech(
    session: ort.InferenceSession, piper_voice: PiperVoice
) -> None:
    before = speech(piper_voice, "I would like a cup of coffee,")
    after = speech(piper_voice, "and a slice of lemon cake.")
    clip, spans = layout(1.0, before, 0.25, after, 1.0)
    found = segments(detect(session, clip)[0])
    assert len(found) == 1, found
    assert abs(found[0][0] - spans[0][0]) <= START_TOLERANCE_S
    assert abs(found[0][1] - spans[1][1]) <= END_TOLERANCE_S
    # The hangover is what holds them together: a pause longer than it splits the speech.
    clip, _ = layout(1.0, before, 0.8, after, 1.0)
    assert len(segments(detect(session, clip)[0])) == 2


def test_a_burst_shorter_than_the_minimum_speech_starts_nothing(
    session: ort.InferenceSession, sentences: list[np.ndarray]
) -> None:
    voiced = sentences[0][RATE // 10 : RATE // 10 + round(0.15 * RATE)]
    clip, _ = layout(1.0, voiced, 1.5)
    events, stream = detect(session, clip)
    probabilities = np.array(stream.probabilities)
    assert (probabilities >= 0.5).sum() >= 2, "the burst must sound like speech to the model"
    assert events == []
    # With a minimum below the burst's length it does start (and ends).
    events, _ = detect(session, clip, VadSettings(min_speech_s=0.05))
    assert [type(event) for event in events] == [SpeechStarted, SpeechEnded]


def test_detector_rules_on_probabilities() -> None:
    chunk = np.zeros(512, np.float32)
    settings = VadSettings(min_speech_s=0.064, min_silence_s=0.096, pre_roll_s=0.0)
    detector = SpeechDetector(settings)

    def feed(values: Sequence[float]) -> list[VadEvent]:
        return [event for value in values for event in detector.push(value, chunk)]

    assert feed([0.9]) == []
    started = feed([0.9])
    assert [(type(event), event.t) for event in started] == [(SpeechStarted, 0.0)]
    assert detector.speaking
    # Between the two thresholds nothing changes; two silent chunks are under the hangover.
    assert feed([0.4, 0.1, 0.1, 0.6]) == []
    ended = feed([0.2, 0.2, 0.2])
    assert [(type(event), event.t) for event in ended] == [(SpeechEnded, 0.192)]
    assert isinstance(ended[0], SpeechEnded)
    assert ended[0].duration_s == pytest.approx(0.192)
    # Speech still going at the end of the stream ends where its silence began.
    feed([0.9, 0.9, 0.9, 0.1])
    finished = detector.finish()
    assert [(type(event), event.t) for event in finished] == [(SpeechEnded, 0.384)]
    assert detector.finish() == []
    with pytest.raises(UsageError, match="was finished"):
        detector.push(0.9, chunk)


def test_chunking_does_not_change_the_result(
    session: ort.InferenceSession, sentences: list[np.ndarray]
) -> None:
    clip, _ = layout(0.7, sentences[2], 0.9)
    whole, whole_stream = detect(session, clip)
    pieces = VadStream(keep_probabilities=True)
    events: list[VadEvent] = []
    call = session_call(session)
    rng = np.random.default_rng(3)
    at = 0
    while at < clip.size:
        size = int(rng.integers(1, 2000))
        events += pieces.run(clip[at : at + size], call)
        at += size
    events += pieces.run(np.zeros(0, np.float32), call, last=True)
    assert pieces.probabilities == whole_stream.probabilities
    assert [(type(e), e.t, e.detected_at) for e in events] == [
        (type(e), e.t, e.detected_at) for e in whole
    ]


# -- the state carried from call to call ------------------------------------------------------


def test_without_the_carried_context_no_speech_is_found_and_the_state_matters(
    session: ort.InferenceSession, sentences: list[np.ndarray]
) -> None:
    clip, spans = layout(1.0, sentences[0], 1.0, sentences[1], 1.0)
    events, stream = detect(session, clip)
    assert len(segments(events)) == 2
    carried = np.array(stream.probabilities[: clip.size // 512])
    full = clip[: clip.size // 512 * 512].reshape(-1, 512)
    without_context = SpeechDetector()
    state = initial_state()
    found: list[VadEvent] = []
    fresh = []
    for index, chunk in enumerate(full):
        previous = full[index - 1][-64:] if index else np.zeros(64, np.float32)
        # The state carried, but not the 64 samples before the chunk: no speech at all.
        probability, state = session.run(
            None, {"input": chunk[None], "state": state, "sr": np.array(16000, dtype=np.int64)}
        )
        found += without_context.push(float(probability.reshape(())), chunk)
        # The context given, but the state started afresh at every call.
        probability, _ = session.run(
            None, model_inputs(np.concatenate([previous, chunk]), initial_state())
        )
        fresh.append(float(probability.reshape(())))
    found += without_context.finish()
    assert found == []
    # Without the carried state the model hears each chunk alone: inside speech its
    # probabilities fall and scatter (measured on these clips: mean 0.99 carried, 0.34 fresh).
    inside = np.zeros(carried.size, bool)
    for start, end in spans:
        inside[int(start * RATE) // 512 + 3 : int(end * RATE) // 512 - 3] = True
    fresh_inside = np.array(fresh)[inside]
    print(
        f"speech chunks: carried mean {carried[inside].mean():.3f}, fresh {fresh_inside.mean():.3f}"
    )
    assert carried[inside].mean() > 0.9
    assert fresh_inside.mean() < 0.6
    assert (fresh_inside < 0.5).mean() > 0.1


# -- the stage in a real worker -----------------------------------------------------------------


@pytest.fixture
def omni(data_dir: Path) -> Iterator[Omni]:
    with Omni(PIPELINE) as pipeline:
        yield pipeline


def _run(omni: Omni, request: Any) -> tuple[list[VadEvent], dict[str, Any]]:
    events: list[VadEvent] = []
    final: dict[str, Any] = {}
    for output in omni.generate(request):
        event = event_from_outputs(output.outputs)
        if event is not None:
            events.append(event)
        if output.finished:
            final = dict(output.metrics)
    return events, final


def test_the_stage_runs_in_a_worker_equal_to_the_packages_wrapper(
    omni: Omni, session: ort.InferenceSession, sentences: list[np.ndarray]
) -> None:
    stage = omni.execution_plan.to_json()["stages"][0]
    pid = stage["worker"]["pid"]
    assert pid != os.getpid()
    assert psutil.Process(pid).cmdline()[-2:] == ["-m", "workers.ort_worker"]
    assert stage["placement"]["fraction_on_target"] == 1.0
    assert stage["manifest"]["component"] == "silero-vad"
    clip, spans = layout(1.0, sentences[0], 1.2, sentences[1], 0.8)
    # The request arrives at the voice's rate, 22,050 Hz, and is resampled to 16 kHz.
    at_voice_rate = soxr.resample(clip, RATE, VOICE_RATE).astype(np.float32)
    events, metrics = _run(omni, {"audio": at_voice_rate, "sample_rate": VOICE_RATE})
    resampled = to_mono_16k(at_voice_rate, VOICE_RATE)
    reference = reference_probabilities(session, resampled)
    worker = np.array(metrics["probabilities"], np.float32)
    assert worker.shape == reference.shape
    np.testing.assert_allclose(worker, reference, atol=1e-5)
    # The same probabilities give the same events as in this process.
    local, _ = detect(session, resampled)
    assert [(type(e), e.t, e.detected_at) for e in events] == [
        (type(e), e.t, e.detected_at) for e in local
    ]
    found = segments(events)
    assert len(found) == 2
    for (start, end), (t_start, t_end) in zip(spans, found, strict=True):
        assert abs(t_start - start) <= START_TOLERANCE_S + 0.01
        assert abs(t_end - end) <= END_TOLERANCE_S + 0.01
    assert metrics["segments"] == [list(pair) for pair in found]
    assert metrics["chunks"] == reference.size
    print(
        f"per chunk p50: model {metrics['call_run_s_p50'] * 1e3:.3f} ms, whole call "
        f"{metrics['call_wall_s_p50'] * 1e3:.3f} ms"
    )


def test_a_live_source_is_read_as_it_arrives(
    omni: Omni, session: ort.InferenceSession, sentences: list[np.ndarray]
) -> None:
    clip, _ = layout(0.5, sentences[2], 1.0)
    # 32 ms chunks, as a microphone delivers them, and one ragged tail.
    chunks = [clip[begin : begin + 512] for begin in range(0, clip.size, 512)]
    events, metrics = _run(omni, iter(chunks))
    local, _ = detect(session, clip)
    assert [(type(e), e.t) for e in events] == [(type(e), e.t) for e in local]
    assert len(events) == 2
    assert "probabilities" not in metrics, "a live stream keeps no per-chunk record"


class _Source44k(list[np.ndarray]):
    """A live source that says it runs at 44.1 kHz."""

    sample_rate = 44100


@pytest.mark.parametrize(
    ("request_input", "message"),
    [
        ("hello", "type str is not audio"),
        ({"audio": np.zeros(0, np.float32)}, "are not audio"),
        ({"audio": np.zeros(100, np.float32), "rate": 16000}, "unknown key 'rate'"),
        ({"audio": np.zeros(100, np.float32), "sample_rate": 0}, "sample_rate 0"),
        ({"audio": np.array(["a", "b"])}, "are not audio"),
        ({"audio": np.full(100, np.nan, np.float32)}, "NaN"),
        (_Source44k(), "delivers 44100 Hz; accepted: 16000 Hz"),
    ],
)
def test_bad_requests_are_refused(data_dir: Path, request_input: Any, message: str) -> None:
    config = load_pipeline(PIPELINE)
    assert config.adapter is not None
    adapter = VadAdapter(config, dict(config.adapter.options))
    with pytest.raises(UsageError, match=message):
        adapter.prepare(request_input)


def test_closing_ends_the_worker(data_dir: Path) -> None:
    pipeline = Omni(PIPELINE)
    pid = pipeline.execution_plan.worker_pids[0]
    clip = np.zeros(RATE, np.float32)
    events, metrics = _run(pipeline, {"audio": clip})
    assert events == []
    assert metrics["chunks"] == 32
    pipeline.close()
    wait_until(lambda: process_gone(pid), f"worker {pid} to exit")


def test_the_pipeline_file_documents_every_option() -> None:
    text = textwrap.dedent(open(PIPELINE, encoding="utf-8").read())
    for name in ("threshold", "min_speech_s", "min_silence_s", "pre_roll_s"):
        assert f"{name}:" in text


def test_a_live_chunk_that_is_not_float32_mono_fails_the_request(
    omni: Omni, sentences: list[np.ndarray]
) -> None:
    chunks = [sentences[0][:512], (sentences[0][512:1024] * 32767).astype(np.int16)]
    with pytest.raises(UsageError, match=r"a live chunk of dtype int16 .* accepted: 1-D float32"):
        _run(omni, iter(chunks))
    # The stage stays usable for the next request.
    events, metrics = _run(omni, {"audio": np.zeros(RATE, np.float32)})
    assert events == []
    assert metrics["chunks"] == 32


def test_leaving_a_live_request_early_stops_reading_it(
    omni: Omni, sentences: list[np.ndarray]
) -> None:
    clip, _ = layout(0.3, sentences[0], 0.3)
    taken: list[int] = []

    def endless() -> Iterator[np.ndarray]:
        position = 0
        while True:
            piece = clip[position % clip.size : position % clip.size + 512]
            taken.append(piece.size)
            position += 512
            time.sleep(0.002)
            yield piece

    outputs = omni.generate(endless())
    first = event_from_outputs(next(outputs).outputs)
    assert isinstance(first, SpeechStarted)
    outputs.close()
    ended = wait_until(lambda: omni.metrics()["requests"], "the request to end")
    assert ended[-1]["status"] == "cancelled"
    read = len(taken)
    time.sleep(0.2)
    assert len(taken) <= read + 1, "nothing reads the source once the request ended"
    # The stage takes the next request.
    assert _run(omni, {"audio": np.zeros(RATE, np.float32)})[1]["chunks"] == 32


def test_the_bundle_command_makes_it_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from runtime.cli import main

    out = tmp_path / "vad"
    assert main(["bundle", "export-vad", "--out", str(out), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["made"] is True
    assert first["manifest"] == str(out / "manifest.json")
    assert first["checkpoint_revision"] == find_vad_model().revision
    assert main(["bundle", "export-vad", "--out", str(out)]) == 0
    assert "already present and verified" in capsys.readouterr().out


class _QuietSource:
    """A live source whose device went quiet: ``read`` waits its timeout and returns nothing."""

    sample_rate = 16000

    def __init__(self) -> None:
        self.reads = 0

    def read(self, timeout: float | None = None) -> np.ndarray | None:
        self.reads += 1
        time.sleep(timeout or 0.0)
        return np.zeros(0, np.float32)

    def __iter__(self) -> Iterator[np.ndarray]:
        raise AssertionError("a source with read(timeout) is read with it")


def test_a_cancel_ends_a_request_whose_source_went_quiet(omni: Omni) -> None:
    import threading

    from runtime.errors import RequestCancelled

    source = _QuietSource()
    timer = threading.Timer(0.5, omni.cancel, ["quiet"])
    timer.start()
    try:
        with pytest.raises(RequestCancelled):
            list(omni.generate(source, request_id="quiet"))
    finally:
        timer.cancel()
    assert source.reads >= 3, "the source is read a short wait at a time"
    read = source.reads
    time.sleep(0.3)
    assert source.reads <= read + 1, "nothing reads the source once the request ended"


def test_a_clips_events_go_out_as_they_are_found(omni: Omni, sentences: list[np.ndarray]) -> None:
    clip, _ = layout(0.5, sentences[2], 10.0)
    calls_at_output = []
    for output in omni.generate({"audio": clip}):
        calls_at_output.append((output.outputs["event"], len(output.metrics["stages"])))
    (started, at_start), (ended, at_end), (final, at_final) = calls_at_output
    assert (started, ended, final) == ("speech_started", "speech_ended", "finished")
    # Each event left after the chunk that completed it, not after the whole file.
    assert at_start < at_end < at_final == clip.size // 512 + 1
    assert at_end < at_final / 2


def test_cancelling_a_long_clip_ends_it_and_leaves_nothing_behind(omni: Omni) -> None:
    """A cancel stops a clip within a chunk or two, whether it lands between calls or on
    one (that one's worker is then retired), and its buffers go."""
    import threading

    from runtime.errors import RequestCancelled
    from tests.runtime.engine.support import shm_entries

    before = shm_entries()
    clip = np.random.default_rng(3).standard_normal(RATE * 600).astype(np.float32) * 0.01
    timer = threading.Timer(0.3, omni.cancel, ["long"])
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(RequestCancelled):
            list(omni.generate({"audio": clip, "sample_rate": RATE}, request_id="long"))
    finally:
        timer.cancel()
    assert time.monotonic() - started < 10.0, "a 10-minute clip stops when cancelled"
    (ended,) = wait_until(
        lambda: [r for r in omni.metrics()["requests"] if r["request_id"] == "long"],
        "the cancelled request to be wound up",
    )
    assert ended["status"] == "cancelled"
    wait_until(lambda: shm_entries() <= before, "the cancelled request's buffers to go")
