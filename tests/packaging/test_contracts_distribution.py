"""omni-stage-contracts installed alone runs every conformance fixture with the standard
library only; its source archive carries the fixtures; its ``wire`` extra adds NumPy."""

from __future__ import annotations

import json
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Any

from runtime import __version__
from runtime.contracts.conformance import load_fixtures
from tests.helpers.distributions import REPO, clean_env, fresh_venv, pip_install, run

FIXTURES_JSON = REPO / "runtime" / "contracts" / "conformance" / "v1.json"

#: Run with ``python -I`` by the environment that holds only omni-stage-contracts.
CONFORMANCE_SCRIPT = """
import copy
import json
import sys

before = set(sys.modules)
import omni_stage_contracts
from omni_stage_contracts.conformance import load_fixtures, run_fixture

imported = sorted(set(sys.modules) - before)
fixtures = load_fixtures()
failures = []
for fixture in fixtures:
    for chunking in (None, "bytewise"):
        try:
            run_fixture(fixture, chunking=chunking)
        except AssertionError as exc:
            failures.append(f"{fixture['name']} ({chunking or 'own chunking'}): {exc}")
wrong = copy.deepcopy(next(f for f in fixtures if "error" in f["expect"]))
wrong["expect"]["error"] = "truncated" if wrong["expect"]["error"] != "truncated" else "bad_magic"
try:
    run_fixture(wrong)
    caught = None
except AssertionError as exc:
    caught = str(exc)
# What the interpreter loaded before (__main__, site hooks) is not the package's doing.
outside = sorted(
    name
    for name in set(sys.modules) - before
    if name.split(".")[0] not in sys.stdlib_module_names
    and name.split(".")[0] != "omni_stage_contracts"
)
try:
    import omni_stage_contracts.wire
    wire_error = None
except ModuleNotFoundError as exc:
    wire_error = {"name": exc.name, "message": str(exc)}
print(json.dumps({
    "package": omni_stage_contracts.__file__,
    "imported": imported,
    "fixtures": len(fixtures),
    "names": sorted(f["name"] for f in fixtures),
    "failures": failures,
    "mutated_fixture_error": caught,
    "outside_stdlib": outside,
    "wire_error": wire_error,
}))
"""

#: Run by an environment with ``omni-stage-contracts[wire]``.
WIRE_SCRIPT = """
import numpy as np

from omni_stage_contracts import decode_frame, encode_frame_parts
from omni_stage_contracts.wire import frame_arrays, inline_buffer

arrays = [
    np.arange(12, dtype=">f4").reshape(3, 4)[:, ::2],
    np.array([True, False]),
    np.array(7, dtype=np.int64),
]
parts = [inline_buffer(array, owner="test") for array in arrays]
frame = decode_frame(b"".join(encode_frame_parts("call", {"n": 3}, parts)))
decoded = frame_arrays(frame)
assert [d.to_wire()["dtype"] for d in frame.buffers] == ["float32", "bool", "int64"]
for got, want in zip(decoded, arrays, strict=True):
    assert got.dtype == want.dtype.newbyteorder("=") and got.shape == want.shape
    assert np.array_equal(got, want)
print("wire round trip ok")
"""


def test_contracts_wheel_alone_runs_every_conformance_fixture(
    contracts_dist: dict[str, Path], tmp_path: Path
) -> None:
    python = fresh_venv(tmp_path / "venv")
    pip_install(python, "--no-index", str(contracts_dist["wheel"]), cwd=tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (work / "check.py").write_text(CONFORMANCE_SCRIPT, encoding="utf-8")
    env = clean_env(tmp_path / "home")

    result = run([str(python), "-I", "check.py"], cwd=work, env=env, timeout=120)
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])

    (site,) = (tmp_path / "venv" / "lib").glob("python3*/site-packages")
    assert Path(report["package"]).is_relative_to(site)
    assert "omni_stage_contracts.conformance" in report["imported"]
    expected = load_fixtures()
    assert report["fixtures"] == len(expected) > 100
    assert report["names"] == sorted(f["name"] for f in expected)
    assert report["failures"] == []
    assert report["mutated_fixture_error"] is not None
    assert report["outside_stdlib"] == []
    # NumPy is not installed: the wire helpers say which extra brings it.
    assert report["wire_error"]["name"] == "numpy"
    assert "omni-stage-contracts[wire]" in report["wire_error"]["message"]
    # The shipped fixtures are exactly what their generator builds.
    run(
        [str(python), "-I", "-m", "omni_stage_contracts.conformance.build_v1", "--check"],
        cwd=work,
        env=env,
        timeout=120,
    )
    assert sorted(path.name for path in work.iterdir()) == ["check.py"]


def test_contracts_wire_extra_installs_numpy_and_round_trips_arrays(
    contracts_dist: dict[str, Path], wheelhouse: Path, tmp_path: Path
) -> None:
    python = fresh_venv(tmp_path / "venv")
    requirement = f"omni-stage-contracts[wire] @ {contracts_dist['wheel'].as_uri()}"
    pip_install(python, "--no-index", "--find-links", str(wheelhouse), requirement, cwd=tmp_path)
    (tmp_path / "wire_check.py").write_text(WIRE_SCRIPT, encoding="utf-8")

    result = run(
        [str(python), "-I", "wire_check.py"],
        cwd=tmp_path,
        env=clean_env(tmp_path / "home"),
        timeout=120,
    )

    assert result.stdout.strip() == "wire round trip ok"


def test_contracts_source_archive_carries_the_conformance_fixtures(
    contracts_dist: dict[str, Path],
) -> None:
    prefix = f"omni_stage_contracts-{__version__}"
    with tarfile.open(contracts_dist["sdist"]) as archive:
        names = set(archive.getnames())
        member = archive.extractfile(f"{prefix}/src/omni_stage_contracts/conformance/v1.json")
        assert member is not None
        assert member.read() == FIXTURES_JSON.read_bytes()
        pkg_info = archive.extractfile(f"{prefix}/PKG-INFO")
        assert pkg_info is not None
        metadata = Parser().parsestr(pkg_info.read().decode("utf-8"))
    for module in (REPO / "runtime" / "contracts").glob("*.py"):
        assert f"{prefix}/src/omni_stage_contracts/{module.name}" in names
    assert f"{prefix}/src/omni_stage_contracts/wire.py" in names
    assert f"{prefix}/README.md" in names
    assert metadata["Name"] == "omni-stage-contracts"
    assert metadata["Version"] == __version__
    assert metadata.get_all("Provides-Extra") == ["wire"]
    assert metadata.get_all("Requires-Dist") == ['numpy>=1.26; extra == "wire"']


def test_contracts_wheel_holds_only_the_contracts_package(contracts_dist: dict[str, Path]) -> None:
    names = zipfile.ZipFile(contracts_dist["wheel"]).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"omni_stage_contracts", f"omni_stage_contracts-{__version__}.dist-info"}
    assert "omni_stage_contracts/conformance/v1.json" in names
    assert "omni_stage_contracts/py.typed" in names
