"""A smaller ICU data library for the frozen application: the data of what Qt calls ICU for.

    python packaging/icu_data.py LIBICUDATA OUTDIR

Qt's wheels carry ICU 73 with all of its data in ``libicudata.so.73`` (32 MB: one data
package exported as the symbol ``icudt73_dat``). This script copies that package without the
items Qt never reads, and links what is left into ``OUTDIR/libicudata.so.73`` exporting the
same symbol, for the spec to ship in place of the original. QtCore 6.11 imports these ICU
functions, and nothing else from ICU (:data:`QT_ICU_IMPORTS`; the tests compare the list with
QtCore's dynamic symbols):

* ``ucol_*`` (QCollator): the root collation (``coll/ucadata.icu``, ``coll/root.res``) and the
  tailorings of :data:`LOCALES`; other locales sort by the root collation;
* ``ucal_open``, ``ucal_getTimeZoneDisplayName``, ``ucal_getCanonicalTimeZoneID`` (QTimeZone
  names and ids): the time-zone database, the zone names and calendar data of
  :data:`LOCALES`, and what ICU reads to format a "GMT+01:00" name (supplemental, likely
  subtags and numbering-system data);
* ``ucnv_*`` (QStringConverter for encodings other than UTF-8/16/32 and Latin-1, such as an
  HTML page's ``<meta charset>``): the alias table and the converter tables of the legacy
  encodings of the WHATWG Encoding Standard (:data:`CONVERTERS`); ICU's algorithmic
  converters (UTF-7, ISO-2022-*, SCSU, ...) have no table;
* ``u_strToUpper``, ``u_strToLower`` (QLocale's case mapping): no data item (ICU's case
  properties are compiled into libicuuc).

Everything else goes: break-iterator rules and dictionaries, transliterators, number,
currency and unit formatting, locale display names, IDNA and the other normalizations,
character names, and the locale data of the other languages. Needs ``icupkg`` (Debian:
icu-devtools) and binutils (``as``, ``ld``).
"""

from __future__ import annotations

import argparse
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

#: The ICU functions QtCore imports (without ICU's ``_73`` version suffix).
QT_ICU_IMPORTS: Final = frozenset(
    {
        "UCNV_FROM_U_CALLBACK_SUBSTITUTE",
        "UCNV_TO_U_CALLBACK_SUBSTITUTE",
        "u_strToLower",
        "u_strToUpper",
        "ucal_close",
        "ucal_getCanonicalTimeZoneID",
        "ucal_getTimeZoneDisplayName",
        "ucal_open",
        "ucnv_cbFromUWriteUChars",
        "ucnv_cbToUWriteUChars",
        "ucnv_close",
        "ucnv_countAvailable",
        "ucnv_fromUCountPending",
        "ucnv_fromUnicode",
        "ucnv_getAvailableName",
        "ucnv_getFromUCallBack",
        "ucnv_getMaxCharSize",
        "ucnv_getName",
        "ucnv_getStandardName",
        "ucnv_getToUCallBack",
        "ucnv_open",
        "ucnv_reset",
        "ucnv_setFromUCallBack",
        "ucnv_setToUCallBack",
        "ucnv_toUCountPending",
        "ucnv_toUnicode",
        "ucol_close",
        "ucol_getSortKey",
        "ucol_open",
        "ucol_setAttribute",
        "ucol_strcoll",
    }
)

#: Languages whose locale data is kept in the main, collation and zone trees (with all their
#: regional variants, such as en_GB); the root locale is always kept.
LOCALES: Final = ("en",)

#: Items of the package's top level kept besides the main tree's locales and the converters.
TOP_LEVEL: Final = frozenset(
    {
        # Converter names and aliases (ucnv_open, ucnv_getStandardName, ucnv_countAvailable).
        "cnvalias.icu",
        # The time-zone database, zone ids and metazones (ucal_*).
        "zoneinfo64.res",
        "timezoneTypes.res",
        "metaZones.res",
        "windowsZones.res",
        # Calendar and week data, locale ids and their fallback (every locale lookup).
        "supplementalData.res",
        "likelySubtags.res",
        "metadata.res",
        "keyTypeData.res",
        # The digits of a "GMT+01:00" zone name.
        "numberingSystems.res",
        # The data version (u_getDataVersion, the tz version).
        "icuver.res",
        "icustd.res",
        # Resource keys shared by the main tree's locales, and the list of locales.
        "pool.res",
        "res_index.res",
    }
)

