"""The remote client against a real ``vllm serve`` of the tiny model on 127.0.0.1.

One server (vLLM's OpenAI-compatible API server, run from the managed ``vllm-cpu``
environment) serves the whole module: it takes about a minute to start on two cores. It
runs in its own session, so its whole process tree is one process group; the module stops
the group at the end and checks that every process of the tree, and every shared-memory
file the tree mapped, is gone. The test that kills the server mid-stream leaves the next
user of the server to start a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from runtime.backends.remote_llm import (
    RemoteConnectionLost,
    RemoteDeltaStream,
    RemoteEndpoint,
    RemoteLlmStageClient,
    RemoteModelNotServed,
    completion_body,
)
from runtime.backends.vllm_client import tree_shm_paths
from runtime.contracts import RequestKey
from runtime.contracts.llm_messages import SamplingSpec
from runtime.envs import EnvInfo
from runtime.errors import RequestCancelled, StageRetired, WorkerDied
from runtime.host import set_child_subreaper, wait_processes_gone
from tests.runtime.vllm.support import ENGINE_ARGS, START_TIMEOUT_S, offline_env
from workers.vllm_worker import OFFLINE_ENVIRONMENT

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(2 * START_TIMEOUT_S)]
log = logging.getLogger(__name__)

#: The name the server serves the tiny model under.
SERVED_NAME = "tiny"
#: An aborted stream ends (RequestCancelled) within this many seconds of abort().
#: Measured on two cores: a few milliseconds (the client only closes its socket).
ABORT_BOUND_S = 1.0
#: After the disconnect the server has dropped the request (no request running) within
#: this many seconds; vLLM notices a closed socket at its next write.
SERVER_ABORT_BOUND_S = 5.0
#: A killed server is reported (RemoteConnectionLost) within this many seconds of its exit.
LOSS_BOUND_S = 2.0
#: How long a killed server may take to exit (its memory torn down) before the test gives up.
EXIT_BOUND_S = 60.0
#: SIGTERM lets vLLM shut its engine down; after this many seconds the tree is killed.
STOP_GRACE_S = 30.0
#: How long killed processes may take to be gone before the test calls it a leak.
GONE_BOUND_S = 30.0

GREEDY = SamplingSpec(max_tokens=48, temperature=0.0, ignore_eos=True, seed=0)
SEEDED = SamplingSpec(max_tokens=48, temperature=1.0, top_p=0.9, ignore_eos=True, seed=1234)
LONG = SamplingSpec(max_tokens=1800, temperature=0.0, ignore_eos=True)
SHORT = SamplingSpec(max_tokens=16, temperature=0.0, ignore_eos=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serve_argv(python: Path, model: Path, port: int) -> list[str]:
    """The server's command line: the engine settings the worker tests use (support.py)."""
    args = ENGINE_ARGS
    assert args.max_model_len is not None
    assert args.kv_cache_memory_bytes is not None
    return [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        args.dtype,
        "--max-model-len",
        str(args.max_model_len),
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--kv-cache-memory-bytes",
        str(args.kv_cache_memory_bytes),
        "--enforce-eager",
        "--seed",
        str(args.seed),
    ]


