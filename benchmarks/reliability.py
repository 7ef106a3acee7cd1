"""Run the reliability suite and write ``benchmarks/results/reliability.json``.

Five parts, each a real run (``make reliability`` runs this script):

1. the fault matrix and the security checks (``tests/reliability``, as ``make test`` runs
   them): per fault the typed error, the recovery time against its bound, leaks, and
   whether the pipeline served again;
2. the property fuzzers (Hypothesis) with ``--fuzz-examples`` examples per target (the
   parsers, the audio reader, ``POST /v1/audio/transcriptions`` serving the transcription
   pipeline, and the server's other endpoints' request bodies and realtime event sequences);
3. coverage-guided fuzzing with Atheris, ``--atheris-runs`` inputs per target, when Atheris
   is installed;
4. the soak: ``--soak-requests`` requests across the add, MLP-chain and speech demos with
   about 30% cancelled;
5. the server's soak: 8 mixed clients (chat, speech, transcription, embeddings, realtime)
   of one ``omni-edge serve`` for ``--serve-soak-s`` seconds with random disconnects.

The exit status is 0 only when every part passed with zero leaks.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "benchmarks" / "results" / "reliability.json"
TESTS = REPO_ROOT / "tests" / "reliability"
ATHERIS = REPO_ROOT / "benchmarks" / "fuzz_atheris.py"
ATHERIS_TARGETS = ("frames", "manifests", "pipelines")
#: The Hypothesis fuzz targets' files, run under the slow profile.
FUZZ_FILES = (
    "test_fuzz.py",
    "test_fuzz_audio.py",
    "test_fuzz_transcriptions.py",
    "test_fuzz_serve.py",
    "test_fuzz_realtime.py",
)
EXECUTED = re.compile(r"stat::number_of_executed_units:\s*(\d+)")


def _pytest(
    label: str, paths: list[str], marker: str, env: dict[str, str], work: Path
) -> dict[str, Any]:
    """Run pytest on ``paths``; return its exit status, duration and the records it wrote."""
    records = work / f"{label}.json"
    command = [sys.executable, "-m", "pytest", *paths, "-m", marker, "-q", "-p", "no:cacheprovider"]
    started = time.monotonic()
    print(f"== {label}: {' '.join(command[2:])}", flush=True)
    completed = subprocess.run(
        command,
        cwd=REPO_ROOT,
        env={**os.environ, **env, "OMNI_RELIABILITY_RECORDS": str(records)},
        check=False,
    )
    return {
        "exit_status": completed.returncode,
        "duration_s": round(time.monotonic() - started, 1),
        "records": json.loads(records.read_text()) if records.exists() else [],
    }


def _atheris(target: str, runs: int, work: Path) -> dict[str, Any]:
    folder = work / f"atheris-{target}"
    artifacts = work / f"atheris-{target}-crashes"
    artifacts.mkdir(parents=True)
    command = [
        sys.executable,
        str(ATHERIS),
        target,
        str(folder),
        f"-runs={runs}",
        f"-artifact_prefix={artifacts}/",
        "-print_final_stats=1",
    ]
    print(f"== atheris {target}: {runs} runs", flush=True)
    started = time.monotonic()
    completed = subprocess.run(command, cwd=work, capture_output=True, text=True, check=False)
    executed = EXECUTED.search(completed.stderr)
    crashes = sorted(path.name for path in artifacts.iterdir())
    return {
        "target": target,
        "engine": "atheris",
        "examples": int(executed.group(1)) if executed else None,
        "duration_s": round(time.monotonic() - started, 1),
        "crashes": crashes,
        "passed": completed.returncode == 0 and not crashes and executed is not None,
        "output_tail": None if completed.returncode == 0 else completed.stderr[-2000:],
    }


def _leak_total(leaks: dict[str, int] | None) -> int:
    return sum((leaks or {}).values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fuzz-examples", type=int, default=10_000)
    parser.add_argument("--atheris-runs", type=int, default=100_000)
    parser.add_argument("--soak-requests", type=int, default=1000)
    parser.add_argument("--serve-soak-s", type=float, default=600.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    started = time.monotonic()
    report: dict[str, Any] = {
        "generated": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
    }
    with tempfile.TemporaryDirectory(prefix="oe-reliability-") as folder:
        work = Path(folder)
        matrix = _pytest(
            "matrix",
            [str(TESTS / "test_fault_matrix.py"), str(TESTS / "test_security.py")],
            "not slow",
            {},
            work,
        )
        fuzz = _pytest(
            "fuzz",
            [str(TESTS / name) for name in FUZZ_FILES],
            "slow",
            {"HYPOTHESIS_PROFILE": "slow", "OMNI_FUZZ_EXAMPLES": str(args.fuzz_examples)},
            work,
        )
        atheris = []
        if args.atheris_runs and importlib.util.find_spec("atheris") is not None:
            atheris = [_atheris(target, args.atheris_runs, work) for target in ATHERIS_TARGETS]
        soak = _pytest(
            "soak",
            [str(TESTS / "test_soak.py")],
            "slow",
            {"OMNI_SOAK_REQUESTS": str(args.soak_requests)},
            work,
        )
        serve_soak = _pytest(
            "serve_soak",
            [str(TESTS / "test_soak_serve.py")],
            "slow",
            {"OMNI_SERVE_SOAK_S": str(args.serve_soak_s)},
            work,
        )
        shutil.rmtree(work, ignore_errors=True)
    faults = [r for r in matrix["records"] if r["section"] == "fault"]
    security = [r for r in matrix["records"] if r["section"] == "security"]
    fuzzing = [{**r, "engine": "hypothesis"} for r in fuzz["records"] if r["section"] == "fuzz"]
    fuzzing += atheris
    soaks = [r for r in soak["records"] if r["section"] == "soak"]
    serve_soaks = [r for r in serve_soak["records"] if r["section"] == "serve_soak"]
    leaks = sum(_leak_total(r.get("leaks")) for r in faults + soaks + serve_soaks)
    report.update(
        summary={
            "faults": len(faults),
            "faults_passed": sum(bool(r["passed"]) for r in faults),
            "leaks_found": leaks,
            "security_checks_passed": sum(bool(r["passed"]) for r in security),
            "fuzz_examples": {f"{r['engine']}:{r['target']}": r["examples"] for r in fuzzing},
            "soak_requests": soaks[0]["requests"] if soaks else 0,
            "serve_soak_requests": serve_soaks[0]["requests"] if serve_soaks else 0,
            "serve_soak_rss_growth_bytes": (
                serve_soaks[0]["rss_growth_bytes"] if serve_soaks else None
            ),
            "duration_s": round(time.monotonic() - started, 1),
        },
        faults=faults,
        security=security,
        fuzzing=fuzzing,
        soak=soaks[0] if soaks else None,
        serve_soak=serve_soaks[0] if serve_soaks else None,
        exit_status={
            "matrix": matrix["exit_status"],
            "fuzz": fuzz["exit_status"],
            "soak": soak["exit_status"],
            "serve_soak": serve_soak["exit_status"],
        },
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report["summary"], indent=2))
    print(f"wrote {args.out}")
    passed = (
        all(status == 0 for status in report["exit_status"].values())
        and faults
        and all(r["passed"] for r in faults)
        and all(r["passed"] for r in fuzzing)
        and soaks
        and soaks[0]["passed"]
        and serve_soaks
        and serve_soaks[0]["passed"]
        and leaks == 0
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