#: Converter tables kept: the legacy encodings of the WHATWG Encoding Standard that ICU 73
#: maps to a table (its label -> ICU's converter), and the base tables those extend.
CONVERTERS: Final = frozenset(
    {
        "ibm-866_P100-1995",  # IBM866
        "ibm-912_P100-1995",  # ISO-8859-2
        "ibm-913_P100-2000",  # ISO-8859-3
        "ibm-914_P100-1995",  # ISO-8859-4
        "ibm-915_P100-1995",  # ISO-8859-5
        "ibm-1089_P100-1995",  # ISO-8859-6
        "ibm-9005_X110-2007",  # ISO-8859-7
        "ibm-5012_P100-1999",  # ISO-8859-8, ISO-8859-8-I
        "iso-8859_10-1998",  # ISO-8859-10
        "ibm-921_P100-1995",  # ISO-8859-13
        "iso-8859_14-1998",  # ISO-8859-14
        "ibm-923_P100-1998",  # ISO-8859-15
        "ibm-878_P100-1996",  # KOI8-R
        "ibm-1168_P100-2002",  # KOI8-U
        "macos-0_2-10.2",  # macintosh
        "macos-7_3-10.2",  # x-mac-cyrillic
        "windows-874-2000",  # windows-874
        "ibm-5346_P100-1998",  # windows-1250
        "ibm-5347_P100-1998",  # windows-1251
        "ibm-5348_P100-1997",  # windows-1252
        "ibm-5349_P100-1998",  # windows-1253
        "ibm-5350_P100-1998",  # windows-1254
        "ibm-9447_P100-2002",  # windows-1255
        "ibm-9448_X100-2005",  # windows-1256
        "ibm-9449_P100-2002",  # windows-1257
        "ibm-5354_P100-1998",  # windows-1258
        "windows-936-2000",  # GBK
        "ibm-1386_P100-2001",  # (base of windows-936-2000)
        "gb18030",  # gb18030
        "windows-950-2000",  # Big5
        "ibm-1373_P100-2002",  # (base of windows-950-2000)
        "euc-jp-2007",  # EUC-JP
        "ibm-943_P15A-2003",  # Shift_JIS
        "ibm-970_P110_P110-2006_U2",  # EUC-KR
        "windows-949-2000",  # windows-949 (what the web decodes as EUC-KR)
        "ibm-1363_P11B-1998",  # (base of windows-949-2000)
        "ibm-33722_P12A_P12A-2009_U2",  # JIS X 0208 of ISO-2022-JP
        "jisx-212",  # JIS X 0212 of ISO-2022-JP
    }
)

#: Extra items of the collation and zone trees (besides their locales).
TREE_EXTRAS: Final = {
    "": frozenset(),
    "coll": frozenset({"ucadata.icu", "res_index.res"}),
    "zone": frozenset({"pool.res", "res_index.res", "tzdbNames.res"}),
}

_DATA_SYMBOL: Final = re.compile(r"icudt(\d+)_dat")
_SHT_DYNSYM: Final = 11


class IcuDataError(Exception):
    """The ICU data library cannot be read or rebuilt; the message names the file or tool."""


def _is_locale(name: str) -> bool:
    """``name`` (a ``.res`` file name) is the root locale or one of :data:`LOCALES`."""
    stem = name.removesuffix(".res")
    return name.endswith(".res") and (
        stem == "root" or any(stem == lang or stem.startswith(lang + "_") for lang in LOCALES)
    )


def kept(item: str) -> bool:
    """Whether the data item ``item`` (as ``icupkg -l`` names it, e.g. ``coll/en.res``) stays."""
    tree, _, name = item.rpartition("/")
    if tree not in TREE_EXTRAS:
        return False
    if name in TREE_EXTRAS[tree] or _is_locale(name):
        return True
    if tree:
        return False
    if name.endswith(".cnv"):
        return name.removesuffix(".cnv") in CONVERTERS
    return name in TOP_LEVEL


def read_data_symbol(library: Path) -> tuple[str, bytes]:
    """The name (``icudt73_dat``) and bytes of the data package an ICU data library exports,
    read from its ELF dynamic symbol table."""
    data = library.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise IcuDataError(f"{library}: not a 64-bit little-endian ELF shared library")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if kind != _SHT_DYNSYM:
            continue
        strings = sections[link][4]
        for start in range(offset, offset + size, entsize):
            name_at, _sym_info, _other, index, value, length = struct.unpack_from(
                "<IBBHQQ", data, start
            )
            end = data.index(b"\0", strings + name_at)
            symbol = data[strings + name_at : end].decode("ascii", "replace")
            if not _DATA_SYMBOL.fullmatch(symbol) or not 0 < index < len(sections):
                continue
            section_addr, section_offset = sections[index][3], sections[index][4]
            begin = value - section_addr + section_offset
            return symbol, data[begin : begin + length]
    raise IcuDataError(f"{library}: exports no ICU data symbol (icudtNN_dat)")


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise IcuDataError(
            f"{name} is missing; install it (Debian/Ubuntu: apt-get install {package})"
        )
    return path


