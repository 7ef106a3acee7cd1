"""The one-process baseline: the same ONNX Runtime sessions, created and run in one process.

    python -m benchmarks.one_process MANIFEST [MANIFEST ...] [--calls N]

For each bundle it does what a graph worker does at load (verify the bytes, create the
session with :func:`workers.ort_session.create_session` on the CPU route, warm up every
bucket), all in this one process. It prints one JSON line when every session is ready
(``import_s``: importing ONNX Runtime and the session code; ``sessions_s``: creating and
warming the sessions), then runs each session ``--calls`` times on its example inputs and
prints a second line with the process's peak RSS. It imports nothing else of the runtime,
so its memory and start time are those of the sessions themselves.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

from benchmarks.rss import peak_rss_bytes

CPU = "CPUExecutionProvider"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.one_process")
    parser.add_argument("manifests", nargs="+", type=Path)
    parser.add_argument("--calls", type=int, default=0)
    args = parser.parse_args(argv)
    began = time.perf_counter()
    # Imported here so that the time to import ONNX Runtime is measured on its own.
    from workers.ort_session import (
        bucket_shapes,
        create_session,
        load_verified_graph,
        warm_up_buckets,
    )

    imported = time.perf_counter()
    sessions = []
    for manifest in args.manifests:
        identity = hashlib.sha256(manifest.read_bytes()).hexdigest()
        graph = load_verified_graph(manifest, identity)
        session = create_session(graph, [CPU], [CPU], CPU)
        shapes = bucket_shapes(graph.manifest, graph.example_inputs)
        warm_up_buckets(session, graph.example_inputs, shapes)
        sessions.append((session, dict(graph.example_inputs)))
    ready = time.perf_counter()
    print(
        json.dumps(
            {"event": "ready", "import_s": imported - began, "sessions_s": ready - imported}
        ),
        flush=True,
    )
    for _ in range(args.calls):
        for session, inputs in sessions:
            session.run(None, inputs)
    print(json.dumps({"event": "done", "peak_rss_bytes": peak_rss_bytes()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
