"""The tensor demo's stage transform."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.adapters.tensor import mlp_handoff


def test_mlp_handoff_copies_h_for_the_next_stage() -> None:
    h = np.arange(512, dtype=np.float32).reshape(1, 512)
    handed = mlp_handoff({"h": h})
    assert list(handed) == ["tensors"]
    assert list(handed["tensors"]) == ["h"]
    copy = handed["tensors"]["h"]
    np.testing.assert_array_equal(copy, h)
    assert copy.dtype == np.float32
    assert not np.shares_memory(copy, h)
    h[0, 0] = -1.0
    assert copy[0, 0] == 0.0, "the next stage owns its input"


def test_mlp_handoff_names_what_is_missing() -> None:
    with pytest.raises(ValueError, match=r"needs stage 0's output 'h'; got \['y'\]"):
        mlp_handoff({"y": np.zeros(1, np.float32)})
