"""Stage transforms referenced by test pipelines as ``helpers.transforms:<name>``."""

from __future__ import annotations

from typing import Any


def passthrough(outputs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Hand the previous stage's outputs on unchanged, as the next stage's tensors."""
    return {"tensors": dict(outputs)}
