"""Speech in: transcription speed and memory, voice activity per chunk, and the voice heard back.

    omni-edge bench --only speech_in

Four figures, each measured in this run against its baseline in the same run:

* ``speech_in.rtf``: the transcription pipeline (``assets/pipelines/transcribe.yaml``: the
  Whisper tiny.en encoder and decoder in two ONNX Runtime workers) against faster-whisper
  (CTranslate2 int8, ``cpu_threads`` equal to the pipeline's thread plan) on the same clips of
  the bundled voice, alternating which goes first; real-time factor = wall time / audio
  seconds over every clip; goal: at most 1.2 times faster-whisper's.
* ``speech_in.vad_chunk``: Silero VAD through its worker (``runtime.adapters.vad``), the
  adapter's whole call per 32 ms chunk, p50 over a clip, beside the model's own run in the
  worker (the baseline); goal at most 0.5 ms.
* ``speech_in.memory_10min``: the peak resident memory (controller and workers, each one's
  peak, summed) of transcribing a 10-minute file over that of a 1-minute file, each in a fresh
  child process; goal at most 1.2. Not in quick mode.
* ``speech_in.voice_heard_back``: 20 sentences spoken by the speech pipeline
  (``assets/pipelines/speak.yaml``) and by Piper in this process, transcribed by the
  transcription pipeline: the word error rate of each; goal: the pipeline's at most Piper's
  + 0.02.

A missing prerequisite (faster-whisper, the recogniser or voice packages) leaves the figures
that need it not run, with the reason.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from benchmarks.base import Benchmark, BenchOptions, NotRunnable
from benchmarks.figures import Comparator, FigureSpec, Goal, Subject
from benchmarks.graphs import PROJECT_ROOT

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from benchmarks.figures import Detail, Figure
    from runtime.api import Omni

TRANSCRIBE: Final = PROJECT_ROOT / "assets" / "pipelines" / "transcribe.yaml"
SPEAK: Final = PROJECT_ROOT / "assets" / "pipelines" / "speak.yaml"
VAD: Final = PROJECT_ROOT / "tests" / "runtime" / "adapters" / "vad_pipeline.yaml"
RATE: Final = 16000

RTF: Final = FigureSpec(
    key="speech_in.rtf",
    name="Transcription real-time factor",
    unit="x",
    goal=Goal("ratio <= 1.2", Comparator.AT_MOST, 1.2, Subject.RATIO),
)
VAD_CHUNK: Final = FigureSpec(
    key="speech_in.vad_chunk",
    name="VAD per 32 ms chunk (p50)",
    unit="ms",
    goal=Goal("<= 0.5 ms", Comparator.AT_MOST, 0.5, Subject.MEASUREMENT),
)
MEMORY: Final = FigureSpec(
    key="speech_in.memory_10min",
    name="Transcription peak RSS, 10 min vs 1 min",
    unit="MiB",
    goal=Goal("ratio <= 1.2", Comparator.AT_MOST, 1.2, Subject.RATIO),
)
HEARD_BACK: Final = FigureSpec(
    key="speech_in.voice_heard_back",
    name="Voice heard back (WER)",
    unit="WER",
    goal=Goal("<= Piper's + 0.02", Comparator.AT_MOST, 0.02, Subject.ADDED),
)

#: Varied sentences: numbers, names, questions, long and short.
SENTENCES: Final = (
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


def _engine() -> dict[str, Any]:
    from runtime.devices import DeviceSelection, discover_topology

    return {"topology": discover_topology(), "selection": DeviceSelection()}


def _prerequisites(progress: Callable[[str], None]) -> None:
    """The recogniser's bundles exported (first use), or NotRunnable naming what is missing."""
    from runtime.adapters.whisper_ct2 import WhisperConvertError
    from runtime.adapters.whisper_export import export_missing_recognisers, find_whisper

    try:
        find_whisper()
        export_missing_recognisers(TRANSCRIBE, progress)
    except WhisperConvertError as exc:
        raise NotRunnable(f"the speech recogniser is not available: {exc}") from None
    try:
        import piper  # noqa: F401
    except ImportError:
        raise NotRunnable("piper (the bundled voice) is not installed") from None


