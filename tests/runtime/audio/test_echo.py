"""Echo cancellation: the played reply leaves the microphone signal, the user's voice stays.

The echo comes through :class:`EchoPath` (a loudspeaker 80 or 150 ms away with a short room
response and noise). Without the model: speech-shaped noise with a syllable rhythm (what an
adaptive filter learns from as it does from speech) for the cancellation depth, the streaming
and the errors. With the model (the voice joe speaking, Silero VAD listening): the echo alone
starts no speech, the user talking over the reply does.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.audio import echo
from runtime.audio.echo import (
    ECHO_KINDS,
    FRAME_SAMPLES,
    SAMPLE_RATE,
    EchoCanceller,
    EchoCancellerUnavailable,
    EchoPath,
    NoEchoCanceller,
    SpeexEchoCanceller,
    StreamEchoCanceller,
    UnknownEchoCanceller,
    make_echo_canceller,
)
from runtime.errors import RefusedError, UsageError

if TYPE_CHECKING:
    import onnxruntime as ort

    from runtime.adapters.vad import VadEvent

#: Measured on :func:`speech_noise` through the 80 ms path: WebRTC 24 dB from 0.5 s on (21 to 31
#: dB in each second from the first); Speex 47 dB from 3 s on, once converged (37 to 52 dB in
#: each second from the third). The thresholds leave 9 and 22 dB of margin.
WEBRTC_MIN_ERLE_DB = 15.0
SPEEX_MIN_ERLE_DB = 25.0
#: On the voice's reply through the 150 ms path: 29 dB measured (benchmarks/echo_compare.py: 25
#: to 34 dB on its longer reply, the noise floor of its paths).
WEBRTC_MIN_SPEECH_ERLE_DB = 20.0
VAD_THRESHOLD = 0.5
KINDS = ("webrtc", "speex", "off")


def speech_noise(seconds: float, seed: int = 0) -> np.ndarray:
    """Noise shaped like speech's long-term spectrum (80 Hz high-pass, falling 6 dB per octave
    above 500 Hz) in 4 Hz syllables, at an RMS of 0.1; deterministic for ``seed``."""
    rng = np.random.default_rng(seed)
    n = round(seconds * SAMPLE_RATE)
    spectrum = np.fft.rfft(rng.standard_normal(n))
    frequencies = np.fft.rfftfreq(n, 1 / SAMPLE_RATE)
    spectrum *= (frequencies > 80) / np.sqrt(1 + (frequencies / 500) ** 2)
    t = np.arange(n) / SAMPLE_RATE
    signal = np.fft.irfft(spectrum, n) * np.clip(0.7 * np.sin(2 * np.pi * 4 * t) + 0.5, 0, 1)
    return (0.1 * signal / np.sqrt(np.mean(signal**2))).astype(np.float32)


def by_frames(canceller: EchoCanceller, near: np.ndarray, far: np.ndarray) -> np.ndarray:
    out = np.empty_like(near)
    for begin in range(0, near.size - near.size % FRAME_SAMPLES, FRAME_SAMPLES):
        span = slice(begin, begin + FRAME_SAMPLES)
        out[span] = canceller.process(near[span], far[span])
    return out[: near.size - near.size % FRAME_SAMPLES]


def erle_db(echo_in: np.ndarray, out: np.ndarray) -> float:
    energy_in = np.sum(echo_in.astype(np.float64) ** 2)
    return float(10 * np.log10(energy_in / np.sum(out.astype(np.float64) ** 2)))


def path_80ms(**options: Any) -> EchoPath:
    return EchoPath(delay_s=0.08, gain=0.5, room_s=0.06, rt60_s=0.15, seed=3, **options)


# -- cancelling ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "from_s", "minimum_db"),
    [("webrtc", 0.5, WEBRTC_MIN_ERLE_DB), ("speex", 3.0, SPEEX_MIN_ERLE_DB)],
)
def test_the_echo_is_cancelled_beyond_the_measured_depth(
    kind: str, from_s: float, minimum_db: float
) -> None:
    far = speech_noise(6.0)
    echo_only = path_80ms().pickup(far)
    mic = path_80ms(noise_rms=0.001).pickup(far)
    canceller = make_echo_canceller(kind)
    out = by_frames(canceller, mic, far)
    canceller.close()
    converged = slice(round(from_s * SAMPLE_RATE), None)
    assert abs(erle_db(echo_only[converged], mic[converged])) < 0.1, "the raw echo loses nothing"
    assert erle_db(echo_only[converged], out[converged]) >= minimum_db


def test_every_kind_is_an_echo_canceller_of_10_ms_frames() -> None:
    for kind in KINDS:
        canceller = make_echo_canceller(kind)
        assert isinstance(canceller, EchoCanceller)
        assert (canceller.kind, canceller.frame_samples, canceller.sample_rate) == (
            kind,
            FRAME_SAMPLES,
            SAMPLE_RATE,
        )
        canceller.close()
    assert make_echo_canceller().kind == "webrtc", "auto is the measured best when installed"


def test_the_pass_through_is_the_identity() -> None:
    near, far = speech_noise(0.5, seed=1), speech_noise(0.5, seed=2)
    assert np.array_equal(by_frames(NoEchoCanceller(), near, far), near[: 50 * FRAME_SAMPLES])
    stream = StreamEchoCanceller(make_echo_canceller("off"))
    out = np.concatenate([stream.process(near[:1234], far[:1234]), stream.process(near[1234:])])
    assert np.array_equal(np.concatenate([out, stream.flush()]), near)


@pytest.mark.parametrize("kind", ["webrtc", "speex"])
def test_reset_forgets_what_was_learned(kind: str) -> None:
    far = speech_noise(1.0)
    mic = path_80ms().pickup(far)
    canceller = make_echo_canceller(kind)
    first = by_frames(canceller, mic, far)
    canceller.reset()
    assert np.array_equal(by_frames(canceller, mic, far), first)


# -- streams of any block size ------------------------------------------------------------------


@pytest.fixture(scope="module")
def frame_results() -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per kind: the microphone, the reference and the frame-by-frame output (0.4 s)."""
    far = speech_noise(0.4, seed=5)
    far = far[: far.size - 77]  # not a whole number of frames
    mic = path_80ms(noise_rms=0.001).pickup(far)
    results = {}
    for kind in KINDS:
        canceller = make_echo_canceller(kind)
        padded_mic = np.concatenate([mic, np.zeros(-mic.size % FRAME_SAMPLES, np.float32)])
        padded_far = np.concatenate([far, np.zeros(-far.size % FRAME_SAMPLES, np.float32)])
        results[kind] = (mic, far, by_frames(canceller, padded_mic, padded_far)[: mic.size])
        canceller.close()
    return results


