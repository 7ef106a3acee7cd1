"""Streaming audio output: a PortAudio player with a jitter buffer, resampling, and WAV files.

Nothing here imports ``sounddevice`` (and so starts PortAudio) until a device is listed
or a player starts.
"""

from runtime.audio.devices import (
    AudioDeviceError,
    OutputDevice,
    UnknownAudioDevice,
    list_output_devices,
    open_stream_count,
    rescan_output_devices,
    resolve_output_device,
)
from runtime.audio.player import AudioPlayer, PlaybackBufferFull, PlaybackMetrics, PlayerState
from runtime.audio.resample import StreamResampler
from runtime.audio.ring import SampleRing
from runtime.audio.wav import WavWriteError, WavWriter, write_wav

__all__ = [
    "AudioDeviceError",
    "AudioPlayer",
    "OutputDevice",
    "PlaybackBufferFull",
    "PlaybackMetrics",
    "PlayerState",
    "SampleRing",
    "StreamResampler",
    "UnknownAudioDevice",
    "WavWriteError",
    "WavWriter",
    "list_output_devices",
    "open_stream_count",
    "rescan_output_devices",
    "resolve_output_device",
    "write_wav",
]
