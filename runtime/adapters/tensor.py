"""Stage transforms for the tensor demo pipelines (``assets/pipelines``).

A transform turns the previous stage's outputs into the next graph stage's inputs, as
``{"tensors": {name: array}}``. It copies what it hands over, so the next stage owns its
inputs even after the previous stage's result buffers are released.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["mlp_handoff"]


def mlp_handoff(outputs: Mapping[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """``mlp-stage0`` -> ``mlp-stage1``: the hidden activations ``h`` become stage 1's input."""
    if "h" not in outputs:
        raise ValueError(
            f"mlp_handoff needs stage 0's output 'h'; got {sorted(outputs)}; accepted: the "
            "outputs of the mlp-stage0 bundle"
        )
    return {"tensors": {"h": np.array(outputs["h"], copy=True, order="C")}}
