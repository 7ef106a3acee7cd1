"""Paths of the bundled topologies and loaders for the recorded device samples."""

from __future__ import annotations

import json
from pathlib import Path

from runtime.devices import EpDeviceRecord

REPO = Path(__file__).resolve().parents[3]
TOPOLOGIES = REPO / "assets" / "topologies"
SAMPLES = Path(__file__).resolve().parent / "samples"

BUNDLED = (
    "cpu-only",
    "cpu-igpu",
    "cpu-npu",
    "cpu-igpu-npu",
    "cpu-igpu-npu-dgpu",
    "cpu-dgpu",
    "hx370-rtx5090-laptop",
)
BUNDLED_FILES = tuple(
    TOPOLOGIES / f"{stem}{variant}.yaml" for stem in BUNDLED for variant in ("", "-wsl")
)
LAPTOP = TOPOLOGIES / "hx370-rtx5090-laptop.yaml"
LAPTOP_WSL = TOPOLOGIES / "hx370-rtx5090-laptop-wsl.yaml"


def ep_records(name: str) -> tuple[EpDeviceRecord, ...]:
    document = json.loads((SAMPLES / name).read_text(encoding="utf-8"))
    return tuple(EpDeviceRecord(**record) for record in document["ep_devices"])