@settings(max_examples=10, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    sizes=st.lists(st.integers(min_value=1, max_value=700), min_size=1, max_size=40),
)
def test_blocks_of_any_size_give_the_frame_by_frame_result(
    frame_results: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
    kind: str,
    sizes: list[int],
) -> None:
    mic, far, expected = frame_results[kind]
    stream = StreamEchoCanceller(make_echo_canceller(kind))
    pieces, at, index = [], 0, 0
    while at < mic.size:
        size = sizes[index % len(sizes)]
        index += 1
        pieces.append(stream.process(mic[at : at + size], far[at : at + size]))
        at += size
        delivered = sum(piece.size for piece in pieces)
        assert 0 <= min(at, mic.size) - delivered == stream.pending < FRAME_SAMPLES
    pieces.append(stream.flush())
    stream.close()
    assert np.array_equal(np.concatenate(pieces), expected)


def test_the_reference_fed_on_its_own_path_pairs_with_the_microphone(
    frame_results: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> None:
    mic, far, expected = frame_results["webrtc"]
    stream = StreamEchoCanceller(make_echo_canceller("webrtc"))
    out, mic_at = [], 0
    # The player's callback (441 samples) runs ahead of the microphone's (300 samples).
    for fed in range(441, far.size + 441, 441):
        stream.feed_reference(far[fed - 441 : fed])
        while mic_at + 300 <= fed - FRAME_SAMPLES:
            out.append(stream.process(mic[mic_at : mic_at + 300]))
            mic_at += 300
    out += [stream.process(mic[mic_at:]), stream.flush()]
    assert np.array_equal(np.concatenate(out), expected)
    # Only the last, partial frame lacked reference (silence, as the frame-by-frame run had).
    assert (stream.reference_missing, stream.reference_dropped) == (-far.size % FRAME_SAMPLES, 0)


def test_missing_reference_is_silence_and_an_overflow_drops_the_oldest() -> None:
    seen: list[np.ndarray] = []

    class Recorder(NoEchoCanceller):
        def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
            seen.append(far.copy())
            return super().process(near, far)

    stream = StreamEchoCanceller(Recorder(), max_reference_s=0.02)
    stream.process(np.zeros(FRAME_SAMPLES, np.float32))
    assert not seen[0].any()
    assert stream.reference_missing == FRAME_SAMPLES
    stream.feed_reference(np.arange(400, dtype=np.float32))
    assert stream.reference_dropped == 400 - 320
    stream.process(np.zeros(FRAME_SAMPLES, np.float32))
    assert np.array_equal(seen[1], np.arange(80, 240, dtype=np.float32))


# -- the simulated path ---------------------------------------------------------------------------


def test_the_echo_path_delays_scales_and_keeps_its_state_across_blocks() -> None:
    played = speech_noise(0.5)
    direct = EchoPath(delay_s=0.02, gain=0.4).pickup(played)
    assert np.allclose(direct[320:], 0.4 * played[:-320], atol=1e-7)
    assert not direct[:320].any()
    room = EchoPath(delay_s=0.05, gain=0.6, room_s=0.06, noise_rms=0.01, seed=9)
    assert np.sum(room.impulse_response**2) == pytest.approx(0.36)
    whole = EchoPath(delay_s=0.05, gain=0.6, room_s=0.06, noise_rms=0.01, seed=9).pickup(played)
    blocks = [room.pickup(played[a : a + 333]) for a in range(0, played.size, 333)]
    assert np.allclose(np.concatenate(blocks), whole, atol=1e-6)


# -- errors ---------------------------------------------------------------------------------------


def test_an_unknown_kind_names_the_accepted_ones() -> None:
    with pytest.raises(
        UnknownEchoCanceller, match=r"unknown echo canceller 'aec'; accepted: "
    ) as e:
        make_echo_canceller("aec")
    assert all(kind in str(e.value) for kind in ECHO_KINDS)
    assert isinstance(e.value, UsageError)


@pytest.mark.parametrize("kind", KINDS)
def test_another_sample_rate_is_refused(kind: str) -> None:
    with pytest.raises(UsageError, match=r"runs at 16000 Hz, not 48000 Hz; accepted: 16000"):
        make_echo_canceller(kind, sample_rate=48000)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("near", "message"),
    [
        (np.zeros(FRAME_SAMPLES, np.float64), r"the near frame is float64; accepted: float32"),
        (np.zeros(FRAME_SAMPLES, np.int16), r"the near frame is int16; accepted: float32"),
        ([0.0] * FRAME_SAMPLES, r"the near frame is list; accepted: float32"),
        (np.zeros(FRAME_SAMPLES + 1, np.float32), r"shape \(161,\); accepted: \(160,\)"),
        (np.zeros((FRAME_SAMPLES, 1), np.float32), r"shape \(160, 1\); accepted: \(160,\)"),
    ],
)
def test_a_frame_of_another_type_or_shape_is_refused(kind: str, near: Any, message: str) -> None:
    canceller = make_echo_canceller(kind)
    with pytest.raises(UsageError, match=message):
        canceller.process(near, np.zeros(FRAME_SAMPLES, np.float32))
    with pytest.raises(UsageError, match=message.replace("near", "far")):
        canceller.process(np.zeros(FRAME_SAMPLES, np.float32), near)
    canceller.close()


