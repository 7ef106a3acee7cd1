"""Speaking one text through a running speech pipeline, into a WAV file and/or a player.

:func:`speak` submits a request to an :class:`~runtime.api.Omni` whose adapter is the
:class:`~runtime.adapters.tts.SpeechAdapter`, writes each PCM chunk to a WAV file as it
arrives, and hands it to a feeder thread that queues it on an
:class:`~runtime.audio.AudioPlayer`, so the engine is never held back by playback. What it
measures is what ``omni-edge speak --metrics`` writes (:data:`METRIC_KEYS`, then extras):

``time_to_first_audio_s``
    From the call (the text's preparation included) to the first PCM chunk received.
``time_to_first_playback_s``
    From the call to the first block handed to the audio device (playing only).
``real_time_factor``
    From the call to the last chunk received, over ``audio_seconds``.
``audio_seconds`` and ``chunks``
    The audio received and the number of non-empty chunks it came in.
``max_chunk_gap_s``
    The longest wait between two chunks received.
``underruns`` and ``underrun_seconds``
    The times the player's buffer ran dry after playback started, and the silence they caused
    (playing only; null otherwise).
``cancel_latency_s``
    From the cancel (Ctrl+C or :meth:`SpeechCancel.cancel`) until the output stopped: the
    player's first silent block when playing, else the engine's cancellation of the request
    (null when not cancelled).

Playback starts once the queued audio both reaches ``cushion_s`` and covers the shortfall
the synthesis speed measured so far predicts: the audio still to come (known per utterance
from its frames, estimated from phoneme ids for the utterances not yet started) times how
much slower than real time it is being made, with a margin. Faster than real time, playback
starts at the cushion; on a slower (or busy) machine it starts later instead of stalling.

Cancelling stops the player first (silence within one block), then cancels the request (the
engine retires a worker whose call was running) and discards the half-written WAV file.
A ``KeyboardInterrupt`` in the calling thread cancels too, and :func:`speak` returns its result
with ``status == "interrupted"`` instead of raising; when it lands while the next output is
awaited, the engine cancels the request before the player stops. :func:`speak_interruptibly`
(what ``omni-edge speak`` uses) waits in the calling thread instead, so Ctrl+C always silences
the player first.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from runtime.adapters.tts import SpeechAdapter
from runtime.adapters.tts_text import SpeechPlan
from runtime.audio import AudioDeviceError, AudioPlayer, WavWriter
from runtime.contracts import new_request_id
from runtime.engine.outputs import AudioChunk
from runtime.errors import OmniError, RequestCancelled, UsageError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from pathlib import Path

    from runtime.api import Omni
    from runtime.audio import PlaybackMetrics
    from runtime.engine.outputs import OmniRequestOutput

__all__ = [
    "DEFAULT_CUSHION_S",
    "METRIC_KEYS",
    "NotASpeechPipeline",
    "SpeechCancel",
    "SpeechResult",
    "speak",
    "speak_interruptibly",
    "speech_plan",
]

#: The metrics every speak result reports, in this order (null where not applicable).
METRIC_KEYS: Final = (
    "time_to_first_audio_s",
    "time_to_first_playback_s",
    "real_time_factor",
    "audio_seconds",
    "chunks",
    "max_chunk_gap_s",
    "underruns",
    "underrun_seconds",
    "cancel_latency_s",
)
#: Audio queued before playback starts. The first chunk holds about 0.19 s; waiting for the
#: second as well covers the decoder's first growing call, so playback does not run dry.
DEFAULT_CUSHION_S: Final = 0.5
#: Margin on the predicted shortfall before playback starts (see the module docstring).
START_MARGIN: Final = 1.25
#: Extra time ``speak`` waits for playback to drain beyond the audio still queued.
DRAIN_SLACK_S: Final = 5.0
#: How long ``speak`` waits for a cancel started in another thread (it retires a worker).
CANCEL_WAIT_S: Final = 60.0


class NotASpeechPipeline(UsageError):
    """The pipeline's adapter is not the speech adapter."""


