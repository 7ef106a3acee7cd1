"""packaging/icu_data.py: Qt's ICU data library trimmed to what Qt reads, and re-linked.

The trimmed library is built from the installed PySide6's ``libicudata.so.73`` and loaded in
place of it (``LD_LIBRARY_PATH`` comes before the ``$ORIGIN`` run path of Qt's libraries) by
a child process that runs the self-test's checks of Qt's ICU-backed functions.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.distributions import REPO

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF libraries")


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("icu_data", REPO / "packaging" / "icu_data.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


icu = _load()


@pytest.fixture(scope="module")
def qt_lib() -> Path:
    import PySide6

    return Path(PySide6.__file__).parent / "Qt" / "lib"


@pytest.fixture(scope="module")
def trimmed(qt_lib: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The trimmed library (in a folder of its own) and the items it kept."""
    library, keep, drop = icu.trim_icu_data(
        qt_lib / "libicudata.so.73", tmp_path_factory.mktemp("icu")
    )
    assert drop
    return library, keep


def _icu_imports(library: Path) -> set[str]:
    """The ICU functions ``library`` imports, without ICU's version suffix."""
    table = subprocess.run(
        ["objdump", "-T", str(library)], capture_output=True, text=True, check=True
    ).stdout
    names = {line.split()[-1] for line in table.splitlines() if "*UND*" in line}
    return {name.rsplit("_", 1)[0] for name in names if name.endswith("_73")}


def test_the_kept_data_follows_the_icu_functions_qt_imports(qt_lib: Path) -> None:
    assert _icu_imports(qt_lib / "libQt6Core.so.6") == icu.QT_ICU_IMPORTS
    for other in ("Gui", "Widgets", "OpenGL", "DBus", "XcbQpa", "WaylandClient"):
        assert _icu_imports(qt_lib / f"libQt6{other}.so.6") == set(), other


def test_items_are_kept_for_the_root_and_english_locales_and_the_services_qt_uses() -> None:
    for item in (
        "root.res",
        "en.res",
        "en_GB.res",
        "pool.res",
        "coll/root.res",
        "coll/ucadata.icu",
        "coll/en.res",
        "zone/root.res",
        "zone/en_001.res",
        "zone/pool.res",
        "zoneinfo64.res",
        "metaZones.res",
        "supplementalData.res",
        "likelySubtags.res",
        "cnvalias.icu",
        "ibm-5348_P100-1997.cnv",
        "gb18030.cnv",
    ):
        assert icu.kept(item), item
    for item in (
        "de.res",
        "coll/sv.res",
        "zone/fr.res",
        "enx.res",  # a language whose code only starts like "en"
        "brkitr/word.brk",
        "brkitr/burmesedict.dict",
        "translit/root.res",
        "curr/en.res",
        "lang/en.res",
        "region/en.res",
        "unit/en.res",
        "rbnf/en.res",
        "unames.icu",
        "uts46.nrm",
        "nfkc.nrm",
        "ibm-37_P100-1995.cnv",
        "euc-tw-2014.cnv",
    ):
        assert not icu.kept(item), item


def test_the_trimmed_library_exports_the_kept_items_under_the_same_symbol(
    qt_lib: Path, trimmed: tuple[Path, list[str]]
) -> None:
    library, keep = trimmed
    symbol, package = icu.read_data_symbol(library)
    assert symbol == "icudt73_dat"
    assert library.stat().st_size < 5 * 10**6 < (qt_lib / "libicudata.so.73").stat().st_size
    assert not [p for p in library.parent.iterdir() if p != library]  # no leftovers

    copy = library.parent / "check" / "icudt73l.dat"
    copy.parent.mkdir()
    copy.write_bytes(package)
    items = icu.package_items(copy)
    assert sorted(items) == sorted(keep)
    # Every converter and top-level item named is in ICU's package: none is a stale name.
    for name in icu.CONVERTERS:
        assert f"{name}.cnv" in items, name
    for name in icu.TOP_LEVEL:
        assert name in items, name
    soname = subprocess.run(
        ["objdump", "-p", str(library)], capture_output=True, text=True, check=True
    ).stdout
    assert "SONAME               libicudata.so.73" in soname


def test_qt_collates_maps_case_names_zones_and_decodes_charsets_on_the_trimmed_data(
    trimmed: tuple[Path, list[str]],
) -> None:
    library, _keep = trimmed
    script = (
        "import json\n"
        "from app.selftest import qt_icu_checks\n"
        "report = qt_icu_checks()\n"
        "with open('/proc/self/maps', encoding='utf-8') as maps:\n"
        "    report['icu_data'] = sorted({l.split()[-1] for l in maps if 'libicudata' in l})\n"
        "print(json.dumps(report))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env={**os.environ, "LD_LIBRARY_PATH": str(library.parent), "QT_QPA_PLATFORM": "offscreen"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["icu_data"] == [str(library)]
    assert len(report["checks"]) >= 14
    assert report["ok"] is True, report["checks"]


def test_a_kept_item_needing_a_removed_one_is_refused_by_name(
    qt_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_kept = icu.kept
    monkeypatch.setattr(icu, "kept", lambda item: real_kept(item) or item == "coll/zh_Hant.res")

    with pytest.raises(icu.IcuDataError, match=r"coll/zh_Hant\.res depends on missing item"):
        icu.trim_icu_data(qt_lib / "libicudata.so.73", tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


def test_a_library_without_icu_data_and_a_file_that_is_not_elf_are_named(
    qt_lib: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(icu.IcuDataError, match=r"libicuuc\.so\.73: exports no ICU data symbol"):
        icu.read_data_symbol(qt_lib / "libicuuc.so.73")
    text = tmp_path / "libicudata.so.73"
    text.write_text("not a library", encoding="utf-8")
    assert icu.main([str(text), str(tmp_path / "out")]) == 1
    assert "not a 64-bit little-endian ELF shared library" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_missing_tool_is_named_with_its_debian_package(
    qt_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(icu.shutil, "which", lambda name: None)

    with pytest.raises(icu.IcuDataError, match=r"icupkg is missing.*apt-get install icu-devtools"):
        icu.trim_icu_data(qt_lib / "libicudata.so.73", tmp_path / "out")
    with pytest.raises(icu.IcuDataError, match=r"as is missing.*apt-get install binutils"):
        icu.link_data_library(tmp_path / "icudt73l.dat", "icudt73_dat", tmp_path / "lib.so")
