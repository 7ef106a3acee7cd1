"""Room scenarios run in a fresh process against the JACK server in JACK_DEFAULT_SERVER.

Usage: ``python room_child.py SCENARIO``; prints one JSON object on stdout.

A :class:`Device` client stands in for the application's full-duplex stream: its capture port
is what the room speaks into (the microphone), its playback port what the room listens to (the
speaker). It plays a known signal from a frame the scenario picks and records, by its own
frame times, what it played and what it heard. The scenario reports both sides; the test
judges them. ``jack_playback_child.main`` adds what the process left behind.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from tests.runtime.audio.jack_playback_child import main

if TYPE_CHECKING:
    from collections.abc import Callable

RATE = 48000
LEAD_FRAMES = 12345  # a start that is no multiple of the period


class Device:
    """A JACK client with a capture (input) and a playback (output) port; it plays
    ``signal`` from frame ``play_at`` on and records both ports, indexed by frame time."""

    def __init__(self, seconds: float, signal: np.ndarray | None = None) -> None:
        import jack

        self.signal = np.zeros(1, np.float32) if signal is None else signal
        size = round(seconds * RATE)
        self.heard = np.zeros(size, np.float32)
        self.played = np.zeros(size, np.float32)
        self.origin = -1
        self.end = -1
        self.play_at = -1
        self.xruns = 0
        self.glitches = 0
        self.client = jack.Client("omni-device", no_start_server=True)
        self.capture = self.client.inports.register("capture")
        self.playback = self.client.outports.register("playback")
        self.client.set_process_callback(self._process)
        self.client.set_xrun_callback(self._xrun)
        self.client.activate()

    def _xrun(self, _delay: float) -> None:
        self.xruns += 1

    def _process(self, frames: int) -> None:
        t = self.client.last_frame_time
        if self.origin < 0:
            self.origin = t
        elif t != self.end:
            self.glitches += 1
        out = self.playback.get_array()
        out.fill(0.0)
        if self.play_at >= 0:
            lead = max(0, self.play_at - t)
            first = t + lead - self.play_at
            take = min(frames - lead, self.signal.size - first)
            if take > 0:
                out[lead : lead + take] = self.signal[first : first + take]
        position = t - self.origin
        if position + frames <= self.heard.size:
            self.heard[position : position + frames] = self.capture.get_array()
            self.played[position : position + frames] = out
        self.end = t + frames

    def now(self) -> int:
        return int(self.client.frame_time)

    def wait_for(self, frame: int, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.end < frame:
            assert time.monotonic() < deadline, f"the device did not reach frame {frame}"
            time.sleep(0.005)

    def heard_between(self, start: int, end: int) -> np.ndarray:
        return self.heard[start - self.origin : end - self.origin]

    def played_between(self, start: int, end: int) -> np.ndarray:
        return self.played[start - self.origin : end - self.origin]

    def close(self) -> None:
        self.client.deactivate()
        self.client.close()


def _room(**kwargs: Any) -> Any:
    from runtime.audio.room import Room

    return Room(speaker="omni-device:playback", microphone="omni-device:capture", **kwargs)


def _burst(seconds: float, seed: int, amplitude: float = 0.3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (amplitude * rng.uniform(-1.0, 1.0, round(seconds * RATE))).astype(np.float32)


def _lag(captured: np.ndarray, reference: np.ndarray) -> int:
    """Where ``reference`` sits in ``captured``: the peak of their cross-correlation."""
    n = 1 << (captured.size + reference.size).bit_length()
    spectrum = np.fft.rfft(captured, n) * np.conj(np.fft.rfft(reference, n))
    correlation = np.fft.irfft(spectrum, n)[: captured.size - reference.size + 1]
    return int(np.argmax(correlation))


def _until_clean(
    measure: Callable[[], dict[str, Any]], device: Device, *rooms: Any
) -> dict[str, Any]:
    """``measure()``, again (up to four times) while the server lost cycles during it: the
    dummy server runs without real-time scheduling, and a late cycle shifts audio in time."""

    def lost() -> int:
        time.sleep(0.05)  # xruns are notified on another thread
        stats = [room.stats() for room in rooms]
        return (
            device.xruns + device.glitches + sum(stat.xruns + stat.frame_glitches for stat in stats)
        )

    for attempt in range(4):
        before = lost()
        result = measure()
        result["lost"] = lost() - before
        result["attempts"] = attempt + 1
        if not result["lost"]:
            break
    return result


def clips() -> dict[str, Any]:
    """Three clips into the microphone: at a frame, as soon as possible, after a while; and
    one asked for a frame already past."""
    device = Device(12.0)
    try:
        with _room() as room:

            def measure() -> dict[str, Any]:
                now = room.now()
                signals = [_burst(0.2, 1), _burst(0.15, 2), _burst(0.2, 3)]
                at = room.schedule(signals[0], now + LEAD_FRAMES)
                soon = room.schedule(signals[1])
                later = room.say(signals[2], after_s=0.5)
                ends = [clip.wait_done(5.0) for clip in (at, soon, later)]
                # A frame already past: the clip goes out in the next cycle.
                past = room.now() - 1000
                late = room.schedule(_burst(0.05, 4), past, rate=RATE)
                ends.append(late.wait_done(5.0))
                device.wait_for(max(ends) + 2 * room.period)
                heard = device.heard_between(now, device.end)
                found = []
                for clip, signal in zip((at, soon, later), signals, strict=True):
                    start = clip.start_frame
                    found.append(
                        {
                            "requested": clip.requested_frame,
                            "reported": start,
                            "found": now + _lag(heard, signal),
                            "exact": bool(
                                np.array_equal(
                                    device.heard_between(start, start + signal.size), signal
                                )
                            ),
                        }
                    )
                return {
                    "now": now,
                    "clips": found,
                    "late_requested": past,
                    "late_reported": late.start_frame,
                }

            result = _until_clean(measure, device, room)
            stats = room.stats()
            result["period"] = room.period
    finally:
        device.close()
    result["pid"] = os.getpid()
    result["clips_done"] = stats.clips_done
    result["failure"] = stats.failure
    return result


def echo() -> dict[str, Any]:
    """The device plays a burst; the room sends it back delayed and scaled. Then the echo
    switched off; then a second room with an impulse response and a noise floor."""
    from runtime.audio.room import RoomSettings

    burst = _burst(0.3, 5)
    device = Device(20.0, burst)
    result: dict[str, Any] = {"pid": os.getpid()}
    try:
        settings = RoomSettings(echo_delay_s=0.1, echo_gain=0.5)
        with _room(settings=settings) as room:
            window = burst.size + round(0.2 * RATE)

            def measure() -> dict[str, Any]:
                room.echo_on = True
                start = device.now() + LEAD_FRAMES
                device.play_at = start
                device.wait_for(start + window)
                heard = device.heard_between(start, start + window)
                lag = _lag(heard, burst)
                segment = heard[lag : lag + burst.size].astype(np.float64)
                reference = burst.astype(np.float64)
                # The echo path off: nothing comes back.
                room.echo_on = False
                again = device.now() + LEAD_FRAMES
                device.play_at = again
                device.wait_for(again + window)
                return {
                    "lag": lag,
                    "gain": float(segment @ reference / (reference @ reference)),
                    "exact": bool(np.array_equal(heard[lag : lag + burst.size], 0.5 * burst)),
                    "before_echo_peak": float(np.max(np.abs(heard[:lag]), initial=0.0)),
                    "off_peak": float(np.max(np.abs(device.heard_between(again, again + window)))),
                }

            result.update(_until_clean(measure, device, room))
            result["period"] = room.period
            result["delay_frames"] = settings.delay_frames(room.rate)
        impulse = np.zeros(1000, np.float32)
        impulse[[0, 100, 999]] = [1.0, -0.5, 0.25]
        settings = RoomSettings(
            echo_delay_s=0.05, echo_gain=0.8, noise_dbfs=-60.0, impulse=tuple(impulse)
        )
        with _room(settings=settings) as room:
            delay = settings.delay_frames(room.rate) + room.period
            expected = 0.8 * np.convolve(burst.astype(np.float64), impulse)

            def measure_impulse() -> dict[str, Any]:
                start = device.now() + LEAD_FRAMES
                device.play_at = start
                device.wait_for(start + delay + expected.size)
                heard = device.heard_between(start + delay, start + delay + expected.size)
                residual = heard - expected
                quiet = device.heard_between(start - RATE // 10, start).astype(np.float64)
                return {
                    "impulse_residual_dbfs": float(20 * np.log10(np.sqrt(np.mean(residual**2)))),
                    "noise_dbfs": float(20 * np.log10(np.sqrt(np.mean(quiet**2)))),
                    "impulse_correlation": float(np.corrcoef(heard, expected)[0, 1]),
                }

            second = _until_clean(measure_impulse, device, room)
            result.update({key: value for key, value in second.items() if key != "lost"})
            result["lost"] += second["lost"]
    finally:
        device.close()
    return result


ON_OFF = ((0, 0.25), (0.55, 0.95))  # seconds from the start: the tone is on in these


def on_off() -> dict[str, Any]:
    """The device plays a tone twice; the room finds where each sound starts and stops."""
    total = round(1.0 * RATE)
    t = np.arange(total) / RATE
    signal = np.zeros(total, np.float32)
    for on, off in ON_OFF:
        span = slice(round(on * RATE), round(off * RATE))
        signal[span] = 0.1 * np.cos(2 * np.pi * 440 * t[span])
    device = Device(12.0, signal)
    try:
        with _room() as room:
            period = room.period
            shift = period  # the speaker's connection is the loop's feedback connection

            def measure() -> dict[str, Any]:
                start = device.now() + LEAD_FRAMES
                device.play_at = start
                done = start + shift + total + 2 * RATE // 5
                device.wait_for(done)
                room.wait_for_frame(done)
                # Where the room heard the tone's edges (the device played them a period earlier).
                (on1, off1), (on2, off2) = [
                    (start + shift + round(on * RATE), start + shift + round(off * RATE))
                    for on, off in ON_OFF
                ]
                return {
                    "edges": [[on1, off1], [on2, off2]],
                    "found": {
                        "first_sound": room.first_sound_after(start - RATE // 10),
                        "second_sound": room.first_sound_after(off1),
                        "first_silence": room.silent_after(on1),
                        "second_silence": room.silent_after(on2),
                        "long_silence": room.silent_after(on1, hold_s=0.35),
                        "no_sound_after_the_end": room.first_sound_after(off2),
                    },
                    "recording_exact": bool(
                        np.array_equal(
                            room.recording(start + shift, start + shift + total),
                            device.played_between(start, start + total),
                        )
                    ),
                }

            result = _until_clean(measure, device, room)
            result["period"] = period
    finally:
        device.close()
    result["pid"] = os.getpid()
    return result


def errors() -> dict[str, Any]:
    """What a room refuses, and closing twice."""
    from runtime.audio.devices import AudioDeviceError
    from runtime.audio.room import Room
    from runtime.errors import UsageError

    device = Device(1.0)
    messages: dict[str, str] = {}
    try:
        cases = {
            "no_speaker": {"speaker": "no-such-app:out.*", "microphone": "omni-device:capture"},
            "no_microphone": {"speaker": "omni-device:playback", "microphone": "nobody"},
            "wrong_direction": {"microphone": ["omni-device:playback"]},
            "unknown_name": {"speaker": ["omni-device:nothing"]},
        }
        for case, ports in cases.items():
            room = Room(**ports)
            try:
                room.start()
            except UsageError as error:
                messages[case] = str(error)
            messages[f"{case}_closed"] = str(room.closed)
            room.close()
        try:
            Room(expected_rate=44100)
        except UsageError as error:
            messages["rate"] = str(error)
        try:
            Room(os.environ["JACK_DEFAULT_SERVER"] + "-absent")
        except AudioDeviceError as error:
            messages["no_server"] = str(error)
        room = Room(speaker="omni-device:playback", microphone="omni-device:capture")
        room.start()
        try:
            room.schedule(np.zeros((2, 10), np.float32))
        except UsageError as error:
            messages["clip_shape"] = str(error)
        try:
            room.schedule(np.zeros(10, np.float32), rate=16000)
        except UsageError as error:
            messages["clip_rate"] = str(error)
        room.close()
        room.close()
        messages["closed_twice"] = str(room.closed)
        try:
            room.schedule(np.zeros(10, np.float32))
        except UsageError as error:
            messages["after_close"] = str(error)
        before_threads = threading.active_count()
    finally:
        device.close()
    return {"pid": os.getpid(), "messages": messages, "threads": before_threads}


SCENARIOS = {"clips": clips, "echo": echo, "on_off": on_off, "errors": errors}


if __name__ == "__main__":
    raise SystemExit(main(SCENARIOS))
