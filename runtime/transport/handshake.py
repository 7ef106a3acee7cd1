"""The first exchange on a worker channel: the worker's ``hello``, checked by the controller.

The worker announces its protocol version, the features it requires and offers, and
its process identity (pid plus creation time, computed as :mod:`psutil` computes it, so
it matches the host's process identity). The controller refuses a version or a required
feature it does not implement, a pid other than the one it started, and a worker
generation other than the one it assigned.
"""

from __future__ import annotations

import os
import sys

from runtime.contracts.messages import HelloMessage
from runtime.contracts.versions import KNOWN_FEATURES, PROTOCOL_VERSION, FeatureError

from .channel import ChannelTimeout, FramedChannel, ProtocolError


class HandshakeError(ProtocolError):
    """A worker's ``hello`` was missing, late or refused.

    ``code`` is ``timeout``, ``unsupported_version``, ``unknown_required_feature``,
    ``wrong_pid``, ``wrong_generation``, or the frame/message code of a malformed hello.
    """


def send_hello(
    channel: FramedChannel,
    *,
    worker: str,
    generation: int,
    required_features: tuple[str, ...] = (),
    offered_features: tuple[str, ...] | None = None,
) -> HelloMessage:
    """Worker side: announce this process on ``channel``; returns what was sent."""
    hello = HelloMessage(
        protocol_version=PROTOCOL_VERSION,
        required_features=required_features,
        offered_features=(
            tuple(sorted(KNOWN_FEATURES)) if offered_features is None else offered_features
        ),
        worker=worker,
        pid=os.getpid(),
        create_time=process_create_time(),
        generation=generation,
    )
    channel.send_message(hello)
    return hello


def process_create_time() -> float:
    """When this process was created, in seconds since the epoch, as psutil computes it.

    On Linux it is read from ``/proc`` (start ticks after boot plus the boot time), which
    spares a worker the import of psutil on its way to ``hello``."""
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/self/stat", "rb") as stat:
                # Fields after the command name (which may hold spaces and parentheses).
                fields = stat.read().rpartition(b")")[2].split()
            with open("/proc/stat", "rb") as machine:
                boot = next(
                    float(line.split()[1]) for line in machine if line.startswith(b"btime ")
                )
            return float(fields[19]) / os.sysconf("SC_CLK_TCK") + boot
        except (OSError, ValueError, IndexError, StopIteration):
            pass
    import psutil

    return float(psutil.Process(os.getpid()).create_time())


def process_rss_bytes() -> int:
    """This process's resident memory in bytes (``/proc/self/statm`` on Linux)."""
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/self/statm", "rb") as statm:
                return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            pass
    import psutil

    return int(psutil.Process().memory_info().rss)


def expect_hello(
    channel: FramedChannel,
    *,
    expected_generation: int,
    expected_pid: int | None,
    timeout_s: float,
    known_features: frozenset[str] = KNOWN_FEATURES,
) -> HelloMessage:
    """Controller side: wait up to ``timeout_s`` for the worker's ``hello`` and check it.

    ``expected_pid`` is the pid the controller started (``None`` when a launcher stands
    between them). Raises :class:`HandshakeError`; a worker that exits first surfaces
    as ``ChannelClosed``.
    """
    try:
        message, _ = channel.read_message(timeout_s=timeout_s)
    except ChannelTimeout as exc:
        raise HandshakeError(
            f"no hello within {timeout_s} s", code="timeout", channel=channel.name
        ) from exc
    except ProtocolError as exc:
        raise HandshakeError(exc.detail, code=exc.code, channel=channel.name) from exc
    if not isinstance(message, HelloMessage):
        raise HandshakeError(
            f"expected hello as the first frame, got {message.KIND}",
            code="unexpected_kind",
            channel=channel.name,
        )
    try:
        message.negotiate(known_features)
    except FeatureError as exc:
        code = "unknown_required_feature" if exc.unknown else "unsupported_version"
        raise HandshakeError(
            f"worker {message.worker}: {exc}", code=code, channel=channel.name
        ) from exc
    if expected_pid is not None and message.pid != expected_pid:
        raise HandshakeError(
            f"worker {message.worker} announced pid {message.pid}; the controller started "
            f"pid {expected_pid}",
            code="wrong_pid",
            channel=channel.name,
        )
    if message.generation != expected_generation:
        raise HandshakeError(
            f"worker {message.worker} announced generation {message.generation}; "
            f"expected {expected_generation}",
            code="wrong_generation",
            channel=channel.name,
        )
    return message
