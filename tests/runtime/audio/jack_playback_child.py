"""Playback scenarios run in a fresh process against the JACK server in JACK_DEFAULT_SERVER.

Usage: ``python jack_playback_child.py SCENARIO``; prints one JSON object on stdout.

libjack maps JACK's shared-memory registry once per process and keeps it for the process's
life, so each real-time scenario runs in its own process, as the command line does. The
process also checks its own cleanup: Python and OS threads, open streams and /dev/shm
entries after the players stopped and PortAudio let go of the JACK client.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

RATE = 22050
UTTERANCES_S = (0.3, 0.8, 1.6, 2.5, 4.0)
SHM = Path("/dev/shm")


def speech_like(seconds: float, seed: int) -> np.ndarray:
    """A voiced tone with a wobble and noise bursts, shaped like an utterance."""
    rng = np.random.default_rng(seed)
    t = np.arange(round(seconds * RATE)) / RATE
    voiced = np.sin(2 * np.pi * (140 + 20 * np.sin(2 * np.pi * 3 * t)) * t)
    bursts = rng.standard_normal(t.size) * (np.sin(2 * np.pi * 5 * t) > 0.8)
    envelope = np.minimum(1.0, np.minimum(t, t[-1] - t) / 0.02)
    return (0.25 * (voiced + 0.3 * bursts) * envelope).astype(np.float32)


class SynthesisLike(threading.Thread):
    """Feeds an utterance the way a streaming voice does: uneven chunks, faster than real time."""

    def __init__(self, player: Any, pcm: np.ndarray, *, real_time_factor: float) -> None:
        super().__init__(name="synthesis-like producer")
        self.player = player
        self.pcm = pcm
        self.real_time_factor = real_time_factor
        self.cancelled = False

    def run(self) -> None:
        from runtime.errors import RequestCancelled

        sizes = np.random.default_rng(len(self.pcm)).integers(1500, 6000, size=len(self.pcm))
        position = 0
        try:
            for size in sizes:
                chunk = self.pcm[position : position + int(size)]
                if not chunk.size:
                    break
                time.sleep(chunk.size / RATE * self.real_time_factor)
                self.player.feed(chunk)
                position += chunk.size
            self.player.end_of_stream()
        except RequestCancelled:
            self.cancelled = True


def _shm_names() -> set[str]:
    return {entry.name for entry in SHM.iterdir()}


def _metrics(player: Any) -> dict[str, Any]:
    from dataclasses import asdict

    result: dict[str, Any] = asdict(player.metrics())
    result["state"] = player.state.value
    result["block_duration_s"] = player.block_duration_s
    return result


def utterances() -> dict[str, Any]:
    from runtime.audio import AudioPlayer

    played = []
    for seed, seconds in enumerate(UTTERANCES_S):
        pcm = speech_like(seconds, seed)
        player = AudioPlayer("system", sample_rate_in=RATE)
        player.mark_request_start()
        player.start()
        producer = SynthesisLike(player, pcm, real_time_factor=0.3)
        producer.start()
        finished = player.wait(seconds + 5.0)
        producer.join()
        player.stop()
        played.append(
            {"seconds": seconds, "input_frames": len(pcm), "finished": finished, **_metrics(player)}
        )
    return {"utterances": played}


def pause() -> dict[str, Any]:
    from runtime.audio import AudioPlayer

    pcm = speech_like(1.5, 9)
    with AudioPlayer("system", sample_rate_in=RATE) as player:
        player.feed(pcm)
        player.end_of_stream()
        while player.metrics().frames_played < 0.4 * 48000:
            time.sleep(0.005)
        player.pause()
        state_paused = player.state.value
        time.sleep(2 * player.block_duration_s)
        held = player.metrics().frames_played
        time.sleep(0.3)
        after_pause = player.metrics().frames_played
        player.resume()
        finished = player.wait(5.0)
    return {
        "input_frames": len(pcm),
        "paused_state": state_paused,
        "held": held,
        "after_pause": after_pause,
        "finished": finished,
        **_metrics(player),
    }


def cancel() -> dict[str, Any]:
    from runtime.audio import AudioPlayer, list_output_devices

    # PortAudio's own JACK client (and its semaphore) exists from PortAudio's start on.
    list_output_devices()
    shm_before = _shm_names()
    player = AudioPlayer("system", sample_rate_in=RATE)
    player.mark_request_start()
    player.start()
    producer = SynthesisLike(player, speech_like(4.0, 5), real_time_factor=0.5)
    producer.start()
    while player.metrics().frames_played < 1.0 * 48000:
        time.sleep(0.005)
    began = time.monotonic()
    player.stop()
    stop_took = time.monotonic() - began
    frames_at_stop = player.metrics().frames_played
    producer.join(2.0)
    time.sleep(0.1)
    return {
        "stop_took_s": stop_took,
        "frames_at_stop": frames_at_stop,
        "producer_alive": producer.is_alive(),
        "producer_cancelled": producer.cancelled,
        "new_shm_after_stop": sorted(_shm_names() - shm_before),
        **_metrics(player),
    }


SCENARIOS = {"utterances": utterances, "pause": pause, "cancel": cancel}


def main(scenarios: dict[str, Callable[[], dict[str, Any]]] = SCENARIOS) -> int:
    """Run ``sys.argv[1]`` of ``scenarios`` and print its JSON with what it left behind."""
    scenario = scenarios[sys.argv[1]]
    process = psutil.Process()
    threads_before = set(threading.enumerate())
    shm_before = _shm_names()
    os_threads_before = process.num_threads()
    result = scenario()

    from runtime.audio import list_output_devices, open_stream_count, rescan_output_devices

    result["device_names"] = [device.name for device in list_output_devices()]
    result["open_streams"] = open_stream_count()
    result["threads_left"] = sorted(t.name for t in set(threading.enumerate()) - threads_before)
    # PortAudio holds one JACK client until it restarts; point it nowhere to let go of it.
    os.environ["JACK_DEFAULT_SERVER"] = f"{os.environ['JACK_DEFAULT_SERVER']}-gone"
    rescan_output_devices()
    result["os_threads_left"] = process.num_threads() - os_threads_before
    result["new_shm_after_release"] = sorted(_shm_names() - shm_before)
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
