"""Device-initialisation locks in the host's temporary folder.

Drivers of some accelerators misbehave when two processes initialise the same device at the
same moment. A worker takes the device's lock while it creates its session there: one file
per device under :func:`runtime.host.wslpaths.host_temp_lock_dir`, which depends only on the
user's temporary folder (never on where the project is checked out), so every same-user
native process of the domain takes the same file. It coordinates processes of one domain
and one user; it is no lock authority across Windows and WSL, whose workers one controller
coordinates through its reservations.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final

from runtime.host.wslpaths import current_os_domain, host_temp_lock_dir

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

__all__ = ["DeviceLockTimeout", "device_init_lock", "device_lock_path"]

_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]")
_POLL_S: Final = 0.05


class DeviceLockTimeout(TimeoutError):
    """Another process held a device's initialisation lock past the deadline."""


def device_lock_path(
    physical_id: str, *, os_domain: str | None = None, environ: Mapping[str, str] | None = None
) -> Path:
    """The lock file of device ``physical_id`` in this domain's host temporary folder."""
    if not physical_id:
        raise ValueError("a device lock needs the device's physical id")
    domain = current_os_domain() if os_domain is None else os_domain
    folder = host_temp_lock_dir(domain, os.environ if environ is None else environ)
    return Path(folder) / f"device-{_UNSAFE.sub('_', physical_id)}.lock"


def _try_lock(fd: int) -> bool:
    if sys.platform == "win32":
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _unlock(fd: int) -> None:
    if sys.platform == "win32":
        import msvcrt

        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        return
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_UN)


@contextlib.contextmanager
def device_init_lock(
    physical_id: str,
    *,
    timeout_s: float = 120.0,
    os_domain: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Iterator[Path]:
    """Hold device ``physical_id``'s initialisation lock for the ``with`` block.

    The folder is created owner-only; the lock file stays (an empty file per device) and the
    lock goes with the process that held it, however it ends. Raises
    :class:`DeviceLockTimeout` naming the file after ``timeout_s``.
    """
    path = device_lock_path(physical_id, os_domain=os_domain, environ=environ)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout_s
        while not _try_lock(fd):
            if time.monotonic() >= deadline:
                raise DeviceLockTimeout(
                    f"another process has been initialising device {physical_id} for more than "
                    f"{timeout_s:g} s (lock {path}); try again once it has started"
                )
            time.sleep(_POLL_S)
        try:
            yield path
        finally:
            _unlock(fd)
    finally:
        os.close(fd)
