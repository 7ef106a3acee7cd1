"""The checks the voice activity and turn-taking settings share: a speech probability
threshold, its release threshold, and durations in seconds."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

__all__ = ["PROBABILITIES", "RELEASE_GAP", "check_settings", "read_options", "release_threshold"]

#: The options that are speech probabilities.
PROBABILITIES: Final = ("threshold", "neg_threshold")
#: The release threshold sits this far under the threshold unless given (Silero's own rule).
RELEASE_GAP: Final = 0.15


class _Thresholds(Protocol):
    @property
    def threshold(self) -> float: ...
    @property
    def neg_threshold(self) -> float | None: ...


def _is_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def release_threshold(threshold: float, neg_threshold: float | None) -> float:
    """The probability under which a chunk counts as silence."""
    if neg_threshold is not None:
        return neg_threshold
    return max(0.01, threshold - RELEASE_GAP)


def check_settings(settings: _Thresholds, durations: Sequence[str], max_duration_s: float) -> None:
    """Raise ValueError naming the first field of ``settings`` out of range: ``threshold`` and
    ``neg_threshold`` (None allowed) probabilities, the release at most the threshold,
    ``durations`` seconds from 0 to ``max_duration_s``."""
    for name in PROBABILITIES:
        value = getattr(settings, name)
        if value is None and name == "neg_threshold":
            continue
        if not _is_number(value) or not 0.0 < value < 1.0:
            raise ValueError(f"{name} must be a probability between 0 and 1; got {value!r}")
    for name in durations:
        value = getattr(settings, name)
        if not _is_number(value) or not 0.0 <= value <= max_duration_s:
            raise ValueError(f"{name} must be seconds from 0 to {max_duration_s:g}; got {value!r}")
    threshold, negative = settings.threshold, settings.neg_threshold
    if negative is not None and negative > threshold:
        raise ValueError(f"neg_threshold ({negative}) must be at most threshold ({threshold})")


def read_options(
    options: Mapping[str, Any],
    durations: Sequence[str],
    max_duration_s: float,
    fail: Callable[[str, str], Exception],
) -> dict[str, float]:
    """The probabilities and ``durations`` present in ``options``, as floats; a value out of
    range raises ``fail(name, message)`` with what is accepted. Other keys are left alone."""
    values: dict[str, float] = {}
    for name in PROBABILITIES:
        if name in options:
            value = options[name]
            if not _is_number(value) or not 0.0 < float(value) < 1.0:
                raise fail(
                    name,
                    f"{value!r} is not a speech probability; accepted: a number between 0 "
                    "and 1 (exclusive), e.g. 0.5",
                )
            values[name] = float(value)
    for name in durations:
        if name in options:
            value = options[name]
            if not _is_number(value) or not 0.0 <= float(value) <= max_duration_s:
                raise fail(
                    name,
                    f"{value!r} is not a duration; accepted: seconds from 0 to {max_duration_s:g}",
                )
            values[name] = float(value)
    return values