def test_a_stream_block_must_be_float32_mono() -> None:
    stream = StreamEchoCanceller(NoEchoCanceller())
    with pytest.raises(UsageError, match=r"the near block has shape \(10, 2\); accepted: one"):
        stream.process(np.zeros((10, 2), np.float32))
    with pytest.raises(UsageError, match=r"the far block is float64; accepted: float32"):
        stream.feed_reference(np.zeros(10))


@pytest.mark.parametrize("kind", ["webrtc", "speex"])
def test_a_closed_canceller_refuses_frames(kind: str) -> None:
    canceller = make_echo_canceller(kind)
    canceller.close()
    canceller.close()
    silence = np.zeros(FRAME_SAMPLES, np.float32)
    with pytest.raises(UsageError, match=f"the {kind} echo canceller is closed"):
        canceller.process(silence, silence)


def test_a_tail_outside_the_range_is_refused() -> None:
    with pytest.raises(UsageError, match=r"tail_s is 5.0; accepted: 0.01 to 2.0 seconds"):
        make_echo_canceller("speex", tail_s=5.0)


def test_a_missing_speex_library_names_the_debian_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(echo, "SPEEXDSP_LIBRARY", "libspeexdsp-absent.so.9")
    with pytest.raises(EchoCancellerUnavailable) as error:
        make_echo_canceller("speex")
    message = str(error.value)
    assert message.startswith("the speex echo canceller needs SpeexDSP (libspeexdsp-absent.so.9)")
    assert "install the Debian package libspeexdsp1 (apt-get install libspeexdsp1)" in message
    assert "accepted kinds: auto, webrtc, speex, off" in message
    assert isinstance(error.value, RefusedError)