def _run(argv: list[str]) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise IcuDataError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
    return result.stdout


def package_items(package: Path) -> list[str]:
    """The items of an ICU data package (``icupkg -l``)."""
    return _run([_tool("icupkg", "icu-devtools"), "-l", str(package)]).split()


def filter_package(package: Path, out: Path) -> tuple[list[str], list[str]]:
    """Write ``package`` without the items :func:`kept` refuses to ``out``; return (kept,
    removed) item names."""
    items = package_items(package)
    keep = [item for item in items if kept(item)]
    drop = [item for item in items if not kept(item)]
    with tempfile.TemporaryDirectory(prefix="icu-data-") as scratch:
        removal = Path(scratch) / "removed.txt"
        removal.write_text("".join(f"{item}\n" for item in drop), encoding="ascii")
        # icupkg refuses (and names the item) when a kept item needs a removed one.
        _run([_tool("icupkg", "icu-devtools"), "-r", str(removal), str(package), str(out)])
    return keep, drop


def _assembly(symbol: str, package: Path) -> str:
    quoted = str(package.resolve()).replace("\\", "\\\\").replace('"', '\\"')
    return (
        '\t.section .note.GNU-stack,"",@progbits\n'
        "\t.section .rodata\n"
        f"\t.globl {symbol}\n"
        f"\t.type {symbol}, @object\n"
        "\t.balign 16\n"
        f"{symbol}:\n"
        f'\t.incbin "{quoted}"\n'
        f"\t.size {symbol}, . - {symbol}\n"
    )


def link_data_library(package: Path, symbol: str, out: Path) -> None:
    """Link ``package`` into the shared library ``out`` (soname: its file name) exporting the
    read-only ``symbol``, as ICU's own data library does."""
    with tempfile.TemporaryDirectory(prefix="icu-data-") as scratch:
        source = Path(scratch) / "data.s"
        obj = Path(scratch) / "data.o"
        source.write_text(_assembly(symbol, package), encoding="utf-8")
        _run([_tool("as", "binutils"), "--64", "-o", str(obj), str(source)])
        _run(
            [
                _tool("ld", "binutils"),
                "-shared",
                "-soname",
                out.name,
                "-z",
                "noexecstack",
                "--hash-style=both",
                "-o",
                str(out),
                str(obj),
            ]
        )


def trim_icu_data(library: Path, outdir: Path) -> tuple[Path, list[str], list[str]]:
    """``outdir/<library's name>``: ``library`` with only the kept data items. Returns the new
    library and the (kept, removed) item names."""
    symbol, blob = read_data_symbol(library)
    outdir.mkdir(parents=True, exist_ok=True)
    # icupkg names a package's items after its file name, which ICU looks them up by
    # (icudt73l/coll/root.res: the package name with its endianness), so both copies keep it.
    name = symbol.removesuffix("_dat") + "l.dat"
    with tempfile.TemporaryDirectory(prefix="icu-data-", dir=outdir) as scratch:
        full = Path(scratch) / "full" / name
        small = Path(scratch) / "trimmed" / name
        full.parent.mkdir()
        small.parent.mkdir()
        full.write_bytes(blob)
        keep, drop = filter_package(full, small)
        out = outdir / library.name
        link_data_library(small, symbol, out)
    return out, keep, drop


def _summary(library: Path, out: Path, kept: int, removed: int) -> str:
    return (
        f"{out}: {out.stat().st_size / 1e6:.1f} MB, {kept} ICU data items kept, {removed} "
        f"removed (from {library}, {library.stat().st_size / 1e6:.1f} MB)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("library", type=Path, help="ICU's data library (libicudata.so.NN)")
    parser.add_argument("outdir", type=Path, help="where the smaller library is written")
    args = parser.parse_args(argv)
    try:
        out, keep, drop = trim_icu_data(args.library, args.outdir)
    except (IcuDataError, OSError) as exc:
        print(f"icu_data: {exc}", file=sys.stderr)
        return 1
    print(_summary(args.library, out, len(keep), len(drop)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
