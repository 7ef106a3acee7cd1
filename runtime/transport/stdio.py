"""A worker channel's stdio and threads: claiming stdin/stdout for frames, reading on a thread
where an event loop cannot watch the pipe, and forwarding a worker's stderr lines."""

from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING, BinaryIO

from .channel import ChannelClosed

if TYPE_CHECKING:
    from collections.abc import Callable

    from runtime.contracts.codec import Frame

    from .channel import FramedChannel


def loop_reading_supported(channel: FramedChannel) -> bool:
    """Whether an event loop can watch this channel's pipe itself (POSIX pipes)."""
    return sys.platform != "win32" and channel.read_fd is not None


def start_reader_thread(
    channel: FramedChannel,
    on_frame: Callable[[Frame], None],
    on_closed: Callable[[BaseException | None], None],
) -> threading.Thread:
    """Read frames on a daemon thread; report the end once: ``None`` at end of stream."""

    def loop() -> None:
        error: BaseException | None = None
        try:
            while True:
                on_frame(channel.read_frame())
        except ChannelClosed:
            error = None
        except Exception as exc:  # noqa: BLE001 - the reader's loop reports whatever ended it
            error = exc
        on_closed(error)

    thread = threading.Thread(target=loop, name=f"{channel.name}-reader", daemon=True)
    thread.start()
    return thread


def start_log_pump(
    stream: BinaryIO, on_line: Callable[[str], None], *, name: str
) -> threading.Thread:
    """Forward each line of a worker's stderr to ``on_line`` until end of file, then close it."""

    def loop() -> None:
        try:
            for raw in iter(stream.readline, b""):
                on_line(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
        finally:
            stream.close()

    thread = threading.Thread(target=loop, name=f"{name}-stderr", daemon=True)
    thread.start()
    return thread


def claim_worker_stdio() -> tuple[BinaryIO, BinaryIO]:
    """In a worker: take stdin/stdout for frames and send everything else to stderr.

    Returns private streams on the original descriptors 0 and 1; afterwards descriptor
    0 reads nothing and descriptor 1 (``print``, native libraries) writes to stderr, so
    nothing but frames can reach the controller's stream.
    """
    sys.stdout.flush()
    frames_in = os.dup(0)
    frames_out = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(devnull, 0)
    finally:
        os.close(devnull)
    os.dup2(2, 1)
    return os.fdopen(frames_in, "rb"), os.fdopen(frames_out, "wb")
