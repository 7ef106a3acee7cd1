"""Create, list and remove managed worker environments.

Environments live under :func:`envs_root` (``<user data dir>/envs``, or
``$OMNI_EDGE_DATA_DIR/envs``), one directory per name, each with a marker file
(:data:`MARKER_NAME`) written only when every step of its recipe succeeded.

Creation is idempotent and all-or-nothing:

* an environment whose marker says it was made by the current recipe and whose import
  check passes is reused as it is;
* otherwise the recipe runs in ``<envs>/.NAME.partial-<random>``; the marker is written
  there and the directory is renamed into place only at the end (an outdated or broken
  environment it replaces is moved aside first and then deleted);
* when a step fails, times out or is interrupted, the partial directory is deleted and
  :class:`EnvCreateError` names the step, its command and the tail of its output.

One creator or remover works on a name at a time (a lock file beside the environment),
so two processes asking for the same environment wait for each other and the second
reuses what the first made.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Final, Literal

from runtime.errors import ExecutionError, RefusedError, UsageError
from runtime.host.launch import default_env_dir, default_project_root, is_frozen
from runtime.paths import data_dir

from .recipes import ENV_NAME_PATTERN, RECIPES, EnvRecipe, EnvStep, env_python_path, step_argv

__all__ = [
    "DATA_DIR_VARIABLE",
    "MARKER_NAME",
    "EnvCreateError",
    "EnvError",
    "EnvInfo",
    "EnvUnsupported",
    "Progress",
    "create_env",
    "data_dir",
    "directory_size",
    "env_python",
    "envs_root",
    "list_envs",
    "recipe_unsupported_reason",
    "remove_env",
]

#: Overrides the user data directory (environments, model cache) when set.
DATA_DIR_VARIABLE: Final = "OMNI_EDGE_DATA_DIR"
#: The file that says an environment is complete, and what made it.
MARKER_NAME: Final = "omni-edge-env.json"
MARKER_FORMAT: Final = 1
#: Output lines kept for an error report.
OUTPUT_TAIL_LINES: Final = 40
#: Files under bin/ larger than this are binaries; their paths are not rewritten.
_SCRIPT_MAX_BYTES: Final = 1 << 20

Progress = Callable[[str], None]
EnvStatus = Literal["ready", "outdated", "broken"]


class EnvError(UsageError):
    """An environment request is malformed: a bad name or an unknown recipe."""


class EnvUnsupported(RefusedError):
    """The recipe cannot run on this machine (wrong platform, no NVIDIA driver)."""


class EnvCreateError(ExecutionError):
    """A step of an environment's recipe failed; nothing of the environment is left.

    ``step`` is the step's title, ``command`` its argv, ``returncode`` its exit status
    (None when it timed out or could not start) and ``output_tail`` its last output lines.
    """

    def __init__(
        self,
        message: str,
        *,
        env: str,
        step: str,
        command: tuple[str, ...],
        returncode: int | None,
        output_tail: tuple[str, ...],
    ) -> None:
        tail = "\n".join(f"  | {line}" for line in output_tail)
        super().__init__(f"{message}\n{tail}" if tail else message)
        self.env = env
        self.step = step
        self.command = command
        self.returncode = returncode
        self.output_tail = output_tail


@dataclass(frozen=True, slots=True)
class EnvInfo:
    """One managed environment as its marker describes it.

    ``status`` is ``ready`` (made by the current recipe), ``outdated`` (made by an older
    recipe, or one this version does not know) or ``broken`` (no readable marker: an
    interrupted removal or a directory made by hand). ``reused`` is true when
    :func:`create_env` found it ready instead of building it.
    """

    name: str
    path: Path
    python: Path
    recipe: str | None
    recipe_digest: str | None
    python_version: str | None
    created_at: str | None
    create_s: float | None
    status: EnvStatus
    reused: bool = False
    size_bytes: int | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "path": str(self.path),
            "python": str(self.python),
            "recipe": self.recipe,
            "recipe_digest": self.recipe_digest,
            "python_version": self.python_version,
            "created_at": self.created_at,
            "create_s": self.create_s,
            "status": self.status,
            "reused": self.reused,
            "size_bytes": self.size_bytes,
        }


# -- locations ------------------------------------------------------------------------


def envs_root() -> Path:
    """Where managed environments live (the route resolver looks in the same place)."""
    return default_env_dir()


def _root(root: Path | None) -> Path:
    return envs_root() if root is None else Path(root)


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not ENV_NAME_PATTERN.match(name):
        raise EnvError(
            f"environment name {name!r} is invalid: use letters, digits, '.', '-' and '_', "
            "starting with a letter or digit"
        )
    return name


def env_python(name: str, *, root: Path | None = None) -> Path:
    """The Python executable of environment ``name`` (it may not exist yet)."""
    return env_python_path(_root(root) / _check_name(name))


def recipe_unsupported_reason(
    recipe: EnvRecipe, *, platform: str | None = None, nvidia: bool | None = None
) -> str | None:
    """Why ``recipe`` cannot run here, or None. ``platform``/``nvidia`` default to this machine."""
    where = sys.platform if platform is None else platform
    if where not in recipe.platforms:
        return (
            f"recipe {recipe.name!r} runs on {', '.join(sorted(recipe.platforms))}; this "
            f"machine is {where}"
        )
    if recipe.needs_nvidia and not (_nvidia_driver_present() if nvidia is None else nvidia):
        return (
            f"recipe {recipe.name!r} needs an NVIDIA GPU and driver (on WSL: the Windows "
            "driver with WSL support); none was found (no /proc/driver/nvidia, no "
            "/usr/lib/wsl/lib/libcuda.so, no nvidia-smi on PATH)"
        )
    return None


def _nvidia_driver_present() -> bool:
    return (
        Path("/proc/driver/nvidia/version").exists()
        or Path("/usr/lib/wsl/lib/libcuda.so").exists()
        or shutil.which("nvidia-smi") is not None
    )


# -- markers --------------------------------------------------------------------------


def _read_marker(env_root: Path) -> dict[str, object] | None:
    try:
        document = json.loads((env_root / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (
        not isinstance(document, dict)
        or document.get("format") != MARKER_FORMAT
        or document.get("complete") is not True
    ):
        return None
    return document


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _info(
    name: str,
    env_root: Path,
    recipes: Mapping[str, EnvRecipe],
    *,
    reused: bool = False,
    with_size: bool = False,
) -> EnvInfo:
    marker = _read_marker(env_root)
    recipe_name = None if marker is None else _str_or_none(marker.get("recipe"))
    digest = None if marker is None else _str_or_none(marker.get("recipe_digest"))
    status: EnvStatus
    if marker is None:
        status = "broken"
    elif (
        recipe_name is not None and recipe_name in recipes and recipes[recipe_name].digest == digest
    ):
        status = "ready"
    else:
        status = "outdated"
    create_s = None if marker is None else marker.get("create_s")
    return EnvInfo(
        name=name,
        path=env_root,
        python=env_python_path(env_root),
        recipe=recipe_name,
        recipe_digest=digest,
        python_version=None if marker is None else _str_or_none(marker.get("python_version")),
        created_at=None if marker is None else _str_or_none(marker.get("created_at")),
        create_s=float(create_s) if isinstance(create_s, int | float) else None,
        status=status,
        reused=reused,
        size_bytes=directory_size(env_root) if with_size else None,
    )


def directory_size(path: Path) -> int:
    """Bytes of every regular file under ``path`` (links are not followed)."""
    total = 0
    for folder, _dirs, files in os.walk(path):
        for file in files:
            try:
                stat = os.lstat(os.path.join(folder, file))
            except OSError:
                continue
            if not os.path.islink(os.path.join(folder, file)):
                total += stat.st_size
    return total


# -- locking --------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(root: Path, name: str) -> Iterator[None]:
    """Hold the lock of environment ``name`` (blocking) for the body."""
    root.mkdir(parents=True, exist_ok=True)
    handle = open(root / f".{name}.lock", "a+b")
    try:
        if sys.platform == "win32":
            import msvcrt

            handle.seek(0)
            while True:
                try:
                    msvcrt.locking(handle.fileno(), msvcrt.LK_LOCK, 1)
                    break
                except OSError:
                    # LK_LOCK gives up after 10 s; keep waiting for the other creator.
                    continue
            try:
                yield
            finally:
                handle.seek(0)
                msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)
        else:
            import fcntl

            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    finally:
        handle.close()


def _sweep_leftovers(root: Path, name: str) -> None:
    """Delete what an interrupted creation or removal of ``name`` left (lock held)."""
    for pattern in (f".{name}.partial-*", f".{name}.removing-*"):
        for leftover in root.glob(pattern):
            shutil.rmtree(leftover, ignore_errors=True)


# -- running steps --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _StepRun:
    exit_code: int | None
    tail: tuple[str, ...]
    timed_out: bool
    seconds: float


def _step_environment(step: EnvStep, project_root: Path) -> dict[str, str]:
    """The parent's environment minus what would point Python elsewhere."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONSAFEPATH")
        and key != "__PYVENV_LAUNCHER__"
    }
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONIOENCODING"] = "utf-8"
    env["PYTHONUNBUFFERED"] = "1"
    if step.kind == "python":
        env["PYTHONPATH"] = str(project_root)
    return env


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    try:
        if sys.platform == "win32":
            process.kill()
        else:
            os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _run_command(
    argv: tuple[str, ...],
    *,
    env: Mapping[str, str],
    cwd: Path,
    timeout_s: float,
    on_line: Callable[[str], None],
) -> _StepRun:
    """Run ``argv`` with its output merged and streamed line by line; kill its group on timeout."""
    started = time.monotonic()
    tail: deque[str] = deque(maxlen=OUTPUT_TAIL_LINES)
    # Its own process group, so a timeout or an interrupt stops everything the step started.
    if sys.platform == "win32":
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=str(cwd),
            creationflags=subprocess.CREATE_NEW_PROCESS_GROUP,
        )
    else:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=str(cwd),
            start_new_session=True,
        )
    timed_out = threading.Event()

    def on_timeout() -> None:
        timed_out.set()
        _kill_group(process)

    timer = threading.Timer(timeout_s, on_timeout)
    timer.daemon = True
    timer.start()
    try:
        stream: IO[bytes] | None = process.stdout
        assert stream is not None
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            tail.append(line)
            on_line(line)
        code = process.wait()
    except BaseException:
        _kill_group(process)
        process.wait()
        raise
    finally:
        timer.cancel()
        if process.stdout is not None:
            process.stdout.close()
        # Whatever the step started in its group must not outlive it.
        _kill_group(process)
    return _StepRun(
        exit_code=None if timed_out.is_set() else code,
        tail=tuple(tail),
        timed_out=timed_out.is_set(),
        seconds=time.monotonic() - started,
    )


