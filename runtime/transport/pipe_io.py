"""The channel's errors and how it waits on a pipe (``select`` on POSIX, ``PeekNamedPipe``
on Windows, whose pipes ``select`` does not take)."""

from __future__ import annotations

import io
import select
import sys
import time
from typing import BinaryIO, cast

from runtime.errors import ExecutionError

__all__ = [
    "ChannelClosed",
    "ChannelTimeout",
    "ProtocolError",
    "fileno",
    "wait_readable",
    "wait_writable",
]


class ChannelClosed(ExecutionError):
    """The peer closed the stream (end of file at a frame boundary) or this side closed."""

    def __init__(self, message: str, *, channel: str) -> None:
        super().__init__(message)
        self.channel = channel


class ChannelTimeout(ExecutionError):
    """No complete frame arrived before the deadline; the stream stays usable."""

    def __init__(self, message: str, *, channel: str, timeout_s: float) -> None:
        super().__init__(message)
        self.channel = channel
        self.timeout_s = timeout_s


class ProtocolError(ExecutionError):
    """The peer broke the protocol. ``code`` is a frame or message error code.

    After a framing error the stream cannot be resynchronised: the channel is unusable.
    """

    def __init__(self, message: str, *, code: str, channel: str) -> None:
        super().__init__(f"{channel}: {code}: {message}")
        self.detail = message
        self.code = code
        self.channel = channel


def fileno(stream: object) -> int | None:
    try:
        return cast("BinaryIO", stream).fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


if sys.platform == "win32":
    import ctypes
    import msvcrt

    def wait_readable(fd: int, deadline: float) -> bool:
        # select() takes only sockets on Windows; poll the pipe instead.
        handle = msvcrt.get_osfhandle(fd)
        available = ctypes.c_ulong(0)
        while True:
            ok = ctypes.windll.kernel32.PeekNamedPipe(
                handle, None, 0, None, ctypes.byref(available), None
            )
            if not ok or available.value:
                # A broken pipe is readable too: the read reports end of file.
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

else:

    def wait_readable(fd: int, deadline: float) -> bool:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            readable, _, _ = select.select([fd], [], [], 0)
        else:
            readable, _, _ = select.select([fd], [], [], remaining)
        return bool(readable)


def wait_writable(fd: int) -> None:
    if sys.platform == "win32":  # pragma: no cover - Windows pipes stay blocking
        time.sleep(0.001)
        return
    select.select([], [fd], [], 1.0)
