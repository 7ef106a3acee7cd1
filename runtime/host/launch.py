"""From a route to a launch: interpreter, worker argv and an explicit environment.

A route names everything it needs; nothing here guesses from the machine. The
interpreter is ``bundled`` (the runtime's own: this Python, or the frozen application's
executable), ``env:NAME`` (a managed environment created by ``omni-edge env create NAME``)
or an absolute path. The worker is a built-in name or an absolute ``.py`` path. Frozen
builds have no separate Python, so a built-in worker on the bundled interpreter re-launches
the application's own executable with ``--worker NAME``.

The worker's environment is built key by key, never copied wholesale from ``os.environ``,
so a worker sees the same variables on every machine apart from the few listed below.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

from runtime.contracts.process import GENERATION_VARIABLE
from runtime.errors import ConfigError
from runtime.host.wslpaths import OS_DOMAINS, current_os_domain
from runtime.paths import data_dir

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = [
    "APP_NAME",
    "BUILTIN_WORKERS",
    "GENERATION_VARIABLE",
    "INHERITED_VARIABLES",
    "WINDOWS_VARIABLES",
    "LaunchSpec",
    "RouteError",
    "default_env_dir",
    "default_project_root",
    "is_frozen",
    "resolve_interpreter",
    "worker_argv",
    "worker_environment",
]

APP_NAME: Final = "omni-edge-studio"

#: Built-in worker names and the modules that run them (``python -m <module>``).
BUILTIN_WORKERS: Final[Mapping[str, str]] = MappingProxyType(
    {"ort": "workers.ort_worker", "vllm": "workers.vllm_worker"}
)

#: Variables copied from the controller's environment when set, with the reason for each.
INHERITED_VARIABLES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "PATH": "finds helper executables (and, on Windows, the DLLs next to them)",
        "HOME": "libraries locate per-user configuration and caches",
        "LANG": "keeps text decoding the same as the controller's",
        "LC_ALL": "keeps text decoding the same as the controller's when it overrides LANG",
        "TMPDIR": "tempfile writes where the controller was told to",
        "XDG_RUNTIME_DIR": "the host lock directory is derived from it",
        "OMP_NUM_THREADS": "the user's thread limit for OpenMP runtimes, only when set",
    }
)

#: Extra variables copied on Windows, with the reason for each.
WINDOWS_VARIABLES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "SYSTEMROOT": "Windows needs it to load system DLLs and initialise sockets",
        "TEMP": "the Windows temporary directory (and the host lock directory)",
        "TMP": "the fallback Windows temporary directory",
        "USERPROFILE": "Windows' HOME: Path.home() and per-user caches",
        "LOCALAPPDATA": "per-user application data and the last lock-directory fallback",
    }
)

_ENV_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_INTERPRETER_FORMS = (
    "accepted values are 'bundled', 'env:NAME' (a managed environment) and an absolute path "
    "to a Python executable"
)


class RouteError(ConfigError):
    """A route's interpreter or worker cannot be used on this machine. ``key`` names the field."""


def is_frozen() -> bool:
    """True inside a frozen (PyInstaller) build, where there is no separate Python."""
    return bool(getattr(sys, "frozen", False))


def default_project_root() -> Path:
    """The directory holding the ``runtime`` and ``workers`` packages (what workers import)."""
    bundle = getattr(sys, "_MEIPASS", None)
    if is_frozen() and isinstance(bundle, str):
        return Path(bundle)
    return Path(__file__).resolve().parents[2]


