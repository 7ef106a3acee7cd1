"""The speech adapter through the real engine: two ORT worker processes (acoustic, decoder),
chunks streamed as partial outputs, joined audio equal to a whole decode, the sound of
one-process Piper, bad input, and a cancel mid-utterance that leaves nothing behind."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from piper import SynthesisConfig

from runtime.adapters.speak import NotASpeechPipeline, speak
from runtime.adapters.tts import (
    WHOLE_FRAMES,
    SpeechAdapter,
    SpeechOptions,
    SpeechOptionsError,
    _Pacer,
)
from runtime.adapters.tts_text import SpeechInputError, SpeechPlan, Utterance
from runtime.adapters.voice_export import DEFAULT_SCHEDULE, acoustic_inputs, snr_db
from runtime.api import AsyncOmni, Omni
from runtime.audio import AudioPlayer
from runtime.backends.threads import plan_threads
from runtime.devices import DeviceSelection, discover_topology
from runtime.errors import RequestCancelled, UsageError
from tests.helpers.audio_metrics import log_mel_correlation
from tests.helpers.engine import engine_of
from tests.helpers.onnx_graphs import make_bundle
from tests.helpers.voice import assert_speech, speak_config
from tests.runtime.audio.conftest import alsa_null
from tests.runtime.engine.support import (
    StageSpec,
    process_gone,
    shm_entries,
    wait_until,
    write_pipeline,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from pathlib import Path

    from piper import PiperVoice

    from runtime.devices import Topology
    from runtime.engine.outputs import OmniRequestOutput
    from tests.helpers.voice import Exported
    from tests.runtime.adapters.conftest import Sessions

__all__ = ["alsa_null"]

RATE = 22050
#: Streamed chunks joined against one whole decode of the same latents are held to the voice's
#: validation threshold (``metadata.validation.thresholds.min_snr_db``); a click or a gap at a
#: join would fall far below it.
TEXT = "Streaming speech starts quickly. Then its chunks grow, and the joins stay clean!"
#: Real text of 20,000 characters (about twenty minutes of speech).
LONG_TEXT = ("A long text keeps the voice busy, sentence after sentence. " * 400)[:20_000]


@pytest.fixture(scope="module")
def machine() -> Topology:
    return discover_topology()


def _engine(machine: Topology) -> dict[str, Any]:
    """Engine options independent of the user's saved device selection."""
    return {"topology": machine, "selection": DeviceSelection()}


@pytest.fixture(scope="module")
def adapter(exported: Exported) -> SpeechAdapter:
    """The speech adapter on the session's bundles (no stage started)."""
    config = speak_config(exported)
    assert config.adapter is not None
    return SpeechAdapter(config, config.adapter.options)


def _drain(outputs: Iterable[OmniRequestOutput]) -> list[dict[str, Any]]:
    taken = []
    for output in outputs:
        taken.append(
            {**output.outputs, "finished": output.finished, "metrics": dict(output.metrics)}
        )
    return taken


def _whole_decode(
    sessions: Sessions, ids: tuple[int, ...], buckets: tuple[int, ...], *, sized: bool
) -> np.ndarray:
    """One decoder run over every latent frame of an utterance (no chunks), in this process,
    on the latents of an acoustic call shaped as the adapter shapes it (``sized``)."""
    inputs = acoustic_inputs(ids, buckets, (0.0, 1.0, 0.0), sized=sized)
    z, mask = sessions.acoustic.run(["z", "mask"], inputs)
    (audio,) = sessions.decoder.run(["audio"], {"z": z, "mask": mask})
    return np.asarray(audio, dtype=np.float32).reshape(-1)


def _join_threshold(adapter: SpeechAdapter) -> float:
    threshold = adapter.bundles.validation["thresholds"]["min_snr_db"]
    assert isinstance(threshold, float)
    assert threshold >= 40.0
    return threshold


