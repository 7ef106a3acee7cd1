"""Speech: time to first audio and real-time factor vs one-process Piper, same text.

The measurement itself lives with the speech stages, in ``benchmarks/speech.py``; this
module connects it to the suite. The hook it calls::

    benchmarks.speech.run_speech_benchmark(*, quick: bool) -> Mapping[str, object]

returning at least (seconds, and audio seconds per wall second for the factors):

* ``time_to_first_audio_s``: the speech pipeline, text submitted -> first PCM chunk;
* ``one_process_first_audio_s``: Piper in one process, the first sentence's audio ready;
* ``real_time_factor``: the pipeline, synthesis time / audio duration;
* ``one_process_real_time_factor``: Piper in one process, the same text;

plus any other scalar entries, which are kept as details. It raises
:class:`benchmarks.base.NotRunnable` when a prerequisite (the voice, piper) is missing.
"""

from __future__ import annotations

import importlib
import math
from typing import TYPE_CHECKING, Final

from benchmarks.base import Benchmark, BenchOptions, NotRunnable
from benchmarks.figures import Comparator, FigureSpec, Goal, Subject

if TYPE_CHECKING:
    from collections.abc import Mapping

    from benchmarks.figures import Detail, Figure

FIRST_AUDIO: Final = FigureSpec(
    key="speech.first_audio",
    name="Speech time to first audio",
    unit="s",
    goal=Goal("ratio <= 1.0", Comparator.AT_MOST, 1.0, Subject.RATIO),
)
RTF: Final = FigureSpec(
    key="speech.rtf",
    name="Speech real-time factor",
    unit="x",
    goal=Goal("ratio <= 1.2", Comparator.AT_MOST, 1.2, Subject.RATIO),
)
MODULE: Final = "benchmarks.speech"
HOOK: Final = "run_speech_benchmark"
FIRST_AUDIO_LABEL: Final = "one-process Piper, first sentence's audio"
RTF_LABEL: Final = "one-process Piper, same text"
REQUIRED: Final = (
    "time_to_first_audio_s",
    "one_process_first_audio_s",
    "real_time_factor",
    "one_process_real_time_factor",
)


def _number(result: Mapping[str, object], name: str) -> float:
    value = result.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{MODULE}.{HOOK} returned {name}={value!r}; expected a finite number")
    return float(value)


def measure(options: BenchOptions) -> list[Figure]:
    try:
        module = importlib.import_module(MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != MODULE:
            raise
        raise NotRunnable(f"{MODULE} is not available in this checkout") from None
    hook = getattr(module, HOOK, None)
    if not callable(hook):
        raise NotRunnable(f"{MODULE} has no {HOOK}(*, quick: bool) for the suite to call")
    result: Mapping[str, object] = hook(quick=options.quick)
    first, first_base, rtf, rtf_base = (_number(result, name) for name in REQUIRED)
    details: dict[str, Detail] = {
        str(name): value
        for name, value in result.items()
        if name not in REQUIRED and (value is None or isinstance(value, str | int | float | bool))
    }
    first_note = ""
    if FIRST_AUDIO.goal.check(first, first_base) is False:
        first_note = str(
            result.get("first_audio_note")
            or (
                "The pipeline's first audio waits for the acoustic stage on the whole first "
                "sentence and one decoder chunk, each a call to a worker process."
            )
        )
    rtf_note = ""
    if RTF.goal.check(rtf, rtf_base) is False:
        piper_too = ", itself above the goal: the machine is the limit" if rtf_base > 0.1 else ""
        rtf_note = str(
            result.get("rtf_note")
            or (
                f"One-process Piper took {rtf_base:.3g} on the same texts in the same run"
                f"{piper_too}; the pipeline runs a controller and two workers on the same cores."
            )
        )
    return [
        FIRST_AUDIO.measured(first, first_base, FIRST_AUDIO_LABEL, details, first_note),
        RTF.measured(rtf, rtf_base, RTF_LABEL, details, rtf_note),
    ]


BENCHMARK: Final = Benchmark("speech", (FIRST_AUDIO, RTF), measure)
