"""Process hosting: routes to launches, worker processes and their bounded retirement.

* :mod:`runtime.host.identity` -- :class:`ProcessIdentity`, a pid plus creation time.
* :mod:`runtime.host.wslpaths` -- pure Windows/WSL path and command mapping, lock directories.
* :mod:`runtime.host.launch` -- interpreter and worker resolution, the explicit environment.
* :mod:`runtime.host.process` -- :func:`spawn_worker`, :class:`WorkerProcess`, :func:`retire_tree`.
"""

from __future__ import annotations

from runtime.host.identity import CREATE_TIME_TOLERANCE_S, ProcessIdentity
from runtime.host.launch import (
    BUILTIN_WORKERS,
    GENERATION_VARIABLE,
    INHERITED_VARIABLES,
    WINDOWS_VARIABLES,
    LaunchSpec,
    RouteError,
    default_env_dir,
    default_project_root,
    is_frozen,
    resolve_interpreter,
    worker_argv,
    worker_environment,
)
from runtime.host.process import (
    STDERR_TAIL_LINES,
    RetireOutcome,
    WorkerProcess,
    WorkerStartError,
    handles_of,
    retire_tree,
    set_child_subreaper,
    spawn_worker,
    wait_processes_gone,
    watch_until_gone,
)
from runtime.host.wslpaths import (
    DEFAULT_MOUNT_ROOT,
    OS_DOMAINS,
    current_os_domain,
    host_temp_lock_dir,
    is_wsl,
    windows_command_from_wsl,
    windows_to_wsl_path,
    wsl_command_from_windows,
    wsl_to_windows_path,
)

__all__ = [
    "BUILTIN_WORKERS",
    "CREATE_TIME_TOLERANCE_S",
    "DEFAULT_MOUNT_ROOT",
    "GENERATION_VARIABLE",
    "INHERITED_VARIABLES",
    "OS_DOMAINS",
    "STDERR_TAIL_LINES",
    "WINDOWS_VARIABLES",
    "LaunchSpec",
    "ProcessIdentity",
    "RetireOutcome",
    "RouteError",
    "WorkerProcess",
    "WorkerStartError",
    "current_os_domain",
    "default_env_dir",
    "default_project_root",
    "handles_of",
    "host_temp_lock_dir",
    "is_frozen",
    "is_wsl",
    "resolve_interpreter",
    "retire_tree",
    "set_child_subreaper",
    "spawn_worker",
    "wait_processes_gone",
    "watch_until_gone",
    "windows_command_from_wsl",
    "windows_to_wsl_path",
    "worker_argv",
    "worker_environment",
    "wsl_command_from_windows",
    "wsl_to_windows_path",
]
