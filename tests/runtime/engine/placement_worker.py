"""The real ORT graph worker with one named seam: the placement it reports.

A machine with only the CPU provider cannot produce a split across providers, so this
script runs ``workers.ort_worker`` unchanged except that, after measuring the real
placement, it reports one of the nodes as running on ``PLACEMENT_MOVE_TO``. Everything
else (verification, session, warm-up, calls) is the real worker.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

if __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parents[3])

import workers.ort_session as ort_session
import workers.ort_worker as ort_worker
from workers.ort_session import CPU_PROVIDER, PlacementCounts, placement_of

if TYPE_CHECKING:
    from onnxruntime import InferenceSession

MOVE_TO = os.environ["PLACEMENT_MOVE_TO"]


def reported_placement(source: InferenceSession | str | Path) -> PlacementCounts:
    """The measured split, with one CPU node reported on ``PLACEMENT_MOVE_TO`` instead."""
    measured = placement_of(source)
    counts = dict(measured.counts)
    counts[CPU_PROVIDER] -= 1
    counts[MOVE_TO] = counts.get(MOVE_TO, 0) + 1
    return PlacementCounts(MappingProxyType(counts), measured.total, measured.method)


ort_session.placement_of = reported_placement

if __name__ == "__main__":
    sys.exit(ort_worker.main())
