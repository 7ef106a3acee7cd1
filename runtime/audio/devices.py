"""Audio output devices as PortAudio (through ``sounddevice``) sees them.

``sounddevice`` is imported on first use, not at module import: importing it starts
PortAudio, which probes every host API (ALSA, OSS, JACK) and needs the system library
(Debian ``libportaudio2``). PortAudio fixes its device list when it starts, so a device
that appears later (a JACK server started afterwards, a new ALSA configuration) is only
seen after :func:`rescan_output_devices`.
"""

from __future__ import annotations

import atexit
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from runtime.errors import ExecutionError, UsageError

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

__all__ = [
    "AudioDeviceError",
    "InputDevice",
    "OutputDevice",
    "UnknownAudioDevice",
    "audio_devices_json",
    "audio_devices_text",
    "list_input_devices",
    "list_output_devices",
    "open_stream_count",
    "rescan_output_devices",
    "resolve_input_device",
    "resolve_output_device",
    "sounddevice_module",
]

NO_DEVICE_HELP = (
    "connect a sound card, start a sound server (JACK, PipeWire, PulseAudio), or for a "
    "silent test device write 'pcm.!default { type null }' to "
    "$XDG_CONFIG_HOME/alsa/asoundrc (or ~/.asoundrc) before starting"
)


class AudioDeviceError(ExecutionError):
    """No usable audio output: PortAudio missing, no device, or the device failed."""


class UnknownAudioDevice(UsageError):
    """The requested output device (by name or index) does not exist."""


@dataclass(frozen=True, slots=True)
class OutputDevice:
    """One PortAudio device that can play sound."""

    index: int
    name: str
    host_api: str
    max_output_channels: int
    default_sample_rate: int
    default_low_latency_s: float
    default_high_latency_s: float
    is_default: bool

    def describe(self) -> str:
        """One line for listings and error messages."""
        default = ", default" if self.is_default else ""
        return (
            f"{self.index}: {self.name} ({self.host_api}, {self.max_output_channels} ch, "
            f"{self.default_sample_rate} Hz{default})"
        )


@dataclass(frozen=True, slots=True)
class InputDevice:
    """One PortAudio device that can record sound (a microphone, a line in, a JACK capture)."""

    index: int
    name: str
    host_api: str
    max_input_channels: int
    default_sample_rate: int
    default_low_latency_s: float
    default_high_latency_s: float
    is_default: bool

    def describe(self) -> str:
        """One line for listings and error messages."""
        default = ", default" if self.is_default else ""
        return (
            f"{self.index}: {self.name} ({self.host_api}, {self.max_input_channels} ch in, "
            f"{self.default_sample_rate} Hz{default})"
        )


class _StreamOwner(Protocol):
    stream: Any | None

    def close(self, grace_s: float) -> None: ...


_lifecycle = threading.Lock()
_open_owners: set[_StreamOwner] = set()
_exit_hook_registered = False
EXIT_GRACE_S = 0.5


def sounddevice_module() -> ModuleType:
    """Import ``sounddevice``; a missing PortAudio library becomes an AudioDeviceError."""
    try:
        import sounddevice
    except OSError as error:
        raise AudioDeviceError(
            f"the PortAudio library could not be loaded ({error}); install the Debian "
            "package libportaudio2 (or your system's PortAudio package)"
        ) from error
    global _exit_hook_registered
    with _lifecycle:
        if not _exit_hook_registered:
            # Registered after sounddevice's own exit handler, so it runs first (LIFO): each
            # open stream ends from its callback before PortAudio is terminated under it.
            atexit.register(_close_open_streams)
            _exit_hook_registered = True
    module: ModuleType = sounddevice
    return module


def _close_open_streams() -> None:
    with _lifecycle:
        owners = list(_open_owners)
    for owner in owners:
        owner.close(EXIT_GRACE_S)


def open_stream_count() -> int:
    """How many player streams are open in this process (0 once every player stopped)."""
    with _lifecycle:
        return len(_open_owners)


