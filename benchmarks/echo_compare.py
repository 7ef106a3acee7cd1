"""Echo cancellers compared on a simulated loudspeaker-to-microphone path, with real speech.

    .venv/bin/python benchmarks/echo_compare.py [--quick]

The far end (what the loudspeaker plays) is a reply spoken by the bundled Piper voice joe; the
microphone picks it up through :class:`runtime.audio.echo.EchoPath` (delay, gain, a short
decaying room response, noise at -60 dBFS) and, for a while in the middle of the reply, the
user speaks a different sentence (double talk). Every canceller gets the same 10 ms frames.

Per canceller and path it reports:

* ``erle_db``: echo return loss enhancement, 10 log10(echo energy in / energy out), over the
  echo-only audio from 2 s after the reply started (converged), before the double talk (the
  output's noise counts: ``erle_ceiling_db`` is what a perfect canceller that leaves the noise
  would reach; more means the canceller also suppresses noise);
  ``erle_after_dt_db`` the same over the echo-only audio after the double talk (did the user's
  voice disturb the filter?); ``erle_first_s_db`` over the reply's first second.
* ``converge_10db_s`` / ``converge_20db_s``: seconds from the reply's start to the end of the
  first 250 ms window whose ERLE reaches 10 / 20 dB (None: never).
* ``latency_ms``: the output's delay against the input (by correlation, on the user's voice
  alone); ``near_alone_snr_db`` / ``near_alone_corr``: the user's voice alone (nothing played)
  in and out, delay removed: how much the canceller changes speech without any echo (the
  high-pass filter counts against it).
* ``near_snr_in_db`` / ``near_snr_out_db`` / ``near_corr``: during the double talk, the user's
  clean speech against what is not it (echo and noise in; echo, noise and distortion out, delay
  removed), and the correlation of the output with the clean speech.
* ``cpu_us_per_frame``: process CPU time per 10 ms frame, the call through the binding with its
  checks and conversions, the least of three runs.
* Silero VAD (the product's model, in process, the stage's chunking and state) on the output:
  ``echo_vad_max`` / ``echo_vad_max_converged`` the highest speech probability over echo-only
  chunks (all / from 2 s on), ``echo_vad_over`` the share of echo-only chunks at 0.5 or more,
  ``false_starts`` the speech starts the VAD's detector (threshold 0.5, 250 ms minimum) reports
  before the user speaks: each would be a false barge-in; ``near_detected`` the share of the
  user's voiced chunks (voiced alone) still voiced in the output, ``near_start_delay_s`` how
  long after the user starts the detector reports speech.

Writes ``benchmarks/results/echo-compare.json`` and prints a table. A canceller whose library is
not installed is listed as skipped with the reason. ``livekit`` (WebRTC's module through the
LiveKit SDK) is measured when that package is importable; the runtime does not use it.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from runtime.audio.echo import (
    FRAME_SAMPLES,
    SAMPLE_RATE,
    EchoCancellerUnavailable,
    EchoPath,
    NoEchoCanceller,
    SpeexEchoCanceller,
    WebRtcEchoCanceller,
)
from runtime.audio.levels import sound_span

if TYPE_CHECKING:
    from collections.abc import Callable

    import onnxruntime as ort

RESULTS: Final = Path(__file__).resolve().parent / "results" / "echo-compare.json"
REPLY: Final = (
    "Sure, here is the plan for tomorrow. We leave the house at eight, drive to the station, "
    "and take the early train to the city. After lunch we can visit the museum, and in the "
    "evening we will meet your sister for dinner near the river."
)
USER: Final = "Wait, stop. What time does the train leave?"
LEAD_S: Final = 0.5
#: The user starts speaking this long into the reply.
USER_AT_S: Final = 5.0
CONVERGED_S: Final = 2.0
#: Both voices peak here (about -20 dBFS RMS), so echo plus user stays within [-1, 1].
SPEECH_PEAK: Final = 0.5
NOISE_RMS: Final = 0.001
WINDOW_FRAMES: Final = 25
#: CPU time is the least of this many runs (the machine may be busy with other work).
TIMING_RUNS: Final = 3
MAX_LAG: Final = SAMPLE_RATE * 30 // 1000
VAD_CHUNK: Final = 512


@dataclass(frozen=True)
class Path_:
    name: str
    delay_s: float
    gain: float
    room_s: float
    rt60_s: float = 0.15


PATHS: Final = (
    Path_("20ms x0.3 direct", 0.02, 0.3, 0.0),
    Path_("80ms x0.5 room", 0.08, 0.5, 0.06),
    Path_("150ms x0.8 room", 0.15, 0.8, 0.06),
    # Beyond Speex's default 256 ms filter: what a longer output latency does.
    Path_("300ms x0.5 room", 0.30, 0.5, 0.06),
)


# -- speech --------------------------------------------------------------------------------------


def speak(text: str) -> np.ndarray:
    """The voice joe saying ``text`` deterministically, 16 kHz float32, trimmed, peaks at
    SPEECH_PEAK."""
    import soxr
    from piper import PiperVoice, SynthesisConfig

    from runtime.adapters.voice_export import find_voice

    voice = find_voice("joe")
    piper = PiperVoice.load(voice.model_path, voice.config_path)
    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    audio = np.concatenate([c.audio_float_array for c in piper.synthesize(text, config)])
    audio = soxr.resample(audio, piper.config.sample_rate, SAMPLE_RATE).astype(np.float32)
    start, end = sound_span(audio, FRAME_SAMPLES)
    audio = audio[start:end]
    return (audio * (SPEECH_PEAK / np.abs(audio).max())).astype(np.float32)


@dataclass(frozen=True)
class Scene:
    far: np.ndarray
    echo: np.ndarray
    noise: np.ndarray
    near: np.ndarray
    mic: np.ndarray
    reply_start: int
    reply_end: int
    user_start: int
    user_end: int


def scene(reply: np.ndarray, user: np.ndarray, path: Path_) -> Scene:
    lead = round(LEAD_S * SAMPLE_RATE)
    total = lead + reply.size + lead
    total += -total % FRAME_SAMPLES
    far = np.zeros(total, np.float32)
    far[lead : lead + reply.size] = reply
    echo_path = EchoPath(
        delay_s=path.delay_s, gain=path.gain, room_s=path.room_s, rt60_s=path.rt60_s, seed=7
    )
    echo = echo_path.pickup(far)
    noise = np.random.default_rng(11).standard_normal(total).astype(np.float32) * NOISE_RMS
    near = np.zeros(total, np.float32)
    user_start = lead + round(USER_AT_S * SAMPLE_RATE)
    near[user_start : user_start + user.size] = user
    return Scene(
        far=far,
        echo=echo,
        noise=noise,
        near=near,
        mic=echo + noise + near,
        reply_start=lead,
        reply_end=lead + reply.size + echo_path.delay_samples + echo_path.impulse_response.size,
        user_start=user_start,
        user_end=user_start + user.size,
    )


# -- cancellers ------------------------------------------------------------------------------------


class LiveKitApm:
    """WebRTC's audio processing module (AEC3) through livekit.rtc, 10 ms int16 frames."""

    kind = "livekit"
    frame_samples = FRAME_SAMPLES
    sample_rate = SAMPLE_RATE

    def __init__(self) -> None:
        try:
            from livekit import rtc
        except ImportError:
            raise EchoCancellerUnavailable(
                "livekit is not installed (pip install livekit)"
            ) from None
        self._rtc = rtc
        self._apm = rtc.AudioProcessingModule(echo_cancellation=True)
        self._apm.set_stream_delay_ms(0)

    def _frame(self, samples: np.ndarray) -> Any:
        pcm = np.clip(samples * 32768.0, -32768, 32767).astype(np.int16)
        return self._rtc.AudioFrame(pcm.tobytes(), SAMPLE_RATE, 1, FRAME_SAMPLES)

    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        far_frame = self._frame(far)
        self._apm.process_reverse_stream(far_frame)
        near_frame = self._frame(near)
        self._apm.process_stream(near_frame)
        return np.frombuffer(near_frame.data, np.int16).astype(np.float32) / 32768.0

    def reset(self) -> None:
        self._apm = self._rtc.AudioProcessingModule(echo_cancellation=True)

    def close(self) -> None:
        pass


