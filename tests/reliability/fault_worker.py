"""The graph worker with one injected fault, for the fault matrix.

``FAULT`` selects the fault; the real ORT worker code does everything else:

* ``pause-load``: stops inside ``load`` before the bundle is read, as a worker busy reading
  a large bundle would; it writes its pid to ``FAULT_MARKER`` first, so the test can kill it
  there.
* ``pause-warmup``: loads the bundle and creates the session, then stops before warm-up,
  announcing itself the same way.
* ``stdout-noise``: writes noise to its standard output (``print``, ``sys.stdout`` and raw
  descriptor 1) while loading and before every call, as a chatty native library would.
* ``stale-acks``: acknowledges every shared-memory buffer twice, re-sends the previous
  call's acknowledgements and one for an owner that never existed.
* ``oversize-result``: answers its first call with a frame whose prefix declares a payload
  of 1 TiB.
* ``malformed-result``: answers its first call with a frame whose header is not JSON.

The two ``*-result`` faults then wait for the controller to close their stdin and exit.
"""

from __future__ import annotations

import os
import struct
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # Run by path: the project root (holding `runtime`, `workers` and `tests`) replaces this folder.
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from runtime.contracts.codec import MAGIC
from runtime.transport.channel import FramedChannel
from runtime.transport.stdio import claim_worker_stdio
from tests.runtime.engine.misbehaving_worker import _until_first_call
from workers import ort_session, ort_worker

FAULTS = (
    "pause-load",
    "pause-warmup",
    "stdout-noise",
    "stale-acks",
    "oversize-result",
    "malformed-result",
)
PREFIX = struct.Struct("<4sIQ")
#: A header that is not JSON, behind a correct prefix.
MALFORMED_HEADER = b"{this is not json"
NOISE = "NOISE ON STDOUT, NOT A FRAME"


def _announce_and_stop(where: str) -> None:
    """Tell the test where this worker stopped, then wait to be killed."""
    marker = Path(os.environ["FAULT_MARKER"])
    marker.with_suffix(".tmp").write_text(f"{os.getpid()} {where}")
    marker.with_suffix(".tmp").replace(marker)
    while True:
        time.sleep(1.0)


def _pause_in_load(*_: Any, **__: Any) -> Any:
    _announce_and_stop("load")


def _pause_in_warmup(*_: Any, **__: Any) -> Any:
    _announce_and_stop("warmup")


def _noise() -> None:
    print(NOISE)
    sys.stdout.write(NOISE + "\n")
    sys.stdout.flush()
    os.write(1, b"\x00\xffOEF1" + NOISE.encode() + b"\n")


def _install_noise() -> None:
    load, call = ort_worker.GraphWorker.load, ort_worker.GraphWorker._call

    def noisy_load(self: ort_worker.GraphWorker, message: Any) -> Any:
        _noise()
        return load(self, message)

    def noisy_call(self: ort_worker.GraphWorker, message: Any, frame: Any) -> None:
        _noise()
        call(self, message, frame)

    ort_worker.GraphWorker.load = noisy_load  # type: ignore[method-assign]
    ort_worker.GraphWorker._call = noisy_call  # type: ignore[method-assign]


def _install_stale_acks() -> None:
    send_acks = FramedChannel.send_acks
    send_message = FramedChannel.send_message
    previous: list[tuple[str, int]] = []

    def repeated(acks: Any) -> list[tuple[str, int]]:
        current = list(acks)
        if not current:
            return current
        # Each twice, the previous call's again, and one for an owner that never existed.
        spoiled = [*current, *current, *previous, ("nobody", 1)]
        previous[:] = current
        return spoiled

    def stale_acks(self: FramedChannel, acks: Any, **options: Any) -> None:
        send_acks(self, repeated(acks), **options)

    def stale_message(self: FramedChannel, message: Any, *args: Any, **options: Any) -> int:
        # The worker acknowledges a call's inputs in the same write as its result.
        options["acks"] = repeated(options.get("acks", ()))
        return send_message(self, message, *args, **options)

    prepare_answer = ort_worker.prepare_answer

    def stale_prepared(channel: FramedChannel, message: Any, *args: Any, **options: Any) -> Any:
        # ... also when the answer is encoded before its run.
        options["acks"] = repeated(options.get("acks", ()))
        return prepare_answer(channel, message, *args, **options)

    FramedChannel.send_acks = stale_acks  # type: ignore[method-assign]
    FramedChannel.send_message = stale_message  # type: ignore[method-assign]
    ort_worker.prepare_answer = stale_prepared


def _bad_result(fault: str) -> int:
    generation = int(os.environ["OMNI_EDGE_WORKER_GENERATION"])
    frames_in, frames_out = claim_worker_stdio()
    _until_first_call(frames_in, frames_out, generation)
    if fault == "oversize-result":
        frames_out.write(PREFIX.pack(MAGIC, 32, 1 << 40) + bytes(64))
    else:
        frames_out.write(PREFIX.pack(MAGIC, len(MALFORMED_HEADER), 0) + MALFORMED_HEADER)
    frames_out.flush()
    while frames_in.read(65536):
        pass
    return 0


def main() -> int:
    fault = os.environ.get("FAULT", "")
    if fault not in FAULTS:
        print(f"fault worker: FAULT={fault!r}; accepted: {', '.join(FAULTS)}", file=sys.stderr)
        return 2
    if fault in ("oversize-result", "malformed-result"):
        return _bad_result(fault)
    if fault == "pause-load":
        ort_session.load_verified_graph = _pause_in_load  # type: ignore[assignment]
    elif fault == "pause-warmup":
        ort_session.warm_up_buckets = _pause_in_warmup  # type: ignore[assignment]
    elif fault == "stdout-noise":
        _install_noise()
    else:
        _install_stale_acks()
    return ort_worker.main([])


if __name__ == "__main__":
    sys.exit(main())