def _check_timing(metrics: dict[str, Any], wall_s: float, chunks: int, sentences: int) -> None:
    """The timing breakdown: one step per stage call, and totals that add up."""
    steps = metrics["steps"]
    timing = metrics["timing"]
    decoder = [step for step in steps if step["stage"] == "decoder"]
    acoustic = [step for step in steps if step["stage"] == "acoustic"]
    assert len(decoder) == timing["decoder_calls"] == chunks
    assert len(acoustic) == timing["acoustic_calls"] == sentences
    assert [step["sentence"] for step in acoustic] == list(range(sentences))
    for step in steps:
        assert 0 <= step["started_s"] < wall_s
        assert 0 < step["run_s"] <= step["wall_s"] + 1e-3
        assert 0 <= step["transfer_s"] <= step["wall_s"]
    assert all(step["window"] >= step["kept"] > 0 for step in decoder)
    assert timing["decoder_kept_frames"] == sum(step["kept"] for step in decoder)
    assert timing["decoder_window_frames"] == sum(step["window"] for step in decoder)
    assert timing["decoder_run_s"] == pytest.approx(sum(step["run_s"] for step in decoder))
    assert timing["acoustic_run_s"] == pytest.approx(sum(step["run_s"] for step in acoustic))
    assert timing["decoder_work_ratio"] >= 1.0
    assert 0 < timing["wall_s"] < wall_s
    assert timing["adapter_s"] >= 0
    assert timing["emit_s"] >= 0
    assert timing["acoustic_run_s"] + timing["decoder_run_s"] <= timing["wall_s"] * 1.01


def _interrupt_at(chunk: int) -> Callable[[OmniRequestOutput], None]:
    def on_chunk(output: OmniRequestOutput) -> None:
        if output.outputs["chunk_index"] == chunk:
            raise KeyboardInterrupt

    return on_chunk