def speech_plan(omni: Omni, text: str | SpeechPlan | Mapping[str, Any]) -> tuple[SpeechPlan, int]:
    """``text`` prepared by ``omni``'s speech adapter, and the voice's sample rate; raises
    NotASpeechPipeline for a pipeline that does not speak, SpeechInputError for bad text."""
    session = omni.session
    rate = session.options.sample_rate
    if session.kind != SpeechAdapter.kind or rate is None:
        config = session.config
        name = config.adapter.name if config.adapter is not None else "none (a linear chain)"
        raise NotASpeechPipeline(
            f"pipeline {config.pipeline} cannot speak: its adapter is {name}; accepted: a "
            "pipeline whose adapter is runtime.adapters.tts:SpeechAdapter (e.g. "
            "assets/pipelines/speak.yaml)"
        )
    plan = session.prepare(text)
    assert isinstance(plan, SpeechPlan)
    return plan, rate


class SpeechCancel:
    """A cancel switch for one :func:`speak` call; :meth:`cancel` works from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requested_at: float | None = None
        self._action: Callable[[], None] | None = None
        self._done = threading.Event()

    @property
    def requested(self) -> bool:
        return self._requested_at is not None

    @property
    def requested_at(self) -> float | None:
        """When :meth:`cancel` was first called (``time.monotonic`` clock)."""
        return self._requested_at

    def cancel(self) -> None:
        """Stop the speech: silence the player, cancel the request. Idempotent."""
        with self._lock:
            if self._requested_at is not None:
                return
            self._requested_at = time.monotonic()
            action = self._action
        self._run(action)

    def _run(self, action: Callable[[], None] | None) -> None:
        if action is None:
            return
        try:
            action()
        finally:
            self._done.set()

    def _bind(self, action: Callable[[], None] | None) -> None:
        """Set what :meth:`cancel` does (run at once when it was already called)."""
        with self._lock:
            self._action = action
            run_now = self._requested_at is not None
        if run_now:
            self._run(action)

    def _wait_done(self, timeout_s: float = CANCEL_WAIT_S) -> None:
        """Wait until a cancel running in another thread has stopped the output."""
        self._done.wait(timeout_s)


@dataclass(frozen=True, slots=True)
class SpeechResult:
    """What one :func:`speak` call produced and measured (see the module for each metric).

    ``status`` is ``completed``, ``cancelled`` (:meth:`SpeechCancel.cancel`) or
    ``interrupted`` (KeyboardInterrupt). ``engine`` holds the adapter's own metrics of the
    request (measured from its admission; absent when cancelled), ``playback`` the player's.
    """

    status: str
    sample_rate: int
    time_to_first_audio_s: float | None
    time_to_first_playback_s: float | None
    real_time_factor: float | None
    audio_seconds: float
    chunks: int
    max_chunk_gap_s: float
    underruns: int | None
    underrun_seconds: float | None
    cancel_latency_s: float | None
    engine_cancel_s: float | None
    sentences: int
    skipped: tuple[Mapping[str, Any], ...]
    wav_path: Path | None
    engine: Mapping[str, Any]
    playback: Mapping[str, Any] | None

    def to_metrics(self) -> dict[str, Any]:
        """The metrics document: :data:`METRIC_KEYS` first, then extras."""
        document: dict[str, Any] = {key: getattr(self, key) for key in METRIC_KEYS}
        document.update(
            status=self.status,
            sample_rate=self.sample_rate,
            sentences=self.sentences,
            engine_cancel_s=self.engine_cancel_s,
            skipped=list(self.skipped),
            wav=None if self.wav_path is None else str(self.wav_path),
            engine=dict(self.engine),
            playback=None if self.playback is None else dict(self.playback),
        )
        return document

    def summary(self) -> str:
        """One line for a terminal."""
        parts = [
            f"{self.status}: {self.audio_seconds:.2f} s of audio in {self.chunks} chunk(s), "
            f"{self.sentences} sentence(s)"
        ]
        if self.time_to_first_audio_s is not None:
            parts.append(f"first audio {self.time_to_first_audio_s:.3f} s")
        if self.time_to_first_playback_s is not None:
            parts.append(f"first playback {self.time_to_first_playback_s:.3f} s")
        if self.real_time_factor is not None:
            parts.append(f"real-time factor {self.real_time_factor:.3f}")
        if self.underruns is not None:
            parts.append(f"underruns {self.underruns}")
        if self.cancel_latency_s is not None:
            parts.append(f"stopped {self.cancel_latency_s * 1000:.0f} ms after the cancel")
        if self.skipped:
            parts.append(f"skipped {len(self.skipped)} part(s)")
        if self.wav_path is not None:
            parts.append(f"wrote {self.wav_path}")
        return "; ".join(parts)


_END: Final = object()


@dataclass(slots=True)
class _StartGate:
    """Decides when playback may start (see the module docstring); the calling thread only."""

    started: float
    rate: int
    cushion: int
    sentence_ids: tuple[int, ...]
    sentence_samples: dict[int, int] = dataclasses.field(default_factory=dict)
    produced: int = 0

    def add(self, samples: int, sentence: int, sentence_samples: int) -> bool:
        """Count a chunk; True when the audio queued so far may start playing."""
        self.produced += samples
        if 0 <= sentence < len(self.sentence_ids) and sentence_samples > 0:
            self.sentence_samples[sentence] = sentence_samples
        if self.produced < self.cushion or not self.sentence_samples:
            return False
        real_time_factor = (time.monotonic() - self.started) * self.rate / self.produced
        known_ids = sum(self.sentence_ids[index] for index in self.sentence_samples)
        known = sum(self.sentence_samples.values())
        unknown_ids = sum(self.sentence_ids) - known_ids
        total = known + unknown_ids * known / max(1, known_ids)
        remaining_s = max(0.0, total - self.produced) / self.rate
        shortfall_s = remaining_s * max(0.0, real_time_factor - 1.0) * START_MARGIN
        return self.produced / self.rate >= shortfall_s


class _Feeder(threading.Thread):
    """Queues chunks on the player in its own thread, so ``feed`` never holds up the engine;
    chunks are held back until the start gate opens."""

    def __init__(self, player: AudioPlayer, gate: _StartGate) -> None:
        super().__init__(name="speech-feeder", daemon=True)
        self.player = player
        self.gate = gate
        self.queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.held: list[np.ndarray] | None = []
        self.error: OmniError | None = None
        self.queued_samples = 0

    def put(self, pcm: np.ndarray, sentence: int, sentence_samples: int) -> None:
        if self.error is not None:
            raise self.error
        self.queued_samples += pcm.size
        if self.held is None:
            self.queue.put(pcm)
            return
        self.held.append(pcm)
        if self.gate.add(pcm.size, sentence, sentence_samples):
            self._release()

    def _release(self) -> None:
        held, self.held = self.held, None
        for pcm in held or ():
            self.queue.put(pcm)

    def finish(self) -> None:
        self._release()
        self.queue.put(_END)

    def run(self) -> None:
        try:
            while (item := self.queue.get()) is not _END:
                assert isinstance(item, np.ndarray)
                self.player.feed(item)
            self.player.end_of_stream()
        except RequestCancelled:
            return
        except OmniError as exc:
            self.error = exc

    def abandon(self) -> None:
        """After ``player.stop()``: the next ``feed`` raises, so the thread ends."""
        self.held = None
        self.queue.put(_END)
        self.join()


@dataclass(slots=True)
class _Clock:
    """The consumer's measurements (the calling thread only)."""

    started: float
    chunks: int = 0
    samples: int = 0
    first: float | None = None
    last: float | None = None
    max_gap: float = 0.0

    def chunk(self, samples: int) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        elif self.last is not None:
            self.max_gap = max(self.max_gap, now - self.last)
        self.last = now
        self.chunks += 1
        self.samples += samples


