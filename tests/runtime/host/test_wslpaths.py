"""Windows/WSL route logic: path mapping, command construction, lock directories."""

from __future__ import annotations

import os
import re

import pytest

from runtime.host.wslpaths import (
    current_os_domain,
    host_temp_lock_dir,
    is_wsl,
    windows_command_from_wsl,
    windows_to_wsl_path,
    wsl_command_from_windows,
    wsl_to_windows_path,
)

# ------------------------------------------------------------------------------ is_wsl


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Linux version 5.15.153.1-microsoft-standard-WSL2 (root@1c602f52c2e4) (gcc)", True),
        ("Linux version 4.4.0-19041-Microsoft (Microsoft@Microsoft.com) (gcc version 5.4.0)", True),
        ("Linux version 6.1.0-18-amd64 (debian-kernel@lists.debian.org) (gcc-12)", False),
        ("Linux version 6.8.0-45-generic (buildd@lcy02-amd64-115) #45-Ubuntu SMP", False),
        ("", False),
    ],
)
def test_is_wsl_reads_the_kernel_banner(text: str, expected: bool) -> None:
    assert is_wsl(text) is expected


def test_is_wsl_without_text_reads_proc_version() -> None:
    try:
        with open("/proc/version", encoding="utf-8") as stream:
            expected = is_wsl(stream.read())
    except OSError:
        expected = False
    assert is_wsl() is expected


def test_current_os_domain_is_posix_off_windows() -> None:
    assert current_os_domain() == ("windows" if os.name == "nt" else "posix")


# ------------------------------------------------------------------ WSL -> Windows paths


@pytest.mark.parametrize(
    ("path", "distro", "expected"),
    [
        ("/mnt/c/Users/x", None, "C:\\Users\\x"),
        ("/mnt/c", None, "C:\\"),
        ("/mnt/c/", None, "C:\\"),
        ("/mnt/d/models/voice.onnx", None, "D:\\models\\voice.onnx"),
        ("/mnt/c//Users/./x/", None, "C:\\Users\\x"),
        ("/mnt/c/Program Files/Python311", None, "C:\\Program Files\\Python311"),
        ("/mnt/c/Users/x", "Ubuntu", "C:\\Users\\x"),
        ("/home/u/project", "Ubuntu-22.04", "\\\\wsl.localhost\\Ubuntu-22.04\\home\\u\\project"),
        ("/", "Ubuntu", "\\\\wsl.localhost\\Ubuntu\\"),
        ("/mnt/wsl/shared", "Debian", "\\\\wsl.localhost\\Debian\\mnt\\wsl\\shared"),
        ("/mnt/cc/x", "Debian", "\\\\wsl.localhost\\Debian\\mnt\\cc\\x"),
        ("/mnt/C/x", "Debian", "\\\\wsl.localhost\\Debian\\mnt\\C\\x"),
    ],
)
def test_wsl_to_windows_path(path: str, distro: str | None, expected: str) -> None:
    assert wsl_to_windows_path(path, distro=distro) == expected


def test_wsl_to_windows_path_with_a_custom_mount_root() -> None:
    assert wsl_to_windows_path("/c/Users/x", mount_root="/") == "C:\\Users\\x"
    assert wsl_to_windows_path("/win/e/data", mount_root="/win/") == "E:\\data"
    with pytest.raises(ValueError, match=re.escape("'/win/<drive letter>/'")):
        wsl_to_windows_path("/mnt/c/x", mount_root="/win")