def test_chunks_stream_join_into_a_whole_decode_and_sound_like_piper(
    exported: Exported,
    sessions: Sessions,
    piper_voice: PiperVoice,
    machine: Topology,
    tmp_path: Path,
    alsa_null: Path,
) -> None:
    config = speak_config(exported, scales="deterministic")
    with Omni(config, **_engine(machine)) as omni:
        adapter = engine_of(omni).program
        assert isinstance(adapter, SpeechAdapter)
        plan = adapter.prepare(TEXT)
        started = time.perf_counter()
        outputs = _drain(omni.generate(TEXT))
        wall_s = time.perf_counter() - started
        # Bad input is refused in the caller's thread; the pipeline keeps serving.
        with pytest.raises(SpeechInputError, match="nothing in the text can be spoken") as caught:
            next(omni.generate("\U0001f600\U0001f680 \u2764\ufe0f"))
        assert caught.value.code == "nothing_speakable"
        mixed = _drain(omni.generate("Hello \U0001f600 there \u4f60\u597d, and\x07 goodbye."))
        # A player must take the voice's rate; nothing is submitted otherwise.
        with pytest.raises(UsageError, match="takes 16000 Hz audio; this voice speaks at 22050"):
            speak(omni, "Hi.", player=AudioPlayer(sample_rate_in=16000))
        # Ctrl+C in the consuming thread: speak() stops cleanly and keeps no partial WAV.
        wav = tmp_path / "interrupted.wav"
        interrupted = speak(omni, LONG_TEXT[:600], out=wav, on_chunk=_interrupt_at(2))

    *chunks, final = outputs
    assert final["finished"]
    assert final["pcm"].size == 0
    assert all(not chunk["finished"] for chunk in chunks)
    assert [chunk["chunk_index"] for chunk in chunks] == list(range(len(chunks)))
    assert {chunk["sample_rate"] for chunk in chunks} == {RATE}
    assert all(chunk["pcm"].dtype == np.float32 and chunk["pcm"].ndim == 1 for chunk in chunks)
    assert len(plan.sentences) == 2
    assert [chunk["sentence_index"] for chunk in chunks] == sorted(
        chunk["sentence_index"] for chunk in chunks
    )
    assert {chunk["sentence_index"] for chunk in chunks} == {0, 1}

    buckets = exported.bundles.acoustic_settings.buckets
    joined = []
    for index, sentence in enumerate(plan.sentences):
        pieces = [chunk["pcm"] for chunk in chunks if chunk["sentence_index"] == index]
        sizes = [piece.size // 256 for piece in pieces]
        whole = _whole_decode(sessions, sentence.ids, buckets, sized=adapter.sized_acoustic)
        # A short first chunk for early audio, then sizes of the schedule (the last chunk of
        # each utterance keeps the rest).
        if index == 0:
            assert sizes[0] == adapter.schedule[0] == DEFAULT_SCHEDULE[0]
        assert set(sizes[:-1]) <= set(adapter.schedule)
        streamed = np.concatenate(pieces)
        assert streamed.size == whole.size
        snr = snr_db(whole, streamed)
        print(f"sentence {index}: {len(pieces)} chunks {sizes} frames, joins at {snr:.1f} dB")
        assert snr >= _join_threshold(adapter)
        joined.append(streamed)

    deterministic = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0, normalize_audio=False)
    reference = np.concatenate(
        [chunk.audio_float_array for chunk in piper_voice.synthesize(TEXT, deterministic)]
    )
    ours = np.concatenate(joined)
    assert ours.size == reference.size
    correlation = log_mel_correlation(ours, reference, RATE)
    print(f"log-mel correlation with one-process Piper: {correlation:.5f}")
    assert correlation >= 0.95
    assert_speech(ours, RATE)

    metrics = final["metrics"]
    assert metrics["chunks"] == len(chunks)
    assert metrics["sentences"] == 2
    assert metrics["audio_seconds"] == pytest.approx(ours.size / RATE)
    assert 0 < metrics["time_to_first_audio_s"] < wall_s
    assert 0 < metrics["real_time_factor"] <= wall_s / metrics["audio_seconds"]
    assert 0 < metrics["max_chunk_gap_s"] < wall_s
    assert metrics["skipped"] == []
    assert metrics["scales"] == [0.0, 1.0, 0.0]
    assert metrics["windows"] == "sized"
    assert metrics["acoustic_ids"] == "sized"
    assert metrics["context"] == list(adapter.bundles.decoder_settings.context)
    _check_timing(metrics, wall_s, len(chunks), sentences=2)
    print(
        f"first audio {metrics['time_to_first_audio_s']:.3f} s, real-time factor "
        f"{metrics['real_time_factor']:.3f}, longest gap {metrics['max_chunk_gap_s']:.3f} s"
    )

    # Mixed input: what the voice cannot say is skipped with a note, the rest is spoken.
    *mixed_chunks, mixed_final = mixed
    reasons = [item["reason"] for item in mixed_final["metrics"]["skipped"]]
    assert sorted(reasons) == ["control", "emoji", "script"]
    assert_speech(np.concatenate([chunk["pcm"] for chunk in mixed_chunks]), RATE)

    assert interrupted.status == "interrupted"
    assert interrupted.chunks == 3
    assert interrupted.cancel_latency_s is not None
    assert interrupted.cancel_latency_s < 5.0
    assert interrupted.wav_path is None
    assert not wav.exists()
    assert [path.name for path in tmp_path.iterdir() if path.name.endswith(".partial")] == []


def test_speaking_needs_a_speech_pipeline(tmp_path: Path, machine: Topology) -> None:
    manifest = make_bundle(tmp_path)
    pipeline = write_pipeline(tmp_path / "add.yaml", StageSpec(manifest))
    with Omni(pipeline, **_engine(machine)) as omni:
        with pytest.raises(NotASpeechPipeline, match="cannot speak: its adapter is none"):
            speak(omni, "Hello.")