class VllmServer:
    """One running ``vllm serve``: its process (a session leader), port and log."""

    def __init__(self, python: Path, model: Path, log_path: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        # Short: vLLM puts Unix sockets (107-byte paths at most) in its TMPDIR.
        self.tmpdir = Path(tempfile.mkdtemp(prefix="oe-serve-"))
        self.env = {**offline_env(self.tmpdir), **OFFLINE_ENVIRONMENT}
        self.argv = serve_argv(python, model, self.port)
        with open(log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.members: dict[int, psutil.Process] = {}
        self.shm: set[str] = set()
        self.started_s: float | None = None

    def alive(self) -> bool:
        return self.process.poll() is None

    def observe(self) -> set[int]:
        """Remember the tree's processes and shared memory now; return the tree's pids."""
        for process in [psutil.Process(self.process.pid), *self._children()]:
            self.members.setdefault(process.pid, process)
        self.shm |= tree_shm_paths(self.process.pid)
        return set(self.members)

    def _children(self) -> list[psutil.Process]:
        try:
            return list(psutil.Process(self.process.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            return []

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def wait_healthy(self, bound_s: float) -> None:
        began = time.monotonic()
        while time.monotonic() - began < bound_s:
            if not self.alive():
                raise AssertionError(
                    f"vllm serve exited with {self.process.returncode} before it was healthy:\n"
                    + self.log_tail()
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as reply:
                    if reply.status == 200:
                        self.started_s = time.monotonic() - began
                        self.observe()
                        log.info("vllm serve healthy after %.1f s: %s", self.started_s, self.argv)
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise AssertionError(f"vllm serve was not healthy within {bound_s} s:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL every serving process of the tree at once (a crash).

        Python's resource tracker is spared, as a crash spares it: it unlinks the shared
        memory and semaphores its dead clients registered, then exits by itself.
        """
        # The process serving HTTP goes first, before the tree is walked: on a busy machine
        # walking it takes long enough for a fast engine to finish the whole completion.
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.observe()
        for process in self.members.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                if not _is_resource_tracker(process):
                    process.kill()

    def stop(self) -> None:
        """SIGTERM the group, SIGKILL what outlives the grace, and check the tree is gone."""
        if self.alive():
            self.observe()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.kill()
        alive = wait_processes_gone(list(self.members.values()), STOP_GRACE_S)
        for process in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        self.process.wait(GONE_BOUND_S)
        left = wait_processes_gone(alive, GONE_BOUND_S)
        shm_left = sorted(path for path in self.shm if Path(path).exists())
        for path in shm_left:
            Path(path).unlink(missing_ok=True)
        shutil.rmtree(self.tmpdir, ignore_errors=True)
        assert not left, f"vllm serve processes outlived the stop: {[p.pid for p in left]}"
        assert not shm_left, f"vllm serve left shared memory behind: {shm_left}"


class ServerPool:
    """The module's server, started on first use and again after a test killed it."""

    def __init__(self, python: Path, model: Path, workdir: Path) -> None:
        self.python = python
        self.model = model
        self.workdir = workdir
        self.current: VllmServer | None = None
        self.starts = 0

    def get(self) -> VllmServer:
        if self.current is not None and self.current.alive():
            return self.current
        self.close()
        self.starts += 1
        server = VllmServer(self.python, self.model, self.workdir / f"serve-{self.starts}.log")
        self.current = server
        server.wait_healthy(START_TIMEOUT_S)
        return server

    def tree(self) -> set[int]:
        if self.current is None or not self.current.alive():
            return set()
        return self.current.observe()

    def close(self) -> None:
        server, self.current = self.current, None
        if server is not None:
            server.stop()


@pytest.fixture(scope="module")
def pool(
    vllm_env: EnvInfo, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerPool]:
    # Adopt the tree's orphans (vLLM's engine core outlives a killed API server briefly),
    # so they are reaped here rather than left as zombies of init.
    adopted = set_child_subreaper(True)
    pool = ServerPool(vllm_env.python, tiny_model, tmp_path_factory.mktemp("vllm-serve"))
    try:
        yield pool
    finally:
        pool.close()
        if adopted:
            set_child_subreaper(False)


@pytest.fixture
def server(pool: ServerPool) -> VllmServer:
    return pool.get()


def _is_resource_tracker(process: psutil.Process) -> bool:
    return any("multiprocessing.resource_tracker" in part for part in process.cmdline())


def _live_children() -> list[psutil.Process]:
    alive = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
    return alive


def _client_sockets(port: int) -> list[Any]:
    return [
        conn
        for conn in psutil.Process().net_connections(kind="tcp")
        if conn.raddr and conn.raddr.port == port
    ]


@pytest.fixture(autouse=True)
def no_residue(pool: ServerPool) -> Iterator[None]:
    """The project's residue guard, less the module's server tree (checked at module end).

    It also fails a test that leaves a socket of this process open to the server.
    """
    yield
    deadline = time.monotonic() + 3.0
    while True:
        tree = pool.tree()
        strays = [p for p in _live_children() if p.pid not in tree]
        sockets = [] if pool.current is None else _client_sockets(pool.current.port)
        if not (strays or sockets) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not strays, f"child processes left running: {[p.pid for p in strays]}"
    assert not sockets, f"sockets left open to the server: {sockets}"


# -- helpers ---------------------------------------------------------------------------


def complete_once(
    server: VllmServer, prompt: str | list[int], sampling: SamplingSpec
) -> dict[str, Any]:
    """A non-streamed ``/v1/completions`` with the same fields the client streams with."""
    body = json.loads(completion_body(SERVED_NAME, prompt, sampling))
    body["stream"] = False
    request = urllib.request.Request(
        f"{server.url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        choice: dict[str, Any] = json.loads(reply.read())["choices"][0]
    return choice


def metric(server: VllmServer, name: str) -> float:
    """The sum of one Prometheus metric's samples on the server's ``/metrics``."""
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", re.MULTILINE)
    values = [float(match) for match in pattern.findall(text)]
    assert values, f"{name} is not among the server's metrics"
    return sum(values)


async def _drain(stream: RemoteDeltaStream) -> None:
    async for _ in stream:
        pass


def endpoint(server: VllmServer, model: str = SERVED_NAME) -> RemoteEndpoint:
    return RemoteEndpoint(server.url, model, read_timeout_s=120.0)


async def started(server: VllmServer) -> RemoteLlmStageClient:
    client = RemoteLlmStageClient("llm", endpoint(server))
    record = (await client.start()).to_json()
    assert record["offered_models"] == [SERVED_NAME]
    assert record["max_model_len"] == ENGINE_ARGS.max_model_len
    return client


# -- tests -----------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_streamed_completion_equals_a_non_streamed_one(
    server: VllmServer, sampling: SamplingSpec
) -> None:
    prompts: list[str | list[int]] = ["the river", "morning light on the quiet harbor", [1, 9, 40]]
    references = [complete_once(server, prompt, sampling) for prompt in prompts]

    async def scenario() -> None:
        client = await started(server)
        try:
            for index, (prompt, reference) in enumerate(zip(prompts, references, strict=True)):
                key = RequestKey(f"r{index}", 1)
                deltas = [delta async for delta in await client.generate(key, prompt, sampling)]
                text = "".join(delta.text for delta in deltas)
                tokens = [token for delta in deltas for token in delta.token_ids]
                assert text == reference["text"]
                assert tokens == reference["token_ids"]
                assert len(tokens) == sampling.max_tokens
                assert [delta.index for delta in deltas] == list(range(len(deltas)))
                assert [delta.finished for delta in deltas] == [False] * (len(deltas) - 1) + [True]
                assert deltas[-1].finish_reason == reference["finish_reason"] == "length"
                assert len(deltas) > 1
            assert client.in_flight == ()
        finally:
            await client.close()

    asyncio.run(scenario())


def test_abort_mid_stream_ends_the_stream_and_the_server_serves_on(server: VllmServer) -> None:
    async def scenario() -> None:
        client = await started(server)
        try:
            key = RequestKey("long", 1)
            stream = await client.generate(key, "the river", LONG)
            seen = 0
            async for delta in stream:
                seen += len(delta.token_ids)
                if seen >= 8:
                    break
            generated = metric(server, "vllm:generation_tokens_total")
            # A read is pending when abort() comes: it must wake and end the stream.
            reader = asyncio.create_task(_drain(stream))
            await asyncio.sleep(0.05)
            began = time.monotonic()
            if not await client.abort(key):
                outcome = await asyncio.gather(reader, return_exceptions=True)
                pytest.fail(f"the request ended before the abort: {outcome!r}")
            with pytest.raises(RequestCancelled, match="request long was aborted"):
                await reader
            elapsed = time.monotonic() - began
            assert elapsed < ABORT_BOUND_S, f"the aborted stream ended after {elapsed:.3f} s"
            assert client.in_flight == ()
            assert _client_sockets(server.port) == []

            until = time.monotonic() + SERVER_ABORT_BOUND_S
            while metric(server, "vllm:num_requests_running") > 0:
                assert time.monotonic() < until, "the server still runs the aborted request"
                await asyncio.sleep(0.05)
            dropped = time.monotonic() - began
            after_abort = metric(server, "vllm:generation_tokens_total") - generated
            log.info(
                "abort: stream ended %.4f s after abort(), server idle after %.3f s, "
                "%d tokens generated after the snapshot taken just before it",
                elapsed,
                dropped,
                after_abort,
            )
            # The server stopped the request short of its length (how soon after the abort
            # depends on how busy the machine's cores are: its disconnect check waits its turn).
            assert seen + after_abort < LONG.max_tokens, (
                f"{after_abort} tokens were generated after the abort: the request ran to its end"
            )

            deltas = [d async for d in await client.generate(RequestKey("next"), "hi", SHORT)]
            assert sum(len(d.token_ids) for d in deltas) == SHORT.max_tokens
            assert deltas[-1].finish_reason == "length"
            assert client.usable
        finally:
            await client.close()

    asyncio.run(scenario())


def test_an_unknown_model_name_lists_the_offered_model(server: VllmServer) -> None:
    client = RemoteLlmStageClient("llm", endpoint(server, model="llama-3-70b"))
    with pytest.raises(RemoteModelNotServed) as caught:
        asyncio.run(client.start())
    message = str(caught.value)
    assert f"{server.url}/v1/models" in message
    assert "does not serve model 'llama-3-70b'; it offers 'tiny'" in message
    assert caught.value.offered == (SERVED_NAME,)
    assert not client.usable


@pytest.mark.slow
def test_killing_the_server_mid_stream_is_connection_lost(
    pool: ServerPool, server: VllmServer
) -> None:
    # A starved client may read its first tokens only after a fast engine has sent the
    # whole completion: then the kill comes too late to cut the stream, and the attempt is
    # repeated on a fresh server (the completion must then have finished in full).
    for _ in range(3):
        if asyncio.run(_kill_mid_stream(server)):
            break
        server = pool.get()
    else:
        raise AssertionError("three times, the whole completion arrived before the kill")
    pool.close()


async def _kill_mid_stream(server: VllmServer) -> bool:
    """Kill ``server`` mid-stream and check the loss; False when the stream had finished."""
    client = await started(server)
    try:
        stream = await client.generate(RequestKey("doomed"), "the river", LONG)
        seen = 0
        async for delta in stream:
            seen += len(delta.token_ids)
            if seen >= 8:
                break
        exited: list[float] = []

        async def watch_exit() -> None:
            # The kernel closes the server's sockets only once its process has exited,
            # which takes a killed vLLM server seconds on a busy machine.
            while server.process.poll() is None:
                await asyncio.sleep(0.01)
            exited.append(time.monotonic())

        began = time.monotonic()
        server.kill()
        watcher = asyncio.create_task(watch_exit())
        try:
            async for delta in stream:
                seen += len(delta.token_ids)
        except RemoteConnectionLost as lost:
            caught = lost
        else:
            await asyncio.wait_for(watcher, EXIT_BOUND_S)
            assert seen == LONG.max_tokens, f"the stream ended after {seen} tokens, unbroken"
            log.info("kill: the whole completion had arrived before the kill; again")
            return False
        reported = time.monotonic()
        await asyncio.wait_for(watcher, EXIT_BOUND_S)
        after_exit = reported - exited[0]
        log.info(
            "kill: RemoteConnectionLost %.4f s after SIGKILL, %.4f s after the server exited",
            reported - began,
            after_exit,
        )
        assert after_exit < LOSS_BOUND_S, (
            f"the lost connection was reported {after_exit:.3f} s after the server exited"
        )
        assert seen < LONG.max_tokens
        assert isinstance(caught, WorkerDied)
        assert caught.url == f"{server.url}/v1/completions"
        assert "before the completion finished" in str(caught)
        assert client.failure is caught
        assert not client.usable
        assert client.in_flight == ()
        with pytest.raises(StageRetired, match="recreate the stage"):
            await client.generate(RequestKey("after"), "hi", SHORT)
        return True
    finally:
        await client.close()