def default_env_dir() -> Path:
    """Where ``omni-edge env create NAME`` puts managed environments."""
    return data_dir() / "envs"


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything needed to start one worker process, decided before it starts.

    ``os_domain`` is where the worker runs; ``argv`` is already built for reaching it (for
    example a Windows interpreter's ``/mnt/c/...`` path when the controller runs in WSL).
    """

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None
    os_domain: str

    def __post_init__(self) -> None:
        argv = tuple(self.argv)
        if not argv or not isinstance(argv[0], str) or not argv[0]:
            raise ValueError(f"launch spec: argv needs a program as its first item, got {argv!r}")
        if not all(isinstance(arg, str) and "\0" not in arg for arg in argv):
            raise ValueError(f"launch spec: every argv item must be a string without NUL: {argv!r}")
        object.__setattr__(self, "argv", argv)
        object.__setattr__(self, "env", MappingProxyType(_checked_env(self.env, "launch spec env")))
        if self.cwd is not None and not isinstance(self.cwd, str):
            raise ValueError(f"launch spec: cwd must be a string or None, got {self.cwd!r}")
        if self.os_domain not in OS_DOMAINS:
            raise ValueError(
                f"launch spec: unknown os_domain {self.os_domain!r}; accepted values are "
                f"{', '.join(repr(domain) for domain in OS_DOMAINS)}"
            )


def _checked_env(env: Mapping[str, str], what: str) -> dict[str, str]:
    checked: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise ValueError(f"{what}: invalid variable name {key!r} (non-empty, no '=' or NUL)")
        if not isinstance(value, str) or "\0" in value:
            raise ValueError(f"{what}: variable {key} must be a string without NUL, got {value!r}")
        checked[key] = value
    return checked


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a file; a path the OS refuses to look up (too long) is none."""
    try:
        return path.is_file()
    except OSError:
        return False


def _python_in_env(env_root: Path, os_domain: str) -> Path:
    if os_domain == "windows":
        return env_root / "Scripts" / "python.exe"
    return env_root / "bin" / "python"


def resolve_interpreter(
    interpreter: str,
    *,
    frozen: bool | None = None,
    env_dir: Path | None = None,
    os_domain: str | None = None,
) -> tuple[str, ...]:
    """The argv prefix that runs a route's interpreter on this machine.

    * ``bundled``: ``(sys.executable,)`` -- this Python, or in a frozen build the
      application's executable (:func:`worker_argv` then adds ``--worker NAME``).
    * ``env:NAME``: the Python of managed environment NAME under ``env_dir`` (default
      :func:`default_env_dir`): ``NAME/bin/python``, or ``NAME\\Scripts\\python.exe`` on
      Windows. A missing environment tells the user to run ``omni-edge env create NAME``.
    * an absolute path: must exist and be executable.

    ``os_domain`` selects the environment layout (default: this machine's domain).
    Raises :class:`RouteError` with ``key='interpreter'``.
    """
    frozen = is_frozen() if frozen is None else frozen
    domain = current_os_domain() if os_domain is None else os_domain
    if domain not in OS_DOMAINS:
        raise RouteError(
            f"unknown os_domain {domain!r}; accepted values are 'posix' and 'windows'",
            key="os_domain",
        )
    if not isinstance(interpreter, str) or not interpreter:
        raise RouteError(f"empty interpreter; {_INTERPRETER_FORMS}", key="interpreter")
    if interpreter == "bundled":
        if not sys.executable:
            what = "the application's executable" if frozen else "the running Python interpreter"
            raise RouteError(f"interpreter 'bundled': cannot locate {what}", key="interpreter")
        return (sys.executable,)
    if interpreter.startswith("env:"):
        name = interpreter[len("env:") :]
        if not _ENV_NAME.match(name):
            raise RouteError(
                f"interpreter {interpreter!r}: environment names use letters, digits, '.', '-' "
                "and '_'",
                key="interpreter",
            )
        root = (default_env_dir() if env_dir is None else env_dir) / name
        python = _python_in_env(root, domain)
        if not _is_file(python):
            raise RouteError(
                f"interpreter {interpreter!r}: environment {name!r} does not exist ({python} is "
                f"missing); create it with `omni-edge env create {name}`",
                key="interpreter",
            )
        return (str(python),)
    path = Path(interpreter)
    if not path.is_absolute():
        raise RouteError(
            f"interpreter {interpreter!r} is not recognised; {_INTERPRETER_FORMS}",
            key="interpreter",
        )
    if not _is_file(path):
        raise RouteError(
            f"interpreter {interpreter!r} does not exist or is not a file", key="interpreter"
        )
    if not os.access(path, os.X_OK):
        raise RouteError(f"interpreter {interpreter!r} is not executable", key="interpreter")
    return (str(path),)


def worker_argv(interpreter_argv: Sequence[str], worker: str, *, frozen: bool) -> tuple[str, ...]:
    """The full argv of a worker run by ``interpreter_argv``.

    * a built-in name (see :data:`BUILTIN_WORKERS`): ``python -m workers.<name>_worker``; in
      a frozen build on the bundled interpreter, ``<app executable> --worker <name>``
      (another interpreter keeps ``-m``: it runs the workers installed in its environment).
    * an absolute ``.py`` path: ``python <path>``; a frozen executable cannot run scripts.

    Raises :class:`RouteError` with ``key='worker'``.
    """
    prefix = tuple(interpreter_argv)
    if not prefix:
        raise RouteError("worker_argv needs an interpreter argv", key="interpreter")
    bundled = prefix == (sys.executable,)
    if worker in BUILTIN_WORKERS:
        if frozen and bundled:
            return (sys.executable, "--worker", worker)
        return (*prefix, "-m", BUILTIN_WORKERS[worker])
    if isinstance(worker, str) and worker.endswith(".py"):
        script = Path(worker)
        if not script.is_absolute():
            raise RouteError(f"worker script {worker!r} must be an absolute path", key="worker")
        if not _is_file(script):
            raise RouteError(f"worker script {worker!r} does not exist", key="worker")
        if frozen and bundled:
            raise RouteError(
                f"worker script {worker!r} needs a Python interpreter, but the bundled "
                "interpreter of this build is the application itself; use 'env:NAME' or an "
                "absolute interpreter path",
                key="worker",
            )
        return (*prefix, str(script))
    raise RouteError(
        f"unknown worker {worker!r}; accepted values are "
        f"{', '.join(repr(name) for name in BUILTIN_WORKERS)} or an absolute path to a .py file",
        key="worker",
    )


def worker_environment(
    extra: Mapping[str, str],
    *,
    generation: int,
    project_root: Path,
    base: Mapping[str, str] | None = None,
    os_domain: str | None = None,
) -> dict[str, str]:
    """The explicit, minimal environment of a worker.

    Copied from ``base`` (default ``os.environ``) when set: :data:`INHERITED_VARIABLES`, and
    on Windows :data:`WINDOWS_VARIABLES`. Then set, each for one reason:

    * ``PYTHONPATH`` = ``project_root``: workers import ``runtime.contracts`` and ``workers``.
    * ``PYTHONUNBUFFERED=1``: stderr lines reach the controller's log as they are written.
    * ``PYTHONDONTWRITEBYTECODE=1``: a worker never writes into the installation.
    * ``PYTHONIOENCODING=utf-8``: stderr is decoded as UTF-8 on every platform.
    * ``OMNI_EDGE_WORKER_GENERATION``: the worker echoes it so stale replies are fenced.
    * ``ORT_DISABLE_TELEMETRY=1``: ONNX Runtime otherwise writes a session file into the
      temporary folder and a database under ``~/.cache/Microsoft`` in every process.

    The route's ``extra`` variables come last and override everything above.
    """
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise ValueError(f"worker generation must be a non-negative integer, got {generation!r}")
    source = os.environ if base is None else base
    domain = current_os_domain() if os_domain is None else os_domain
    inherited = dict(INHERITED_VARIABLES)
    if domain == "windows":
        inherited.update(WINDOWS_VARIABLES)
    if domain == "windows":
        # Windows variable names are case-insensitive.
        source = {key.upper(): value for key, value in source.items()}
    env = {key: source[key] for key in inherited if key in source}
    env.update(
        {
            "PYTHONPATH": str(project_root),
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONIOENCODING": "utf-8",
            GENERATION_VARIABLE: str(generation),
            "ORT_DISABLE_TELEMETRY": "1",
        }
    )
    env.update(_checked_env(extra, "route env"))
    return env