def _stream_opened(owner: _StreamOwner) -> None:
    with _lifecycle:
        _open_owners.add(owner)


def _stream_closed(owner: _StreamOwner) -> None:
    with _lifecycle:
        _open_owners.discard(owner)


def _first_rate(sd: Any, candidates: list[int], check: Callable[[int], None], refusal: str) -> int:
    """The first of ``candidates`` (duplicates dropped) that ``check`` accepts (it raises
    PortAudio's error otherwise); none: an AudioDeviceError, ``refusal`` followed by the
    rates tried."""
    tried = list(dict.fromkeys(candidates))
    for rate in tried:
        try:
            check(rate)
        except sd.PortAudioError:
            continue
        return rate
    raise AudioDeviceError(refusal.format(rates=f"{tried} Hz"))


def _start_stream(
    sd: Any, owner: _StreamOwner, open_stream: Callable[[], Any], *, opening: str, starting: str
) -> Any:
    """Open a PortAudio stream with ``open_stream``, give it to ``owner``, register the owner
    for the exit hook and start the stream. A failure raises an AudioDeviceError ("could not
    open ``opening``", "could not start ``starting``"); a stream that opened but did not start
    is closed through its owner."""
    try:
        stream = open_stream()
    except sd.PortAudioError as error:
        raise AudioDeviceError(f"could not open {opening}: {error}") from error
    owner.stream = stream
    _stream_opened(owner)
    try:
        stream.start()
    except sd.PortAudioError as error:
        owner.close(0.0)
        raise AudioDeviceError(f"could not start {starting}: {error}") from error
    return stream


def rescan_output_devices() -> list[OutputDevice]:
    """Restart PortAudio so it sees devices that appeared or vanished since it started.

    Refused while a player's stream is open: restarting PortAudio would pull the device
    out from under it.
    """
    sd = sounddevice_module()
    with _lifecycle:
        if _open_owners:
            raise AudioDeviceError(
                f"cannot rescan audio devices while {len(_open_owners)} playback stream(s) are "
                "open; stop the players first"
            )
        # sounddevice exposes no public rescan; PortAudio only rescans on re-initialisation.
        sd._terminate()
        sd._initialize()
    return list_output_devices()


def _default_output_index(sd: Any) -> int:
    try:
        info = sd.query_devices(kind="output")
    except sd.PortAudioError:
        return -1
    return int(info["index"])


def list_output_devices() -> list[OutputDevice]:
    """Every device with at least one output channel, in PortAudio's order."""
    sd = sounddevice_module()
    host_apis = sd.query_hostapis()
    default_index = _default_output_index(sd)
    devices = []
    for info in sd.query_devices():
        channels = int(info["max_output_channels"])
        if channels < 1:
            continue
        index = int(info["index"])
        devices.append(
            OutputDevice(
                index=index,
                name=str(info["name"]),
                host_api=str(host_apis[int(info["hostapi"])]["name"]),
                max_output_channels=channels,
                default_sample_rate=round(float(info["default_samplerate"])),
                default_low_latency_s=float(info["default_low_output_latency"]),
                default_high_latency_s=float(info["default_high_output_latency"]),
                is_default=index == default_index,
            )
        )
    return devices


def _no_device_error() -> AudioDeviceError:
    return AudioDeviceError(f"no audio output device was found; {NO_DEVICE_HELP}")


def _parse_index(spec: str | int) -> int | None:
    if isinstance(spec, bool):
        raise UnknownAudioDevice(f"audio device must be a name or an index; got {spec!r}")
    if isinstance(spec, int):
        return spec
    text = spec.strip()
    if text.isdigit():
        return int(text)
    return None


