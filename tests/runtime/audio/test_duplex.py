"""The full-duplex stream on ALSA null devices, and every refusal.

ALSA's null device opens for duplex (input and output on one PortAudio stream) and runs
unpaced: the callback is called as fast as it returns, the output goes nowhere and the input
holds whatever the device hands over. That is enough for the plumbing (replies, controls,
the captured pairs, the echo canceller's frames, closing) and for the errors; what is heard
and when is checked on JACK (``test_duplex_jack.py``). Runs here are kept short: an unpaced
stream keeps one core busy.
"""

from __future__ import annotations

import gc
import itertools
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from runtime.audio import (
    AudioDeviceError,
    PlaybackBufferFull,
    SampleRing,
    UnknownAudioDevice,
    list_input_devices,
    list_output_devices,
    open_stream_count,
)
from runtime.audio.duplex import (
    CapturedBlock,
    DuplexAudio,
    PassThroughEchoCanceller,
    ReplyPlayback,
)
from runtime.audio.input import SILENCE_DBFS
from runtime.errors import EXIT_FAILED, EXIT_USAGE, RequestCancelled, UsageError

RATE = 22050


def tone(seconds: float, rate: int = RATE) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def wait_for(condition: object, timeout: float = 5.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def test_a_reply_plays_and_is_captured_as_the_reference(
    alsa_null: Path, thread_baseline: None
) -> None:
    pcm = tone(0.3)
    canceller = PassThroughEchoCanceller(160)
    # The capture queue holds the first 30 s of the unpaced device's time, so the blocks
    # that carried the reply are still there when they are read.
    with DuplexAudio("default", echo_canceller=canceller, queue_s=30.0) as duplex:
        metrics = duplex.metrics()
        assert metrics.host_api == "ALSA"
        assert metrics.device_rate == duplex.device_rate > 0
        assert metrics.input_channels == 1
        assert metrics.output_channels == 2
        assert open_stream_count() == 1
        duplex.begin_reply("hello")
        for start in range(0, pcm.size, 1000):
            assert duplex.feed(pcm[start : start + 1000])
        duplex.end_reply()
        assert duplex.wait_reply("hello", 5.0)
        # (The unpaced device outruns a chunked feed: underruns are checked on JACK.)
        reply = duplex.reply("hello")
        assert reply == ReplyPlayback(
            reply_id="hello",
            sample_rate=RATE,
            fed=pcm.size,
            discarded=0,
            played=pcm.size,
            first_sample_at=reply.first_sample_at,
            output_latency_s=metrics.output_latency_s,
            ended=True,
            finished=True,
            interrupted=False,
        )
        assert reply.first_sample_at is not None
        assert duplex.played_samples("hello") == pcm.size
        blocks: list[CapturedBlock] = []
        far_energy = 0.0
        while far_energy < 0.9 * float(np.sum(tone(0.3, 16000) ** 2)):
            block = duplex.read(timeout=2.0)
            assert block is not None
            blocks.append(block)
            far_energy += float(np.sum(block.far.astype(np.float64) ** 2))
        level = duplex.level()
        assert SILENCE_DBFS <= level.rms_dbfs <= level.peak_dbfs <= 0.0
    assert open_stream_count() == 0
    for earlier, later in itertools.pairwise(blocks):
        assert later.position == earlier.position + earlier.near.size
    for block in blocks:
        assert block.sample_rate == 16000
        assert block.near.dtype == block.far.dtype == np.float32
        assert block.near.shape == block.far.shape
        # Whole frames of the canceller: it cleaned every sample of near.
        assert block.near.size % 160 == 0
        assert block.echo_cancelled
        assert np.isfinite(block.near).all()
        assert SILENCE_DBFS <= block.rms_dbfs <= block.peak_dbfs <= 0.0
        assert block.captured_at >= block.started_at - 1.0
    assert canceller.frames_processed * 160 >= sum(block.near.size for block in blocks)
    # The reference is the reply as played, 22.05 kHz -> device rate -> 16 kHz (where the
    # unpaced device ran dry mid-reply, the conversion rings a little past its 0.3 peak).
    far = np.concatenate([block.far for block in blocks])
    assert 0.28 < np.abs(far).max() < 0.4


def test_duck_holds_resume_continues_and_interrupt_drops(
    alsa_null: Path, thread_baseline: None
) -> None:
    # The unpaced device may play a whole reply before a control arrives: what is held and
    # dropped where is measured on JACK; here the controls' bookkeeping is checked.
    with DuplexAudio("default", fade_s=0.005) as duplex:
        duplex.begin_reply("long")
        assert duplex.feed(tone(2.0))
        duplex.end_reply()
        wait_for(lambda: duplex.played_samples("long") > 0)
        called = time.monotonic()
        duplex.duck()
        silent_at = duplex.wait_silent(2.0)
        assert silent_at is not None
        assert silent_at >= called
        assert duplex.metrics().held
        assert duplex.metrics().gain == 0.0
        assert duplex.metrics().silent_at == silent_at
        assert duplex.metrics().silence_requested_at == pytest.approx(called, abs=0.01)
        held = duplex.played_samples("long")
        time.sleep(0.05)
        assert duplex.played_samples("long") == held
        duplex.resume()
        assert duplex.wait_silent(0.0) is None, "resumed: no silence to wait for"
        assert duplex.wait_reply("long", 5.0)
        assert duplex.played_samples("long") == 2 * RATE
        assert not duplex.reply("long").interrupted
        duplex.begin_reply("cut")
        assert duplex.feed(tone(2.0))
        assert duplex.interrupt() == ("cut",)
        assert duplex.wait_silent(2.0) is not None
        # Feeds of the interrupted reply are discarded; once it is ended, it is over.
        assert duplex.feed(tone(0.5)) is False
        assert not duplex.reply("cut").finished, "open until its producer ends it"
        duplex.end_reply()
        assert duplex.wait_reply("cut", 2.0)
        reply = duplex.reply("cut")
        assert reply.interrupted
        assert reply.finished
        assert reply.discarded == round(0.5 * RATE)
        assert reply.fed == 2 * RATE
        assert reply.played <= reply.fed
        # The next reply plays whole, at full gain.
        duplex.begin_reply("next")
        assert duplex.feed(tone(0.2))
        duplex.end_reply()
        assert duplex.wait_reply("next", 5.0)
        assert duplex.reply("next").played == duplex.reply("next").fed
        assert not duplex.reply("next").interrupted
        assert duplex.metrics().gain == 1.0


def test_an_underrun_is_a_dry_ring_inside_a_reply_not_silence_between_replies(
    alsa_null: Path,
) -> None:
    with DuplexAudio("default") as duplex:
        duplex.begin_reply("slow")
        duplex.feed(tone(0.2))
        # The unpaced device drains the ring long before more comes: an underrun.
        wait_for(lambda: duplex.metrics().underruns >= 1)
        assert duplex.metrics().underrun_seconds > 0.0
        duplex.feed(tone(0.2))
        duplex.end_reply()
        assert duplex.wait_reply("slow", 5.0)
        assert duplex.played_samples("slow") == round(0.4 * RATE)
        underruns = duplex.metrics().underruns
        before = duplex.metrics().frames
        wait_for(lambda: duplex.metrics().frames > before + duplex.device_rate)
        assert duplex.metrics().underruns == underruns, "silence between replies"


def test_an_interrupted_open_reply_is_closed_by_the_next_one(alsa_null: Path) -> None:
    with DuplexAudio("default") as duplex:
        duplex.begin_reply("first")
        duplex.feed(tone(1.0))
        assert duplex.interrupt() == ("first",)
        duplex.begin_reply("second")
        assert duplex.feed(tone(0.1))
        duplex.end_reply()
        assert duplex.wait_reply("second", 5.0)
        first = duplex.reply("first")
        assert first.ended
        assert first.finished
        assert first.interrupted
        assert duplex.interrupt() == (), "nothing left to interrupt"
        assert duplex.wait_silent(2.0) is not None


def test_a_full_buffer_while_ducked_times_out(alsa_null: Path) -> None:
    with DuplexAudio("default", buffer_s=0.25, cushion_s=0.1) as duplex:
        duplex.duck()
        assert duplex.wait_silent(2.0) is not None
        duplex.begin_reply("waits")
        with pytest.raises(PlaybackBufferFull, match=r"stayed full for 0.05 s .* 'waits'"):
            duplex.feed(tone(1.0), timeout_s=0.05)


def test_close_ends_a_waiting_reader_and_twice_is_harmless(
    alsa_null: Path, thread_baseline: None
) -> None:
    duplex = DuplexAudio("default", queue_s=0.2)
    duplex.start()
    seen: list[int] = []

    def consume() -> None:
        while (block := duplex.read()) is not None:
            seen.append(block.near.size)

    reader = threading.Thread(target=consume, name="duplex reader")
    reader.start()
    time.sleep(0.1)
    duplex.close()
    reader.join(2.0)
    assert not reader.is_alive(), "the reader must see the end once the stream closed"
    assert seen
    assert duplex.read(timeout=0.1) is None
    assert duplex.ended
    assert duplex.closed
    duplex.close()
    assert open_stream_count() == 0
    with pytest.raises(UsageError, match="was closed"):
        duplex.start()
    with pytest.raises(RequestCancelled, match="closed"):
        duplex.begin_reply("late")
    with pytest.raises(RequestCancelled, match="closed"):
        duplex.feed(tone(0.1))


def test_a_forgotten_stream_is_closed_by_its_finalizer(alsa_null: Path) -> None:
    duplex = DuplexAudio("default")
    duplex.start()
    assert open_stream_count() == 1
    del duplex
    gc.collect()
    assert open_stream_count() == 0


# The callback's own error is reported by CFFI as unraisable: here it is the point.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_failing_device_ends_the_stream_with_a_clear_error(alsa_null: Path) -> None:
    duplex = DuplexAudio("default")
    duplex.start()
    try:
        duplex.begin_reply("cut")
        # The callback fails (as a broken driver would end the stream): PortAudio aborts it.
        shared = duplex._duplex
        assert shared is not None
        shared.mic = None  # type: ignore[assignment]
        wait_for(shared.finished.is_set)
        with pytest.raises(AudioDeviceError, match="ended unexpectedly") as error:
            duplex.feed(tone(0.1))
        assert "default" in str(error.value)
        while duplex.read(timeout=1.0) is not None:
            pass
        assert duplex.ended
    finally:
        duplex.close()


def test_an_unknown_device_names_it_and_what_is_available(alsa_null: Path) -> None:
    duplex = DuplexAudio("studio headset")
    with pytest.raises(UnknownAudioDevice, match="no audio input device matches") as error:
        duplex.start()
    assert "'studio headset'" in str(error.value)
    for device in list_input_devices():
        assert device.describe() in str(error.value)
    assert error.value.exit_code == EXIT_USAGE
    pair = DuplexAudio(("default", "studio speaker"))
    with pytest.raises(UnknownAudioDevice, match="no audio output device matches") as error:
        pair.start()
    for device in list_output_devices():
        assert device.describe() in str(error.value)
    with pytest.raises(UnknownAudioDevice, match="input device index 999 does not exist"):
        DuplexAudio((999, "default")).start()


def test_no_device_at_all_is_said(no_audio_devices: None) -> None:
    with pytest.raises(AudioDeviceError, match="no audio input device was found") as error:
        DuplexAudio().start()
    assert error.value.exit_code == EXIT_FAILED


def test_a_rate_neither_side_accepts_names_both(alsa_null: Path) -> None:
    duplex = DuplexAudio("default", device_rate=1)
    with pytest.raises(AudioDeviceError, match=r"accept none of the sample rates \[1\] Hz") as e:
        duplex.start()
    assert "audio input " in str(e.value)
    assert "default (ALSA, 128 ch in" in str(e.value)
    assert "default (ALSA, 128 ch," in str(e.value)
    assert open_stream_count() == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"input_channels": 1000}, r"input channel\(s\); input_channels=1000 was requested"),
        ({"output_channels": 1000}, r"output channel\(s\); output_channels=1000 was requested"),
    ],
)
def test_too_many_channels_names_the_device(
    alsa_null: Path, options: dict[str, int], message: str
) -> None:
    with pytest.raises(UsageError, match=message) as error:
        DuplexAudio("default", **options).start()  # type: ignore[arg-type]
    assert "default" in str(error.value)