@pytest.mark.parametrize(
    ("path", "distro", "message"),
    [
        ("relative/path", None, "not an absolute POSIX path"),
        ("/home/u/x", None, "no distro name was given"),
        ("/mnt/c/../etc", None, "contains '..'"),
        ("/mnt/c/a:b", None, "component 'a:b' contains ':'"),
        ("/mnt/c/what?", None, "contains '?'"),
        ("/home/back\\slash", "Ubuntu", "contains '\\\\'"),
    ],
)
def test_wsl_to_windows_path_refuses_unmappable_paths(
    path: str, distro: str | None, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        wsl_to_windows_path(path, distro=distro)
    assert f"'{path}'" in str(caught.value)


def test_wsl_to_windows_path_refuses_an_empty_path() -> None:
    with pytest.raises(ValueError, match="not an absolute POSIX path"):
        wsl_to_windows_path("")


@pytest.mark.parametrize("distro", ["", "bad name", "a/b", "-dash"])
def test_wsl_to_windows_path_refuses_bad_distro_names(distro: str) -> None:
    with pytest.raises(ValueError, match=f"invalid WSL distro name '{re.escape(distro)}'"):
        wsl_to_windows_path("/home/u", distro=distro)


def test_unmappable_wsl_path_error_lists_accepted_forms() -> None:
    with pytest.raises(ValueError, match=re.escape("accepted forms are '/mnt/<drive letter>/...'")):
        wsl_to_windows_path("/home/u/x")


# ------------------------------------------------------------------ Windows -> WSL paths


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("C:\\Users\\x", "/mnt/c/Users/x"),
        ("c:\\Users\\x", "/mnt/c/Users/x"),
        ("C:/Users/x", "/mnt/c/Users/x"),
        ("C:\\", "/mnt/c"),
        ("D:\\models\\voice.onnx", "/mnt/d/models/voice.onnx"),
        ("C:\\Program Files\\Python311\\python.exe", "/mnt/c/Program Files/Python311/python.exe"),
        ("C:\\Users\\\\x\\.\\y\\", "/mnt/c/Users/x/y"),
        ("\\\\?\\C:\\very\\long", "/mnt/c/very/long"),
        ("\\\\wsl$\\Ubuntu\\home\\u", "/home/u"),
        ("\\\\wsl.localhost\\Ubuntu\\home\\u\\project", "/home/u/project"),
        ("\\\\WSL.LOCALHOST\\Ubuntu\\etc", "/etc"),
        ("//wsl$/Ubuntu/home/u", "/home/u"),
        ("\\\\wsl$\\Ubuntu", "/"),
        ("\\\\?\\UNC\\wsl$\\Ubuntu\\tmp", "/tmp"),
    ],
)
def test_windows_to_wsl_path(path: str, expected: str) -> None:
    assert windows_to_wsl_path(path) == expected


def test_windows_to_wsl_path_with_a_custom_mount_root() -> None:
    assert windows_to_wsl_path("C:\\x", mount_root="/") == "/c/x"
    assert windows_to_wsl_path("E:\\", mount_root="/win/") == "/win/e"


