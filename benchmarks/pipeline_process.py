"""A pipeline in a fresh controller process: start-up time, requests, peak memory.

    python -m benchmarks.pipeline_process PIPELINE.yaml [--requests N]

Prints a ``ready`` JSON line once every stage is loaded (``import_s``: importing the
runtime; ``start_s``: ``Omni`` start to ready), runs ``N`` requests (a graph chain gets its
example inputs, the speech adapter a sentence, the transcription adapter the samples of
``--audio`` (a ``.npy`` at ``--sample-rate``); another adapter is only loaded), then prints
``done`` with the peak RSS of this controller and of each stage's worker (and the worker's
own child processes), read while they are alive. A runtime refusal (a missing bundle, an
unexported voice, a missing environment) prints ``error`` and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from benchmarks.rss import peak_rss_bytes

if TYPE_CHECKING:
    from runtime.records import ExecutionPlan

#: What each model adapter gets as its benchmark request.
ADAPTER_REQUESTS: dict[str, Any] = {
    "runtime.adapters.tts:SpeechAdapter": (
        "The benchmark measures how much memory each process holds while it speaks."
    ),
}


def _emit(document: dict[str, Any]) -> None:
    print(json.dumps(document), flush=True)


def _worker_peaks(plan: ExecutionPlan) -> list[dict[str, Any]]:
    peaks = []
    for stage in plan.stages:
        pid = None if stage.worker is None else stage.worker.pid
        if pid is None:
            continue
        try:
            descendants = psutil.Process(pid).children(recursive=True)
        except psutil.NoSuchProcess:
            descendants = []
        peaks.append(
            {
                "stage": stage.stage,
                "pid": pid,
                "peak_rss_bytes": peak_rss_bytes(pid),
                "descendants_peak_rss_bytes": [peak_rss_bytes(child.pid) for child in descendants],
            }
        )
    return peaks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pipeline_process")
    parser.add_argument("pipeline", type=Path)
    parser.add_argument("--requests", type=int, default=0)
    parser.add_argument("--audio", type=Path, help="a .npy of samples: each request's audio")
    parser.add_argument("--sample-rate", type=int, default=16_000)
    args = parser.parse_args(argv)
    began = time.perf_counter()
    # Imported here so that the runtime's import time is measured on its own.
    from runtime.api import Omni
    from runtime.config import load_pipeline
    from runtime.devices import DeviceSelection
    from runtime.errors import OmniError

    imported = time.perf_counter()
    try:
        config = load_pipeline(args.pipeline)
        adapter = None if config.adapter is None else config.adapter.name
        with Omni(config, selection=DeviceSelection()) as omni:
            ready = time.perf_counter()
            _emit({"event": "ready", "import_s": imported - began, "start_s": ready - imported})
            request = None if adapter is None else ADAPTER_REQUESTS.get(adapter)
            if args.audio is not None:
                import numpy as np

                request = {"audio": np.load(args.audio), "sample_rate": args.sample_rate}
            known = adapter is None or adapter in ADAPTER_REQUESTS or args.audio is not None
            requests = args.requests if known else 0
            for _ in range(requests):
                for _output in omni.generate(request):
                    pass
            _emit(
                {
                    "event": "done",
                    "requests": requests,
                    "adapter": adapter,
                    "controller_peak_rss_bytes": peak_rss_bytes(),
                    "workers": _worker_peaks(omni.execution_plan),
                }
            )
    except OmniError as exc:
        _emit({"event": "error", "message": f"{type(exc).__name__}: {exc}"})
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
