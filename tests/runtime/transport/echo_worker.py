"""A real worker process for the transport tests: answers each call with its own inputs.

It speaks the worker protocol on its stdin/stdout through ``FramedChannel``: hello,
then ``call`` -> ``ack`` (for shared inputs) + ``result``, ``ack`` -> release,
``cancel`` -> non-fatal ``error``, ``shutdown`` -> ``bye``. Logs go to stderr.

Usage: echo_worker.py GENERATION [SHM_PREFIX] [SHM_THRESHOLD]
"""

from __future__ import annotations

import sys
import time

from runtime.contracts.messages import (
    CONTROLLER_TO_WORKER,
    AckMessage,
    ByeMessage,
    CallMessage,
    CancelMessage,
    ErrorMessage,
    ResultMessage,
    ShutdownMessage,
)
from runtime.transport.channel import ChannelClosed, FramedChannel
from runtime.transport.handshake import send_hello
from runtime.transport.stdio import claim_worker_stdio


def main(argv: list[str]) -> int:
    generation = int(argv[0])
    prefix = argv[1] if len(argv) > 1 and argv[1] != "-" else None
    threshold = int(argv[2]) if len(argv) > 2 else 0
    frames_in, frames_out = claim_worker_stdio()
    # After claiming, a stray print must land on stderr, not in the frame stream.
    print("echo worker: stray stdout line")
    channel = FramedChannel(
        frames_in,
        frames_out,
        name="echo-worker",
        shm_threshold=threshold,
        shm_prefix=prefix,
        same_domain=prefix is not None,
    )
    try:
        send_hello(channel, worker="echo", generation=generation)
        print("echo worker: ready", file=sys.stderr, flush=True)
        while True:
            try:
                message, frame = channel.read_message(CONTROLLER_TO_WORKER)
            except ChannelClosed:
                return 0
            if isinstance(message, CallMessage):
                started = time.perf_counter()
                arrays, acks = channel.arrays_from_frame(frame, message.input_names)
                channel.send_acks(acks)
                result = ResultMessage(
                    message.call_id,
                    message.request_id,
                    message.epoch,
                    message.input_names,
                    time.perf_counter() - started,
                )
                channel.send_message(result, arrays, owner="echo", generation=message.call_id)
            elif isinstance(message, AckMessage):
                channel.acknowledge(message.owner, message.generation)
            elif isinstance(message, CancelMessage):
                channel.send_message(
                    ErrorMessage(message.call_id, "cancelled", "nothing was running", fatal=False)
                )
            elif isinstance(message, ShutdownMessage):
                print(f"echo worker: bye, {channel.retained_count} retained", file=sys.stderr)
                channel.send_message(ByeMessage())
                return 0
    finally:
        channel.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