def test_a_missing_webrtc_wheel_names_the_pip_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pywebrtc_audio", None)
    with pytest.raises(EchoCancellerUnavailable, match=r"needs the pywebrtc-audio wheel") as e:
        make_echo_canceller("webrtc")
    assert "pip install pywebrtc-audio (accepted kinds: auto, webrtc, speex, off" in str(e.value)
    # auto falls back to the second canceller; with neither, it names both.
    assert isinstance(make_echo_canceller("auto"), SpeexEchoCanceller)
    monkeypatch.setattr(echo, "SPEEXDSP_LIBRARY", "libspeexdsp-absent.so.9")
    with pytest.raises(EchoCancellerUnavailable, match=r"no echo canceller is installed: ") as e:
        make_echo_canceller("auto")
    assert "pip install pywebrtc-audio) or the Debian package libspeexdsp1" in str(e.value)
    assert "kind 'off' (headphones)" in str(e.value)
    assert isinstance(make_echo_canceller("off"), NoEchoCanceller)


# -- with the voice and the voice activity model --------------------------------------------------

REPLY = "We leave the house at eight, drive to the station, and take the early train to the city."
USER = "Wait, what time does it leave?"
LEAD_S = 0.3
#: The user starts talking this far into the reply.
USER_AT_S = 2.5


@pytest.fixture(scope="module")
def spoken() -> tuple[np.ndarray, np.ndarray]:
    return speak(REPLY, USER)


def speak(*texts: str) -> tuple[np.ndarray, ...]:
    """The voice joe saying each text, 16 kHz, trimmed, peaks at 0.5 (deterministic)."""
    import soxr
    from piper import PiperVoice, SynthesisConfig

    from runtime.adapters.voice_export import find_voice

    found = find_voice("joe")
    voice = PiperVoice.load(found.model_path, found.config_path)
    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    clips = []
    for text in texts:
        audio = np.concatenate(
            [chunk.audio_float_array for chunk in voice.synthesize(text, config)]
        )
        audio = soxr.resample(audio, voice.config.sample_rate, SAMPLE_RATE).astype(np.float32)
        loud = np.flatnonzero(np.abs(audio) > 0.01 * np.abs(audio).max())
        audio = audio[loud[0] : loud[-1] + 1]
        clips.append((0.5 * audio / np.abs(audio).max()).astype(np.float32))
    return tuple(clips)


@pytest.fixture(scope="module")
def vad_session() -> ort.InferenceSession:
    import onnxruntime as ort

    from runtime.adapters.vad_bundle import find_vad_model

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(
        str(find_vad_model().path), options, providers=["CPUExecutionProvider"]
    )


