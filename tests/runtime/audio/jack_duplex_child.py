"""Duplex scenarios run in a fresh process against the JACK server in JACK_DEFAULT_SERVER.

Usage: ``python jack_duplex_child.py SCENARIO``; prints one JSON object on stdout, with what
the process left behind (see ``jack_playback_child.main``).

A JACK client of this process (:class:`Probe`) is wired to the ports of the full-duplex
stream that :class:`runtime.audio.duplex.DuplexAudio` opened on the server's ``system``
device: it records what the stream plays, and writes into the stream's input a known clip
and, when asked, an echo of what the stream plays (a loudspeaker heard by the microphone).
The server's clock paces both, as a sound card would.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any

import numpy as np

from tests.runtime.audio.jack_capture_child import _align
from tests.runtime.audio.jack_playback_child import main, speech_like

RATE = 22050
SERVER_RATE = 48000
SPEECH = 16000
FADE_S = 0.02
#: Seconds of the stream's output the probe can record.
RECORD_S = 20.0


class Probe:
    """A JACK client recording the duplex stream's output and feeding its input."""

    def __init__(self) -> None:
        import jack

        self.recording = np.zeros(round(RECORD_S * SERVER_RATE), np.float32)
        self.recorded = 0
        self.clip = np.zeros(0, np.float32)
        self.clip_position = 0
        self.echo_gain = 0.0
        self.xruns = 0
        self.client = jack.Client("omni-duplex-probe", no_start_server=True)
        self.inport = self.client.inports.register("in")
        self.outport = self.client.outports.register("out")
        self.client.set_process_callback(self._process)
        self.client.set_xrun_callback(self._xrun)
        self.client.activate()

    def _xrun(self, _delay: float) -> None:
        self.xruns += 1

    def _process(self, frames: int) -> None:
        heard = self.inport.get_array()
        end = min(self.recorded + frames, self.recording.size)
        self.recording[self.recorded : end] = heard[: end - self.recorded]
        self.recorded = end
        out = self.outport.get_array()
        out.fill(0.0)
        piece = self.clip[self.clip_position : self.clip_position + frames]
        out[: piece.size] = piece
        self.clip_position += piece.size
        if self.echo_gain:
            out += self.echo_gain * heard

    def connect(self) -> dict[str, list[str]]:
        """Our input from the stream's first output port; our output into its input ports."""
        own = ("system:", "omni-duplex-probe:")
        outputs = [
            port.name
            for port in self.client.get_ports(is_audio=True, is_output=True)
            if not port.name.startswith(own)
        ]
        inputs = [
            port.name
            for port in self.client.get_ports(is_audio=True, is_input=True)
            if not port.name.startswith(own)
        ]
        self.client.connect(outputs[0], self.inport)
        for target in inputs:
            self.client.connect(self.outport, target)
        return {"stream_outputs": outputs, "stream_inputs": inputs}

    def play(self, clip: np.ndarray) -> None:
        self.clip_position = 0
        self.clip = clip

    def close(self) -> None:
        self.client.deactivate()
        self.client.close()


def _stream_conversion(pcm: np.ndarray, sizes: list[int]) -> np.ndarray:
    """The reply as the duplex stream converts it: fed in these chunks, then flushed."""
    from runtime.audio import StreamResampler

    resampler = StreamResampler(RATE, SERVER_RATE)
    pieces = []
    position = 0
    for size in sizes:
        pieces.append(resampler.process(pcm[position : position + size]))
        position += size
    pieces.append(resampler.flush())
    return np.concatenate(pieces)


def _chunk_sizes(total: int, seed: int) -> list[int]:
    sizes = []
    rng = np.random.default_rng(seed)
    while sum(sizes) < total:
        sizes.append(int(min(rng.integers(700, 4000), total - sum(sizes))))
    return sizes


def _find(recording: np.ndarray, expected: np.ndarray) -> int:
    """Where ``expected`` starts in ``recording`` (its first non-silent sample)."""
    first = int(np.flatnonzero(expected)[0])
    nonzero = np.flatnonzero(recording)
    return int(nonzero[0]) - first if nonzero.size else -1