def test_cancel_mid_utterance_of_a_long_text_stops_and_leaves_nothing(
    exported: Exported, machine: Topology
) -> None:
    shm_before = shm_entries()
    with Omni(speak_config(exported), **_engine(machine)) as omni:
        pids = list(omni.execution_plan.worker_pids)
        started = time.perf_counter()
        outputs = omni.generate(LONG_TEXT, request_id="long-text")
        first = next(outputs)
        first_audio_s = time.perf_counter() - started
        assert first.outputs["pcm"].size == DEFAULT_SCHEDULE[0] * 256
        assert next(outputs).outputs["chunk_index"] == 1
        decoder = engine_of(omni).clients[1]
        wait_until(lambda: decoder.slot is not None, "a decoder call in flight")
        began = time.perf_counter()
        assert omni.cancel("long-text")
        cancel_s = time.perf_counter() - began
        with pytest.raises(RequestCancelled):
            _drain(outputs)
        # The decoder's call was running: its worker is retired at once, not at close.
        wait_until(lambda: process_gone(pids[1]), "the decoder worker to exit", timeout_s=5.0)
        status = omni.metrics()["requests"][-1]["status"]
        print(
            f"20,000 characters: first audio {first_audio_s:.3f} s (phonemization included), "
            f"cancel returned after {cancel_s:.3f} s"
        )
    assert first_audio_s < 15.0
    assert cancel_s < 5.0
    assert status == "cancelled"
    for pid in pids:
        wait_until(lambda pid=pid: process_gone(pid), f"worker {pid} to exit", timeout_s=5.0)
    assert shm_entries() - shm_before == set()


@pytest.mark.parametrize(
    ("text", "code", "message"),
    [
        ("", "empty", "the text is empty"),
        ("  \n\t \u3000", "whitespace_only", "only whitespace"),
        ("\U0001f600\U0001f389\U0001f680", "nothing_speakable", "skipped: emoji"),
        ("\u4f60\u597d\u4e16\u754c", "nothing_speakable", "skipped: script"),
        ("\x00\x01\x02\x1b", "nothing_speakable", "skipped: control"),
        ("a" * 100_001, "too_long", "100001 characters"),
        (42, "not_text", "must be a string"),
        ({"txt": "hello"}, "not_text", "accepted: {'text': str}"),
        ({"text": "hello", "voice": "x"}, "not_text", "accepted: {'text': str}"),
    ],
    ids=[
        "empty",
        "whitespace",
        "emoji",
        "unsupported-script",
        "control",
        "over-limit",
        "not-text",
        "wrong-key",
        "extra-key",
    ],
)
def test_bad_input_gets_a_clear_error(
    adapter: SpeechAdapter, text: object, code: str, message: str
) -> None:
    with pytest.raises(SpeechInputError) as caught:
        adapter.prepare(text)
    assert caught.value.code == code
    assert message in str(caught.value)


def test_twenty_thousand_characters_are_split_to_fit_the_buckets(adapter: SpeechAdapter) -> None:
    started = time.perf_counter()
    plan = adapter.prepare({"text": LONG_TEXT})
    took = time.perf_counter() - started
    print(f"20,000 characters -> {len(plan.sentences)} utterances in {took:.2f} s")
    assert len(plan.sentences) == LONG_TEXT.count(". ") + 1
    assert max(len(sentence.ids) for sentence in plan.sentences) <= adapter.max_ids
    assert took < 20.0


def test_mixed_input_is_spoken_with_notes_on_what_was_skipped(adapter: SpeechAdapter) -> None:
    plan = adapter.prepare("Hi \U0001f600 there\x07, \u4f60\u597d friend.")
    assert [item.reason for item in plan.skipped] == ["emoji", "control", "script"]
    # Each skipped run becomes a space, so the words stay apart.
    assert [sentence.text for sentence in plan.sentences] == ["Hi there , friend."]