@pytest.mark.parametrize(
    ("path", "distro", "message"),
    [
        ("relative\\path", None, "not an absolute Windows path"),
        ("C:relative", None, "not an absolute Windows path"),
        ("C:", None, "not an absolute Windows path"),
        ("", None, "accepted forms"),
        ("\\\\fileserver\\share\\x", None, "is not a WSL share"),
        ("\\\\wsl$\\", None, "is not a WSL share"),
        ("C:\\a\\..\\b", None, "contains '..'"),
        ("\\\\wsl$\\Debian\\home", "Ubuntu", "a file of distro 'Debian'"),
    ],
)
def test_windows_to_wsl_path_refuses_unmappable_paths(
    path: str, distro: str | None, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        windows_to_wsl_path(path, distro=distro)
    assert f"'{path}'" in str(caught.value)


def test_unmappable_windows_path_error_lists_accepted_forms() -> None:
    with pytest.raises(ValueError, match=r"accepted forms are a drive path 'C:\\dir\\file'"):
        windows_to_wsl_path("relative")


def test_windows_to_wsl_path_accepts_the_matching_distro_in_any_case() -> None:
    assert windows_to_wsl_path("\\\\wsl$\\Ubuntu\\home", distro="ubuntu") == "/home"


@pytest.mark.parametrize(
    "wsl_path",
    ["/mnt/c/Users/x/file.txt", "/mnt/z", "/mnt/d/a b/c"],
)
def test_drive_paths_round_trip(wsl_path: str) -> None:
    assert windows_to_wsl_path(wsl_to_windows_path(wsl_path)) == wsl_path


def test_distro_paths_round_trip() -> None:
    windows = wsl_to_windows_path("/home/u/models", distro="Ubuntu")
    assert windows_to_wsl_path(windows, distro="Ubuntu") == "/home/u/models"


# ---------------------------------------------------------------------------- commands


@pytest.mark.parametrize(
    ("interpreter", "args", "expected"),
    [
        (
            "C:\\Python311\\python.exe",
            ["-m", "workers.ort_worker"],
            ["/mnt/c/Python311/python.exe", "-m", "workers.ort_worker"],
        ),
        (
            "C:\\Python311\\python.exe",
            ["/mnt/d/models/voice.onnx", "--bundle", "/mnt/c/Users/x/b"],
            [
                "/mnt/c/Python311/python.exe",
                "D:\\models\\voice.onnx",
                "--bundle",
                "C:\\Users\\x\\b",
            ],
        ),
        (
            "/mnt/c/Python311/python.exe",
            ["/home/u/model.onnx", "/v", "--flag=/mnt/c/x"],
            ["/mnt/c/Python311/python.exe", "/home/u/model.onnx", "/v", "--flag=/mnt/c/x"],
        ),
        ("C:/Py/python.exe", [], ["/mnt/c/Py/python.exe"]),
    ],
)
def test_windows_command_from_wsl(interpreter: str, args: list[str], expected: list[str]) -> None:
    assert windows_command_from_wsl(interpreter, args) == expected


@pytest.mark.parametrize(
    ("interpreter", "message"),
    [
        ("python.exe", "not an absolute Windows path"),
        ("/usr/bin/python3", "not under '/mnt/<drive letter>/'"),
        ("\\\\server\\share\\python.exe", "is not a WSL share"),
    ],
)
def test_windows_command_from_wsl_refuses_unmappable_interpreters(
    interpreter: str, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        windows_command_from_wsl(interpreter, [])


def test_commands_refuse_a_string_as_args() -> None:
    with pytest.raises(TypeError, match="sequence of strings"):
        windows_command_from_wsl("C:\\py.exe", "-m x")
    with pytest.raises(TypeError, match="sequence of strings"):
        wsl_command_from_windows("Ubuntu", "/usr/bin/python3", "-m x")


@pytest.mark.parametrize(
    ("interpreter", "args", "expected_tail"),
    [
        (
            "/home/u/.venv/bin/python",
            ["-m", "workers.ort_worker"],
            ["/home/u/.venv/bin/python", "-m", "workers.ort_worker"],
        ),
        (
            "/usr/bin/python3",
            ["C:\\models\\voice.onnx", "D:/data", "\\\\wsl$\\Ubuntu\\home\\u\\b", "-v", "/x"],
            [
                "/usr/bin/python3",
                "/mnt/c/models/voice.onnx",
                "/mnt/d/data",
                "/home/u/b",
                "-v",
                "/x",
            ],
        ),
        (
            "\\\\wsl.localhost\\Ubuntu\\home\\u\\.venv\\bin\\python",
            [],
            ["/home/u/.venv/bin/python"],
        ),
        ("C:\\tools\\python", ["x"], ["/mnt/c/tools/python", "x"]),
    ],
)
def test_wsl_command_from_windows(
    interpreter: str, args: list[str], expected_tail: list[str]
) -> None:
    assert wsl_command_from_windows("Ubuntu", interpreter, args) == [
        "wsl.exe",
        "-d",
        "Ubuntu",
        "--",
        *expected_tail,
    ]


@pytest.mark.parametrize(
    ("distro", "interpreter", "args", "message"),
    [
        ("", "/usr/bin/python3", [], "invalid WSL distro name"),
        ("Ubuntu; rm", "/usr/bin/python3", [], "invalid WSL distro name"),
        ("Ubuntu", "python3", [], "not an absolute Windows path"),
        ("Ubuntu", "/usr/../bin/python3", [], "contains '..'"),
        ("Ubuntu", "/usr/bin/python3", ["\\\\wsl$\\Debian\\x"], "a file of distro 'Debian'"),
    ],
)
def test_wsl_command_from_windows_refuses_bad_input(
    distro: str, interpreter: str, args: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        wsl_command_from_windows(distro, interpreter, args)


# ---------------------------------------------------------------------- lock directory


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (
            {"TEMP": "C:\\Users\\x\\AppData\\Local\\Temp", "TMP": "D:\\tmp"},
            "C:\\Users\\x\\AppData\\Local\\Temp\\omni-edge\\locks",
        ),
        ({"TMP": "D:\\tmp\\"}, "D:\\tmp\\omni-edge\\locks"),
        ({"temp": "C:/Temp/"}, "C:\\Temp\\omni-edge\\locks"),
        (
            {"LOCALAPPDATA": "C:\\Users\\x\\AppData\\Local"},
            "C:\\Users\\x\\AppData\\Local\\Temp\\omni-edge\\locks",
        ),
        ({"TEMP": "relative", "TMP": "E:\\t"}, "E:\\t\\omni-edge\\locks"),
        ({"TEMP": "\\\\server\\tmp"}, "\\\\server\\tmp\\omni-edge\\locks"),
        ({"TEMP": "C:\\"}, "C:\\omni-edge\\locks"),
    ],
)
def test_windows_lock_dir_uses_the_host_temp_directory(
    environ: dict[str, str], expected: str
) -> None:
    assert host_temp_lock_dir("windows", environ) == expected


def test_windows_lock_dir_ignores_the_working_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]
) -> None:
    environ = {"TEMP": "C:\\Temp"}
    first = host_temp_lock_dir("windows", environ)
    monkeypatch.chdir(tmp_path)
    assert host_temp_lock_dir("windows", environ) == first


