"""The security review (docs/security.md), enforced.

* Workers talk to the controller over their stdin/stdout pipes only: no sockets at all in a
  graph worker, no listening socket in the controller.
* Shared-memory segments have unpredictable names under a per-worker random prefix and are
  owner-only (0600) whatever the umask.
* No pickle crosses a process boundary: the code never imports a pickling module, loads
  NumPy files only with ``allow_pickle=False``, and the transport refuses object arrays.
* Workers receive an explicit environment: exactly the variables the runtime chose.
* Manifest paths stay inside their bundle: the fault matrix (``manifest-*`` and
  ``bundle-*-after-verification`` cases) and ``tests/runtime/test_artifacts.py`` cover it.
"""

from __future__ import annotations

import ast
import io
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from runtime.api import Omni
from runtime.contracts.buffers import DescriptorError
from runtime.host import GENERATION_VARIABLE, INHERITED_VARIABLES
from runtime.transport import arena, shm
from runtime.transport.channel import FramedChannel
from tests.helpers.engine import engine_of
from tests.reliability.support import record
from tests.runtime.engine.support import StageSpec, write_pipeline

REPO_ROOT = Path(__file__).resolve().parents[2]
CHECKED_PACKAGES = ("runtime", "workers")
SEGMENT_NAME = re.compile(r"oe-(\d+)-(\d+)-([0-9a-f]{8})-([0-9a-f]{16})")
#: Every variable a graph worker may see, each set for a stated reason (runtime.host.launch).
WORKER_VARIABLES = {
    *INHERITED_VARIABLES,
    "PYTHONPATH",
    "PYTHONUNBUFFERED",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONIOENCODING",
    GENERATION_VARIABLE,
    "ORT_DISABLE_TELEMETRY",
    "OMNI_EDGE_WORKER_TMPDIR",
}
PICKLING_MODULES = {"pickle", "_pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve"}


def _add_pipeline(demo_root: Path) -> Path:
    return demo_root / "pipelines" / "add.yaml"


def _fd_targets(pid: int) -> list[str]:
    targets = []
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        try:
            targets.append(os.readlink(entry))
        except OSError:
            continue
    return targets


def test_graph_workers_have_no_sockets_and_the_controller_listens_on_none(
    demo_root: Path, options: dict[str, Any]
) -> None:
    with Omni(_add_pipeline(demo_root), **options) as omni:
        omni.run()
        (client,) = engine_of(omni).clients
        assert client.pid is not None
        worker = psutil.Process(client.pid)
        targets = _fd_targets(client.pid)
        assert worker.net_connections(kind="all") == []
        assert not [target for target in targets if target.startswith("socket:")], targets
        # Descriptor 0 reads nothing; the frames travel on duplicated pipe descriptors.
        assert targets.count(os.devnull) >= 1
        assert sum(target.startswith("pipe:") for target in targets) >= 3
        listening = [
            connection
            for connection in psutil.Process().net_connections(kind="all")
            if connection.status == psutil.CONN_LISTEN
        ]
        assert listening == []
    record("security", check="workers use pipes only, no sockets", passed=True)


