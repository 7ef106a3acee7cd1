"""Coverage-guided fuzzing (Atheris / libFuzzer) of the three parsers the property tests cover.

Usage: ``python benchmarks/fuzz_atheris.py TARGET WORKDIR [libFuzzer options]``, TARGET one
of ``frames``, ``manifests``, ``pipelines``; for example ``-runs=100000``. libFuzzer ends the
process itself, so the seeds and the bundle copy go to WORKDIR, which the caller removes.
Each input must end in the parser's typed error or be accepted; anything else is a crash that
libFuzzer reports (and saves under ``-artifact_prefix``). ``benchmarks/reliability.py`` runs
every target when Atheris is installed; the seeds are the demo bundle's manifest, the demo
pipelines (``make bundles`` builds the bundles) and a few valid frames.
"""

from __future__ import annotations

import importlib
import io
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import atheris

if TYPE_CHECKING:
    from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

with atheris.instrument_imports(include=["runtime", "workers"]):
    from runtime.artifacts import verify_bundle
    from runtime.config import parse_pipeline
    from runtime.contracts import BufferDescriptor, DType, FrameLimits, encode_frame
    from runtime.contracts.manifest import ArtifactManifest, ManifestError
    from runtime.contracts.messages import WORKER_TO_CONTROLLER, ResultMessage
    from runtime.errors import ConfigError, VerificationError
    from runtime.transport.channel import ChannelClosed, FramedChannel, ProtocolError
    from runtime.transport.handshake import expect_hello
    from runtime.transport.shm import new_prefix
    from workers.errors import WorkerError
    from workers.ort_session import load_verified_graph

import runtime.config.callables as callables_module  # noqa: E402

#: The modules a fuzzed pipeline may import. A pipeline file is code (it names callables to
#: import), so arbitrary mutations must not reach arbitrary modules; others are "not found".
ALLOWED_MODULES = frozenset({"runtime.adapters.tensor", "runtime.adapters.tts"})


class _GuardedImports:
    """Stands in for ``importlib`` inside ``runtime.config.callables`` while fuzzing."""

    @staticmethod
    def import_module(name: str) -> ModuleType:
        if name not in ALLOWED_MODULES:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return importlib.import_module(name)


callables_module.importlib = _GuardedImports  # type: ignore[assignment]

BUNDLE = REPO_ROOT / "assets" / "bundles" / "add"
PIPELINES = REPO_ROOT / "assets" / "pipelines"
LIMITS = FrameLimits(max_header_bytes=4096, max_buffers=8, max_total_bytes=64 << 10)
SHM_PREFIX = new_prefix(os.getpid(), 424243)
TARGETS = ("frames", "manifests", "pipelines")


def frames(data: bytes) -> None:
    channel = FramedChannel(
        io.BytesIO(data),
        io.BytesIO(),
        name="fuzz",
        limits=LIMITS,
        shm_prefix=SHM_PREFIX,
        same_domain=True,
    )
    try:
        expect_hello(channel, expected_generation=1, expected_pid=None, timeout_s=1.0)
    except (ProtocolError, ChannelClosed):
        pass
    try:
        while True:
            message, frame = channel.read_message(WORKER_TO_CONTROLLER)
            if isinstance(message, ResultMessage):
                channel.arrays_from_frame(frame, message.output_names)
    except (ProtocolError, ChannelClosed):
        pass


class Manifests:
    """A private copy of the add bundle whose manifest each input replaces."""

    def __init__(self, root: Path) -> None:
        self.root = root / "bundle"
        self.root.mkdir()
        for entry in BUNDLE.iterdir():
            (self.root / entry.name).write_bytes(entry.read_bytes())
        self.manifest = self.root / "manifest.json"

    def __call__(self, data: bytes) -> None:
        try:
            ArtifactManifest.from_bytes(data)
        except ManifestError:
            return
        self.manifest.write_bytes(data)
        try:
            verified = verify_bundle(self.manifest)
        except VerificationError:
            return
        try:
            load_verified_graph(self.manifest, verified.identity)
        except WorkerError:
            pass


def pipelines(data: bytes) -> None:
    try:
        parse_pipeline(data.decode("utf-8", "replace"), source="fuzz.yaml", base_dir=PIPELINES)
    except ConfigError:
        pass


def _seeds(target: str, corpus: Path) -> None:
    samples: list[bytes] = []
    if target == "frames":
        hello: dict[str, Any] = {
            "protocol_version": 1,
            "required_features": [],
            "offered_features": ["cancel", "shm-buffers"],
            "worker": "ort",
            "pid": 1,
            "create_time": 1.0,
            "generation": 1,
        }
        result = {"call_id": 1, "request_id": "r", "epoch": 0, "output_names": ["y"], "run_s": 0.1}
        buffer = (BufferDescriptor.for_array("ort-1", 1, DType.FLOAT32, (2,)), bytes(8))
        samples.append(encode_frame("hello", hello) + encode_frame("result", result, [buffer]))
        samples.append(encode_frame("ack", {"owner": "o", "generation": 1}))
    elif target == "manifests":
        samples.append((BUNDLE / "manifest.json").read_bytes())
    else:
        samples.extend(path.read_bytes() for path in sorted(PIPELINES.glob("*.yaml")))
    for index, sample in enumerate(samples):
        (corpus / f"seed-{index}").write_bytes(sample)


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: fuzz_atheris.py {{{','.join(TARGETS)}}} WORKDIR [libFuzzer options]")
    target, work = sys.argv[1], Path(sys.argv[2])
    corpus = work / "corpus"
    corpus.mkdir(parents=True)
    _seeds(target, corpus)
    test = {"frames": frames, "manifests": Manifests(work), "pipelines": pipelines}[target]
    atheris.Setup([sys.argv[0], *sys.argv[3:], str(corpus)], test)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