def _relocate_scripts(env_root: Path, old: Path, new: Path) -> None:
    """Point the scripts under bin/ (shebangs, activate) at the final location."""
    scripts = env_root / ("Scripts" if sys.platform == "win32" else "bin")
    old_text, new_text = str(old).encode(), str(new).encode()
    for path in [*scripts.iterdir(), env_root / "pyvenv.cfg"]:
        try:
            if path.is_symlink() or not path.is_file() or path.stat().st_size > _SCRIPT_MAX_BYTES:
                continue
            data = path.read_bytes()
        except OSError:
            continue
        if old_text in data and b"\0" not in data:
            path.write_bytes(data.replace(old_text, new_text))


def _venv_python_version(env_root: Path) -> str | None:
    """The Python version ``venv`` recorded in ``pyvenv.cfg``."""
    try:
        lines = (env_root / "pyvenv.cfg").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.strip() in ("version", "version_info"):
            return value.strip()
    return None


def _run_check(
    recipe: EnvRecipe, env_root: Path, project_root: Path, base_python: Path
) -> _StepRun:
    step = recipe.check
    return _run_command(
        step_argv(step, base_python=base_python, env_root=env_root),
        env=_step_environment(step, project_root),
        cwd=project_root,
        timeout_s=step.timeout_s,
        on_line=lambda _line: None,
    )


