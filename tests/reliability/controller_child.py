"""A controller process for the fault matrix: it starts a pipeline, starts an endless call,
reports its worker, then waits to be killed.

Usage: ``python controller_child.py PIPELINE INPUTS_NPZ``. Prints one JSON line
``{"worker_pid": ..., "controller_pid": ...}`` once the worker is computing.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    # Run by path: the project root (holding `runtime` and `tests`) replaces this folder.
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import numpy as np

from runtime.api import Omni
from runtime.devices import DeviceSelection, discover_topology
from tests.helpers.engine import engine_of
from tests.runtime.engine.support import ENDLESS_STEPS, wait_busy


def main() -> int:
    pipeline, inputs = sys.argv[1:3]
    with np.load(inputs, allow_pickle=False) as archive:
        x = archive["x"]
    omni = Omni(pipeline, topology=discover_topology(), selection=DeviceSelection())
    (client,) = engine_of(omni).clients
    assert client.pid is not None
    engine_of(omni).submit({"x": x, "n": np.array(ENDLESS_STEPS, np.int64)})
    wait_busy(client.pid)
    print(json.dumps({"worker_pid": client.pid, "controller_pid": os.getpid()}), flush=True)
    while True:
        time.sleep(1.0)


if __name__ == "__main__":
    sys.exit(main())
