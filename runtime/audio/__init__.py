"""Streaming audio: a PortAudio player with a jitter buffer, an input delivering 16 kHz mono
chunks, a full-duplex stream for spoken conversations, resampling, and WAV files.

Nothing here imports ``sounddevice`` (and so starts PortAudio) until a device is listed
or a stream starts.
"""

from runtime.audio.devices import (
    AudioDeviceError,
    InputDevice,
    OutputDevice,
    UnknownAudioDevice,
    list_input_devices,
    list_output_devices,
    open_stream_count,
    rescan_output_devices,
    resolve_input_device,
    resolve_output_device,
)
from runtime.audio.duplex import (
    CapturedBlock,
    DuplexAudio,
    DuplexMetrics,
    FrameEchoCanceller,
    PassThroughEchoCanceller,
    ReplyPlayback,
)
from runtime.audio.input import AudioInput, AudioLevel, AudioSource, CaptureMetrics, level_dbfs
from runtime.audio.player import AudioPlayer, PlaybackBufferFull, PlaybackMetrics, PlayerState
from runtime.audio.resample import StreamResampler
from runtime.audio.ring import SampleRing
from runtime.audio.wav import WavWriteError, WavWriter, write_wav

__all__ = [
    "AudioDeviceError",
    "AudioInput",
    "AudioLevel",
    "AudioPlayer",
    "AudioSource",
    "CaptureMetrics",
    "CapturedBlock",
    "DuplexAudio",
    "DuplexMetrics",
    "FrameEchoCanceller",
    "InputDevice",
    "OutputDevice",
    "PassThroughEchoCanceller",
    "PlaybackBufferFull",
    "PlaybackMetrics",
    "PlayerState",
    "ReplyPlayback",
    "SampleRing",
    "StreamResampler",
    "UnknownAudioDevice",
    "WavWriteError",
    "WavWriter",
    "level_dbfs",
    "list_input_devices",
    "list_output_devices",
    "open_stream_count",
    "rescan_output_devices",
    "resolve_input_device",
    "resolve_output_device",
    "write_wav",
]
