"""Studio: how late the window's event loop runs while it streams a speech request.

A fresh offscreen studio (:mod:`benchmarks.studio_stall`) opens the speech demo, loads it
with one request, then streams more requests while its own stall monitor (a 10 ms precise
timer) records how late each tick fires. The baseline is the same monitor in the same
window, idle with the stages loaded (10 s; 3 s in quick mode). Audio goes to an ALSA null device, so
playback runs without a sound card (unpaced).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from benchmarks import graphs
from benchmarks.base import Benchmark, BenchOptions
from benchmarks.child import event, run_child
from benchmarks.figures import Comparator, FigureSpec, Goal, Subject
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
    requests = options.count(3, 1)
    idle_s = options.count(10, 3)
    arguments = [str(graphs.demo_pipeline("speak")), "--requests", str(requests)]
    arguments += ["--idle-s", str(idle_s), *(["--short"] if options.quick else [])]
    done = event(
        run_child(
            "benchmarks.studio_stall",
            arguments,
            timeout_s=CHILD_TIMEOUT_S,
            env=_null_audio_config(options.workdir),
        ),
        "done",
    ).document
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
    return [STALL.measured(during["p99_ms"], idle["p99_ms"], BASELINE_LABEL, details, note)]


BENCHMARK: Final = Benchmark("studio", (STALL,), measure)