# -- the public operations ------------------------------------------------------------


def _recipe(name: str, recipe: str | None, recipes: Mapping[str, EnvRecipe]) -> EnvRecipe:
    wanted = name if recipe is None else recipe
    found = recipes.get(wanted)
    if found is None:
        raise EnvError(
            f"unknown environment recipe {wanted!r}; accepted: {', '.join(sorted(recipes))}"
        )
    return found


def _base_python(base_python: Path | None) -> Path:
    if base_python is not None:
        return Path(base_python)
    if is_frozen() or not sys.executable:
        raise EnvError(
            "creating an environment needs a Python interpreter, and this application has "
            "none of its own; pass one (omni-edge env create NAME --python /path/to/python3)"
        )
    return Path(sys.executable)


def create_env(
    name: str,
    *,
    progress: Progress | None = None,
    recipe: str | None = None,
    root: Path | None = None,
    recipes: Mapping[str, EnvRecipe] = RECIPES,
    base_python: Path | None = None,
    project_root: Path | None = None,
) -> EnvInfo:
    """Create environment ``name`` from its recipe (``recipe``, default: the recipe named
    ``name``), or reuse it when it is already complete and passes its import check.

    ``progress`` receives one line per step (``[2/5] install ...``), each line of the
    steps' output indented by four spaces, and the outcome. ``base_python`` creates the
    virtual environment (default: this Python). Raises :class:`EnvError` for a bad name or
    recipe, :class:`EnvUnsupported` when the recipe cannot run here and
    :class:`EnvCreateError` when a step fails (then nothing of it is left on disk).
    """
    say: Progress = progress or (lambda _line: None)
    _check_name(name)
    chosen = _recipe(name, recipe, recipes)
    reason = recipe_unsupported_reason(chosen)
    if reason is not None:
        raise EnvUnsupported(f"cannot create environment {name!r}: {reason}")
    envs = _root(root)
    python = _base_python(base_python)
    project = default_project_root() if project_root is None else Path(project_root)
    final = envs / name
    with _locked(envs, name):
        _sweep_leftovers(envs, name)
        replacing = False
        if final.exists():
            info = _info(name, final, recipes)
            if info.status == "ready" and info.recipe == chosen.name:
                say(f"checking environment {name!r} at {final}")
                check = _run_check(chosen, final, project, python)
                if check.exit_code == 0:
                    say(f"environment {name!r} is ready (reused; check took {check.seconds:.1f} s)")
                    return _info(name, final, recipes, reused=True)
                say(f"environment {name!r} fails its import check; rebuilding it")
            elif info.status == "broken":
                say(f"environment {name!r} is incomplete (no marker); rebuilding it")
            else:
                say(f"environment {name!r} was made by another recipe version; rebuilding it")
            replacing = True
        partial = envs / f".{name}.partial-{secrets.token_hex(4)}"
        try:
            create_s, timings = _build(name, chosen, partial, python, project, say)
            marker = {
                "format": MARKER_FORMAT,
                "complete": True,
                "name": name,
                "recipe": chosen.name,
                "recipe_digest": chosen.digest,
                "python_version": _venv_python_version(partial),
                "base_python": str(python),
                "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "create_s": round(create_s, 3),
                "steps": timings,
            }
            _relocate_scripts(partial, partial, final)
            (partial / MARKER_NAME).write_text(json.dumps(marker, indent=2), encoding="utf-8")
            if replacing:
                aside = envs / f".{name}.removing-{secrets.token_hex(4)}"
                final.rename(aside)
                partial.rename(final)
                shutil.rmtree(aside, ignore_errors=True)
            else:
                partial.rename(final)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    say(f"environment {name!r} created at {final} in {create_s:.1f} s")
    return _info(name, final, recipes)