def speak(
    omni: Omni,
    text: str | SpeechPlan | Mapping[str, Any],
    *,
    out: Path | None = None,
    play: bool = False,
    device: str | int | None = None,
    player: AudioPlayer | None = None,
    cancel: SpeechCancel | None = None,
    cushion_s: float = DEFAULT_CUSHION_S,
    on_chunk: Callable[[OmniRequestOutput], None] | None = None,
) -> SpeechResult:
    """Speak ``text`` (or a plan from the pipeline's adapter) into ``out`` and/or the device.

    With ``play``, a player is made for ``device`` (a name or an index; None: the default
    output); or pass your own ``player`` (not started, ``sample_rate_in`` the voice's rate),
    which this call starts and stops. ``on_chunk`` sees every output as it arrives (in this
    thread). Raises the engine's errors, ``SpeechInputError`` for unspeakable text and
    ``AudioDeviceError`` when playback fails.
    """
    plan, rate = speech_plan(omni, text)
    cancel = cancel if cancel is not None else SpeechCancel()
    request_id = new_request_id()
    clock = _Clock(started=time.monotonic())
    engine: Mapping[str, Any] = {}
    status = "completed"
    feeder: _Feeder | None = None
    marks: dict[str, float] = {}

    def stop_output() -> None:
        marks.setdefault("stopping", time.monotonic())
        if player is not None:
            player.stop()
        omni.cancel(request_id)
        marks.setdefault("engine_cancelled", time.monotonic())

    with contextlib.ExitStack() as stack:
        writer = stack.enter_context(WavWriter(out, rate)) if out is not None else None
        if play and player is None:
            player = AudioPlayer(
                device,
                sample_rate_in=rate,
                cushion_s=cushion_s,
                max_cushion_s=max(1.0, 2 * cushion_s),
            )
        if player is not None:
            player.mark_request_start(clock.started)
            player.start()
            stack.callback(player.stop)
            if player.metrics().input_rate != rate:
                raise UsageError(
                    f"the player takes {player.metrics().input_rate} Hz audio; this voice "
                    f"speaks at {rate} Hz"
                )
            gate = _StartGate(
                started=clock.started,
                rate=rate,
                cushion=round(cushion_s * rate),
                sentence_ids=tuple(len(sentence.ids) for sentence in plan.sentences),
            )
            feeder = _Feeder(player, gate)
            stack.callback(_shutdown_playback, player, feeder)
            feeder.start()
        outputs = omni.generate(_request_input(plan), request_id=request_id)
        stack.callback(_close_outputs, outputs)
        cancel._bind(stop_output)
        stack.callback(cancel._bind, None)
        try:
            engine = _consume(outputs, clock, cancel, writer, feeder, on_chunk)
            if player is not None and feeder is not None:
                _drain(player, feeder, clock.samples / rate)
            if cancel.requested:
                raise RequestCancelled("speech was cancelled")
        except RequestCancelled:
            if not cancel.requested:
                raise
            status = "cancelled"
        except KeyboardInterrupt:
            status = "interrupted"
            cancel.cancel()
        if status != "completed":
            cancel._wait_done()
            # Only complete speech is written: discard the half-written file.
            if writer is not None:
                writer.abort()
                writer = None
        if player is not None:
            player.stop()
        playback = None if player is None else player.metrics()
    return _result(status, rate, clock, plan, engine, playback, cancel, marks, writer)


