"""PyInstaller runtime hook of the frozen application; runs first in every process of it.

* sounddevice loads the PortAudio bundled with the application: it asks
  ``ctypes.util.find_library("portaudio")``, which on Linux sees only the system's libraries.
* ONNX Runtime's telemetry stays off: when on, it writes a session file into the temporary
  folder and a database under ``~/.cache/Microsoft``. Workers re-launch this executable, so
  they run this hook too (their environment is built key by key and would not carry it).
"""

import ctypes.util
import os
import sys

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

_BUNDLED_PORTAUDIO = os.path.join(getattr(sys, "_MEIPASS", ""), "libportaudio.so.2")
_system_find_library = ctypes.util.find_library


def _find_library(name: str) -> str | None:
    if name == "portaudio" and os.path.isfile(_BUNDLED_PORTAUDIO):
        return _BUNDLED_PORTAUDIO
    return _system_find_library(name)


if sys.platform.startswith("linux"):
    ctypes.util.find_library = _find_library