def _build(
    name: str,
    recipe: EnvRecipe,
    partial: Path,
    base_python: Path,
    project_root: Path,
    say: Progress,
) -> tuple[float, list[dict[str, object]]]:
    """Run every step of ``recipe`` into ``partial``; raise EnvCreateError on the first failure."""
    started = time.monotonic()
    timings: list[dict[str, object]] = []
    total = len(recipe.steps)
    for index, step in enumerate(recipe.steps, start=1):
        argv = step_argv(step, base_python=base_python, env_root=partial)
        say(f"[{index}/{total}] {step.title}")
        try:
            run = _run_command(
                argv,
                env=_step_environment(step, project_root),
                cwd=project_root if project_root.is_dir() else partial.parent,
                timeout_s=step.timeout_s,
                on_line=lambda line: say(f"    {line}"),
            )
        except OSError as exc:
            raise EnvCreateError(
                f"creating environment {name!r} failed at step {index}/{total} "
                f"({step.title}): cannot run {argv[0]}: {exc.strerror or exc}",
                env=name,
                step=step.title,
                command=argv,
                returncode=None,
                output_tail=(),
            ) from exc
        if run.exit_code != 0:
            what = (
                f"did not finish within {step.timeout_s:g} s"
                if run.timed_out
                else f"exited with status {run.exit_code}"
            )
            raise EnvCreateError(
                f"creating environment {name!r} failed at step {index}/{total} "
                f"({step.title}): the command {what}: {' '.join(argv)[:300]}",
                env=name,
                step=step.title,
                command=argv,
                returncode=run.exit_code,
                output_tail=run.tail,
            )
        timings.append({"title": step.title, "seconds": round(run.seconds, 3)})
    return time.monotonic() - started, timings


def list_envs(
    *,
    root: Path | None = None,
    recipes: Mapping[str, EnvRecipe] = RECIPES,
    with_size: bool = False,
) -> tuple[EnvInfo, ...]:
    """Every environment under the root, by name; hidden leftovers are not listed."""
    envs = _root(root)
    if not envs.is_dir():
        return ()
    found = []
    for entry in sorted(envs.iterdir()):
        if entry.name.startswith(".") or not entry.is_dir() or entry.is_symlink():
            continue
        if not ENV_NAME_PATTERN.match(entry.name):
            continue
        found.append(_info(entry.name, entry, recipes, with_size=with_size))
    return tuple(found)


def remove_env(name: str, *, root: Path | None = None) -> bool:
    """Delete environment ``name``; False when there was none.

    The directory is first renamed aside, so an interrupted removal never leaves
    something that looks like an environment.
    """
    _check_name(name)
    envs = _root(root)
    final = envs / name
    if not envs.is_dir():
        return False
    with _locked(envs, name):
        _sweep_leftovers(envs, name)
        if not final.exists() and not final.is_symlink():
            return False
        if final.is_symlink() or not final.is_dir():
            final.unlink()
            return True
        aside = envs / f".{name}.removing-{secrets.token_hex(4)}"
        final.rename(aside)
        shutil.rmtree(aside)
    # The lock file stays: unlinking it could let a waiter and a newcomer lock different files.
    return True
