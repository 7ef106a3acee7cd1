"""Windows/WSL route logic as small pure functions.

A worker may run in the other OS domain than the controller: a WSL controller can run a
Windows interpreter directly (WSL executes Windows ``.exe`` files through interop), and a
Windows controller reaches a WSL interpreter through ``wsl.exe -d <distro> -- ...``.
Paths that cross the boundary must be rewritten:

* WSL ``/mnt/c/Users/x``  <->  Windows ``C:\\Users\\x``
* WSL ``/home/x``  <->  Windows ``\\\\wsl.localhost\\<distro>\\home\\x`` (or ``\\\\wsl$\\...``)

Nothing here touches the file system; only :func:`is_wsl` reads ``/proc/version`` and
:func:`host_temp_lock_dir` reads the uid when none is given. Paths containing ``..`` are
refused rather than resolved, because resolving them lexically is wrong across symlinks.
"""

from __future__ import annotations

import ntpath
import os
import posixpath
import re
import sys
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = [
    "DEFAULT_MOUNT_ROOT",
    "OS_DOMAINS",
    "current_os_domain",
    "host_temp_lock_dir",
    "is_wsl",
    "windows_command_from_wsl",
    "windows_to_wsl_path",
    "wsl_command_from_windows",
    "wsl_to_windows_path",
]

#: The OS domains a route may name.
OS_DOMAINS: Final = ("posix", "windows")

#: Where WSL mounts Windows drives unless ``/etc/wsl.conf`` sets another ``automount.root``.
DEFAULT_MOUNT_ROOT: Final = "/mnt"

_WSL_MARKER = re.compile(r"microsoft|wsl", re.IGNORECASE)
_DRIVE_ABSOLUTE = re.compile(r"^([A-Za-z]):\\(.*)$", re.DOTALL)
_DISTRO_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_WSL_UNC_HOSTS = frozenset({"wsl$", "wsl.localhost"})
# Characters a Windows file name cannot hold (besides the separators).
_WINDOWS_FORBIDDEN = frozenset('<>:"|?*\\') | frozenset(chr(code) for code in range(32))

_WINDOWS_FORMS = (
    "accepted forms are a drive path 'C:\\dir\\file' (or 'C:/dir/file') and a WSL share "
    "'\\\\wsl.localhost\\<distro>\\path' or '\\\\wsl$\\<distro>\\path'"
)


def _wsl_forms(mount_root: str) -> str:
    root = mount_root.rstrip("/")
    return (
        f"accepted forms are '{root}/<drive letter>/...' (maps to '<DRIVE>:\\...') and, "
        "when a distro name is given, any absolute path (maps to "
        "'\\\\wsl.localhost\\<distro>\\...')"
    )


def is_wsl(proc_version_text: str | None = None) -> bool:
    """True when the kernel is WSL's (``/proc/version`` names Microsoft or WSL).

    With ``proc_version_text`` None, ``/proc/version`` is read; an unreadable file means
    this is not WSL (for example native Windows or macOS).
    """
    if proc_version_text is None:
        try:
            with open("/proc/version", encoding="utf-8", errors="replace") as stream:
                proc_version_text = stream.read()
        except OSError:
            return False
    return _WSL_MARKER.search(proc_version_text) is not None


def current_os_domain() -> str:
    """The OS domain this interpreter runs in: ``"windows"`` natively, ``"posix"`` otherwise (WSL too)."""
    return "windows" if os.name == "nt" else "posix"


def _show(path: object) -> str:
    """A path quoted for a message; backslashes stay single so Windows paths read naturally."""
    if isinstance(path, str) and path.isprintable():
        return f"'{path}'"
    return repr(path)


def _check_distro(distro: str) -> str:
    if not isinstance(distro, str) or not _DISTRO_NAME.match(distro):
        raise ValueError(
            f"invalid WSL distro name {distro!r}: use letters, digits, '.', '-' and '_' "
            "(as listed by 'wsl.exe --list')"
        )
    return distro


