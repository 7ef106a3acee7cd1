"""A graph worker whose load never ends, as a language model's worker that takes minutes: it
says ``hello``, reads its ``load`` and then only waits for the controller to close its stdin
(or to end it). The studio's tests cancel such a load."""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run by path: the project root (holding `runtime` and `workers`) replaces this folder.
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from runtime.contracts.messages import CONTROLLER_TO_WORKER, LoadMessage
from runtime.transport.channel import ChannelClosed, FramedChannel
from runtime.transport.handshake import send_hello
from runtime.transport.stdio import claim_worker_stdio


def main() -> int:
    generation = int(os.environ["OMNI_EDGE_WORKER_GENERATION"])
    frames_in, frames_out = claim_worker_stdio()
    channel = FramedChannel(frames_in, frames_out, name="slow-load", same_domain=True)
    send_hello(channel, worker="slow-load", generation=generation)
    try:
        load, _ = channel.read_message(CONTROLLER_TO_WORKER)
        assert isinstance(load, LoadMessage)
        while True:  # "loading" until the controller gives up on it
            channel.read_message(CONTROLLER_TO_WORKER)
    except ChannelClosed:
        return 0
    finally:
        channel.close()


if __name__ == "__main__":
    sys.exit(main())
