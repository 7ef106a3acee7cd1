"""Studio: how late the window's event loop runs while it streams a speech request, and how
fast the window speaks against the command line.

A fresh offscreen studio (:mod:`benchmarks.studio_stall`) opens the speech demo, loads it
with one request, then streams more requests while its own stall monitor (a 10 ms precise
timer) records how late each tick fires. The baseline is the same monitor in the same
window, idle with the stages loaded (10 s; 3 s in quick mode). Audio plays on a JACK dummy
server the benchmark starts (paced in real time, no sound card): each request's playback
runs to its end, and the underruns after playback started are counted. Then, in the same
process, the command line's way (``speak`` at full speed, no player) speaks the same texts:
the second figure is the window's real-time factor against that one (goal: at most 1.3 times,
with no underruns). Without JACK the audio goes to an ALSA null device (unpaced) and the
second figure is not run.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any, Final

from benchmarks import graphs
from benchmarks.base import Benchmark, BenchOptions
from benchmarks.child import event, run_child
from benchmarks.figures import Comparator, FigureSpec, Goal, Subject
from benchmarks.jack import JackUnavailable, jack_dummy
from benchmarks.stats import rounded

if TYPE_CHECKING:
    from pathlib import Path

    from benchmarks.figures import Detail, Figure

STALL: Final = FigureSpec(
    key="studio.stall_p99",
    name="Studio event-loop stall p99 while streaming speech",
    unit="ms",
    goal=Goal("<= 16.7 ms", Comparator.AT_MOST, 16.7, Subject.MEASUREMENT),
)
BASELINE_LABEL: Final = "the same window idle with the stages loaded"
RTF: Final = FigureSpec(
    key="studio.real_time_factor",
    name="Studio real-time factor, speech demo on a JACK device",
    unit="x",
    goal=Goal("ratio <= 1.3, 0 underruns", Comparator.AT_MOST, 1.3, Subject.RATIO),
)
RTF_BASELINE_LABEL: Final = "the command line's speak, same texts, no player, same process"
CHILD_TIMEOUT_S: Final = 900.0


def _null_audio_config(folder: Path) -> dict[str, str]:
    """An ``XDG_CONFIG_HOME`` whose ALSA default device discards audio (no sound card needed)."""
    alsa = folder / "xdg-config" / "alsa"
    alsa.mkdir(parents=True)
    (alsa / "asoundrc").write_text("pcm.!default { type null }\n", encoding="utf-8")
    return {"XDG_CONFIG_HOME": str(folder / "xdg-config"), "QT_QPA_PLATFORM": "offscreen"}


def _stats(document: dict[str, Any], name: str) -> dict[str, float]:
    stats = document[name]
    return {
        key: float(stats[key]) for key in ("samples", "p99_ms", "max_ms", "mean_ms", "over_50ms")
    }


def measure(options: BenchOptions) -> list[Figure]:
    try:
        with jack_dummy(options.workdir) as jack:
            env = {**jack.environment, "QT_QPA_PLATFORM": "offscreen"}
            return _measure(options, env, device="system")
    except JackUnavailable as exc:
        figures = _measure(options, _null_audio_config(options.workdir), device=None)
        return [*figures[:1], RTF.not_run(f"no paced audio device: {exc}")]


def _measure(options: BenchOptions, env: dict[str, str], device: str | None) -> list[Figure]:
    requests = options.count(3, 1)
    idle_s = options.count(10, 3)
    arguments = [str(graphs.demo_pipeline("speak")), "--requests", str(requests)]
    arguments += ["--idle-s", str(idle_s), *(["--short"] if options.quick else [])]
    if device is not None:
        arguments += ["--device", device, "--cli"]
    child = run_child("benchmarks.studio_stall", arguments, timeout_s=CHILD_TIMEOUT_S, env=env)
    done = event(child, "done").document
    during = _stats(done, "during")
    idle = _stats(done, "idle")
    loading = _stats(done, "first_run_with_loading")
    details: dict[str, Detail] = {
        "requests": requests,
        "idle_s": idle_s,
        "streaming_s": rounded(float(done["streaming_s"])),
        "ticks": int(during["samples"]),
        "max_ms": rounded(during["max_ms"]),
        "mean_ms": rounded(during["mean_ms"]),
        "ticks_over_50ms": int(during["over_50ms"]),
        "idle_max_ms": rounded(idle["max_ms"]),
        "first_run_with_loading_p99_ms": rounded(loading["p99_ms"]),
        "first_audio_s": None
        if done.get("first_audio_s") is None
        else rounded(float(done["first_audio_s"])),
        "playback_device": str(done.get("playback_device") or "ALSA null (unpaced)"),
    }
    note = ""
    if STALL.goal.check(during["p99_ms"], idle["p99_ms"]) is False:
        note = (
            "While speech streams, both workers synthesize and the studio's own runtime threads "
            "(orchestrator loop, channel readers, audio feeder) run beside the GUI thread, "
            "competing with it for the cores and for the interpreter lock; idle, the same window "
            f"is late by {rounded(idle['p99_ms'])} ms at p99, so the lateness comes from that "
            "competition. On a machine whose cores are already busy (see the load average) the "
            "GUI thread waits longest."
        )
    stall = STALL.measured(during["p99_ms"], idle["p99_ms"], BASELINE_LABEL, details, note)
    if device is None:
        return [stall]
    studio_rtfs = [float(value) for value in done.get("real_time_factors", [])]
    cli = event(child, "cli").document
    cli_rtfs = [float(value) for value in cli.get("real_time_factors", [])]
    if not studio_rtfs or not cli_rtfs:
        return [stall, RTF.not_run("the window or the command line reported no real-time factor")]
    studio_rtf, cli_rtf = statistics.median(studio_rtfs), statistics.median(cli_rtfs)
    underruns = [int(value) for value in done.get("underruns", [])]
    rtf_details: dict[str, Detail] = {
        "studio_real_time_factors": [rounded(value) for value in studio_rtfs],
        "cli_real_time_factors": [rounded(value) for value in cli_rtfs],
        "studio_underruns": underruns,
        "playback_device": details["playback_device"],
    }
    rtf_note = ""
    if RTF.goal.check(studio_rtf, cli_rtf) is False or any(underruns):
        rtf_note = (
            f"{sum(underruns)} underrun(s) after playback started. The window's request runs "
            "beside the GUI thread, its waveform and the playback feeder in one process, on "
            "the same two cores the workers synthesize on."
        )
    return [stall, RTF.measured(studio_rtf, cli_rtf, RTF_BASELINE_LABEL, rtf_details, rtf_note)]


BENCHMARK: Final = Benchmark("studio", (STALL, RTF), measure)
