"""A spoken conversation measured from outside, in real time: turn latency, barge-in and echo.

    omni-edge bench --only voice

``omni-edge talk --json`` (``assets/pipelines/voice-chat.yaml`` with its default settings) runs
in a child process on a JACK dummy server, its full-duplex stream on the server's ``system``
ports. This process is the room (:class:`runtime.audio.room.Room`): it speaks the user's turns
(sentences spoken by the bundled voice, trimmed to their sound, so the last voiced sample of
each is known to the frame) into the conversation's microphone, records its speaker, and for
the speaker cases mixes the speaker back into the microphone 50 ms later at half the level.
Every time comes from the JACK frame clock of the recording.

* ``voice.turn_latency``: from the last voiced sample of a user turn to the first sample of the
  reply heard in the room, p50 over 10 turns (p90 and the conversation's own parts in the
  details: end-of-turn wait, transcription, first clause from the model, first audio, player
  lead); goal at most 800 ms. With headphones (no echo path, echo cancellation off).
* ``voice.barge_in``: from the onset of user speech during a reply to the speaker silent (under
  -45 dBFS for 100 ms), p50 over 10 interruptions; goal at most 200 ms. Every interrupted
  reply's requests must have been cancelled (the conversation counts its interruptions) and
  the child must leave no process or shared memory behind. With headphones.
* ``voice.echo_false_barge_in``: replies played through the echo path with no user speech,
  echo cancellation on (the default): the barge-ins the conversation reported; goal 0. The
  baseline is the same with echo cancellation off, which must show false barge-ins (else the
  path would prove nothing).
* ``voice.echo_missed``: replies with the user speaking over them through the echo path, echo
  cancellation on: the interruptions not detected; goal 0.

Not in quick mode (each figure takes minutes of real time).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from benchmarks.base import Benchmark, BenchOptions, NotRunnable
from benchmarks.figures import Comparator, FigureSpec, Goal, Subject
from benchmarks.graphs import PROJECT_ROOT

if TYPE_CHECKING:
    from collections.abc import Sequence

    from benchmarks.figures import Detail, Figure
    from runtime.audio.room import Room

VOICE_CHAT: Final = PROJECT_ROOT / "assets" / "pipelines" / "voice-chat.yaml"
ROOM_RATE: Final = 48000
#: The speaker counts as silent under this level, held this long.
SILENT_DBFS: Final = -45.0
SILENT_HOLD_S: Final = 0.1
#: The echo path of the speaker cases: 50 ms, half the level.
ECHO_DELAY_S: Final = 0.05
ECHO_GAIN: Final = 0.5
LOAD_TIMEOUT_S: Final = 240.0

TURN_LATENCY: Final = FigureSpec(
    key="voice.turn_latency",
    name="Voice turn latency, end of speech to reply heard (p50)",
    unit="ms",
    goal=Goal("<= 800 ms", Comparator.AT_MOST, 800.0, Subject.MEASUREMENT),
)
BARGE_IN: Final = FigureSpec(
    key="voice.barge_in",
    name="Barge-in, user speech onset to speaker silent (p50)",
    unit="ms",
    goal=Goal("<= 200 ms", Comparator.AT_MOST, 200.0, Subject.MEASUREMENT),
)
ECHO_FALSE: Final = FigureSpec(
    key="voice.echo_false_barge_in",
    name="False barge-ins on the reply's own echo",
    unit="count",
    goal=Goal("0", Comparator.AT_MOST, 0.0, Subject.MEASUREMENT),
)
ECHO_MISSED: Final = FigureSpec(
    key="voice.echo_missed",
    name="User speech over the echo not detected",
    unit="count",
    goal=Goal("0", Comparator.AT_MOST, 0.0, Subject.MEASUREMENT),
)

#: Questions with short answers (turn latency, echo without speech).
QUESTIONS: Final = (
    "What is the capital of France?",
    "How many legs does a spider have?",
    "What colour is the sky?",
    "What is two plus two?",
    "Who wrote Romeo and Juliet?",
    "What is the capital of Spain?",
    "How many days are in a week?",
    "What do bees make?",
    "What is the opposite of hot?",
    "Which planet do we live on?",
)
#: Questions with long answers, to speak over.
LONG_QUESTIONS: Final = (
    "Tell me a story about a dragon.",
    "Describe a walk in the forest.",
    "Tell me about the history of Rome.",
    "Explain how rain forms.",
    "Tell me a story about a brave knight.",
)
INTERRUPTIONS: Final = ("Stop, please.", "Wait a moment.", "Hold on, I have a question.")


def say(line: str) -> None:
    print(f"bench: voice: {line}", file=sys.stderr, flush=True)


def speech_clips(texts: Sequence[str]) -> dict[str, np.ndarray]:
    """Each text spoken by the bundled voice at the room's rate, trimmed to its sound (frames of
    10 ms within 40 dB of the loudest), so its first and last samples are voiced."""
    import soxr

    from runtime.adapters.whisper_export import spoken_clips
    from runtime.audio.levels import sound_span

    clips = {}
    for text, clip in zip(texts, spoken_clips(list(texts)), strict=True):
        start, end = sound_span(clip, 160)
        trimmed = clip[start:end]
        clips[text] = np.asarray(soxr.resample(trimmed, 16000, ROOM_RATE), dtype=np.float32)
    return clips


@dataclass(frozen=True)
class SpokenOver:
    """One user utterance spoken over a reply: whether the reply was still sounding as it
    began, seconds from its first sample to the speaker silent (None: it never fell silent),
    and whether the conversation reported the reply interrupted."""

    over_reply: bool
    silent_after_s: float | None
    interrupted: bool


@dataclass
class TalkChild:
    """``omni-edge talk --json`` in a child process on the JACK server."""

    environment: dict[str, str]
    echo: str
    process: subprocess.Popen[str] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)
    listening: threading.Event = field(default_factory=threading.Event)
    tree: list[Any] = field(default_factory=list)
    left_behind: list[str] = field(default_factory=list)

    def start(self) -> None:
        from runtime.paths import data_dir

        # The JACK server's environment gives the child a HOME of its own: the models, the
        # bundles and the vLLM environment stay this user's.
        environment = {**os.environ, **self.environment, "OMNI_EDGE_DATA_DIR": str(data_dir())}
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runtime.cli",
                "talk",
                str(VOICE_CHAT),
                "--input-device",
                "system",
                "--output-device",
                "system",
                "--echo",
                self.echo,
                "--json",
            ],
            env=environment,
            cwd=PROJECT_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read_out, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()
        if not self.listening.wait(LOAD_TIMEOUT_S):
            self.stop()
            raise NotRunnable(f"omni-edge talk did not start listening: {self.errors[-5:]}")

    def _read_out(self) -> None:
        assert self.process is not None
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if "summary" in record:
                    self.summary = record["summary"]
                else:
                    record["received_at"] = time.monotonic()
                    self.events.append(record)

    def _read_err(self) -> None:
        assert self.process is not None
        assert self.process.stderr is not None
        for line in self.process.stderr:
            if "listening" in line:
                self.listening.set()
            if " INFO " not in line:
                self.errors.append(line.rstrip())

    def count(self, event: str, since: int = 0) -> int:
        return sum(1 for record in self.events[since:] if record.get("event") == event)

    def check_running(self) -> None:
        """Raise when the conversation has ended under the benchmark (with its last words)."""
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(
                f"omni-edge talk exited with {self.process.returncode}: {self.errors[-5:]}"
            )

    def wait_answered(self, since: int, timeout_s: float) -> bool:
        """Until the last turn that ended after event ``since`` has its reply done."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_running()
            events = self.events[since:]
            ended = [e.get("turn") for e in events if e.get("event") == "turn_ended"]
            if ended and any(
                e.get("event") == "reply_done" and e.get("turn") == ended[-1] for e in events
            ):
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> int | None:
        """Ctrl+C, as a user ends it; the exit code (None when it had to be killed). What the
        child left (processes of its tree still running, its shared memory) goes to
        :attr:`left_behind`."""
        import psutil

        process = self.process
        if process is None:
            return None
        with contextlib.suppress(psutil.Error):
            self.tree = psutil.Process(process.pid).children(recursive=True)
        try:
            return self._stop(process)
        finally:
            time.sleep(0.5)
            self.left_behind = [f"process {p.pid}" for p in self.tree if p.is_running()]
            self.left_behind += [e.name for e in Path("/dev/shm").glob(f"oe-{process.pid}-*")]

    def _stop(self, process: subprocess.Popen[str]) -> int | None:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
                return None
        return process.returncode


