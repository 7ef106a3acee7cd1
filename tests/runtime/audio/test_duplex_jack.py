"""The full-duplex stream in real time, on a JACK dummy server at 48 kHz that each test starts
and stops. A JACK client (``jack_duplex_child.Probe``) records what the stream plays and feeds
its input, paced by the server's clock as a sound card would be; each scenario runs in its own
process, which also reports what it left behind."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.runtime.audio.test_input_jack import left_nothing

if TYPE_CHECKING:
    from conftest import JackServer

CHILD = Path(__file__).with_name("jack_duplex_child.py")
RATE = 22050
SERVER_RATE = 48000
#: Scheduling slack of a busy two-core machine on top of the fade and one block.
MARGIN_S = 0.010

pytestmark = pytest.mark.audio


def run(jack_server: JackServer, scenario: str) -> dict[str, Any]:
    """Run the scenario; again (up to three times) when the non-real-time server lost cycles
    (xruns, on a machine busy elsewhere), which shifts audio and proves nothing."""
    for attempt in range(3):
        result = jack_server.run_scenario(scenario, child=CHILD)
        print(f"{scenario} attempt {attempt}: xruns {result['xruns']}")
        if not result["xruns"]:
            break
    return result


def test_a_reply_fed_in_chunks_plays_bit_exact(jack_server: JackServer) -> None:
    result = run(jack_server, "play")
    print(
        f"correlation {result['correlation']:.6f}, SNR {result['snr_db']:.1f} dB, max difference "
        f"{result['max_difference']:.2e}, output latency {result['output_latency_s'] * 1e3:.1f} ms"
    )
    assert (result["host_api"], result["device_rate"]) == ("JACK Audio Connection Kit", 48000)
    assert len(result["stream_inputs"]) == 1, "one (mono) microphone port"
    assert len(result["stream_outputs"]) == result["output_channels"] == 2
    assert result["finished"]
    assert result["reply_finished"]
    assert not result["reply_interrupted"]
    assert result["first_sample_at_set"]
    # What the server received is the fed reply after the stream's own 22.05 -> 48 kHz
    # conversion, sample for sample, and nothing else was played around it.
    assert result["bit_exact"], result["max_difference"]
    assert result["correlation"] > 0.99999
    assert result["silent_outside_reply"]
    assert result["fed"] == result["played"] == result["input_samples"]
    assert result["frames_played"] == result["expected_frames"]
    assert result["underruns"] == 0
    left_nothing(result)


def test_duck_holds_resume_loses_nothing_and_interrupt_drops_the_rest(
    jack_server: JackServer,
) -> None:
    result = run(jack_server, "barge_in")
    print(
        f"duck: silent after {result['duck_latency_s'] * 1e3:.1f} ms; interrupt: silent after "
        f"{result['interrupt_latency_s'] * 1e3:.1f} ms (fade {result['fade_s'] * 1e3:.0f} ms, "
        f"block {result['block_s'] * 1e3:.1f} ms); held {result['hold_s']:.3f} s"
    )
    bound = result["fade_s"] + result["block_s"] + MARGIN_S
    # duck: silent within the fade and one block, then held: nothing more is played.
    assert 0.0 < result["duck_latency_s"] <= bound
    assert result["held_samples"] == result["still_held_samples"]
    assert result["held_gain"] == 0.0
    assert result["held_flag"]
    assert result["hold_s"] >= 0.4
    # resume: the reply goes on from the held sample. With the hold taken out, what was
    # played is the reply itself, but for the gain of the fade-out and the fade-in around the
    # held sample: no sample lost, none repeated.
    fade = result["fade_frames"]
    assert 0 < result["differences"] <= 2 * fade
    assert -fade <= result["differences_from"]
    assert result["differences_to"] < fade
    # interrupt: silent within the fade and one block; the rest of the reply is dropped.
    assert 0.0 < result["interrupt_latency_s"] <= bound
    assert result["interrupted_ids"] == ["long"]
    assert result["fed_after_interrupt"] is False
    assert result["long_dropped"]
    assert result["long_interrupted"]
    assert result["long_finished"]
    assert result["long_discarded"] == 3 * RATE - 3 * RATE * 3 // 4
    assert result["long_fed"] == 3 * RATE * 3 // 4
    assert result["long_played"] < result["long_fed"]
    assert result["long_played"] == pytest.approx(
        result["cut_played_frames"] * RATE / SERVER_RATE, abs=2
    )
    # The next reply plays whole, at full gain, and nothing of the dropped one before it.
    assert result["after_gap_frames"] == 0
    assert result["after_bit_exact"]
    assert result["after_finished"]
    assert not result["after_interrupted"]
    assert result["after_played"] == result["after_fed"]
    assert result["underruns"] == 0
    left_nothing(result)


def test_near_is_the_microphone_and_far_the_reply_at_a_constant_offset(
    jack_server: JackServer,
) -> None:
    result = run(jack_server, "capture")
    replies = result["replies"]
    print(
        f"clip in near: correlation {result['clip_correlation']:.5f}, SNR "
        f"{result['clip_snr_db']:.1f} dB; echo delays "
        f"{[replies[n].get('echo_delay') for n in replies]} samples at 16 kHz; latency in "
        f"{result['input_latency_s'] * 1e3:.1f} ms, out {result['output_latency_s'] * 1e3:.1f} ms"
    )
    for name, reply in replies.items():
        print(
            f"{name}: far correlation {reply['far_correlation']:.5f}, SNR "
            f"{reply['far_snr_db']:.1f} dB, far start - first_sample_at "
            f"{reply['far_start_vs_first_sample_at_s'] * 1e3:.2f} ms"
        )
    assert result["dropped"] == result["capture_blocks_dropped"] == 0
    assert result["positions_contiguous"]
    assert result["near_samples"] == result["far_samples"]
    # The pass-through canceller saw every sample, in whole 10 ms frames.
    assert result["echo_cancelled"]
    assert result["frame_multiples"]
    assert result["frames_cancelled"] * 160 >= result["near_samples"]
    # near: the clip the microphone heard, at 16 kHz.
    assert result["clip_correlation"] > 0.999
    assert result["clip_snr_db"] > 30.0
    for reply in replies.values():
        # far: the reply as played (22.05 -> 48 -> 16 kHz against 22.05 -> 16 kHz directly),
        # where the callback played its first sample.
        assert reply["far_correlation"] > 0.999
        assert reply["far_snr_db"] > 30.0
        assert abs(reply["far_start_vs_first_sample_at_s"]) < 0.011, "within one block"
        assert reply["played"] == reply["fed"]
    # The echo of two replies played at different times reaches near with the same delay:
    # the device offset between far and near is constant.
    second, third = replies["second"], replies["third"]
    assert second["echo_score"] > 0.9
    assert third["echo_score"] > 0.9
    assert second["echo_delay"] == third["echo_delay"]
    assert result["level_rms_dbfs"] > -40.0
    left_nothing(result)
