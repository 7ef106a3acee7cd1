"""A handoff transform the fault matrix can catch in the act.

``slow_handoff`` is the MLP demo's own handoff, made to take ``HANDOFF_S`` and to say
when it starts, so a test can cancel the request while the handoff runs.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from runtime.adapters.tensor import mlp_handoff

if TYPE_CHECKING:
    from collections.abc import Mapping

    import numpy as np

#: Set when a handoff starts; the test clears it before each request.
HANDOFF_STARTED = threading.Event()
HANDOFF_S = 0.3


def slow_handoff(outputs: Mapping[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """:func:`runtime.adapters.tensor.mlp_handoff`, after announcing itself and waiting."""
    HANDOFF_STARTED.set()
    time.sleep(HANDOFF_S)
    return mlp_handoff(outputs)