def _posix_parts(path: str, *, what: str) -> list[str]:
    """The components of an absolute POSIX path, without empty and '.' components."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(
            f"{what} {_show(path)} is not an absolute POSIX path (it must start with '/')"
        )
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"{what} {_show(path)} contains '..'; give the resolved path")
    return parts


def _check_windows_names(parts: Sequence[str], path: str) -> None:
    for part in parts:
        bad = sorted(set(part) & _WINDOWS_FORBIDDEN)
        if bad:
            raise ValueError(
                f"cannot map {_show(path)} to a Windows path: component {part!r} contains "
                f"{', '.join(repr(char) for char in bad)}, which Windows file names cannot hold"
            )


def _mounted_drive(parts: Sequence[str], mount_root: str) -> tuple[str, list[str]] | None:
    """(drive letter, rest) when ``parts`` lie under ``<mount_root>/<letter>``; else None."""
    root = _posix_parts(mount_root, what="WSL mount root")
    if len(parts) <= len(root) or list(parts[: len(root)]) != root:
        return None
    letter = parts[len(root)]
    if len(letter) != 1 or not ("a" <= letter <= "z"):
        return None
    return letter, list(parts[len(root) + 1 :])


def wsl_to_windows_path(
    path: str, *, distro: str | None = None, mount_root: str = DEFAULT_MOUNT_ROOT
) -> str:
    """Map a WSL path to the path Windows programs use for the same file.

    ``/mnt/c/Users/x`` -> ``C:\\Users\\x``. Any other absolute path needs ``distro`` and maps
    into the distro's share: ``/home/x`` -> ``\\\\wsl.localhost\\<distro>\\home\\x``.
    Raises :class:`ValueError` naming the path and the accepted forms otherwise.
    """
    try:
        parts = _posix_parts(path, what="WSL path")
    except ValueError as exc:
        raise ValueError(f"cannot map to a Windows path: {exc}; {_wsl_forms(mount_root)}") from None
    drive = _mounted_drive(parts, mount_root)
    if drive is not None:
        letter, rest = drive
        _check_windows_names(rest, path)
        return f"{letter.upper()}:\\" + "\\".join(rest)
    if distro is None:
        raise ValueError(
            f"cannot map {_show(path)} to a Windows path: it is not under "
            f"'{mount_root.rstrip('/')}/<drive letter>/' and no distro name was given; "
            f"{_wsl_forms(mount_root)}"
        )
    _check_distro(distro)
    _check_windows_names(parts, path)
    return f"\\\\wsl.localhost\\{distro}\\" + "\\".join(parts)


def _windows_parts(rest: str, path: str) -> list[str]:
    parts = [part for part in rest.split("\\") if part not in ("", ".")]
    if ".." in parts:
        raise ValueError(
            f"cannot map {_show(path)} to a WSL path: it contains '..'; give the resolved path"
        )
    return parts


def windows_to_wsl_path(
    path: str, *, distro: str | None = None, mount_root: str = DEFAULT_MOUNT_ROOT
) -> str:
    """Map a Windows path to the path WSL programs use for the same file.

    ``C:\\Users\\x`` (or ``C:/Users/x``) -> ``/mnt/c/Users/x``;
    ``\\\\wsl$\\<distro>\\home\\x`` and ``\\\\wsl.localhost\\<distro>\\home\\x`` -> ``/home/x``.
    With ``distro`` given, a share of another distro is refused (it is not reachable as
    ``/...`` from this one). Raises :class:`ValueError` naming the path and the accepted forms.
    """
    if not isinstance(path, str) or not path:
        raise ValueError(f"cannot map {_show(path)} to a WSL path: {_WINDOWS_FORMS}")
    text = path.replace("/", "\\")
    # Extended-length and device prefixes name the same file without them.
    if text.upper().startswith("\\\\?\\UNC\\"):
        text = "\\\\" + text[len("\\\\?\\UNC\\") :]
    elif text.startswith(("\\\\?\\", "\\\\.\\")):
        text = text[len("\\\\?\\") :]
    drive = _DRIVE_ABSOLUTE.match(text)
    if drive is not None:
        letter, rest = drive.group(1), drive.group(2)
        parts = _windows_parts(rest, path)
        _posix_parts(mount_root, what="WSL mount root")
        base = posixpath.join(mount_root.rstrip("/") or "/", letter.lower())
        return posixpath.join(base, *parts) if parts else base
    if text.startswith("\\\\"):
        components = text[2:].split("\\")
        host = components[0].lower()
        if host in _WSL_UNC_HOSTS and len(components) >= 2 and components[1]:
            share_distro = components[1]
            if distro is not None and share_distro.lower() != _check_distro(distro).lower():
                raise ValueError(
                    f"cannot map {_show(path)} to a WSL path in distro {distro!r}: it is a file of "
                    f"distro {share_distro!r}"
                )
            parts = _windows_parts("\\".join(components[2:]), path)
            return "/" + "/".join(parts)
        raise ValueError(
            f"cannot map {_show(path)} to a WSL path: network share "
            f"'\\\\{components[0]}\\...' is not a WSL share; {_WINDOWS_FORMS}"
        )
    raise ValueError(
        f"cannot map {_show(path)} to a WSL path: it is not an absolute Windows path; {_WINDOWS_FORMS}"
    )


def _looks_like_windows_path(arg: str) -> bool:
    text = arg.replace("/", "\\")
    if _DRIVE_ABSOLUTE.match(text) or text.startswith(("\\\\?\\", "\\\\.\\")):
        return True
    if text.startswith("\\\\"):
        return text[2:].split("\\")[0].lower() in _WSL_UNC_HOSTS
    return False


def _check_args(args: Sequence[str]) -> list[str]:
    if isinstance(args, str) or not all(isinstance(arg, str) for arg in args):
        raise TypeError(f"args must be a sequence of strings, got {args!r}")
    return list(args)


def windows_command_from_wsl(
    interpreter_windows_path: str,
    args: Sequence[str],
    *,
    mount_root: str = DEFAULT_MOUNT_ROOT,
) -> list[str]:
    """The argv that runs a Windows interpreter from WSL.

    WSL executes Windows programs directly, so argv[0] is the interpreter's WSL path
    (``C:\\Python311\\python.exe`` -> ``/mnt/c/Python311/python.exe``; a path already in
    that form is kept). Arguments that are paths under ``<mount_root>/<drive>`` are
    rewritten to Windows paths, because the Windows process cannot read WSL paths; all
    other arguments pass unchanged (a leading ``/`` may be a Windows switch).
    """
    rest = _check_args(args)
    if interpreter_windows_path.startswith("/"):
        # Validates that it is a mounted Windows drive path.
        wsl_to_windows_path(interpreter_windows_path, mount_root=mount_root)
        executable = interpreter_windows_path
    else:
        executable = windows_to_wsl_path(interpreter_windows_path, mount_root=mount_root)
    mapped = []
    for arg in rest:
        if arg.startswith("/"):
            parts = [part for part in arg.split("/") if part not in ("", ".")]
            if ".." not in parts and _mounted_drive(parts, mount_root) is not None:
                arg = wsl_to_windows_path(arg, mount_root=mount_root)
        mapped.append(arg)
    return [executable, *mapped]


def wsl_command_from_windows(
    distro: str,
    interpreter: str,
    args: Sequence[str],
    *,
    mount_root: str = DEFAULT_MOUNT_ROOT,
) -> list[str]:
    """The argv that runs a WSL interpreter from native Windows.

    ``["wsl.exe", "-d", distro, "--", interpreter, *args]``. A Windows interpreter path is
    mapped to its WSL form; arguments that are absolute Windows paths (drive paths or this
    distro's ``\\\\wsl$`` / ``\\\\wsl.localhost`` share) are mapped to ``/mnt/<drive>/...`` or
    ``/...``. Other arguments pass unchanged.
    """
    _check_distro(distro)
    rest = _check_args(args)
    if interpreter.startswith("/"):
        _posix_parts(interpreter, what="WSL interpreter path")
        executable = interpreter
    else:
        executable = windows_to_wsl_path(interpreter, distro=distro, mount_root=mount_root)
    mapped = [
        windows_to_wsl_path(arg, distro=distro, mount_root=mount_root)
        if _looks_like_windows_path(arg)
        else arg
        for arg in rest
    ]
    return ["wsl.exe", "-d", distro, "--", executable, *mapped]


def _lookup_windows(environ: Mapping[str, str], key: str) -> str | None:
    """A variable looked up the way Windows does: names are case-insensitive."""
    wanted = key.upper()
    for name, value in environ.items():
        if name.upper() == wanted:
            return value
    return None


def _is_absolute_windows(path: str) -> bool:
    text = path.replace("/", "\\")
    return bool(_DRIVE_ABSOLUTE.match(text)) or text.startswith("\\\\")


def host_temp_lock_dir(
    os_domain: str, environ: Mapping[str, str], *, uid: int | None = None
) -> str:
    """The host-local directory for device-init and shared-memory locks.

    It never depends on where the project is checked out (a local or UNC checkout gives the
    same directory), so same-user native processes coordinate through it.

    * ``"windows"``: ``%TEMP%``, else ``%TMP%``, else ``%LOCALAPPDATA%\\Temp``, plus
      ``\\omni-edge\\locks`` (variable names are matched case-insensitively, as Windows does).
    * ``"posix"``: ``$XDG_RUNTIME_DIR``, else ``/tmp``, plus ``/omni-edge-<uid>/locks``;
      ``uid`` defaults to this process's real uid.

    Relative values are skipped (they would depend on the working directory). Raises
    :class:`ValueError` for an unknown domain or a Windows environment with no usable
    temporary directory.
    """
    if os_domain == "windows":
        candidates = [_lookup_windows(environ, "TEMP"), _lookup_windows(environ, "TMP")]
        local = _lookup_windows(environ, "LOCALAPPDATA")
        if local and _is_absolute_windows(local):
            candidates.append(ntpath.join(local, "Temp"))
        for value in candidates:
            if value and _is_absolute_windows(value):
                return ntpath.join(ntpath.normpath(value.replace("/", "\\")), "omni-edge", "locks")
        raise ValueError(
            "no host temporary directory for locks: none of TEMP, TMP or LOCALAPPDATA holds an "
            "absolute Windows path"
        )
    if os_domain == "posix":
        base = environ.get("XDG_RUNTIME_DIR") or ""
        if not base.startswith("/"):
            base = "/tmp"
        if uid is None:
            if sys.platform == "win32":
                raise ValueError("a POSIX lock directory needs an explicit uid on Windows")
            uid = os.getuid()
        return posixpath.join(posixpath.normpath(base), f"omni-edge-{uid}", "locks")
    raise ValueError(f"unknown os_domain {os_domain!r}: accepted values are 'posix' and 'windows'")