def listen(session: ort.InferenceSession, audio: np.ndarray) -> tuple[np.ndarray, list[VadEvent]]:
    """Silero's probability per 32 ms chunk and the detector's events (default settings)."""
    from runtime.adapters.vad import VadStream

    def call(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        probability, state = session.run(["output", "stateN"], inputs)
        return {"output": probability, "stateN": state}

    stream = VadStream(keep_probabilities=True)
    events = stream.run(audio, call, last=True)
    return np.asarray(stream.probabilities), events


def conversation(reply: np.ndarray, user: np.ndarray | None) -> dict[str, np.ndarray]:
    """The microphone while the reply plays over the 150 ms path (and the user talks)."""
    lead = round(LEAD_S * SAMPLE_RATE)
    total = lead + reply.size + SAMPLE_RATE // 2
    total += -total % FRAME_SAMPLES
    far = np.zeros(total, np.float32)
    far[lead : lead + reply.size] = reply
    path = dict(delay_s=0.15, gain=0.8, room_s=0.06, rt60_s=0.15, seed=4)
    echo_only = EchoPath(**path).pickup(far)
    near = np.zeros(total, np.float32)
    if user is not None:
        at = lead + round(USER_AT_S * SAMPLE_RATE)
        near[at : at + user.size] = user
    mic = EchoPath(noise_rms=0.001, **path).pickup(far) + near
    return {"far": far, "echo": echo_only, "near": near, "mic": mic}


def starts(events: list[VadEvent]) -> list[float]:
    from runtime.adapters.vad import SpeechStarted

    return [event.t for event in events if isinstance(event, SpeechStarted)]


@pytest.mark.model
def test_the_echo_of_the_reply_alone_starts_no_speech(
    spoken: tuple[np.ndarray, np.ndarray], vad_session: ort.InferenceSession
) -> None:
    scene = conversation(spoken[0], None)
    raw_probabilities, raw_events = listen(vad_session, scene["mic"])
    # Without cancelling, the echo is speech to the VAD: a barge-in at the reply's first words.
    assert raw_probabilities.max() >= 0.9
    assert starts(raw_events)
    assert starts(raw_events)[0] < LEAD_S + 0.5
    stream = StreamEchoCanceller(make_echo_canceller("webrtc"))
    out = np.concatenate([stream.process(scene["mic"], scene["far"]), stream.flush()])
    probabilities, events = listen(vad_session, out)
    assert probabilities.max() < VAD_THRESHOLD, f"echo heard as speech: {probabilities.max():.2f}"
    assert not starts(events)
    assert erle_db(scene["echo"], out) >= WEBRTC_MIN_SPEECH_ERLE_DB


@pytest.mark.model
def test_the_user_talking_over_the_reply_is_heard(
    spoken: tuple[np.ndarray, np.ndarray], vad_session: ort.InferenceSession
) -> None:
    reply, user = spoken
    scene = conversation(reply, user)
    stream = StreamEchoCanceller(make_echo_canceller("webrtc"))
    out = np.concatenate([stream.process(scene["mic"], scene["far"]), stream.flush()])
    probabilities, events = listen(vad_session, out)
    user_start = LEAD_S + USER_AT_S
    # One start, while the user talks, reported within 0.8 s (measured 0.62 s; the benchmark's
    # 0.55 to 0.68 s: the detector's 0.25 s minimum, and the canceller holding back the first
    # syllable while it tells the user from the echo).
    assert len(starts(events)) == 1
    assert user_start - 0.1 <= starts(events)[0] <= user_start + user.size / SAMPLE_RATE
    started = next(event for event in events if type(event).__name__ == "SpeechStarted")
    assert started.detected_at - user_start <= 0.8
    # Most of what the VAD hears as speech in the user's words alone it still hears (95%).
    alone, _ = listen(vad_session, scene["near"])
    voiced = alone >= VAD_THRESHOLD
    assert np.mean(probabilities[voiced] >= VAD_THRESHOLD) >= 0.7
