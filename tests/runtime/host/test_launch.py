"""From a route to a launch: interpreters, worker argv, the explicit environment."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.errors import ConfigError
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

PROJECT_ROOT = Path(__file__).resolve().parents[3]


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# ------------------------------------------------------------------ resolve_interpreter


@pytest.mark.parametrize("frozen", [False, True])
def test_bundled_is_the_running_executable(frozen: bool) -> None:
    assert resolve_interpreter("bundled", frozen=frozen) == (sys.executable,)


def test_bundled_without_an_executable_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "")
    with pytest.raises(RouteError, match="cannot locate the application's executable"):
        resolve_interpreter("bundled", frozen=True)
    with pytest.raises(RouteError, match="cannot locate the running Python interpreter"):
        resolve_interpreter("bundled", frozen=False)


def test_env_name_resolves_inside_the_env_dir(tmp_path: Path) -> None:
    python = _executable(tmp_path / "vllm-cpu" / "bin" / "python")
    assert resolve_interpreter("env:vllm-cpu", env_dir=tmp_path, os_domain="posix") == (
        str(python),
    )


def test_env_name_uses_the_windows_layout_on_windows(tmp_path: Path) -> None:
    python = _executable(tmp_path / "ort" / "Scripts" / "python.exe")
    assert resolve_interpreter("env:ort", env_dir=tmp_path, os_domain="windows") == (str(python),)
    with pytest.raises(RouteError, match="does not exist"):
        resolve_interpreter("env:ort", env_dir=tmp_path, os_domain="posix")


def test_a_missing_env_tells_the_user_how_to_create_it(tmp_path: Path) -> None:
    with pytest.raises(RouteError) as caught:
        resolve_interpreter("env:vllm", env_dir=tmp_path, os_domain="posix")
    message = str(caught.value)
    assert "`omni-edge env create vllm`" in message
    assert str(tmp_path / "vllm" / "bin" / "python") in message
    assert caught.value.key == "interpreter"
    assert isinstance(caught.value, ConfigError)


def test_the_default_env_dir_is_per_user_data() -> None:
    assert default_env_dir().name == "envs"
    assert "omni-edge-studio" in str(default_env_dir())


@pytest.mark.parametrize("name", ["", "../x", "a/b", "-x", "a b"])
def test_env_names_are_checked(name: str, tmp_path: Path) -> None:
    with pytest.raises(RouteError, match="environment names use letters"):
        resolve_interpreter(f"env:{name}", env_dir=tmp_path)


def test_an_absolute_interpreter_must_exist_and_be_executable(tmp_path: Path) -> None:
    python = _executable(tmp_path / "python3")
    assert resolve_interpreter(str(python)) == (str(python),)
    with pytest.raises(RouteError, match="does not exist or is not a file"):
        resolve_interpreter(str(tmp_path / "missing"))
    with pytest.raises(RouteError, match="does not exist or is not a file"):
        resolve_interpreter(str(tmp_path))
    plain = tmp_path / "plain"
    plain.write_text("", encoding="utf-8")
    plain.chmod(0o644)
    if os.access(plain, os.X_OK):
        pytest.skip("running with privileges that ignore the execute bit")
    with pytest.raises(RouteError, match="is not executable"):
        resolve_interpreter(str(plain))


@pytest.mark.parametrize("interpreter", ["python3", "./venv/bin/python", "bundle", ""])
def test_unrecognised_interpreters_list_the_accepted_forms(interpreter: str) -> None:
    with pytest.raises(RouteError, match="accepted values are 'bundled', 'env:NAME'"):
        resolve_interpreter(interpreter)


def test_an_unknown_os_domain_is_refused() -> None:
    with pytest.raises(RouteError, match="unknown os_domain 'dos'") as caught:
        resolve_interpreter("bundled", os_domain="dos")
    assert caught.value.key == "os_domain"


# -------------------------------------------------------------------------- worker_argv


def test_builtin_workers_run_as_modules() -> None:
    python = ("/opt/py/bin/python",)
    assert worker_argv(python, "ort", frozen=False) == (*python, "-m", "workers.ort_worker")
    assert worker_argv(python, "vllm", frozen=False) == (*python, "-m", "workers.vllm_worker")
    assert set(BUILTIN_WORKERS) == {"ort", "vllm"}


def test_a_frozen_build_relaunches_itself_for_builtin_workers() -> None:
    assert worker_argv((sys.executable,), "ort", frozen=True) == (sys.executable, "--worker", "ort")


def test_a_frozen_build_keeps_modules_for_another_interpreter() -> None:
    other = ("/envs/vllm/bin/python",)
    assert worker_argv(other, "vllm", frozen=True) == (*other, "-m", "workers.vllm_worker")


def test_a_script_worker_runs_with_the_interpreter(tmp_path: Path) -> None:
    script = tmp_path / "my_worker.py"
    script.write_text("pass\n", encoding="utf-8")
    assert worker_argv(("/py",), str(script), frozen=False) == ("/py", str(script))
    assert worker_argv(("/py",), str(script), frozen=True) == ("/py", str(script))


def test_a_frozen_bundled_interpreter_cannot_run_scripts(tmp_path: Path) -> None:
    script = tmp_path / "my_worker.py"
    script.write_text("pass\n", encoding="utf-8")
    with pytest.raises(RouteError, match="use 'env:NAME' or an absolute interpreter path"):
        worker_argv((sys.executable,), str(script), frozen=True)


@pytest.mark.parametrize(
    ("worker", "message"),
    [
        ("onnx", "unknown worker 'onnx'; accepted values are 'ort', 'vllm'"),
        ("workers/ort_worker.py", "must be an absolute path"),
        ("/nonexistent/worker.py", "does not exist"),
        ("", "unknown worker ''"),
    ],
)
def test_bad_workers_are_refused(worker: str, message: str) -> None:
    with pytest.raises(RouteError, match=re.escape(message)) as caught:
        worker_argv(("/py",), worker, frozen=False)
    assert caught.value.key == "worker"


def test_worker_argv_needs_an_interpreter() -> None:
    with pytest.raises(RouteError, match="needs an interpreter argv"):
        worker_argv((), "ort", frozen=False)


def test_is_frozen_follows_sys_frozen(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert not is_frozen()
    assert default_project_root() == PROJECT_ROOT
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert is_frozen()
    assert default_project_root() == tmp_path


# -------------------------------------------------------------------- worker_environment


def test_environment_is_built_key_by_key() -> None:
    base = {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "LANG": "C.UTF-8",
        "SECRET_TOKEN": "do-not-pass",
        "PYTHONPATH": "/somewhere/else",
        "VIRTUAL_ENV": "/venv",
    }
    env = worker_environment(
        {}, generation=3, project_root=Path("/proj"), base=base, os_domain="posix"
    )
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(Path("/proj")),
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
        GENERATION_VARIABLE: "3",
        "ORT_DISABLE_TELEMETRY": "1",
    }


def test_omp_threads_pass_only_when_set() -> None:
    without = worker_environment(
        {}, generation=0, project_root=Path("/p"), base={}, os_domain="posix"
    )
    assert "OMP_NUM_THREADS" not in without
    with_it = worker_environment(
        {}, generation=0, project_root=Path("/p"), base={"OMP_NUM_THREADS": "2"}, os_domain="posix"
    )
    assert with_it["OMP_NUM_THREADS"] == "2"


def test_windows_keys_are_inherited_only_for_windows() -> None:
    base = {"SystemRoot": "C:\\Windows", "TEMP": "C:\\T", "TMP": "C:\\T2", "Path": "C:\\bin"}
    windows = worker_environment(
        {}, generation=1, project_root=Path("/p"), base=base, os_domain="windows"
    )
    assert windows["SYSTEMROOT"] == "C:\\Windows"
    assert windows["TEMP"] == "C:\\T"
    assert windows["TMP"] == "C:\\T2"
    assert windows["PATH"] == "C:\\bin"
    posix = worker_environment(
        {}, generation=1, project_root=Path("/p"), base=base, os_domain="posix"
    )
    assert not {"SYSTEMROOT", "SystemRoot", "TEMP", "TMP"} & set(posix)


def test_route_extras_come_last_and_override() -> None:
    env = worker_environment(
        {"OMP_NUM_THREADS": "1", "PYTHONPATH": "/override", "MY_FLAG": "on"},
        generation=2,
        project_root=Path("/p"),
        base={"OMP_NUM_THREADS": "8"},
        os_domain="posix",
    )
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["PYTHONPATH"] == "/override"
    assert env["MY_FLAG"] == "on"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"": "x"}, "invalid variable name ''"),
        ({"A=B": "x"}, "invalid variable name 'A=B'"),
        ({"A": 1}, "variable A must be a string"),
        ({"A": "x\0y"}, "variable A must be a string without NUL"),
    ],
)
def test_bad_route_extras_are_refused(extra: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        worker_environment(extra, generation=0, project_root=Path("/p"), base={})  # type: ignore[arg-type]


@pytest.mark.parametrize("generation", [-1, True, 1.5, "2"])
def test_generation_must_be_a_non_negative_integer(generation: object) -> None:
    with pytest.raises(ValueError, match="worker generation must be a non-negative integer"):
        worker_environment({}, generation=generation, project_root=Path("/p"))  # type: ignore[arg-type]


def test_every_inherited_key_has_a_reason() -> None:
    for reasons in (INHERITED_VARIABLES, WINDOWS_VARIABLES):
        assert all(reason.strip() for reason in reasons.values())


def test_a_worker_sees_only_the_explicit_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OMNI_EDGE_TEST_LEAK", "should-not-pass")
    script = tmp_path / "print_env.py"
    script.write_text(
        "import json, os, sys\nimport runtime.contracts\njson.dump(dict(os.environ), sys.stdout)\n",
        encoding="utf-8",
    )
    argv = worker_argv(resolve_interpreter("bundled"), str(script), frozen=False)
    env = worker_environment({"ROUTE_VAR": "yes"}, generation=7, project_root=PROJECT_ROOT)
    done = subprocess.run(argv, env=env, capture_output=True, check=True, timeout=60)
    seen = json.loads(done.stdout)
    assert "OMNI_EDGE_TEST_LEAK" not in seen
    assert seen["ROUTE_VAR"] == "yes"
    assert seen[GENERATION_VARIABLE] == "7"
    assert seen["PYTHONPATH"] == str(PROJECT_ROOT)


# --------------------------------------------------------------------------- LaunchSpec


def test_launch_spec_freezes_its_inputs() -> None:
    env = {"A": "1"}
    spec = LaunchSpec(argv=("python", "-c", "pass"), env=env, cwd=None, os_domain="posix")
    env["A"] = "2"
    assert spec.env["A"] == "1"
    with pytest.raises(TypeError):
        spec.env["B"] = "3"  # type: ignore[index]
    assert spec.argv == ("python", "-c", "pass")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"argv": ()}, "argv needs a program"),
        ({"argv": ("",)}, "argv needs a program"),
        ({"argv": ("py", "a\0b")}, "without NUL"),
        ({"argv": ("py", 3)}, "without NUL"),
        ({"env": {"A=B": "1"}}, "invalid variable name 'A=B'"),
        ({"cwd": 5}, "cwd must be a string or None"),
        (
            {"os_domain": "linux"},
            "unknown os_domain 'linux'; accepted values are 'posix', 'windows'",
        ),
    ],
)
def test_launch_spec_refuses_bad_fields(kwargs: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"argv": ("py",), "env": {}, "cwd": None, "os_domain": "posix"}
    fields.update(kwargs)
    with pytest.raises(ValueError, match=re.escape(message)):
        LaunchSpec(**fields)  # type: ignore[arg-type]


def test_importing_the_runtime_keeps_onnxruntime_from_writing_telemetry(tmp_path: Path) -> None:
    home = tmp_path / "home"
    temp = tmp_path / "tmp"
    home.mkdir()
    temp.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "TMPDIR": str(temp)}
    code = "import runtime.devices, onnxruntime; onnxruntime.get_available_providers()"
    subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=default_project_root(), check=True, timeout=60
    )
    assert not any(home.rglob("*")), sorted(home.rglob("*"))
    assert not any(temp.rglob("*")), sorted(temp.rglob("*"))