def resolve_output_device(spec: str | int | None = None) -> OutputDevice:
    """Find the output device named by ``spec``.

    ``None`` (or an empty string) is the system's default output; an int or a string of
    digits is a PortAudio device index; any other string matches device names
    case-insensitively, an exact name first, then a unique substring.
    """
    devices = list_output_devices()
    if not devices:
        raise _no_device_error()
    available = "; ".join(device.describe() for device in devices)
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        for device in devices:
            if device.is_default:
                return device
        raise AudioDeviceError(
            f"there is no default audio output device; choose one of: {available}"
        )
    index = _parse_index(spec)
    if index is not None:
        for device in devices:
            if device.index == index:
                return device
        raise UnknownAudioDevice(
            f"audio output device index {index} does not exist; available: {available}"
        )
    wanted = str(spec).strip().casefold()
    exact = [device for device in devices if device.name.casefold() == wanted]
    if len(exact) == 1:
        return exact[0]
    matches = exact or [device for device in devices if wanted in device.name.casefold()]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UnknownAudioDevice(f"no audio output device matches {spec!r}; available: {available}")
    names = "; ".join(device.describe() for device in matches)
    raise UnknownAudioDevice(
        f"audio device {spec!r} is ambiguous, it matches: {names}; give an index or a longer "
        "part of the name"
    )


def _default_input_index(sd: Any) -> int:
    try:
        info = sd.query_devices(kind="input")
    except sd.PortAudioError:
        return -1
    return int(info["index"])


def list_input_devices() -> list[InputDevice]:
    """Every device with at least one input channel, in PortAudio's order."""
    sd = sounddevice_module()
    host_apis = sd.query_hostapis()
    default_index = _default_input_index(sd)
    devices = []
    for info in sd.query_devices():
        channels = int(info["max_input_channels"])
        if channels < 1:
            continue
        index = int(info["index"])
        devices.append(
            InputDevice(
                index=index,
                name=str(info["name"]),
                host_api=str(host_apis[int(info["hostapi"])]["name"]),
                max_input_channels=channels,
                default_sample_rate=round(float(info["default_samplerate"])),
                default_low_latency_s=float(info["default_low_input_latency"]),
                default_high_latency_s=float(info["default_high_input_latency"]),
                is_default=index == default_index,
            )
        )
    return devices


def resolve_input_device(spec: str | int | None = None) -> InputDevice:
    """Find the input device named by ``spec``, as :func:`resolve_output_device` does for
    outputs: None (or "") is the default input, an int or digits an index, any other string
    an exact name (case-insensitive), then a unique part of one."""
    devices = list_input_devices()
    if not devices:
        raise AudioDeviceError(
            "no audio input device was found; connect a microphone, or start a sound server "
            "(JACK, PipeWire, PulseAudio) that offers one"
        )
    available = "; ".join(device.describe() for device in devices)
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        for device in devices:
            if device.is_default:
                return device
        raise AudioDeviceError(
            f"there is no default audio input device; choose one of: {available}"
        )
    index = _parse_index(spec)
    if index is not None:
        for device in devices:
            if device.index == index:
                return device
        raise UnknownAudioDevice(
            f"audio input device index {index} does not exist; available inputs: {available}"
        )
    wanted = str(spec).strip().casefold()
    exact = [device for device in devices if device.name.casefold() == wanted]
    matches = exact or [device for device in devices if wanted in device.name.casefold()]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UnknownAudioDevice(
            f"no audio input device matches {spec!r}; available inputs: {available}"
        )
    names = "; ".join(device.describe() for device in matches)
    raise UnknownAudioDevice(
        f"audio input device {spec!r} is ambiguous, it matches: {names}; give an index or a "
        "longer part of the name"
    )


def audio_devices_json() -> dict[str, list[dict[str, Any]]]:
    """Every input and output device, as ``omni-edge devices --audio --json`` prints them."""
    from dataclasses import asdict

    return {
        "inputs": [asdict(device) for device in list_input_devices()],
        "outputs": [asdict(device) for device in list_output_devices()],
    }


def audio_devices_text() -> str:
    """Every input and output device, one line each, as ``omni-edge devices --audio`` prints."""
    lines = ["audio inputs:"]
    lines += [f"  {device.describe()}" for device in list_input_devices()] or ["  none"]
    lines.append("audio outputs:")
    lines += [f"  {device.describe()}" for device in list_output_devices()] or ["  none"]
    return "\n".join(lines)
