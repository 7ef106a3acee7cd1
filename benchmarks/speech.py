"""Speech: the streaming pipeline against one-process Piper on the same texts, side by side.

    python benchmarks/speech.py [--quick] [--out FILE]

For each text and repeat, in one run and interleaved (so a busy machine slows both alike):

* the speech pipeline (``assets/pipelines/speak.yaml``: two ONNX Runtime worker processes
  driven by the speech adapter) speaks the text through :func:`runtime.adapters.speak.speak`:
  **time to first audio** runs from the call (phonemization included) to the first PCM chunk,
  the **real-time factor** is the time to the last chunk over the audio's duration;
* Piper speaks it in this process with the installed voice (``PiperVoice.synthesize``, which
  phonemizes the whole text, then yields one chunk per sentence): its **first audio** is the
  first sentence's audio, its real-time factor the whole text's time over its duration.

Both use the voice's own noise settings. Each timed run starts :data:`SETTLE_S` after the
previous one ended: Piper's session keeps ONNX Runtime's default spinning pool, whose thread
goes on spinning on a core for about 28 ms after each run (measured here as the process's CPU
time after ``synthesize`` returned), and a run started at once shares its cores with that
spin. Medians over repeats are reported per text, and over
every run for the figures. Where the pipeline's time went comes from each request's ``timing``
(see :mod:`runtime.adapters.tts`): the medians over every run of the acoustic and decoder
calls' model and transport time, the waits for the caller and the adapter's own work, each as
a share of the request's wall time, with the decoder's window frames per kept frame, its time
per window frame and the context, schedule, windows, acoustic call shapes and overlap the
adapter chose; goals: first audio no later than Piper's first sentence, and a real-time factor
at most 1.2 times Piper's own in the same run. Goals are reported, never asserted. The JSON goes to
``benchmarks/results/speech.json`` (or ``--out``); the suite calls
:func:`run_speech_benchmark`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[1]
DEFAULT_OUT: Final = ROOT / "benchmarks" / "results" / "speech.json"
SPEAK_PIPELINE: Final = ROOT / "assets" / "pipelines" / "speak.yaml"
RATE: Final = 22050
TEXTS: Final = {
    "short": "Hello from the edge.",
    "sentence": "The quick brown fox jumps over the lazy dog, then naps in the afternoon sun.",
    "paragraph": (
        "Streaming speech starts quickly. Then its chunks grow while the audio plays. "
        "Is this one voice, cut in two and joined again, as clear as the whole?"
    ),
}
QUICK_TEXTS: Final = ("short", "paragraph")
FIRST_AUDIO_GOAL_RATIO: Final = 1.0
#: The real-time factor at most this many times Piper's own in the same run.
RTF_GOAL_RATIO: Final = 1.2
#: The pause before each timed run, so neither side runs beside what the other left spinning
#: (see the module docstring); measured on two cores, the pipeline's real-time factor for the
#: short text was 0.0645 when it started at once after Piper, 0.0558 after 200 ms and 0.0549
#: when Piper had not run.
SETTLE_S: Final = 0.1


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def _piper_run(voice: Any, text: str) -> tuple[float, float]:
    """One-process Piper: (first sentence's audio ready, real-time factor)."""
    started = time.perf_counter()
    first: float | None = None
    samples = 0
    for chunk in voice.synthesize(text):
        if first is None:
            first = time.perf_counter() - started
        samples += int(chunk.audio_float_array.size)
    total = time.perf_counter() - started
    assert first is not None
    assert samples
    return first, total / (samples / RATE)


def _pipeline_run(omni: Any, text: str) -> tuple[float, float, dict[str, Any]]:
    from runtime.adapters.speak import speak

    result = speak(omni, text)
    assert result.time_to_first_audio_s is not None
    assert result.real_time_factor is not None
    return result.time_to_first_audio_s, result.real_time_factor, dict(result.engine)


def measure(*, quick: bool, progress: Any = None) -> dict[str, Any]:
    """Run the comparison; returns the JSON document (see the module docstring)."""
    from piper import PiperVoice

    from runtime.adapters.voice_export import ensure_voice_bundles, find_voice
    from runtime.api import Omni
    from runtime.config import load_pipeline
    from runtime.devices import DeviceSelection, discover_topology

    report = progress or (lambda line: None)
    repeats = 2 if quick else 5
    names = QUICK_TEXTS if quick else tuple(TEXTS)
    ensure_voice_bundles("joe", progress=report)
    installed = find_voice("joe")
    piper = PiperVoice.load(installed.model_path, installed.config_path)
    load_before = _load_average()
    per_text: dict[str, dict[str, list[float]]] = {
        name: {"first": [], "rtf": [], "piper_first": [], "piper_rtf": []} for name in names
    }
    engine_first: list[float] = []
    timings: list[dict[str, Any]] = []
    chosen: dict[str, Any] = {}
    config = load_pipeline(SPEAK_PIPELINE)
    started = time.perf_counter()
    with Omni(config, topology=discover_topology(), selection=DeviceSelection()) as omni:
        start_s = time.perf_counter() - started
        # Untimed warm-up of both: first calls pay for allocations and caches.
        _pipeline_run(omni, TEXTS["short"])
        _piper_run(piper, TEXTS["short"])
        for repeat in range(repeats):
            for name in names:
                text = TEXTS[name]
                runs = per_text[name]
                # Alternate which goes first, so neither always runs on a fresher cache.
                order = ("pipeline", "piper") if repeat % 2 == 0 else ("piper", "pipeline")
                for which in order:
                    time.sleep(SETTLE_S)
                    if which == "pipeline":
                        first, rtf, engine = _pipeline_run(omni, text)
                        runs["first"].append(first)
                        runs["rtf"].append(rtf)
                        engine_first.append(float(engine["time_to_first_audio_s"]))
                        timings.append(dict(engine["timing"]))
                        chosen = {
                            key: engine[key]
                            for key in ("context", "windows", "acoustic_ids", "overlap", "schedule")
                        }
                    else:
                        first, rtf = _piper_run(piper, text)
                        runs["piper_first"].append(first)
                        runs["piper_rtf"].append(rtf)
                report(
                    f"{name} #{repeat + 1}: first audio {runs['first'][-1]:.3f} s "
                    f"(Piper {runs['piper_first'][-1]:.3f} s), real-time factor "
                    f"{runs['rtf'][-1]:.3f} (Piper {runs['piper_rtf'][-1]:.3f})"
                )
    every = {
        key: [v for runs in per_text.values() for v in runs[key]] for key in per_text[names[0]]
    }
    first, first_base = _median(every["first"]), _median(every["piper_first"])
    rtf, rtf_base = _median(every["rtf"]), _median(every["piper_rtf"])
    return {
        "benchmark": "speech",
        "quick": quick,
        "repeats": repeats,
        "pipeline": str(SPEAK_PIPELINE.relative_to(ROOT)),
        "pipeline_start_s": round(start_s, 3),
        "cpu": _cpu(),
        "load_average": {"before": load_before, "after": _load_average()},
        "texts": {
            name: {
                "text": TEXTS[name],
                "time_to_first_audio_s": _median(runs["first"]),
                "one_process_first_audio_s": _median(runs["piper_first"]),
                "real_time_factor": _median(runs["rtf"]),
                "one_process_real_time_factor": _median(runs["piper_rtf"]),
            }
            for name, runs in per_text.items()
        },
        "engine_time_to_first_audio_s": _median(engine_first),
        "adapter": chosen,
        "time_shares": _time_shares(timings),
        "figures": {
            "time_to_first_audio": _figure(
                first,
                first_base,
                f"ratio <= {FIRST_AUDIO_GOAL_RATIO}",
                first <= FIRST_AUDIO_GOAL_RATIO * first_base,
            ),
            "real_time_factor": _figure(
                rtf, rtf_base, f"ratio <= {RTF_GOAL_RATIO}", rtf <= RTF_GOAL_RATIO * rtf_base
            ),
        },
    }


#: The parts of a request's wall time the benchmark reports, by ``timing`` key.
TIME_PARTS: Final = (
    "acoustic_run_s",
    "acoustic_transfer_s",
    "decoder_run_s",
    "decoder_transfer_s",
    "emit_s",
    "adapter_s",
)


def _time_shares(timings: list[dict[str, Any]]) -> dict[str, float]:
    """Medians over the runs: each part's share of the wall time, the decoder's window frames
    per kept frame and its model time per window frame."""
    shares: dict[str, float] = {}
    for part in TIME_PARTS:
        shares[part.removesuffix("_s")] = round(
            _median([t[part] / t["wall_s"] for t in timings if t["wall_s"] > 0]), 4
        )
    shares["decoder_work_ratio"] = round(_median([t["decoder_work_ratio"] for t in timings]), 4)
    shares["decoder_ms_per_window_frame"] = round(
        1000 * _median([t["decoder_run_s"] / t["decoder_window_frames"] for t in timings]), 4
    )
    shares["decoder_calls"] = _median([float(t["decoder_calls"]) for t in timings])
    return shares


def _figure(measurement: float, baseline: float, goal: str, met: bool) -> dict[str, Any]:
    return {
        "measurement": round(measurement, 4),
        "baseline": round(baseline, 4),
        "ratio": round(measurement / baseline, 3) if baseline > 0 else None,
        "goal": goal,
        "pass": met,
    }


def _load_average() -> list[float] | None:
    from benchmarks.machine import load_average

    return load_average()


def _cpu() -> str:
    from benchmarks.machine import cpu_model

    return cpu_model()


def run_speech_benchmark(*, quick: bool) -> dict[str, object]:
    """The suite's hook (see ``benchmarks/speech_figures.py``): the four figures and details."""
    from benchmarks.base import NotRunnable
    from runtime.adapters.voice_export import VoiceExportError

    try:
        import piper  # noqa: F401
    except ImportError:
        raise NotRunnable("one-process Piper needs piper-tts: pip install piper-tts") from None
    try:
        document = measure(quick=quick)
    except VoiceExportError as exc:
        raise NotRunnable(f"the voice joe is not available: {exc}") from None
    figures = document["figures"]
    details: dict[str, object] = {
        "time_to_first_audio_s": figures["time_to_first_audio"]["measurement"],
        "one_process_first_audio_s": figures["time_to_first_audio"]["baseline"],
        "real_time_factor": figures["real_time_factor"]["measurement"],
        "one_process_real_time_factor": figures["real_time_factor"]["baseline"],
        "repeats": document["repeats"],
        "engine_time_to_first_audio_s": round(document["engine_time_to_first_audio_s"], 4),
    }
    for name, text in document["texts"].items():
        details[f"{name}.time_to_first_audio_s"] = round(text["time_to_first_audio_s"], 4)
        details[f"{name}.real_time_factor"] = round(text["real_time_factor"], 4)
    for part, share in document["time_shares"].items():
        details[f"time.{part}"] = share
    adapter = document["adapter"]
    details["decoder.context_frames"] = adapter["context"][0]
    details["decoder.windows"] = adapter["windows"]
    details["decoder.schedule"] = adapter["schedule"]
    details["acoustic.ids"] = adapter["acoustic_ids"]
    details["overlap_sentences"] = adapter["overlap"]
    return details


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/speech.py", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="two texts, two repeats")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON file ({DEFAULT_OUT})")
    args = parser.parse_args(argv)

    def progress(line: str) -> None:
        print(f"speech: {line}", file=sys.stderr, flush=True)

    document = measure(quick=args.quick, progress=progress)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    for name, figure in document["figures"].items():
        print(
            f"{name}: {figure['measurement']} against {figure['baseline']} (ratio "
            f"{figure['ratio']}); goal {figure['goal']}: {'met' if figure['pass'] else 'missed'}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    # Run as a file, the checkout's packages must be importable by name.
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