def test_a_prepared_plan_is_taken_as_it_is_when_it_fits(adapter: SpeechAdapter) -> None:
    plan = adapter.prepare("Hello there.")
    assert adapter.prepare(plan) is plan
    too_long = SpeechPlan("x", (Utterance("x", ("x",), (1,) * 300),), (), 300)
    with pytest.raises(SpeechInputError, match="300 phoneme ids; accepted: at most 256"):
        adapter.prepare(too_long)
    with pytest.raises(SpeechInputError, match="no utterances"):
        adapter.prepare(SpeechPlan("", (), (), 256))


@pytest.mark.parametrize(
    ("options", "key", "message"),
    [
        ({"voice": "joe", "speed": 2}, "speed", "unknown speech option 'speed'"),
        ({}, "voice", "None is not a voice name"),
        ({"voice": "joe", "schedule": []}, "schedule", "not a list of frame counts"),
        ({"voice": "joe", "schedule": [16, 0]}, "schedule", "not a list of frame counts"),
        ({"voice": "joe", "schedule": "16"}, "schedule", "not a list of frame counts"),
        ({"voice": "joe", "scales": "loud"}, "scales", "'voice', 'deterministic'"),
        ({"voice": "joe", "scales": [0.5, 0.0, 0.5]}, "scales", "length above 0"),
        ({"voice": "joe", "scales": [0.5, 1.0]}, "scales", "[noise, length, noise_w]"),
        ({"voice": "joe", "sentence_silence_s": -1}, "sentence_silence_s", "from 0 to 10"),
        ({"voice": "joe", "sentence_silence_s": True}, "sentence_silence_s", "from 0 to 10"),
        ({"voice": "joe", "overlap_sentences": "yes"}, "overlap_sentences", "auto, true or false"),
        ({"voice": "joe", "windows": "dynamic"}, "windows", "auto, sized, buckets"),
    ],
)
def test_bad_options_name_the_option_and_what_is_accepted(
    options: dict[str, Any], key: str, message: str
) -> None:
    with pytest.raises(SpeechOptionsError) as caught:
        SpeechOptions.parse(options, file="speak.yaml", line=17)
    assert caught.value.key == f"adapter.options.{key}"
    assert message in str(caught.value)
    assert str(caught.value).startswith("speak.yaml:17, key 'adapter.options.")


def test_good_options_are_parsed() -> None:
    parsed = SpeechOptions.parse(
        {
            "voice": "joe",
            "schedule": [8, 16],
            "scales": [0.3, 1.2, 0.4],
            "sentence_silence_s": 0.25,
            "overlap_sentences": True,
        }
    )
    assert parsed == SpeechOptions("joe", (8, 16), (0.3, 1.2, 0.4), 0.25, True)
    assert SpeechOptions.parse({"voice": "joe", "scales": "deterministic"}).scales == (
        "deterministic"
    )


def test_options_that_do_not_fit_the_bundles_are_refused(exported: Exported) -> None:
    config = speak_config(exported, voice="amy")
    assert config.adapter is not None
    with pytest.raises(SpeechOptionsError, match="holds voice 'joe'") as caught:
        SpeechAdapter(config, config.adapter.options)
    assert caught.value.key == "adapter.options.voice"
    widest = exported.bundles.decoder_settings.buckets[-1]
    config = speak_config(exported, schedule=[16, widest])
    assert config.adapter is not None
    largest = DEFAULT_SCHEDULE[-1]
    with pytest.raises(SpeechOptionsError, match=rf"chunk size {widest} .* sizes up to {largest}"):
        SpeechAdapter(config, config.adapter.options)
    one_stage = dataclasses.replace(config, stages=config.stages[:1])
    with pytest.raises(SpeechOptionsError, match="decoder voice bundle as graph stage 1"):
        SpeechAdapter(one_stage, {"voice": "joe"})
    three_stages = dataclasses.replace(config, stages=(*config.stages, config.stages[1]))
    with pytest.raises(SpeechOptionsError, match="exactly two stages"):
        SpeechAdapter(three_stages, {"voice": "joe"})