def _room(environment: dict[str, str], *, echo: bool) -> Room:
    """The room on the child's PortAudio ports (its client is the only one not ``system``)."""
    from runtime.audio.room import Room, RoomSettings

    # Only what a client needs to find the server (the server's HOME is not this process's).
    for name in ("JACK_DEFAULT_SERVER", "JACK_NO_AUDIO_RESERVATION"):
        os.environ[name] = environment[name]
    jack = importlib.import_module("jack")
    probe = jack.Client("omni-voice-probe", no_start_server=True)
    try:
        speakers = [
            p.name
            for p in probe.get_ports(is_audio=True, is_output=True)
            if not p.name.startswith(("system:", "omni-voice-probe:"))
        ]
        microphones = [
            p.name
            for p in probe.get_ports(is_audio=True, is_input=True)
            if not p.name.startswith(("system:", "omni-voice-probe:"))
        ]
    finally:
        probe.deactivate()
        probe.close()
    settings = RoomSettings(
        echo_delay_s=ECHO_DELAY_S, echo_gain=ECHO_GAIN if echo else 0.0, noise_dbfs=-70.0
    )
    room = Room(speaker=speakers, microphone=microphones, settings=settings, record_s=900.0)
    return room.start()


class Conversation:
    """The room's side of one conversation."""

    def __init__(self, room: Room, child: TalkChild) -> None:
        self.room = room
        self.child = child

    def wait_quiet(self, hold_s: float = 1.0, timeout_s: float = 60.0) -> None:
        """Until the speaker was silent for ``hold_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.child.check_running()
            now = self.room.recorded_until
            if now is None:
                time.sleep(0.1)
                continue
            start = now - round(hold_s * ROOM_RATE)
            silent = self.room.silent_after(start, threshold_dbfs=SILENT_DBFS, hold_s=hold_s)
            if silent is not None and silent <= start + self.room.period:
                return
            time.sleep(0.1)

    def ask(self, clip: np.ndarray, timeout_s: float = 20.0) -> float | None:
        """Speak ``clip``; seconds from its last sample to the first sample of the reply
        heard, or None when no reply was heard within ``timeout_s``."""
        period = self.room.period
        spoken = self.room.say(clip)
        spoken.wait_done(timeout_s)
        end = spoken.end_frame
        assert end is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            # What the speaker played at frame f is recorded at f + period.
            heard = self.room.first_sound_after(end + period)
            if heard is not None:
                return (heard - period - end) / ROOM_RATE
            time.sleep(0.02)
        return None

    def speak_over(self, clip: np.ndarray, timeout_s: float = 10.0) -> SpokenOver:
        """Speak ``clip`` now (over a reply) and wait until the conversation has answered it
        (its reply done, or 20 s), so the next trial starts on a quiet, settled conversation."""
        period = self.room.period
        since = len(self.child.events)
        spoken = self.room.say(clip)
        spoken.wait_started(timeout_s)
        start = spoken.start_frame
        assert start is not None
        # Was the reply still sounding as the user began (else this is no speech over it)?
        while (self.room.recorded_until or 0) < start + period:
            time.sleep(0.01)
        before = self.room.recording(start + period - ROOM_RATE // 10, start + period)
        over = _sounding(before)
        silent_s: float | None = None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            silent = self.room.silent_after(
                start + period, threshold_dbfs=SILENT_DBFS, hold_s=SILENT_HOLD_S
            )
            if silent is not None:
                silent_s = (silent - period - start) / ROOM_RATE
                break
            time.sleep(0.02)
        spoken.wait_done(timeout_s)
        self.child.wait_answered(since, timeout_s=20.0)
        return SpokenOver(
            over_reply=over,
            silent_after_s=silent_s,
            interrupted=self.child.count("interrupted", since) > 0,
        )

    def reply_playing(self, timeout_s: float = 20.0) -> bool:
        """Wait until the speaker has been sounding for a second (a reply to speak over)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            now = self.room.recorded_until
            if now is None:
                time.sleep(0.05)
                continue
            window = self.room.recording(now - ROOM_RATE, now)
            if _sounding(window):
                return True
            time.sleep(0.05)
        return False