@pytest.mark.parametrize(
    "environ", [{}, {"TEMP": "relative", "TMP": ""}, {"PATH": "C:\\Windows", "LOCALAPPDATA": "x"}]
)
def test_windows_lock_dir_without_a_temp_directory_is_an_error(environ: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="none of TEMP, TMP or LOCALAPPDATA"):
        host_temp_lock_dir("windows", environ)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"XDG_RUNTIME_DIR": "/run/user/1000"}, "/run/user/1000/omni-edge-1000/locks"),
        ({"XDG_RUNTIME_DIR": "/run/user/1000/"}, "/run/user/1000/omni-edge-1000/locks"),
        ({}, "/tmp/omni-edge-1000/locks"),
        ({"XDG_RUNTIME_DIR": ""}, "/tmp/omni-edge-1000/locks"),
        ({"XDG_RUNTIME_DIR": "relative/dir"}, "/tmp/omni-edge-1000/locks"),
        ({"TMPDIR": "/var/tmp"}, "/tmp/omni-edge-1000/locks"),
    ],
)
def test_posix_lock_dir(environ: dict[str, str], expected: str) -> None:
    assert host_temp_lock_dir("posix", environ, uid=1000) == expected


@pytest.mark.skipif(os.name == "nt", reason="uids exist on POSIX only")
def test_posix_lock_dir_defaults_to_this_uid() -> None:
    assert host_temp_lock_dir("posix", {}) == f"/tmp/omni-edge-{os.getuid()}/locks"


def test_lock_dir_refuses_an_unknown_domain() -> None:
    with pytest.raises(ValueError, match=r"unknown os_domain 'macos'.*'posix' and 'windows'"):
        host_temp_lock_dir("macos", {})