def test_worker_environment_is_exactly_the_explicit_set(
    demo_root: Path, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = {
        "OMNI_CANARY_SECRET": "must-not-reach-a-worker",
        "AWS_SECRET_ACCESS_KEY": "canary",
        "PYTHONSTARTUP": "/nonexistent/startup.py",
        "LD_LIBRARY_PATH": "/nonexistent/lib",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    with Omni(_add_pipeline(demo_root), **options) as omni:
        (client,) = engine_of(omni).clients
        assert client.pid is not None
        raw = Path(f"/proc/{client.pid}/environ").read_bytes()
        seen = dict(item.split("=", 1) for item in raw.decode().split("\0") if item)
        assert seen == dict(client._launch_spec().env)
        assert not set(seen) & set(secrets)
        assert set(seen) <= WORKER_VARIABLES, sorted(set(seen) - WORKER_VARIABLES)
        assert seen[GENERATION_VARIABLE] == str(client.generation)
        # Its temporary folder is its own, not the controller's.
        assert Path(seen["TMPDIR"]).parent == Path(os.environ.get("TMPDIR", "/tmp"))
        assert seen["TMPDIR"] == seen["OMNI_EDGE_WORKER_TMPDIR"]
    record("security", check="workers receive an explicit environment", passed=True)


@contextmanager
def _umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def test_shared_memory_segments_are_random_and_owner_only(
    loop_manifest: Path,
    tmp_path: Path,
    options: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[str, str, int, int]] = []

    def stat_of(name: str) -> tuple[int, int]:
        info = os.stat(shm.SHM_DIR / name, follow_symlinks=False)
        assert stat.S_ISREG(info.st_mode)
        return stat.S_IMODE(info.st_mode), info.st_uid

    create, mapped = arena._create_mapping, arena._open_mapping

    def spy_create(name: str, size: int) -> Any:
        handle = create(name, size)
        seen.append(("controller", name, *stat_of(name)))
        return handle

    def spy_open(name: str) -> Any:
        seen.append(("worker", name, *stat_of(name)))
        return mapped(name)

    monkeypatch.setattr(arena, "_create_mapping", spy_create)
    monkeypatch.setattr(arena, "_open_mapping", spy_open)
    pipeline = write_pipeline(tmp_path / "loop.yaml", StageSpec(loop_manifest, max_io="4MiB"))
    with np.load(loop_manifest.parent / "inputs.npz", allow_pickle=False) as archive:
        inputs = {"x": archive["x"], "n": np.array(1, np.int64)}
    prefixes = []
    # A permissive umask, inherited by the workers, must not widen the segments' mode.
    with _umask(0):
        for _ in range(2):
            before = len(seen)
            with Omni(pipeline, **options) as omni:
                omni.run(inputs)
                omni.run(inputs)
            run = seen[before:]
            # One arena each, mapped once for both calls: the inputs' made here, the results'
            # made by the worker and mapped here.
            assert sorted(side for side, *_ in run) == ["controller", "worker"]
            prefixes.append({SEGMENT_NAME.fullmatch(name).group(3) for _, name, *_ in run})  # type: ignore[union-attr]
    for side, name, mode, uid in seen:
        match = SEGMENT_NAME.fullmatch(name)
        assert match is not None, name
        assert int(match.group(1)) == os.getpid(), (side, name)
        assert mode == 0o600, (side, name, oct(mode))
        assert uid == os.getuid()
    names = [name for _, name, *_ in seen]
    assert len(set(names)) == len(names)
    # One random prefix per worker, never the same across runs.
    assert all(len(run) == 1 for run in prefixes)
    assert prefixes[0] != prefixes[1]
    record("security", check="shared memory: random names, mode 0600", passed=True)


def test_the_transport_refuses_object_arrays() -> None:
    channel = FramedChannel(io.BytesIO(), io.BytesIO(), name="security")
    with pytest.raises(DescriptorError, match="cannot cross a process boundary"):
        channel.send("call", {}, {"x": np.array([{"a": 1}], dtype=object)})


def _sources() -> Iterator[Path]:
    for package in CHECKED_PACKAGES:
        yield from sorted((REPO_ROOT / package).rglob("*.py"))


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((keyword.value for keyword in call.keywords if keyword.arg == name), None)


def _is_constant(node: ast.expr | None, value: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def deserialization_problems(tree: ast.AST) -> list[str]:
    """Where a module imports a pickling module, loads unsafely, or runs a shell or eval."""
    problems: list[str] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PICKLING_MODULES | {"multiprocessing"}:
                    problems.append(f"line {line}: imports {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in PICKLING_MODULES | {"multiprocessing"}:
                problems.append(f"line {line}: imports from {node.module}")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name in ("np.load", "numpy.load") and not _is_constant(
                _keyword(node, "allow_pickle"), False
            ):
                problems.append(f"line {line}: {name} without allow_pickle=False")
            elif name == "torch.load" and not _is_constant(_keyword(node, "weights_only"), True):
                problems.append(f"line {line}: torch.load without weights_only=True")
            elif name in ("yaml.unsafe_load", "yaml.full_load", "yaml.load"):
                loader = _dotted(_keyword(node, "Loader") or ast.Constant(None))
                if name != "yaml.load" or loader not in ("yaml.SafeLoader", "yaml.CSafeLoader"):
                    problems.append(f"line {line}: {name} without a safe loader")
            elif name in ("eval", "exec", "os.system", "os.popen"):
                problems.append(f"line {line}: calls {name}")
            elif _is_constant(_keyword(node, "shell"), True):
                problems.append(f"line {line}: {name} with shell=True")
    return problems


def test_the_checker_finds_each_forbidden_pattern() -> None:
    source = (
        "import pickle\nfrom multiprocessing import Queue\nimport numpy as np\n"
        "np.load('a.npz')\nnp.load('a.npz', allow_pickle=True)\nyaml.load(text)\n"
        "yaml.unsafe_load(text)\nsubprocess.run('ls', shell=True)\neval('1')\n"
        "torch.load('m.pt')\n"
        "np.load('ok.npz', allow_pickle=False)\nyaml.load(text, Loader=yaml.SafeLoader)\n"
    )
    problems = deserialization_problems(ast.parse(source))
    assert [problem.split(":")[0] for problem in problems] == [
        f"line {n}" for n in (1, 2, 4, 5, 6, 7, 8, 9, 10)
    ]


def test_no_pickle_shell_or_eval_in_the_runtime_or_the_workers() -> None:
    found = {
        str(path.relative_to(REPO_ROOT)): problems
        for path in _sources()
        if (problems := deserialization_problems(ast.parse(path.read_bytes(), str(path))))
    }
    assert found == {}
    record("security", check="no pickle, shell or eval in runtime/ and workers/", passed=True)
