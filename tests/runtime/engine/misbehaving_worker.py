"""A graph worker that misbehaves in one chosen way, for the engine's error-path tests.

``MISBEHAVE`` selects how:

* ``garbage-hello``: writes bytes that are no frame in place of its ``hello``.
* ``garbage-result``: says ``hello``, loads the bundle with the ORT worker's own code and
  answers ``ready``; then answers its first ``call`` with bytes that are no frame.
* ``wrong-epoch``: like ``garbage-result``, but answers with a well-formed ``result`` whose
  epoch is not the call's.
* ``stubborn``: like ``garbage-result``, but on its first ``call`` ignores SIGTERM and stops
  reading, as a worker stuck inside one long node would.

Unless stuck, it then waits for the controller to close its stdin and exits.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import BinaryIO

import numpy as np

if __package__ in (None, ""):
    # Run by path: the project root (holding `runtime` and `workers`) replaces this folder.
    sys.path[0] = str(Path(__file__).resolve().parents[3])

from runtime.contracts.messages import (
    CONTROLLER_TO_WORKER,
    CallMessage,
    LoadMessage,
    ReadyMessage,
    ResultMessage,
)
from runtime.transport.channel import FramedChannel
from runtime.transport.handshake import send_hello
from runtime.transport.stdio import claim_worker_stdio
from workers.ort_worker import GraphWorker

MODES = ("garbage-hello", "garbage-result", "wrong-epoch", "stubborn")
#: 24 bytes: more than a frame prefix, and not starting with the frame magic.
GARBAGE = b"NOT A FRAME, JUST NOISE\n"


def _until_first_call(
    frames_in: BinaryIO, frames_out: BinaryIO, generation: int
) -> tuple[FramedChannel, ReadyMessage, CallMessage]:
    """Speak the protocol correctly: hello, a real load, ready, then read the first call."""
    channel = FramedChannel(frames_in, frames_out, name="misbehaving", same_domain=True)
    send_hello(channel, worker="misbehaving", generation=generation)
    load, _ = channel.read_message(CONTROLLER_TO_WORKER)
    assert isinstance(load, LoadMessage)
    if load.shm_prefix is not None:
        channel.enable_shm(load.shm_prefix)
    ready = GraphWorker(channel, generation).load(load)
    channel.send_message(ready)
    call, _ = channel.read_message(CONTROLLER_TO_WORKER)
    assert isinstance(call, CallMessage)
    return channel, ready, call


def main() -> int:
    mode = os.environ.get("MISBEHAVE", "")
    if mode not in MODES:
        print(
            f"misbehaving worker: MISBEHAVE={mode!r}; accepted: {', '.join(MODES)}", file=sys.stderr
        )
        return 2
    generation = int(os.environ["OMNI_EDGE_WORKER_GENERATION"])
    frames_in, frames_out = claim_worker_stdio()
    if mode != "garbage-hello":
        channel, ready, call = _until_first_call(frames_in, frames_out, generation)
        if mode == "wrong-epoch":
            names = tuple(spec.name for spec in ready.outputs)
            arrays = {
                spec.name: np.zeros([int(str(dim)) for dim in spec.shape], spec.dtype.value)
                for spec in ready.outputs
            }
            result = ResultMessage(call.call_id, call.request_id, call.epoch + 1, names, 0.0)
            channel.send_message(result, arrays)
        if mode == "stubborn":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            while True:
                time.sleep(1.0)
    if mode in ("garbage-hello", "garbage-result"):
        frames_out.write(GARBAGE)
        frames_out.flush()
    while frames_in.read(65536):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