def play() -> dict[str, Any]:
    """A reply fed in uneven chunks, faster than real time, and played whole."""
    from runtime.audio.duplex import DuplexAudio

    pcm = speech_like(1.5, 3)
    sizes = _chunk_sizes(pcm.size, 3)
    duplex = DuplexAudio("system", fade_s=FADE_S)
    duplex.start()
    probe = Probe()
    try:
        ports = probe.connect()
        time.sleep(0.1)
        before = probe.recorded
        duplex.begin_reply("one")
        position = 0
        for size in sizes:
            assert duplex.feed(pcm[position : position + size])
            position += size
            time.sleep(size / RATE * 0.3)
        duplex.end_reply()
        finished = duplex.wait_reply("one", 5.0)
        time.sleep(0.1)
        reply = duplex.reply("one")
        metrics = duplex.metrics()
    finally:
        duplex.close()
        probe.close()
    expected = _stream_conversion(pcm, sizes)
    recording = probe.recording[before : probe.recorded]
    lag = _find(recording, expected)
    heard = recording[lag : lag + expected.size]
    _, correlation, snr = _align(recording, expected)
    outside = np.concatenate([recording[:lag], recording[lag + expected.size :]])
    return {
        "pid": os.getpid(),
        **ports,
        "host_api": metrics.host_api,
        "device_rate": metrics.device_rate,
        "output_channels": metrics.output_channels,
        "finished": finished,
        "fed": reply.fed,
        "played": reply.played,
        "input_samples": int(pcm.size),
        "reply_finished": reply.finished,
        "reply_interrupted": reply.interrupted,
        "first_sample_at_set": reply.first_sample_at is not None,
        "output_latency_s": reply.output_latency_s,
        "frames_played": metrics.frames_played,
        "expected_frames": int(expected.size),
        "bit_exact": bool(heard.size == expected.size and np.array_equal(heard, expected)),
        "max_difference": float(np.abs(heard - expected[: heard.size]).max(initial=0.0)),
        "correlation": correlation,
        "snr_db": snr,
        "silent_outside_reply": bool(not outside.any()),
        "underruns": metrics.underruns,
        "xruns": probe.xruns,
    }


def _zero_runs(signal: np.ndarray, shortest: int) -> list[tuple[int, int]]:
    """(start, end) of every run of exact zeros at least ``shortest`` samples long."""
    zero = np.concatenate([[False], signal == 0.0, [False]])
    edges = np.flatnonzero(np.diff(zero.astype(np.int8)))
    return [
        (int(start), int(end))
        for start, end in zip(edges[::2], edges[1::2], strict=True)
        if end - start >= shortest
    ]