def transcribe(omni: Omni, audio: np.ndarray) -> str:
    """The transcription pipeline's text of ``audio`` (16 kHz mono float32)."""
    text = ""
    for output in omni.generate({"audio": audio, "sample_rate": RATE}):
        if output.finished:
            text = output.text or ""
    return text


def _decoder_threads(omni: Omni) -> int:
    """The ONNX Runtime intra-op threads the pipeline's plan gave its stages (the most)."""
    counts = []
    for stage in omni.execution_plan.to_json()["stages"]:
        threads = stage.get("threads") or {}
        applied = threads.get("applied_intra_op_threads") or threads.get("intra_op_threads")
        if isinstance(applied, int) and applied > 0:
            counts.append(applied)
    return max(counts) if counts else 1


# -- transcription real-time factor --------------------------------------------------------


def measure_rtf(omni: Omni, clips: Sequence[np.ndarray], repeats: int) -> Figure:
    from faster_whisper import WhisperModel  # type: ignore[import-untyped]

    from runtime.adapters.whisper_export import find_whisper

    threads = _decoder_threads(omni)
    model = WhisperModel(
        str(find_whisper().model_dir), device="cpu", compute_type="int8", cpu_threads=threads
    )

    def theirs(audio: np.ndarray) -> str:
        segments, _ = model.transcribe(
            audio, beam_size=1, temperature=0, without_timestamps=True, language="en"
        )
        return "".join(segment.text for segment in segments)

    # Untimed warm-up of both.
    transcribe(omni, clips[0])
    theirs(clips[0])
    ours_s = base_s = 0.0
    audio_s = 0.0
    for repeat in range(repeats):
        for index, audio in enumerate(clips):
            order = (True, False) if (repeat + index) % 2 == 0 else (False, True)
            for pipeline in order:
                started = time.perf_counter()
                if pipeline:
                    transcribe(omni, audio)
                    ours_s += time.perf_counter() - started
                else:
                    theirs(audio)
                    base_s += time.perf_counter() - started
            audio_s += audio.size / RATE
    rtf, base = ours_s / audio_s, base_s / audio_s
    details: dict[str, Detail] = {
        "clips": len(clips),
        "repeats": repeats,
        "audio_seconds": round(audio_s, 2),
        "cpu_threads": threads,
        "baseline": "faster-whisper int8, greedy, no timestamps",
    }
    note = ""
    if RTF.goal.check(rtf, base) is False:
        note = (
            "The pipeline runs float32 graphs (faster-whisper int8 kernels), one decoder call "
            "per token to a worker process (prompt tokens included), on the same cores as the "
            "controller."
        )
    return RTF.measured(rtf, base, f"faster-whisper int8, {threads} thread(s)", details, note)


# -- voice activity per chunk --------------------------------------------------------------


def measure_vad(clip: np.ndarray) -> Figure:
    from runtime.adapters.vad_bundle import ensure_vad_bundle
    from runtime.api import Omni
    from runtime.config import load_pipeline

    ensure_vad_bundle()
    with Omni(load_pipeline(VAD), **_engine()) as omni:
        request = {"audio": clip, "sample_rate": RATE}
        list(omni.generate(request))  # warm-up
        walls: list[float] = []
        runs: list[float] = []
        for _ in range(3):
            for output in omni.generate(request):
                if output.finished:
                    metrics = dict(output.metrics)
                    walls.append(float(metrics["call_wall_s_p50"]))
                    runs.append(float(metrics["call_run_s_p50"]))
    wall_ms, run_ms = statistics.median(walls) * 1e3, statistics.median(runs) * 1e3
    details: dict[str, Detail] = {
        "audio_seconds": round(clip.size / RATE, 2),
        "model_run_ms_p50": round(run_ms, 4),
        "runs": [round(w * 1e3, 4) for w in walls],
    }
    note = ""
    if VAD_CHUNK.goal.check(wall_ms, run_ms) is False:
        note = (
            f"The model's own run in the worker took {run_ms:.3g} ms; the rest is the call's "
            "round trip between the adapter on the controller's loop and the worker process."
        )
    return VAD_CHUNK.measured(wall_ms, run_ms, "the model's run in its worker", details, note)