def test_scales_choose_the_noise(adapter: SpeechAdapter, exported: Exported) -> None:
    assert adapter.scales == exported.bundles.voice.scales == (0.667, 1.0, 0.8)
    config = speak_config(exported, scales="deterministic")
    assert config.adapter is not None
    assert SpeechAdapter(config, config.adapter.options).scales == (0.0, 1.0, 0.0)


@pytest.mark.slow
def test_overlapped_sentences_and_silence_stream_the_same_audio_through_async_omni(
    exported: Exported, sessions: Sessions, machine: Topology
) -> None:
    config = speak_config(
        exported, scales="deterministic", overlap_sentences=True, sentence_silence_s=0.1
    )
    text = "One. Two sentences follow. And a third one ends it."

    async def speak() -> list[dict[str, Any]]:
        async with AsyncOmni(config, **_engine(machine)) as omni:
            return [
                {**output.outputs, "finished": output.finished}
                async for output in omni.generate(text)
            ]

    outputs = asyncio.run(speak())
    assert config.adapter is not None
    adapter = SpeechAdapter(config, config.adapter.options)
    plan = adapter.prepare(text)
    buckets = adapter.bundles.acoustic_settings.buckets
    expected = []
    for index, sentence in enumerate(plan.sentences):
        expected.append(
            _whole_decode(sessions, sentence.ids, buckets, sized=adapter.sized_acoustic)
        )
        if index < len(plan.sentences) - 1:
            expected.append(np.zeros(round(0.1 * RATE), np.float32))
    streamed = np.concatenate([output["pcm"] for output in outputs])
    reference = np.concatenate(expected)
    assert streamed.size == reference.size
    assert snr_db(reference, streamed) >= _join_threshold(adapter)
    assert outputs[-1]["finished"]
    assert not any(output["finished"] for output in outputs[:-1])


FIXED_SCHEDULES = [(size,) for size in DEFAULT_SCHEDULE]
#: make test joins the smallest window and the shipped buckets; make slow every window size.
FAST_SCHEDULES = (FIXED_SCHEDULES[0],)


@pytest.mark.parametrize(
    ("schedule", "windows"),
    [
        *(
            pytest.param(one, "sized", marks=() if one in FAST_SCHEDULES else pytest.mark.slow)
            for one in FIXED_SCHEDULES
        ),
        (DEFAULT_SCHEDULE, "buckets"),
    ],
    ids=[*(f"sized-{one[0]}" for one in FIXED_SCHEDULES), "buckets-shipped"],
)
def test_streamed_joins_reach_the_validation_record_for_every_window_size(
    exported: Exported,
    sessions: Sessions,
    machine: Topology,
    schedule: tuple[int, ...],
    windows: str,
) -> None:
    """Through the two worker processes: each chunk size alone with windows sized to it, and
    the shipped schedule on fixed buckets, join at the SNR the voice's validation recorded."""
    config = speak_config(
        exported, scales="deterministic", schedule=list(schedule), windows=windows
    )
    text = "Every window size joins cleanly, even in a sentence long enough for large chunks."
    with Omni(config, **_engine(machine)) as omni:
        adapter = engine_of(omni).program
        assert isinstance(adapter, SpeechAdapter)
        assert adapter.sized_windows is (windows == "sized")
        outputs = _drain(omni.generate(text))
    *chunks, final = outputs
    (sentence,) = adapter.prepare(text).sentences
    assert adapter.sized_acoustic is (windows == "sized")
    whole = _whole_decode(
        sessions,
        sentence.ids,
        exported.bundles.acoustic_settings.buckets,
        sized=adapter.sized_acoustic,
    )
    streamed = np.concatenate([chunk["pcm"] for chunk in chunks])
    assert streamed.size == whole.size
    record = {
        (tuple(case["schedule"]), case["windows"]): case
        for case in exported.bundles.validation["cases"]
    }[(schedule, windows)]
    snr = snr_db(whole, streamed)
    print(f"{windows} {list(schedule)}: {snr:.1f} dB (validation: {record['min_snr_db']} dB)")
    assert snr >= _join_threshold(adapter)
    steps = [step for step in final["metrics"]["steps"] if step["stage"] == "decoder"]
    if len(schedule) == 1:
        assert {step["kept"] for step in steps[:-1]} <= {schedule[0]}
    buckets = set(exported.bundles.decoder_settings.buckets)
    used = {step["window"] for step in steps}
    if windows == "buckets":
        assert used <= buckets
    else:
        context = sum(exported.bundles.decoder_settings.context)
        # Sized windows: the chunk and its context, no padding to a bucket.
        assert all(
            step["window"] <= step["kept"] + context or step["window"] == min(buckets)
            for step in steps
        )