CANDIDATES: Final[dict[str, Callable[[], Any]]] = {
    "none": NoEchoCanceller,
    "webrtc (pywebrtc-audio AEC3)": WebRtcEchoCanceller,
    "livekit (WebRTC APM AEC3)": LiveKitApm,
    "speex (libspeexdsp1 MDF+RES)": SpeexEchoCanceller,
    "speex linear only (MDF)": lambda: SpeexEchoCanceller(residual_suppression=False),
}


def run_canceller(canceller: Any, mic: np.ndarray, far: np.ndarray) -> tuple[np.ndarray, float]:
    out = np.empty_like(mic)
    frames = mic.size // FRAME_SAMPLES
    started = time.process_time()
    for index in range(frames):
        span = slice(index * FRAME_SAMPLES, (index + 1) * FRAME_SAMPLES)
        out[span] = canceller.process(mic[span], far[span])
    cpu = time.process_time() - started
    canceller.close()
    return out, cpu / frames * 1e6


# -- measures --------------------------------------------------------------------------------------


def vad_session() -> ort.InferenceSession:
    import onnxruntime as ort

    from runtime.adapters.vad_bundle import find_vad_model

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(
        str(find_vad_model().path), options, providers=["CPUExecutionProvider"]
    )


def vad(session: ort.InferenceSession, audio: np.ndarray) -> tuple[np.ndarray, list[Any]]:
    """Silero's probability per 512-sample chunk and the detector's events (defaults)."""
    from runtime.adapters.vad import VadStream

    def call(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        probability, state = session.run(["output", "stateN"], inputs)
        return {"output": probability, "stateN": state}

    stream = VadStream(keep_probabilities=True)
    events = stream.run(audio, call, last=True)
    return np.asarray(stream.probabilities), events


def db(numerator: float, denominator: float) -> float:
    return float(10 * np.log10(max(numerator, 1e-20) / max(denominator, 1e-20)))


def frame_energy(signal: np.ndarray) -> np.ndarray:
    frames = signal[: signal.size // FRAME_SAMPLES * FRAME_SAMPLES].astype(np.float64)
    return np.sum(frames.reshape(-1, FRAME_SAMPLES) ** 2, axis=1)


def best_lag(clean: np.ndarray, out: np.ndarray, start: int, end: int) -> int:
    """The output's delay in samples against the clean speech (0 to 30 ms, by correlation)."""
    reference = clean[start:end].astype(np.float64)
    return max(
        range(0, MAX_LAG + 1),
        key=lambda lag: float(np.dot(reference, out[start + lag : end + lag])),
    )


def near_measures(clean: np.ndarray, out: np.ndarray) -> tuple[float, float]:
    """SNR of the clean speech against the output's difference from it, and the correlation."""
    clean64 = clean.astype(np.float64)
    snr = db(np.sum(clean64**2), np.sum((out - clean64) ** 2))
    return snr, float(np.corrcoef(clean64, out)[0, 1])


def measure(
    s: Scene, out: np.ndarray, alone: np.ndarray, session: ort.InferenceSession
) -> dict[str, Any]:
    """``out``: the canceller's output for the scene; ``alone``: for the user's voice alone
    (no reply playing), which gives the output's latency and how it changes the voice."""
    echo_in = frame_energy(s.echo)
    residual = frame_energy(out)
    frame = np.arange(echo_in.size)
    start = s.reply_start // FRAME_SAMPLES
    converged = (s.reply_start + round(CONVERGED_S * SAMPLE_RATE)) // FRAME_SAMPLES
    user_from, user_to = s.user_start // FRAME_SAMPLES, s.user_end // FRAME_SAMPLES
    end = s.reply_end // FRAME_SAMPLES
    active = echo_in > echo_in.max() * 1e-4
    before = active & (frame >= converged) & (frame < user_from)
    after = active & (frame >= user_to + 25) & (frame < end)
    first = active & (frame >= start) & (frame < start + 100)
    noise = frame_energy(s.noise)
    result: dict[str, Any] = {
        "erle_ceiling_db": db(echo_in[before].sum(), noise[before].sum()),
        "erle_db": db(echo_in[before].sum(), residual[before].sum()),
        "erle_after_dt_db": db(echo_in[after].sum(), residual[after].sum()),
        "erle_first_s_db": db(echo_in[first].sum(), residual[first].sum()),
    }
    for goal in (10, 20):
        reached = None
        for last in range(start + WINDOW_FRAMES, user_from):
            window = slice(last - WINDOW_FRAMES, last)
            mask = active[window]
            if mask.sum() < WINDOW_FRAMES // 2:
                continue
            if db(echo_in[window][mask].sum(), residual[window][mask].sum()) >= goal:
                reached = round((last - start) * FRAME_SAMPLES / SAMPLE_RATE, 3)
                break
        result[f"converge_{goal}db_s"] = reached
    lag = best_lag(s.near, alone, s.user_start, s.user_end)
    user = slice(s.user_start, s.user_end)
    shifted = slice(s.user_start + lag, s.user_end + lag)
    clean = s.near[user]
    result["latency_ms"] = lag / SAMPLE_RATE * 1000
    result["near_alone_snr_db"], result["near_alone_corr"] = near_measures(clean, alone[shifted])
    result["near_snr_in_db"], _ = near_measures(clean, s.mic[user])
    result["near_snr_out_db"], result["near_corr"] = near_measures(clean, out[shifted])
    probabilities, events = vad(session, out)
    clean_probabilities, _ = vad(session, s.near)
    chunk = np.arange(probabilities.size)
    chunk_start, chunk_end = chunk * VAD_CHUNK, (chunk + 1) * VAD_CHUNK
    in_reply = (chunk_end > s.reply_start) & (chunk_start < s.reply_end)
    near_free = (chunk_end <= s.user_start - 0.1 * SAMPLE_RATE) | (
        chunk_start >= s.user_end + 0.6 * SAMPLE_RATE
    )
    echo_only = in_reply & near_free
    settled = echo_only & (chunk_start >= s.reply_start + CONVERGED_S * SAMPLE_RATE)
    voiced = clean_probabilities >= 0.5
    starts = [e for e in events if type(e).__name__ == "SpeechStarted"]
    false_starts = [e for e in starts if e.t < s.user_start / SAMPLE_RATE - 0.1]
    false_starts += [e for e in starts if e.t > s.user_end / SAMPLE_RATE + 0.6]
    user_starts = [
        e
        for e in starts
        if s.user_start / SAMPLE_RATE - 0.1 <= e.t <= s.user_end / SAMPLE_RATE + 0.6
    ]
    result.update(
        echo_vad_max=float(probabilities[echo_only].max()),
        echo_vad_max_converged=float(probabilities[settled].max()),
        echo_vad_over=float(np.mean(probabilities[echo_only] >= 0.5)),
        false_starts=len(false_starts),
        near_detected=float(np.mean(probabilities[voiced] >= 0.5)),
        near_start_delay_s=(
            round(user_starts[0].detected_at - s.user_start / SAMPLE_RATE, 3)
            if user_starts
            else None
        ),
    )
    return result


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def versions() -> dict[str, str | None]:
    import importlib.metadata

    found: dict[str, str | None] = {}
    for name in ("pywebrtc-audio", "livekit", "numpy", "onnxruntime", "silero-vad"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    try:
        dpkg = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", "libspeexdsp1"],
            capture_output=True,
            text=True,
            check=False,
        )
        found["libspeexdsp1"] = dpkg.stdout.strip() or None
    except OSError:
        found["libspeexdsp1"] = None
    return found


COLUMNS: Final = (
    ("erle_ceiling_db", "ERLE ceiling", "{:.1f}"),
    ("erle_db", "ERLE dB", "{:.1f}"),
    ("erle_after_dt_db", "ERLE post-DT", "{:.1f}"),
    ("erle_first_s_db", "ERLE 1st s", "{:.1f}"),
    ("converge_10db_s", "t10dB s", "{}"),
    ("latency_ms", "latency ms", "{:.0f}"),
    ("near_alone_corr", "alone corr", "{:.2f}"),
    ("near_snr_out_db", "DT SNR out", "{:.1f}"),
    ("near_corr", "DT corr", "{:.2f}"),
    ("cpu_us_per_frame", "CPU us/10ms", "{:.0f}"),
    ("echo_vad_max", "echo VAD max", "{:.2f}"),
    ("echo_vad_max_converged", "max >2s", "{:.2f}"),
    ("echo_vad_over", "echo>=0.5", "{:.0%}"),
    ("false_starts", "false starts", "{}"),
    ("near_detected", "near detected", "{:.0%}"),
    ("near_start_delay_s", "near start s", "{}"),
)


def table(results: list[dict[str, Any]]) -> str:
    header = ["path", "canceller", *(title for _, title, _ in COLUMNS)]
    rows = [header]
    for entry in results:
        if "skipped" in entry:
            rows.append([entry["path"], entry["canceller"], f"skipped: {entry['skipped']}"])
            continue
        cells = [entry["path"], entry["canceller"]]
        for key, _, pattern in COLUMNS:
            value = entry[key]
            cells.append("-" if value is None else pattern.format(value))
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows if i < len(row)) for i in range(len(header))]
    lines = ["| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(rows[0])) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows[1:]:
        lines.append("| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(row)) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the 80 ms path")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the JSON file to write")
    args = parser.parse_args(argv)
    reply, user = speak(REPLY), speak(USER)
    session = vad_session()
    paths = PATHS[1:2] if args.quick else PATHS
    results: list[dict[str, Any]] = []
    for path in paths:
        s = scene(reply, user, path)
        for name, make in CANDIDATES.items():
            entry: dict[str, Any] = {"path": path.name, "canceller": name}
            try:
                canceller = make()
            except EchoCancellerUnavailable as error:
                entry["skipped"] = str(error)
                results.append(entry)
                continue
            out, cpu_us = run_canceller(canceller, s.mic, s.far)
            for _ in range(TIMING_RUNS - 1):
                cpu_us = min(cpu_us, run_canceller(make(), s.mic, s.far)[1])
            alone, _ = run_canceller(make(), s.near + s.noise, np.zeros_like(s.far))
            entry.update(measure(s, out, alone, session), cpu_us_per_frame=cpu_us)
            results.append(entry)
            print(f"{path.name:18} {name:30} done", file=sys.stderr)
    report = {
        "machine": {"cpu": cpu_model(), "python": platform.python_version()},
        "versions": versions(),
        "setup": {
            "sample_rate": SAMPLE_RATE,
            "frame_samples": FRAME_SAMPLES,
            "reply_s": round(reply.size / SAMPLE_RATE, 2),
            "user_s": round(user.size / SAMPLE_RATE, 2),
            "user_at_s": USER_AT_S,
            "speech_peak": SPEECH_PEAK,
            "noise_rms": NOISE_RMS,
            "paths": [path.__dict__ for path in paths],
        },
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"CPU: {report['machine']['cpu']}")
    print(table(results))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