def speak_interruptibly(
    omni: Omni, text: str | SpeechPlan | Mapping[str, Any], **options: Any
) -> SpeechResult:
    """:func:`speak` in a helper thread while this thread waits: a Ctrl+C here (a
    ``KeyboardInterrupt`` in this thread) cancels at once, the player first, wherever the
    speech thread is. The result's status is then ``interrupted``. For the main thread of a
    command line; ``options`` are those of :func:`speak`."""
    switch: SpeechCancel = options.pop("cancel", None) or SpeechCancel()
    interrupted = False
    with cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="speech") as pool:
        future = pool.submit(speak, omni, text, cancel=switch, **options)
        while True:
            try:
                result = future.result(timeout=0.1)
                break
            except TimeoutError:
                continue
            except KeyboardInterrupt:
                interrupted = True
                switch.cancel()
    if interrupted and result.status == "cancelled":
        result = dataclasses.replace(result, status="interrupted")
    return result


def _close_outputs(outputs: Iterator[OmniRequestOutput]) -> None:
    """Close the request's generator: a request still running is cancelled."""
    close = getattr(outputs, "close", None)
    if close is not None:
        close()


def _shutdown_playback(player: AudioPlayer, feeder: _Feeder) -> None:
    """Stop the player first: a ``feed`` waiting for room then raises and the feeder ends."""
    player.stop()
    feeder.abandon()