def test_overlap_follows_the_thread_plan(exported: Exported) -> None:
    config = speak_config(exported)
    assert config.adapter is not None
    adapter = SpeechAdapter(config, config.adapter.options)
    assert adapter.concurrent_stages == (0, 1)
    names = [stage.name for stage in config.stages]
    for cores, overlaps in ((2, False), (3, False), (4, True), (8, True)):
        plans = plan_threads(config, cores, concurrent=names)
        assert [plans[name].overlaps for name in names] == [overlaps, overlaps]
        if overlaps:
            assert [plans[name].intra_op_threads for name in names] == [cores // 2] * 2
            assert not any(plans[name].allow_spinning for name in names)
            assert [plans[name].spin_wait_us for name in names] == [0, 0], (
                "a stage running beside another burns no core waiting for its next call"
            )
        else:
            assert [plans[name].intra_op_threads for name in names] == [cores, cores]
            assert "could overlap" in plans[names[0]].reason
            assert [plans[name].spin_wait_us for name in names] == [0, 0]
    assert [plan.spin_wait_us for plan in plan_threads(config, 1).values()] == [0, 0]
    # Without concurrent stages the plan is what it always was: every core each, in turn.
    assert [plan.overlaps for plan in plan_threads(config, 8).values()] == [False, False]
    expected = plan_threads(config, concurrent=names)[names[0]].overlaps
    assert adapter.overlap is expected
    never = speak_config(exported, overlap_sentences=False)
    assert never.adapter is not None
    assert SpeechAdapter(never, never.adapter.options).concurrent_stages == ()
    always = speak_config(exported, overlap_sentences=True)
    assert always.adapter is not None
    assert SpeechAdapter(always, always.adapter.options).overlap is True


def test_chunks_grow_with_the_players_lead_and_shrink_when_it_runs_short() -> None:
    pacer = _Pacer((32, 64, 128, 256, 512), context_frames=40, largest_final=532)
    assert pacer.next_size(0.0, first=True, remaining=1000) == 32
    pacer.measured(52, 0.052)  # 1 ms per window frame
    # As many frames as the lead pays for 1.5 times over, window (kept + 40) included.
    assert pacer.next_size(0.3, first=False, remaining=968) == 160
    assert pacer.next_size(0.6, first=False, remaining=808) == 360
    # Far ahead: the largest size; never below the first size when the lead runs short.
    assert pacer.next_size(5.0, first=False, remaining=700) == 512
    assert pacer.next_size(0.05, first=False, remaining=700) == 32
    # The rest of the utterance at once when the lead pays for its window (no right context),
    # up to the largest size plus the right context.
    assert pacer.next_size(0.4, first=False, remaining=240) == 240
    assert pacer.next_size(0.35, first=False, remaining=240) == 193
    assert pacer.next_size(5.0, first=False, remaining=532) == 532
    # A rest of no more than the context goes with this call when the lead covers it once.
    assert pacer.next_size(0.35, first=False, remaining=230) == 230
    assert pacer.next_size(0.24, first=False, remaining=230) == 120
    assert pacer.next_size(5.0, first=False, remaining=533) == 512
    # Never more than the rest.
    assert pacer.next_size(0.05, first=False, remaining=20) == 20


def test_a_short_first_utterance_is_decoded_in_one_call() -> None:
    pacer = _Pacer((32, 64, 128, 256, 512), context_frames=40, whole_frames=128)
    assert pacer.next_size(0.0, first=True, remaining=105) == 105
    assert pacer.next_size(0.0, first=True, remaining=128) == 128
    # One frame more: a short first chunk for early audio, as before.
    assert pacer.next_size(0.0, first=True, remaining=129) == 32
    # Deterministic chunking keeps the schedule, whatever the length.
    fixed = _Pacer((32, 64), context_frames=40, adaptive=False, whole_frames=128)
    assert fixed.next_size(0.0, first=True, remaining=105) == 32
    # Off by default.
    assert _Pacer((32, 64), context_frames=40).next_size(0.0, first=True, remaining=20) == 32


def test_a_short_text_is_one_decoder_call_and_a_long_one_starts_short(
    exported: Exported, machine: Topology
) -> None:
    with Omni(speak_config(exported), **_engine(machine)) as omni:
        adapter = engine_of(omni).program
        assert isinstance(adapter, SpeechAdapter)
        assert adapter.adaptive_chunks
        short = _drain(omni.generate("Hello from the edge."))
        long = _drain(omni.generate(LONG_TEXT[:300]))
    *chunks, final = short
    frames = sum(chunk["pcm"].size for chunk in chunks) // 256
    assert 0 < frames <= WHOLE_FRAMES
    decoder = [step for step in final["metrics"]["steps"] if step["stage"] == "decoder"]
    assert [(step["kept"], step["chunk"]) for step in decoder] == [(frames, 0)]
    # Sized windows: the one call decodes the utterance's frames, no context beyond them.
    assert decoder[0]["window"] == frames
    assert len(chunks) == 1
    # Longer than that: the first chunk stays short, so the first audio comes early.
    first_long = long[0]["pcm"].size // 256
    assert first_long == DEFAULT_SCHEDULE[0]


def test_a_calls_fixed_cost_is_not_spread_over_its_frames() -> None:
    pacer = _Pacer((32, 64, 128, 256, 512), context_frames=40, call_frames=10)
    pacer.next_size(0.0, first=True, remaining=1000)
    pacer.measured(52, 0.062)  # 62 ms: 1 ms per frame, the call counted as 10 more frames
    # The lead pays for a window of 0.6 / 1.5 / 1 ms = 400 frames, less the call's 10.
    assert pacer.next_size(0.6, first=False, remaining=968) == 350
    assert _Pacer((32,), context_frames=40).call_frames == 0


def test_deterministic_chunks_follow_the_schedule_whatever_the_timing() -> None:
    for lead in (0.0, 0.1, 10.0):
        pacer = _Pacer((16, 32, 128), context_frames=44, adaptive=False)
        sizes = [pacer.next_size(lead, first=True, remaining=1000)]
        pacer.measured(60, 0.06 if lead else 5.0)
        sizes += [pacer.next_size(lead, first=False, remaining=r) for r in (984, 952, 824, 150)]
        assert sizes == [16, 32, 128, 128, 128]
        # A short rest goes with the chunk before it, whatever the lead.
        pacer = _Pacer((16, 32, 128), context_frames=44, adaptive=False)
        pacer.next_size(lead, first=True, remaining=76)
        assert pacer.next_size(lead, first=False, remaining=60) == 60


def test_deterministic_scales_make_chunking_follow_the_schedule(
    adapter: SpeechAdapter, exported: Exported
) -> None:
    assert adapter.adaptive_chunks
    config = speak_config(exported, scales="deterministic")
    assert config.adapter is not None
    assert not SpeechAdapter(config, config.adapter.options).adaptive_chunks