class NoFrames:
    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        return near


class NoProcess:
    frame_samples = 160


class WrongShape:
    frame_samples = 160

    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        return near[:10]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"device": 1.5}, "device must be a name, an index, None or an"),
        ({"device": ("default",)}, r"device as a pair must be \(input, output\); got 1 item"),
        ({"device": ("default", True)}, "device must be a name, an index"),
        ({"reply_rate": 0}, "reply_rate must be a positive int"),
        ({"sample_rate": 16000.0}, "sample_rate must be a positive int"),
        ({"device_rate": -1}, "device_rate must be a positive int"),
        ({"input_channels": 0}, "input_channels must be a positive int"),
        ({"output_channels": True}, "output_channels must be a positive int"),
        ({"block_frames": 8}, "block_frames must be an int from 16 to 16384"),
        ({"fade_s": 0}, "fade_s must be a positive number of seconds"),
        ({"cushion_s": float("nan")}, "cushion_s must be a positive number"),
        ({"buffer_s": 0.1}, r"buffer_s \(0.1\) must be at least twice cushion_s"),
        ({"queue_s": -1.0}, "queue_s must be a positive number"),
        ({"latency": "lowest"}, "latency must be 'low', 'high' or seconds"),
        ({"latency": 0}, "latency must be a positive number"),
        ({"echo_canceller": NoFrames()}, "frame_samples, a positive int; got None from NoFrames"),
        ({"echo_canceller": NoProcess()}, r"must have process\(near, far\); NoProcess has not"),
    ],
)
def test_bad_options_are_refused(options: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        DuplexAudio(**options)  # type: ignore[arg-type]


def test_a_canceller_returning_the_wrong_shape_is_named(alsa_null: Path) -> None:
    with DuplexAudio("default", echo_canceller=WrongShape()) as duplex:
        with pytest.raises(UsageError, match=r"WrongShape returned \(10,\) for a frame of 160"):
            duplex.read(timeout=2.0)


def test_the_pass_through_canceller_checks_its_frames() -> None:
    with pytest.raises(UsageError, match="frame_samples must be a positive int"):
        PassThroughEchoCanceller(0)
    with pytest.raises(UsageError, match="frame_samples must be a positive int"):
        PassThroughEchoCanceller(160.0)  # type: ignore[arg-type]
    canceller = PassThroughEchoCanceller(4)
    near = np.arange(4, dtype=np.float32)
    cleaned = canceller.process(near, np.zeros(4, np.float32))
    assert np.array_equal(cleaned, near)
    assert cleaned is not near
    with pytest.raises(UsageError, match=r"two frames of 4 samples; got \(3,\)"):
        canceller.process(near[:3], near[:3])


def test_use_before_start_is_refused() -> None:
    duplex = DuplexAudio()
    for call in (
        duplex.read,
        duplex.duck,
        duplex.resume,
        duplex.interrupt,
        duplex.metrics,
        duplex.level,
        duplex.wait_silent,
        lambda: duplex.begin_reply("early"),
        lambda: duplex.feed(tone(0.1)),
        duplex.end_reply,
    ):
        with pytest.raises(UsageError, match="not started"):
            call()
    assert duplex.block_duration_s == 0.0
    duplex.close()


def test_misuse_of_replies_is_refused(alsa_null: Path) -> None:
    with DuplexAudio("default") as duplex:
        with pytest.raises(UsageError, match="already started"):
            duplex.start()
        with pytest.raises(UsageError, match=r"feed\(\) needs an open reply; call begin_reply"):
            duplex.feed(tone(0.1))
        with pytest.raises(UsageError, match=r"end_reply\(\) needs an open reply"):
            duplex.end_reply()
        with pytest.raises(UsageError, match=r"wait_silent\(\) needs a duck\(\) or interrupt"):
            duplex.wait_silent()
        with pytest.raises(UsageError, match="reply_id must be a non-empty str"):
            duplex.begin_reply("")
        with pytest.raises(UsageError, match="sample_rate must be a positive int"):
            duplex.begin_reply("a", sample_rate=0)
        duplex.begin_reply("a", sample_rate=24000)
        with pytest.raises(UsageError, match=r"reply 'a' is still open; call end_reply\(\)"):
            duplex.begin_reply("b")
        with pytest.raises(UsageError, match="1-D float32 NumPy array"):
            duplex.feed(np.zeros(10, np.float64))
        with pytest.raises(UsageError, match="1-D float32 NumPy array"):
            duplex.feed(np.zeros((10, 2), np.float32))
        with pytest.raises(UsageError, match="NaN or infinite"):
            duplex.feed(np.full(10, np.nan, np.float32))
        assert duplex.feed(tone(0.1, 24000))
        duplex.end_reply()
        assert duplex.reply("a").sample_rate == 24000
        with pytest.raises(UsageError, match="reply id 'a' was already used"):
            duplex.begin_reply("a")
        with pytest.raises(UsageError, match="no reply 'z' was begun; the latest are: 'a'"):
            duplex.reply("z")
        with pytest.raises(UsageError, match="no reply 'z' was begun"):
            duplex.wait_reply("z")


def test_ring_discard_skips_only_what_is_readable() -> None:
    ring = SampleRing(8)
    assert ring.write(np.arange(6, dtype=np.float32)) == 6
    assert ring.discard(4) == 4
    assert ring.discard(10) == 2
    assert ring.discard(1) == 0
    assert ring.write(np.arange(10, 15, dtype=np.float32)) == 5
    out = np.zeros((5, 1), np.float32)
    assert ring.read_into(out, 5) == 5
    assert out[:, 0].tolist() == [10, 11, 12, 13, 14]