def _drain(player: AudioPlayer, feeder: _Feeder, audio_s: float) -> None:
    """After the last chunk: let the player play everything queued, then finish."""
    feeder.finish()
    feeder.join()
    if feeder.error is not None:
        raise feeder.error
    if not player.wait(audio_s + DRAIN_SLACK_S):
        where = player.device.describe() if player.device is not None else "the audio output"
        raise AudioDeviceError(
            f"playback did not finish within {audio_s + DRAIN_SLACK_S:.1f} s on {where}"
        )


def _request_input(plan: SpeechPlan) -> Any:
    """The request as the speech adapter's ``prepare`` takes it (``Omni.generate`` is typed
    for tensor pipelines; the orchestrator hands any input to the pipeline's program)."""
    return plan


def _consume(
    outputs: Iterator[OmniRequestOutput],
    clock: _Clock,
    cancel: SpeechCancel,
    writer: WavWriter | None,
    feeder: _Feeder | None,
    on_chunk: Callable[[OmniRequestOutput], None] | None,
) -> Mapping[str, Any]:
    """Take every output until the final one; returns the adapter's metrics."""
    engine: Mapping[str, Any] = {}
    for output in outputs:
        if cancel.requested:
            raise RequestCancelled("speech was cancelled")
        chunk = AudioChunk.from_output(output)
        if chunk is None:
            raise UsageError(
                f"output {output.index} of {output.request_id} has no 'pcm'; the pipeline is "
                "not a speech pipeline"
            )
        if chunk.pcm.size:
            clock.chunk(chunk.pcm.size)
            if writer is not None:
                writer.write(chunk.pcm)
            if feeder is not None:
                feeder.put(
                    chunk.pcm,
                    -1 if chunk.sentence_index is None else chunk.sentence_index,
                    chunk.sentence_samples or 0,
                )
        if on_chunk is not None:
            on_chunk(output)
        if output.finished:
            engine = {key: value for key, value in output.metrics.items() if key != "stages"}
    if cancel.requested:
        raise RequestCancelled("speech was cancelled")
    return engine


def _result(
    status: str,
    rate: int,
    clock: _Clock,
    plan: SpeechPlan,
    engine: Mapping[str, Any],
    playback: PlaybackMetrics | None,
    cancel: SpeechCancel,
    marks: Mapping[str, float],
    writer: WavWriter | None,
) -> SpeechResult:
    audio_s = clock.samples / rate
    synthesis_s = None if clock.last is None else clock.last - clock.started
    requested = cancel.requested_at
    cancel_latency = engine_cancel = None
    if status != "completed" and requested is not None:
        if "engine_cancelled" in marks:
            engine_cancel = max(0.0, marks["engine_cancelled"] - requested)
        if playback is not None and "stopping" in marks:
            # The player measures from its stop() call to the first silent block.
            cancel_latency = max(0.0, marks["stopping"] - requested) + (
                playback.cancel_latency_s or 0.0
            )
        else:
            cancel_latency = engine_cancel
    return SpeechResult(
        status=status,
        sample_rate=rate,
        time_to_first_audio_s=None if clock.first is None else clock.first - clock.started,
        time_to_first_playback_s=None if playback is None else playback.time_to_first_playback_s,
        real_time_factor=None if synthesis_s is None or not audio_s else synthesis_s / audio_s,
        audio_seconds=audio_s,
        chunks=clock.chunks,
        max_chunk_gap_s=clock.max_gap,
        underruns=None if playback is None else playback.underruns,
        underrun_seconds=None if playback is None else playback.underrun_seconds,
        cancel_latency_s=cancel_latency,
        engine_cancel_s=engine_cancel,
        sentences=len(plan.sentences),
        skipped=tuple(item.to_json() for item in plan.skipped),
        wav_path=None if writer is None else writer.path,
        engine=engine,
        playback=None if playback is None else dataclasses.asdict(playback),
    )
