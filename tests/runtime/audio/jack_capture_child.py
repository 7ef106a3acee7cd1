"""Capture scenarios run in a fresh process against the JACK server in JACK_DEFAULT_SERVER.

Usage: ``python jack_capture_child.py SCENARIO``; prints one JSON object on stdout.

A JACK client of this process plays a known clip into the ports of the input stream that
:class:`runtime.audio.AudioInput` opened on the server's ``system`` device, so the input reads
it through PortAudio exactly as it would read a microphone, paced by the server's clock. The
scenario reports what arrived (aligned against the clip), when, and what it left behind
(through ``jack_playback_child.main``).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np

from tests.runtime.audio.jack_playback_child import main, speech_like

CLIP_RATE = 22050
RATE = 16000
CLIP_S = 2.5
LEAD_S = 0.3


class FilePlayer:
    """A JACK client with one output port that plays ``samples`` (at the server's rate) once,
    from the moment :meth:`play` is called, then silence."""

    def __init__(self, samples: np.ndarray) -> None:
        import jack

        self.samples = samples
        self.position = 0
        self.playing = threading.Event()
        self.started_at: float | None = None
        self.client = jack.Client("omni-file-source", no_start_server=True)
        self.port = self.client.outports.register("out")
        self.xruns = 0
        self.client.set_process_callback(self._process)
        self.client.set_xrun_callback(self._xrun)
        self.client.activate()

    def _xrun(self, _delay: float) -> None:
        self.xruns += 1

    def _process(self, frames: int) -> None:
        buffer = self.port.get_array()
        if not self.playing.is_set():
            buffer.fill(0.0)
            return
        if self.started_at is None:
            self.started_at = time.monotonic()
        piece = self.samples[self.position : self.position + frames]
        buffer[: piece.size] = piece
        buffer[piece.size :] = 0.0
        self.position += piece.size

    def connect_to_inputs(self) -> list[str]:
        """Connect to every audio input port that is not the server's or this client's."""
        targets = [
            port.name
            for port in self.client.get_ports(is_audio=True, is_input=True)
            if not port.name.startswith(("system:", "omni-file-source:"))
        ]
        for target in targets:
            self.client.connect(self.port, target)
        return targets

    def play(self) -> None:
        self.playing.set()

    def close(self) -> None:
        self.client.deactivate()
        self.client.close()


def _align(captured: np.ndarray, reference: np.ndarray) -> tuple[int, float, float]:
    """The lag of ``reference`` inside ``captured``, their correlation there and the SNR."""
    size = captured.size + reference.size
    n = 1 << (size - 1).bit_length()
    spectrum = np.fft.rfft(captured, n) * np.conj(np.fft.rfft(reference, n))
    correlation = np.fft.irfft(spectrum, n)[: captured.size - reference.size + 1]
    lag = int(np.argmax(correlation))
    segment = captured[lag : lag + reference.size].astype(np.float64)
    expected = reference.astype(np.float64)
    coefficient = float(np.corrcoef(segment, expected)[0, 1])
    noise = float(np.sum((segment - expected) ** 2))
    snr = 10 * np.log10(float(np.sum(expected**2)) / max(noise, 1e-30))
    return lag, coefficient, snr


def capture() -> dict[str, Any]:
    import soxr

    from runtime.audio import AudioInput

    clip = speech_like(CLIP_S, 11)
    at_server = soxr.resample(clip, CLIP_RATE, 48000).astype(np.float32)
    clip_48k = at_server
    reference = soxr.resample(clip, CLIP_RATE, RATE).astype(np.float32)
    source = AudioInput("system", sample_rate=RATE)
    source.start()
    player = FilePlayer(at_server)
    try:
        targets = player.connect_to_inputs()
        # Some audio before the clip: the input runs on its own, whatever is playing. What
        # queued up while the player client started is read first, so that the reads after
        # the clip starts wait for the server's clock.
        first = source.read(timeout=2.0)
        assert first is not None
        pieces = [first]
        while source.metrics().queued_blocks:
            chunk = source.read(timeout=0.005)
            assert chunk is not None
            pieces.append(chunk)
        before = sum(piece.size for piece in pieces)
        player.play()
        t_play = time.monotonic()
        wanted = round((CLIP_S + LEAD_S) * RATE) + before
        received = before
        levels = []
        while received < wanted and time.monotonic() - t_play < CLIP_S + 5.0:
            chunk = source.read(timeout=1.0)
            assert chunk is not None
            pieces.append(chunk)
            received += chunk.size
            levels.append(source.level().rms_dbfs)
        t_read = time.monotonic()
        captured = np.concatenate(pieces)
        before_close = source.metrics()
        closing = time.monotonic()
        source.close()
        close_s = time.monotonic() - closing
        after = source.read(timeout=0.5)
        rest = []
        while after is not None:
            rest.append(after)
            after = source.read(timeout=0.5)
    finally:
        source.close()
        player.close()
    # The clip may start at any 48 kHz frame, so the 16 kHz samples the input made of it sit
    # 0, 1/3 or 2/3 of a sample later than those of the direct conversion: align against each.
    candidates = [
        soxr.resample(np.concatenate([np.zeros(shift, np.float32), clip_48k]), 48000, RATE)
        for shift in range(3)
    ]
    lag, coefficient, snr = max(
        (_align(captured, candidate.astype(np.float32)) for candidate in candidates),
        key=lambda found: found[1],
    )
    clip_end_sample = lag + reference.size
    # Samples delivered per second of waiting, from the moment the clip began to play.
    read_rate = (captured.size - before) / (t_read - t_play)
    return {
        "pid": os.getpid(),
        "targets": targets,
        "host_api": before_close.host_api,
        "device_rate": before_close.device_rate,
        "block_frames": before_close.block_frames,
        "clip_s": reference.size / RATE,
        "captured_s": captured.size / RATE,
        "lag_s": lag / RATE,
        "clip_end_s": clip_end_sample / RATE,
        "correlation": coefficient,
        "snr_db": snr,
        "reading_s": t_read - t_play,
        "read_rate": read_rate,
        "player_started_s": None if player.started_at is None else player.started_at - t_play,
        "blocks_dropped": before_close.blocks_dropped,
        "xruns": player.xruns,
        "device_overflows": before_close.device_overflows,
        "max_level_dbfs": max(levels),
        "reference_rms_dbfs": float(20 * np.log10(np.sqrt(np.mean(reference**2)))),
        "close_s": close_s,
        "rest_after_close_samples": int(sum(piece.size for piece in rest)),
        "read_after_end": source.read(timeout=0.1) is None,
    }


def unknown_device() -> dict[str, Any]:
    from runtime.audio import AudioInput, UnknownAudioDevice, list_input_devices

    source = AudioInput("no such microphone")
    try:
        source.start()
    except UnknownAudioDevice as error:
        message = str(error)
    else:
        source.close()
        message = ""
    source.close()
    return {
        "pid": os.getpid(),
        "message": message,
        "inputs": [device.describe() for device in list_input_devices()],
    }


def vad_live() -> dict[str, Any]:
    """The voice joe into the input; the input, as a live source, into the voice activity
    pipeline (``VAD_PIPELINE``, its bundle under ``OMNI_EDGE_DATA_DIR``); events as they come."""
    import soxr
    from piper import PiperVoice, SynthesisConfig

    from runtime.adapters.vad import SpeechEnded, SpeechStarted, event_from_outputs
    from runtime.adapters.voice_export import find_voice
    from runtime.api import Omni
    from runtime.audio import AudioInput
    from runtime.audio.levels import sound_span

    installed = find_voice("joe")
    voice = PiperVoice.load(installed.model_path, installed.config_path)
    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    text = "The quick brown fox jumps over the lazy dog."
    spoken = np.concatenate([chunk.audio_float_array for chunk in voice.synthesize(text, config)])
    lead = np.zeros(round(0.6 * CLIP_RATE), np.float32)
    clip = np.concatenate([lead, spoken, np.zeros(round(1.0 * CLIP_RATE), np.float32)])
    at_server = soxr.resample(clip, CLIP_RATE, 48000).astype(np.float32)
    # Where the voice's sound starts and ends in the clip (10 ms frames above -40 dB).
    start, end = sound_span(clip, CLIP_RATE // 100)
    sound = (start / CLIP_RATE, end / CLIP_RATE)

    with Omni(os.environ["VAD_PIPELINE"]) as omni:
        source = AudioInput("system", sample_rate=RATE)
        source.start()
        player = FilePlayer(at_server)
        try:
            player.connect_to_inputs()
            stream_start = time.monotonic()
            player.play()
            t_play = time.monotonic()

            def close_after_clip() -> None:
                time.sleep(clip.size / CLIP_RATE + 0.3)
                source.close()

            closer = threading.Thread(target=close_after_clip, name="close after the clip")
            closer.start()
            arrivals = []
            final: dict[str, Any] = {}
            for output in omni.generate(source):
                event = event_from_outputs(output.outputs)
                if event is not None:
                    arrivals.append((event, time.monotonic() - t_play))
                if output.finished:
                    final = dict(output.metrics)
            closer.join()
        finally:
            source.close()
            player.close()
    started = [(e, at) for e, at in arrivals if isinstance(e, SpeechStarted)]
    ended = [(e, at) for e, at in arrivals if isinstance(e, SpeechEnded)]
    return {
        "pid": os.getpid(),
        "kinds": [type(event).__name__ for event, _ in arrivals],
        "xruns": player.xruns,
        "sound_s": list(sound),
        "clip_s": clip.size / CLIP_RATE,
        "play_offset_s": t_play - stream_start,
        "start_t": [event.t for event, _ in started],
        "end_t": [event.t for event, _ in ended],
        "start_arrived_s": [at for _, at in started],
        "end_arrived_s": [at for _, at in ended],
        "start_detected_at": [event.detected_at for event, _ in started],
        "chunks": final.get("chunks"),
        "audio_seconds": final.get("audio_seconds"),
        "call_wall_s_p50": final.get("call_wall_s_p50"),
        "call_run_s_p50": final.get("call_run_s_p50"),
    }


SCENARIOS = {"capture": capture, "unknown_device": unknown_device, "vad_live": vad_live}


if __name__ == "__main__":
    raise SystemExit(main(SCENARIOS))