def barge_in() -> dict[str, Any]:
    """duck, hold, resume, then interrupt a reply; the next reply plays whole."""
    from runtime.audio.duplex import DuplexAudio

    pcm = speech_like(3.0, 5)
    after = speech_like(0.6, 6)
    duplex = DuplexAudio("system", fade_s=FADE_S)
    duplex.start()
    probe = Probe()
    try:
        probe.connect()
        time.sleep(0.1)
        before = probe.recorded
        duplex.begin_reply("long")
        assert duplex.feed(pcm[: pcm.size * 3 // 4])
        while duplex.played_samples("long") < 0.5 * RATE:
            time.sleep(0.002)
        t_duck = time.monotonic()
        duplex.duck()
        duck_silent_at = duplex.wait_silent(1.0)
        time.sleep(0.05)
        held = duplex.played_samples("long")
        held_metrics = duplex.metrics()
        time.sleep(0.4)
        still_held = duplex.played_samples("long")
        duplex.resume()
        while duplex.played_samples("long") < 1.5 * RATE:
            time.sleep(0.002)
        t_interrupt = time.monotonic()
        interrupted = duplex.interrupt()
        interrupt_silent_at = duplex.wait_silent(1.0)
        fed_after = duplex.feed(pcm[pcm.size * 3 // 4 :])
        duplex.end_reply()
        dropped = duplex.wait_reply("long", 1.0)
        long_reply = duplex.reply("long")
        time.sleep(0.1)
        duplex.begin_reply("after")
        assert duplex.feed(after)
        duplex.end_reply()
        after_finished = duplex.wait_reply("after", 3.0)
        time.sleep(0.1)
        after_reply = duplex.reply("after")
        metrics = duplex.metrics()
    finally:
        duplex.close()
        probe.close()
    block_s = metrics.block_frames / metrics.device_rate
    fade = round(FADE_S * SERVER_RATE)
    recording = probe.recording[before : probe.recorded]
    expected = _stream_conversion(pcm, [pcm.size])
    expected_after = _stream_conversion(after, [after.size])
    lag = _find(recording, expected)
    # After the reply's start: its audio, the hold (exact silence), its audio again, the
    # interrupt's silence, then the next reply.
    runs = _zero_runs(recording[lag:], round(0.1 * SERVER_RATE))
    hold_start, hold_end = runs[0]
    cut_start, cut_end = runs[1]
    joined = np.concatenate([recording[lag : lag + hold_start], recording[lag + hold_end :]])
    # Up to the interrupt's fade, the reply with the hold taken out is the reply itself, but
    # for the gain of the two fades around the place it held.
    upto = hold_start + (cut_start - hold_end) - fade
    different = np.flatnonzero(joined[:upto] != expected[:upto])
    after_start = lag + cut_end + _find(recording[lag + cut_end :], expected_after)
    heard_after = recording[after_start : after_start + expected_after.size]
    return {
        "pid": os.getpid(),
        "block_s": block_s,
        "fade_s": FADE_S,
        "duck_latency_s": None if duck_silent_at is None else duck_silent_at - t_duck,
        "interrupt_latency_s": (
            None if interrupt_silent_at is None else interrupt_silent_at - t_interrupt
        ),
        "held_samples": held,
        "still_held_samples": still_held,
        "held_gain": held_metrics.gain,
        "held_flag": held_metrics.held,
        "hold_s": (hold_end - hold_start) / SERVER_RATE,
        "fade_frames": fade,
        "differences": int(different.size),
        "differences_from": int(different.min(initial=hold_start) - hold_start),
        "differences_to": int(different.max(initial=hold_start) - hold_start),
        "played_before_hold_frames": hold_start,
        "interrupted_ids": list(interrupted),
        "fed_after_interrupt": fed_after,
        "long_dropped": dropped,
        "long_fed": long_reply.fed,
        "long_played": long_reply.played,
        "long_discarded": long_reply.discarded,
        "long_interrupted": long_reply.interrupted,
        "long_finished": long_reply.finished,
        "cut_played_frames": cut_start - hold_end + hold_start,
        "after_gap_frames": after_start - (lag + cut_end),
        "after_bit_exact": bool(np.array_equal(heard_after, expected_after)),
        "after_finished": after_finished,
        "after_played": after_reply.played,
        "after_fed": after_reply.fed,
        "after_interrupted": after_reply.interrupted,
        "underruns": metrics.underruns,
        "xruns": probe.xruns,
    }


def _collect(duplex: Any, blocks: list[Any]) -> threading.Thread:
    def consume() -> None:
        while (block := duplex.read()) is not None:
            blocks.append(block)

    reader = threading.Thread(target=consume, name="duplex reader")
    reader.start()
    return reader


def _lag(near: np.ndarray, far: np.ndarray, longest: int) -> tuple[int, float]:
    """The delay (samples, at most ``longest``) at which ``far`` best explains ``near``."""
    scores = [
        float(np.dot(near[shift:], far[: far.size - shift]))
        / (np.linalg.norm(far[: far.size - shift]) * np.linalg.norm(near[shift:]) + 1e-12)
        for shift in range(longest)
    ]
    best = int(np.argmax(scores))
    return best, float(scores[best])


def capture() -> dict[str, Any]:
    """The microphone (a clip) and the reference (our reply), then an echo of two replies."""
    import soxr

    from runtime.audio.duplex import DuplexAudio, PassThroughEchoCanceller

    clip = speech_like(2.0, 11)
    clip_server = soxr.resample(clip, RATE, SERVER_RATE).astype(np.float32)
    replies = {"first": speech_like(1.5, 12), "second": speech_like(0.8, 13)}
    replies["third"] = speech_like(0.8, 14)
    canceller = PassThroughEchoCanceller(160)
    duplex = DuplexAudio("system", fade_s=FADE_S, echo_canceller=canceller)
    duplex.start()
    probe = Probe()
    blocks: list[Any] = []
    reader = _collect(duplex, blocks)
    timing: dict[str, float] = {}
    try:
        probe.connect()
        time.sleep(0.2)
        # Phase one: the clip arrives at the microphone while the first reply plays.
        probe.play(clip_server)
        duplex.begin_reply("first")
        duplex.feed(replies["first"])
        duplex.end_reply()
        assert duplex.wait_reply("first", 5.0)
        while probe.clip_position < clip_server.size:
            time.sleep(0.01)
        time.sleep(0.2)
        timing["echo_from"] = time.monotonic()
        # Phase two: the microphone hears what the stream plays, twice, at different times.
        probe.echo_gain = 0.5
        for name in ("second", "third"):
            duplex.begin_reply(name)
            duplex.feed(replies[name])
            duplex.end_reply()
            assert duplex.wait_reply(name, 5.0)
            time.sleep(0.25 if name == "second" else 0.15)
        level = duplex.level(0.5)
        played = {name: duplex.reply(name) for name in replies}
        metrics = duplex.metrics()
    finally:
        duplex.close()
        probe.close()
        reader.join(5.0)
    near = np.concatenate([block.near for block in blocks])
    far = np.concatenate([block.far for block in blocks])
    positions_contiguous = all(
        later.position == earlier.position + earlier.near.size
        for earlier, later in itertools.pairwise(blocks)
    )
    frame_multiples = all(block.near.size % 160 == 0 for block in blocks[:-1])

    def time_of(position: int) -> float:
        """``started_at`` of the block holding 16 kHz sample ``position``, carried to it."""
        for block in blocks:
            if block.position <= position < block.position + block.near.size:
                return float(block.started_at + (position - block.position) / SPEECH)
        raise AssertionError(position)

    echo_from = next(b.position for b in blocks if b.captured_at >= timing["echo_from"])
    # The clip in near, over phase one (three 16 kHz phases of the 48 kHz start, as
    # jack_capture_child does).
    candidates = [
        soxr.resample(np.concatenate([np.zeros(shift, np.float32), clip_server]), 48000, SPEECH)
        for shift in range(3)
    ]
    clip_lag, clip_correlation, clip_snr = max(
        (_align(near[:echo_from], c.astype(np.float32)) for c in candidates),
        key=lambda found: found[1],
    )
    result: dict[str, Any] = {
        "pid": os.getpid(),
        "blocks": len(blocks),
        "positions_contiguous": positions_contiguous,
        "frame_multiples": frame_multiples,
        "echo_cancelled": all(block.echo_cancelled for block in blocks),
        "frames_cancelled": canceller.frames_processed,
        "near_samples": int(near.size),
        "far_samples": int(far.size),
        "dropped": sum(block.dropped_blocks for block in blocks),
        "capture_blocks_dropped": metrics.capture_blocks_dropped,
        "clip_correlation": clip_correlation,
        "clip_snr_db": clip_snr,
        "clip_lag_s": clip_lag / SPEECH,
        "level_rms_dbfs": level.rms_dbfs,
        "input_latency_s": metrics.input_latency_s,
        "output_latency_s": metrics.output_latency_s,
        "xruns": probe.xruns,
        "replies": {},
    }
    for name, pcm in replies.items():
        # Each reply in far: where the callback put its first sample, and how well it matches.
        # The reply starts on a 48 kHz frame that may fall 0, 1/3 or 2/3 of a 16 kHz sample
        # late: its conversion to 16 kHz is compared at each of those phases.
        played_48k = _stream_conversion(pcm, [pcm.size])
        phases = [
            soxr.resample(np.concatenate([np.zeros(shift, np.float32), played_48k]), 48000, SPEECH)
            for shift in range(3)
        ]
        lag, correlation, snr = max(
            (_align(far, phase.astype(np.float32)) for phase in phases),
            key=lambda found: found[1],
        )
        reference = phases[0]
        window = far[lag : lag + reference.size]
        entry = {
            "far_lag": lag,
            "far_correlation": correlation,
            "far_snr_db": snr,
            "far_start_vs_first_sample_at_s": time_of(lag) - played[name].first_sample_at,
            "fed": played[name].fed,
            "played": played[name].played,
        }
        if name != "first":
            # The echo: near is far delayed by the path through the probe.
            stop = lag + reference.size + 4000
            delay, score = _lag(near[lag:stop], far[lag:stop], 2000)
            entry |= {"echo_delay": delay, "echo_score": score}
        entry["far_energy"] = float(np.sum(window.astype(np.float64) ** 2))
        result["replies"][name] = entry
    return result


SCENARIOS = {"play": play, "barge_in": barge_in, "capture": capture}


if __name__ == "__main__":
    raise SystemExit(main(SCENARIOS))
