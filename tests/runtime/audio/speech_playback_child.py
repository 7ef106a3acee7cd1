"""Speech scenarios through the real pipeline and player, in a fresh process, against the
JACK server in JACK_DEFAULT_SERVER; the voice bundles are under OMNI_EDGE_DATA_DIR.

Usage: ``python speech_playback_child.py SCENARIO``; prints one JSON object on stdout, with
what the process left behind (see ``jack_playback_child.main``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psutil
from jack_playback_child import main

# Imported before ``main`` counts the process's threads: importing ONNX Runtime starts one
# thread of its own that lives as long as the process.
from runtime.adapters.speak import SpeechCancel, speak
from runtime.api import Omni
from runtime.config import load_pipeline
from runtime.devices import DeviceSelection, discover_topology

REPO = Path(__file__).resolve().parents[3]
SPEAK_PIPELINE = REPO / "assets" / "pipelines" / "speak.yaml"
#: Five utterances of different lengths (about 0.5 to 5 s of speech), the last two with
#: more than one sentence.
UTTERANCES = (
    "Hi.",
    "Hello from the edge.",
    "The quick brown fox jumps over the lazy dog.",
    "Streaming speech starts quickly. Then its chunks grow.",
    "A longer passage comes last. It has three sentences. Nothing stalls while it plays.",
)
CANCELLED = "This utterance is cut off in the middle, while it plays on the server. " * 3
#: Audio played (at the device's 48 kHz) before the cancel.
CANCEL_AFTER_FRAMES = 24_000


def _speech(omni: Omni) -> dict[str, Any]:
    from runtime.audio import AudioPlayer, PlayerState

    played = []
    for text in UTTERANCES:
        result = speak(omni, text, play=True, device="system")
        played.append({"text": text, **result.to_metrics()})
    # Cancel mid-utterance from another thread, as a stop button would.
    player = AudioPlayer("system", sample_rate_in=22050)
    switch = SpeechCancel()
    frames_at_cancel: list[int] = []

    def cancel_while_playing() -> None:
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            if player.state is PlayerState.PLAYING:
                frames = player.metrics().frames_played
                if frames >= CANCEL_AFTER_FRAMES:
                    frames_at_cancel.append(frames)
                    switch.cancel()
                    return
            time.sleep(0.002)

    watcher = threading.Thread(target=cancel_while_playing, name="stop-button")
    watcher.start()
    cancelled = speak(omni, CANCELLED, player=player, cancel=switch)
    watcher.join()
    time.sleep(0.2)
    return {
        "utterances": played,
        "cancelled": {
            **cancelled.to_metrics(),
            "frames_at_cancel": frames_at_cancel,
            "block_duration_s": player.block_duration_s,
            "frames_played_after": player.metrics().frames_played,
        },
    }


def speech() -> dict[str, Any]:
    config = load_pipeline(SPEAK_PIPELINE)
    with Omni(config, topology=discover_topology(), selection=DeviceSelection()) as omni:
        workers = list(omni.execution_plan.worker_pids)
        result = _speech(omni)
    result["workers_alive"] = [pid for pid in workers if psutil.pid_exists(pid)]
    return result


if __name__ == "__main__":
    raise SystemExit(main({"speech": speech}))