def _sounding(samples: np.ndarray) -> bool:
    """Whether the speaker was playing something in ``samples`` (RMS over 0.01)."""
    return bool(samples.size) and float(np.sqrt(np.mean(samples.astype(np.float64) ** 2))) > 0.01


@contextlib.contextmanager
def conversation(environment: dict[str, str], *, echo: str, room_echo: bool) -> Any:
    child = TalkChild(environment, echo)
    say(f"starting omni-edge talk (echo cancellation {echo}, echo path {room_echo}) ...")
    child.start()
    room = _room(environment, echo=room_echo)
    try:
        yield Conversation(room, child)
    finally:
        room.close()
        child.stop()


def _p(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return float(np.percentile(ordered, q)) if ordered else float("nan")


def headphones(
    options: BenchOptions, env: dict[str, str], clips: dict[str, np.ndarray]
) -> list[Figure]:
    turns = options.count(10, 3)
    latencies: list[float] = []
    barges: list[float] = []
    with conversation(env, echo="off", room_echo=False) as talk:
        for index in range(turns):
            talk.wait_quiet()
            latency = talk.ask(clips[QUESTIONS[index % len(QUESTIONS)]])
            if latency is not None:
                latencies.append(latency)
                say(f"turn {index + 1}: {latency * 1000:.0f} ms")
        interrupted = void = 0
        for index in range(3 * turns):
            if len(barges) == turns:
                break
            talk.wait_quiet()
            talk.ask(clips[LONG_QUESTIONS[index % len(LONG_QUESTIONS)]])
            if not talk.reply_playing():
                void += 1
                continue
            trial = talk.speak_over(clips[INTERRUPTIONS[index % len(INTERRUPTIONS)]])
            if not trial.over_reply:
                # The reply ended before the user spoke: no barge-in to time.
                void += 1
                continue
            interrupted += trial.interrupted
            if trial.silent_after_s is not None:
                barges.append(trial.silent_after_s)
                say(f"barge-in {len(barges)}: silent after {trial.silent_after_s * 1000:.0f} ms")
        talk.wait_quiet(timeout_s=30.0)
    summary = talk.child.summary or {}
    parts: dict[str, Detail] = {}
    timings = [t for t in summary.get("turns", []) if isinstance(t, dict)]
    for name in (
        "end_of_turn_s",
        "transcription_s",
        "first_clause_s",
        "first_audio_s",
        "player_lead_s",
    ):
        values = [float(t[name]) for t in timings[:turns] if isinstance(t.get(name), int | float)]
        if values:
            parts[f"{name[:-2]}_p50_ms"] = round(statistics.median(values) * 1000, 1)
    left = talk.child.left_behind
    figures = [
        TURN_LATENCY.measured(
            _p(latencies, 50) * 1000,
            None,
            "",
            {
                "turns": len(latencies),
                "p90_ms": round(_p(latencies, 90) * 1000, 1),
                "each_ms": [round(v * 1000) for v in latencies],
                **parts,
            },
        ),
        BARGE_IN.measured(
            _p(barges, 50) * 1000,
            None,
            "",
            {
                "interruptions": len(barges),
                "p90_ms": round(_p(barges, 90) * 1000, 1),
                "each_ms": [round(v * 1000) for v in barges],
                "interrupted_events": interrupted,
                "replies_over_before_spoken_over": void,
                "left_behind": left,
            },
            note=""
            if interrupted >= len(barges) and not left
            else "not every reply was cancelled, or something was left behind",
        ),
    ]
    return figures


def speakers(
    options: BenchOptions, env: dict[str, str], clips: dict[str, np.ndarray]
) -> list[Figure]:
    replies = options.count(20, 4)
    false_with = false_without = 0
    missed = 0
    spoken_over = 0
    with conversation(env, echo="auto", room_echo=True) as talk:
        before = talk.child.count("barge_in")
        for index in range(replies):
            talk.wait_quiet()
            since = len(talk.child.events)
            talk.ask(clips[QUESTIONS[index % len(QUESTIONS)]])
            talk.child.wait_answered(since, timeout_s=20.0)
            talk.wait_quiet()
        false_with = talk.child.count("barge_in") - before
        say(f"echo cancelled: {false_with} false barge-ins in {replies} replies")
        void = 0
        for index in range(3 * replies):
            if spoken_over == replies:
                break
            talk.wait_quiet()
            talk.ask(clips[LONG_QUESTIONS[index % len(LONG_QUESTIONS)]])
            if not talk.reply_playing():
                void += 1
                continue
            trial = talk.speak_over(clips[INTERRUPTIONS[index % len(INTERRUPTIONS)]])
            if not trial.over_reply:
                void += 1
                continue
            spoken_over += 1
            missed += not trial.interrupted
        say(f"speech over the echo: {missed} of {spoken_over} missed ({void} replies over first)")
    baseline_replies = options.count(5, 2)
    with conversation(env, echo="off", room_echo=True) as talk:
        before = talk.child.count("barge_in")
        for index in range(baseline_replies):
            talk.wait_quiet()
            talk.ask(clips[QUESTIONS[index % len(QUESTIONS)]])
            talk.wait_quiet()
        false_without = talk.child.count("barge_in") - before
        say(f"echo not cancelled: {false_without} false barge-ins in {baseline_replies} replies")
    return [
        ECHO_FALSE.measured(
            float(false_with),
            float(false_without),
            f"echo cancellation off ({baseline_replies} replies)",
            {"replies": replies, "baseline_replies": baseline_replies},
            note=""
            if false_without
            else "the baseline showed no false barge-in: the echo path proves nothing",
        ),
        ECHO_MISSED.measured(
            float(missed),
            None,
            "",
            {"spoken_over": spoken_over, "replies_over_before_spoken_over": void},
            note="" if spoken_over == replies else f"only {spoken_over} of {replies} spoken over",
        ),
    ]


def measure(options: BenchOptions) -> list[Figure]:
    from benchmarks.jack import JackUnavailable, jack_dummy

    try:
        importlib.import_module("jack")
    except ImportError:
        raise NotRunnable("JACK-Client is not installed (the room is a JACK client)") from None
    clips = speech_clips(QUESTIONS + LONG_QUESTIONS + INTERRUPTIONS)
    try:
        with jack_dummy(options.workdir) as server:
            figures = headphones(options, server.environment, clips)
            figures += speakers(options, server.environment, clips)
    except JackUnavailable as exc:
        raise NotRunnable(str(exc)) from None
    return figures


BENCHMARK: Final = Benchmark(
    "voice",
    (TURN_LATENCY, BARGE_IN, ECHO_FALSE, ECHO_MISSED),
    measure,
    quick_skip="quick mode: the conversation figures take minutes of real time",
)

if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        quick = "--quick" in sys.argv
        for figure in measure(BenchOptions(quick=quick, workdir=Path(folder))):
            print(json.dumps(figure.to_json()))
