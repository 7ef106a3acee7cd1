"""Byte sizes written in a pipeline: an integer, or a number with a unit (``512MiB``)."""

from __future__ import annotations

import re
from fractions import Fraction
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

MAX_SIZE = 2**63 - 1

SIZE_UNITS: Mapping[str, int] = MappingProxyType(
    {
        "B": 1,
        "kB": 10**3,
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
        "TB": 10**12,
        "KiB": 2**10,
        "MiB": 2**20,
        "GiB": 2**30,
        "TiB": 2**40,
    }
)
SIZE_FORMS = (
    "a non-negative integer number of bytes, or a string with a unit such as "
    "'512MiB', '2GiB', '1.5GB' or '100 MB' (units: " + ", ".join(SIZE_UNITS) + ")"
)

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]+)?\s*$")


def parse_size(value: object) -> int:
    """A byte count from an int or a string with a unit ('512MiB', '1.5GB', '100 MB').

    Raises ``ValueError`` for bools, negatives, fractional bytes and anything else.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is a boolean; expected {SIZE_FORMS}")
    if isinstance(value, int):
        amount = Fraction(value)
    elif isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{value!r} is not a number of bytes; expected {SIZE_FORMS}")
        amount = Fraction(value)
    elif isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match is None:
            raise ValueError(f"{value!r} is not a size; expected {SIZE_FORMS}")
        number, unit = match.groups()
        if unit is not None and unit not in SIZE_UNITS:
            raise ValueError(f"{value!r} has an unknown unit {unit!r}; expected {SIZE_FORMS}")
        amount = Fraction(number) * SIZE_UNITS[unit or "B"]
    else:
        raise ValueError(f"{value!r} is not a size; expected {SIZE_FORMS}")
    if amount < 0:
        raise ValueError(f"{value!r} is negative; expected {SIZE_FORMS}")
    if amount.denominator != 1:
        raise ValueError(f"{value!r} is not a whole number of bytes; expected {SIZE_FORMS}")
    if amount > MAX_SIZE:
        raise ValueError(f"{value!r} is larger than {MAX_SIZE} bytes; expected {SIZE_FORMS}")
    return int(amount)