# -- memory: 10 minutes against 1 minute ---------------------------------------------------


def long_clip(clips: Sequence[np.ndarray], seconds: float) -> np.ndarray:
    """``clips`` one after another with half a second of silence, repeated to ``seconds``."""
    pause = np.zeros(RATE // 2, np.float32)
    parts: list[np.ndarray] = []
    total = 0
    while total < seconds * RATE:
        for clip in clips:
            parts += [clip, pause]
            total += clip.size + pause.size
    return np.concatenate(parts)[: int(seconds * RATE)]


def memory_child(path: str) -> None:
    """In a fresh process: transcribe the clip at ``path``; print the peak RSS (bytes) of this
    process and of each worker, read before the workers stop."""
    from benchmarks.rss import peak_rss_bytes
    from runtime.api import Omni
    from runtime.config import load_pipeline

    audio = np.load(path)
    with Omni(load_pipeline(TRANSCRIBE), **_engine()) as omni:
        text = transcribe(omni, audio)
        pids = list(omni.execution_plan.worker_pids)
        workers = [peak_rss_bytes(pid) or 0 for pid in pids]
    print(json.dumps({"controller": peak_rss_bytes(), "workers": workers, "chars": len(text)}))


def _peak_of(workdir: Path, audio: np.ndarray, name: str) -> dict[str, Any]:
    path = workdir / f"{name}.npy"
    np.save(path, audio)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from benchmarks.speech_in import memory_child; memory_child({str(path)!r})",
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    path.unlink(missing_ok=True)
    if done.returncode != 0:
        raise RuntimeError(f"the {name} transcription child failed: {done.stderr[-2000:]}")
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def measure_memory(workdir: Path, clips: Sequence[np.ndarray]) -> Figure:
    short = _peak_of(workdir, long_clip(clips, 60.0), "1min")
    long = _peak_of(workdir, long_clip(clips, 600.0), "10min")

    def total(found: dict[str, Any]) -> float:
        return (int(found["controller"]) + sum(int(w) for w in found["workers"])) / (1 << 20)

    details: dict[str, Detail] = {
        "controller_1min_mib": round(int(short["controller"]) / (1 << 20), 1),
        "controller_10min_mib": round(int(long["controller"]) / (1 << 20), 1),
        "workers_1min_mib": [round(int(w) / (1 << 20), 1) for w in short["workers"]],
        "workers_10min_mib": [round(int(w) / (1 << 20), 1) for w in long["workers"]],
        "text_chars_10min": int(long["chars"]),
    }
    measured, base = total(long), total(short)
    note = ""
    if MEMORY.goal.check(measured, base) is False:
        note = (
            "The controller holds the whole file's samples and log-mel features (about 100 MiB "
            "for 10 minutes) while it transcribes."
        )
    return MEMORY.measured(measured, base, "the same, 1-minute file", details, note)


# -- the voice heard back ------------------------------------------------------------------


def words(text: str) -> list[str]:
    """Lower case, punctuation dropped (a decimal point and a time's colon kept)."""
    found = re.findall(r"[a-z0-9']+(?:[.:][0-9]+)*", text.lower().replace("-", " "))
    return [word.strip("'") for word in found if word.strip("'")]


def word_errors(reference: Sequence[str], heard: Sequence[str]) -> int:
    """Substitutions, insertions and deletions turning ``reference`` into ``heard``."""
    row = list(range(len(heard) + 1))
    for i, ref in enumerate(reference, 1):
        previous, row[0] = row[0], i
        for j, word in enumerate(heard, 1):
            current = min(row[j] + 1, row[j - 1] + 1, previous + (ref != word))
            previous, row[j] = row[j], current
    return row[len(heard)]


def wer(references: Sequence[str], heard: Sequence[str]) -> float:
    errors = total = 0
    for reference, text in zip(references, heard, strict=True):
        ref_words = words(reference)
        errors += word_errors(ref_words, words(text))
        total += len(ref_words)
    return errors / max(1, total)


def _spoken_by_pipeline(workdir: Path, texts: Sequence[str]) -> list[np.ndarray]:
    import soundfile
    import soxr

    from runtime.adapters.speak import speak
    from runtime.adapters.voice_export import ensure_voice_bundles
    from runtime.api import Omni
    from runtime.config import load_pipeline

    ensure_voice_bundles("joe")
    clips = []
    with Omni(load_pipeline(SPEAK), **_engine()) as omni:
        for index, text in enumerate(texts):
            path = workdir / f"spoken-{index}.wav"
            speak(omni, text, out=path)
            audio, rate = soundfile.read(path, dtype="float32")
            path.unlink()
            clips.append(np.asarray(soxr.resample(audio, rate, RATE), dtype=np.float32))
    return clips


def measure_heard_back(
    omni: Omni, workdir: Path, piper_clips: Sequence[np.ndarray], texts: Sequence[str]
) -> Figure:
    ours = _spoken_by_pipeline(workdir, texts)
    heard_ours = [transcribe(omni, clip) for clip in ours]
    heard_piper = [transcribe(omni, clip) for clip in piper_clips]
    ours_wer, piper_wer = wer(texts, heard_ours), wer(texts, heard_piper)
    worst = max(
        range(len(texts)),
        key=lambda i: word_errors(words(texts[i]), words(heard_ours[i])),
    )
    details: dict[str, Detail] = {
        "sentences": len(texts),
        "recogniser": "the transcription pipeline (Whisper tiny.en)",
        "worst_sentence": texts[worst],
        "worst_heard": heard_ours[worst],
    }
    note = ""
    if HEARD_BACK.goal.check(ours_wer, piper_wer) is False:
        note = (
            f"The sentence heard worst from the pipeline's voice: {texts[worst]!r} heard as "
            f"{heard_ours[worst]!r}."
        )
    return HEARD_BACK.measured(ours_wer, piper_wer, "Piper in one process", details, note)


# -- the suite's entry ---------------------------------------------------------------------


def _guarded(spec: FigureSpec, measure: Callable[[], Figure]) -> Figure:
    try:
        return measure()
    except NotRunnable as exc:
        return spec.not_run(str(exc))
    except ImportError as exc:
        return spec.not_run(f"a prerequisite is not installed: {exc}")


def measure(options: BenchOptions) -> list[Figure]:
    def say(line: str) -> None:
        print(f"bench: speech_in: {line}", file=sys.stderr, flush=True)

    try:
        import faster_whisper  # noqa: F401
    except ImportError:
        faster = False
    else:
        faster = True
    _prerequisites(say)
    from runtime.adapters.whisper_export import spoken_clips
    from runtime.api import Omni
    from runtime.config import load_pipeline

    texts = SENTENCES
    clips = spoken_clips(texts)
    rtf_clips = clips[:3] if options.quick else clips[:8]
    figures: list[Figure] = []
    with Omni(load_pipeline(TRANSCRIBE), **_engine()) as omni:
        if faster:
            say("real-time factor ...")
            figures.append(
                _guarded(RTF, lambda: measure_rtf(omni, rtf_clips, 1 if options.quick else 2))
            )
        else:
            figures.append(RTF.not_run("faster-whisper (the baseline) is not installed"))
        say("voice heard back ...")
        figures.append(
            _guarded(HEARD_BACK, lambda: measure_heard_back(omni, options.workdir, clips, texts))
        )
    say("VAD per chunk ...")
    figures.append(_guarded(VAD_CHUNK, lambda: measure_vad(long_clip(clips[:4], 10.0))))
    if options.quick:
        # The suite skips this benchmark in quick mode; a direct quick run leaves this out.
        figures.append(MEMORY.not_run("quick mode: two fresh transcriptions of 1 and 10 minutes"))
    else:
        say("memory, 1 and 10 minutes ...")
        figures.append(_guarded(MEMORY, lambda: measure_memory(options.workdir, clips)))
    for figure in figures:
        if figure.measurement is not None and not math.isfinite(figure.measurement):
            raise ValueError(f"{figure.key} measured {figure.measurement}")
    return figures


BENCHMARK: Final = Benchmark(
    "speech_in",
    (RTF, VAD_CHUNK, MEMORY, HEARD_BACK),
    measure,
    quick_skip="quick mode: the speech-in figures transcribe for minutes",
)
