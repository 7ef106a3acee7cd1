"""``native.vllm.v1``: a language-model stage served by vLLM in a worker process.

The client owns its worker process, its framed channel and its stage reservation, like
:class:`~runtime.backends.graph.GraphStageClient`, but its flow rule differs: up to the
engine's ``max_num_seqs`` requests may be in flight at once (vLLM batches them). Each
request streams :class:`Delta` values until one says ``finished``; that delta frees the
request's slot. :meth:`VllmStageClient.abort` aborts a request inside vLLM without
touching the worker, and waits (at most ``VllmTimeouts.abort_s``) for the worker to
confirm that the slot is free; a worker that does not confirm in time is retired.

A worker that exits or closes its stream fails every open request with
:class:`~runtime.errors.WorkerDied`; the client then retires the whole process tree and
releases its reservation, or quarantines it when the tree could not be confirmed gone.

Nothing starts before the stage's demands are reserved: :func:`start_vllm_stage` reserves
first and starts the worker only when the ledger admitted it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

import psutil

from runtime.backends.base import (
    Delta,
    ReservationRecord,
    StageRecord,
    WorkerRecord,
    check_usable,
)
from runtime.backends.llm import RequestDeltaStream, check_admission
from runtime.backends.worker_client import WorkerStageClient, worker_launch_spec
from runtime.contracts import FrameLimits, RequestKey
from runtime.contracts.devices import vram_constraint
from runtime.contracts.llm_messages import (
    LLM_WORKER_TO_CONTROLLER,
    AbortMessage,
    DeltaMessage,
    EngineArgs,
    GenerateMessage,
    LlmErrorMessage,
    LlmLoadMessage,
    LlmReadyMessage,
    LlmStatsMessage,
    SamplingSpec,
    StatsMessage,
    decode_llm_message,
)
from runtime.contracts.messages import ByeMessage, MessageError
from runtime.contracts.structured import UNSUPPORTED_STRUCTURED_OUTPUT
from runtime.envs.manager import envs_root
from runtime.errors import (
    ConfigError,
    ExecutionError,
    ModelError,
    OmniError,
    RequestCancelled,
    ResourceUnavailable,
    StageRetired,
    StructuredOutputUnsupported,
    UsageError,
    WorkerDied,
)
from runtime.host import ProcessIdentity, spawn_worker, wait_processes_gone
from runtime.transport.channel import ChannelClosed, ProtocolError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from runtime.contracts.codec import Frame
    from runtime.contracts.messages import Message
    from runtime.events import EventBus
    from runtime.host import LaunchSpec, RetireOutcome, WorkerProcess
    from runtime.ledger import ResourceLedger, StageReservation

log = logging.getLogger("omni.backends.vllm")

BACKEND_NAME: Final = "native.vllm.v1"
#: The memory constraint a CPU engine's demand is charged to.
DEFAULT_MEMORY_CONSTRAINT: Final = "machine:ram"
#: How long former tree members may take to finish exiting after retirement, in seconds.
STRAGGLER_WAIT_S: Final = 5.0
#: Files whose bytes a model's weights occupy in memory once loaded.
WEIGHT_SUFFIXES: Final = (".safetensors", ".bin", ".pt", ".gguf")


@dataclass(frozen=True, slots=True)
class VllmRoute:
    """Where the worker runs: ``interpreter`` as in a graph route (``env:NAME`` usually)."""

    interpreter: str = "env:vllm-cpu"
    os_domain: str = "posix"
    worker: str = "vllm"
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: The device kind (``cpu`` or ``cuda``) and the physical id of the device admission chose
    #: for it (None where no topology was consulted).
    ep: str = "cpu"
    device_id: str | None = None


#: Variables that pin a language-model worker to its device (set from the admitted device).
PINNING_VARIABLES: Final = ("CUDA_VISIBLE_DEVICES",)


def pinning_env(ep: str, device_id: str | None) -> dict[str, str]:
    """The variables that keep a worker on its admitted device: a CUDA engine sees only that
    GPU (by its UUID, which ``CUDA_VISIBLE_DEVICES`` accepts); a CPU engine needs none."""
    if ep == "cuda" and device_id is not None and device_id.startswith("GPU-"):
        return {"CUDA_VISIBLE_DEVICES": device_id}
    return {}


def engine_memory_constraint(ep: str, device_id: str | None) -> str:
    """The ledger constraint an engine's weights and KV cache live in: the GPU's own memory
    (``machine:vram:<id>``) for a CUDA engine, the machine's RAM otherwise."""
    if ep == "cuda" and device_id:
        return vram_constraint(device_id)
    return DEFAULT_MEMORY_CONSTRAINT


@dataclass(frozen=True, slots=True)
class VllmStageSpec:
    """One language-model stage: a model directory, engine arguments, a route and demands.

    ``demands`` are what the stage reserves in the ledger before its worker starts (bytes
    per constraint); the one on ``memory_constraint`` must cover at least
    :func:`engine_floor_bytes` (the weights plus the KV cache).
    """

    name: str
    model_dir: Path
    engine_args: EngineArgs
    route: VllmRoute = field(default_factory=VllmRoute)
    demands: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    memory_constraint: str = DEFAULT_MEMORY_CONSTRAINT


@dataclass(frozen=True, slots=True)
class VllmTimeouts:
    """Deadlines of the vLLM client, in seconds."""

    hello_s: float = 60.0
    #: Building the engine imports torch and vLLM and loads the model: slow on a busy CPU.
    load_s: float = 600.0
    #: The stated bound for an aborted request to leave the engine (its slot is then free).
    abort_s: float = 5.0
    stats_s: float = 10.0
    #: The worker shuts its engine down before it answers ``bye``.
    shutdown_s: float = 30.0
    retire_s: float = 10.0


@dataclass(frozen=True, slots=True)
class VllmStageDetail:
    """What a vLLM stage reports in ``execution_plan``: its spec, worker and built engine."""

    spec: VllmStageSpec
    worker: WorkerRecord
    reservation: ReservationRecord | None
    ready: LlmReadyMessage | None
    usable: bool
    failure: str | None

    @property
    def route_name(self) -> str:
        """The record names no route (its ``route`` entry is where the worker runs)."""
        return ""

    @property
    def model_dir(self) -> Path:
        return self.spec.model_dir

    @property
    def ep(self) -> str:
        return self.spec.route.ep

    @property
    def placement(self) -> None:
        """A language-model engine reports no node placement."""
        return None

    @property
    def load_s(self) -> float | None:
        return None if self.ready is None else self.ready.load_s

    @property
    def warmup_s(self) -> None:
        """The engine's warm-up is part of its load."""
        return None

    @property
    def worker_rss_bytes(self) -> int | None:
        return None if self.ready is None else self.ready.rss_bytes

    def to_json(self) -> dict[str, Any]:
        spec, ready = self.spec, self.ready
        return {
            "label": "B",
            "model_dir": str(spec.model_dir),
            "engine_args": spec.engine_args.to_wire(),
            "worker": self.worker.to_json(),
            "route": {
                "interpreter": spec.route.interpreter,
                "worker": spec.route.worker,
                "os_domain": spec.route.os_domain,
                "ep": spec.route.ep,
                "device_id": spec.route.device_id,
                "pinned": {
                    name: spec.route.env[name]
                    for name in PINNING_VARIABLES
                    if name in spec.route.env
                },
            },
            "reservation": None if self.reservation is None else self.reservation.to_json(),
            "vllm_version": None if ready is None else ready.vllm_version,
            "device": None if ready is None else ready.device,
            "max_num_seqs": None if ready is None else ready.max_num_seqs,
            "max_model_len": None if ready is None else ready.max_model_len,
            "load_s": None if ready is None else ready.load_s,
            "worker_rss_bytes": None if ready is None else ready.rss_bytes,
            "worker_pss_bytes": None if ready is None else ready.pss_bytes,
            "worker_processes": None if ready is None else ready.processes,
            "usable": self.usable,
            "failure": self.failure,
        }


def engine_floor_bytes(model_dir: Path, engine_args: EngineArgs) -> int:
    """The least memory an engine needs: its weight files plus its KV cache.

    A hard lower bound, not an estimate of the whole process tree (which also holds
    torch, vLLM and activations: about 1.5 GiB for the tiny model on CPU).
    """
    weights = 0
    root = Path(model_dir)
    if root.is_dir():
        for path in root.iterdir():
            if path.suffix in WEIGHT_SUFFIXES and path.is_file():
                weights += path.stat().st_size
    return weights + (engine_args.kv_cache_memory_bytes or 0)


#: vLLM names Unix sockets ``<TMPDIR>/<uuid4>``; a socket path has at most 107 bytes.
_MAX_TMPDIR_CHARS: Final = 107 - 1 - 36 - 20


def _private_tmpdir() -> Path:
    """A new temporary directory for one worker, short enough for vLLM's socket paths."""
    base = tempfile.gettempdir()
    if sys.platform != "win32" and len(base) > _MAX_TMPDIR_CHARS:
        base = "/tmp"
    return Path(tempfile.mkdtemp(prefix="oe-vllm-", dir=base))


def tree_shm_paths(root_pid: int) -> set[str]:
    """The POSIX shared-memory files (``/dev/shm/...``) mapped by a process and its descendants.

    vLLM's processes make semaphores and shared-memory segments under random names and
    unlink them when they exit cleanly; a killed tree leaves them behind. Linux only
    (elsewhere: empty).
    """
    if sys.platform != "linux":
        return set()
    try:
        root = psutil.Process(root_pid)
        pids = [root_pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.Error:
        return set()
    found: set[str] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    parts = line.split(None, 5)
                    if len(parts) == 6:
                        path = parts[5].rstrip("\n")
                        if path.startswith("/dev/shm/") and not path.endswith(" (deleted)"):
                            found.add(path)
        except OSError:
            continue
    return found


def tree_processes(root_pid: int) -> list[psutil.Process]:
    """A process and its descendants now (empty when it is gone)."""
    try:
        root = psutil.Process(root_pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


class _Request:
    """One in-flight request's state on the controller's loop."""

    __slots__ = ("_waiter", "aborted", "count", "done", "items", "key", "started")

    def __init__(self, key: RequestKey) -> None:
        self.key = key
        # What the stream has yet to yield; a bare deque and one waiter cost less per delta
        # than a queue.
        self.items: deque[Delta | BaseException] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.done = asyncio.Event()
        self.aborted = False
        self.started = time.monotonic()
        self.count = 0

    def put(self, item: Delta | BaseException) -> None:
        self.items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> Delta | BaseException:
        while not self.items:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        return self.items.popleft()


class DeltaStream(RequestDeltaStream["VllmStageClient", _Request]):
    """The deltas of one request, in order. Closing it early aborts the request."""

    async def _next(self) -> Delta:
        if self._request.aborted:
            # The abort fences the request: deltas that arrived before it are not delivered.
            self._ended = True
            raise RequestCancelled(
                f"{self._client.name}: request {self._request.key.request_id} was aborted"
            )
        item = await self._request.get()
        if isinstance(item, BaseException):
            self._ended = True
            raise item
        return item


class VllmStageClient(WorkerStageClient[LlmReadyMessage]):
    """The engine's client for one ``native.vllm.v1`` stage."""

    def __init__(
        self,
        spec: VllmStageSpec,
        *,
        ledger: ResourceLedger,
        reservation: StageReservation,
        generation: int,
        events: EventBus | None = None,
        timeouts: VllmTimeouts | None = None,
        env_dir: Path | None = None,
    ) -> None:
        super().__init__(spec.name, ledger, reservation, generation, events)
        self.spec = spec
        self.route = spec.route
        self.timeouts: VllmTimeouts = timeouts or VllmTimeouts()
        self._env_dir = env_dir
        self._stats_waiters: deque[asyncio.Future[LlmStatsMessage]] = deque()
        self._requests: dict[str, _Request] = {}
        # The worker's private temporary directory (``_tmpdir``) and the shared memory its
        # tree mapped are removed after retirement, since a killed vLLM cannot remove them.
        self._shm_paths: set[str] = set()
        # Every process seen in the worker's tree: vLLM's survive the worker being killed.
        self._members: dict[int, psutil.Process] = {}

    # -- state -----------------------------------------------------------------------

    @property
    def worker(self) -> WorkerProcess | None:
        return self._worker

    @property
    def ready(self) -> LlmReadyMessage | None:
        """What the worker reported once its engine was built."""
        return self._ready

    @property
    def max_num_seqs(self) -> int:
        """How many requests may be in flight at once (the engine's effective limit)."""
        return (
            self.spec.engine_args.max_num_seqs if self._ready is None else self._ready.max_num_seqs
        )

    @property
    def in_flight(self) -> tuple[RequestKey, ...]:
        """The requests holding a slot now."""
        return tuple(request.key for request in self._requests.values())

    @property
    def retire_outcome(self) -> RetireOutcome | None:
        return None if self._worker is None else self._worker.outcome

    # -- start -----------------------------------------------------------------------

    def launch_spec(self) -> LaunchSpec:
        """The worker's argv and environment, resolved from the route.

        ``TMPDIR`` is the worker's private temporary directory once :meth:`start` made it
        (vLLM puts its IPC sockets and rendezvous files there).
        """
        return worker_launch_spec(
            self.route,
            generation=self.generation,
            extra_env={} if self._tmpdir is None else {"TMPDIR": str(self._tmpdir)},
            env_dir=envs_root() if self._env_dir is None else self._env_dir,
        )

    async def start(self) -> StageRecord:
        """Spawn, handshake and build the engine; the record says what was built."""
        if self._worker is not None or self._loop is not None:
            raise UsageError(f"{self.name}: start() was already called")
        self._loop = asyncio.get_running_loop()
        # Resolved once before anything exists, so a bad route leaves nothing to clean up.
        self.launch_spec()
        self._tmpdir = _private_tmpdir()
        worker = self._spawn(self.launch_spec(), spawn_worker)
        self._open_channel(worker, FrameLimits())
        channel = await self._handshake()
        channel.send_message(
            LlmLoadMessage(model_dir=str(self.spec.model_dir), engine_args=self.spec.engine_args)
        )
        assert self._load_future is not None
        try:
            ready = await asyncio.wait_for(self._load_future, self.timeouts.load_s)
        except TimeoutError:
            raise ExecutionError(
                f"{self.name}: the worker did not build its engine within {self.timeouts.load_s} s"
            ) from None
        self._ready = ready
        self._observe_tree(worker.pid)
        return self.record()

    def record(self) -> StageRecord:
        """This stage's entry of ``execution_plan``."""
        detail = VllmStageDetail(
            spec=self.spec,
            worker=self._worker_record(self.launch_spec),
            reservation=self._reservation_record(),
            ready=self._ready,
            usable=self.usable,
            failure=None if self._failure is None else str(self._failure),
        )
        return StageRecord(stage=self.name, backend=BACKEND_NAME, detail=detail)

    # -- frames from the worker ------------------------------------------------------------

    def _decode(self, frame: Frame) -> Message | ProtocolError:
        try:
            return decode_llm_message(frame, LLM_WORKER_TO_CONTROLLER)
        except MessageError as exc:
            return ProtocolError(str(exc), code=exc.code, channel=self.name)

    def _on_frame_loop(self, frame: Frame) -> None:
        """On the loop, which watches the pipe itself: each frame is handled where it is read."""
        message = self._decode(frame)
        if isinstance(message, ProtocolError):
            self._fail(message)
        else:
            self._on_message(message, time.monotonic())

    def _on_frame_thread(self, frame: Frame) -> None:
        """Reader thread (where the loop cannot watch the pipe): decode, then hop to the loop."""
        loop = self._loop
        assert loop is not None
        message = self._decode(frame)
        if isinstance(message, ProtocolError):
            loop.call_soon_threadsafe(self._fail, message)
        else:
            loop.call_soon_threadsafe(self._on_message, message, time.monotonic())

    def _on_message(self, message: Message, received: float) -> None:
        if isinstance(message, DeltaMessage):
            self._on_delta(message, received)
        elif isinstance(message, LlmReadyMessage):
            self._on_ready(message)
        elif isinstance(message, LlmStatsMessage):
            while self._stats_waiters:
                waiter = self._stats_waiters.popleft()
                if not waiter.done():
                    waiter.set_result(message)
                    break
        elif isinstance(message, LlmErrorMessage):
            self._on_error(message)
        elif isinstance(message, ByeMessage):
            self._on_bye()
        else:
            self._fail(
                ProtocolError(
                    f"unexpected {message.KIND} after the handshake",
                    code="unexpected_kind",
                    channel=self.name,
                )
            )

    def _on_delta(self, message: DeltaMessage, received: float) -> None:
        request = self._requests.get(message.request_id)
        if request is None or request.key.epoch != message.epoch:
            log.debug("%s: dropped a stale delta of %s", self.name, message.request_id)
            return
        if request.aborted and not message.finished:
            return
        if message.finished:
            self._end(request)
            if message.finish_reason == "abort":
                request.put(
                    RequestCancelled(f"{self.name}: request {request.key.request_id} was aborted")
                )
                return
        request.put(
            Delta(
                key=request.key,
                text=message.text,
                token_ids=message.token_ids,
                finished=message.finished,
                finish_reason=message.finish_reason,
                index=request.count,
                received_at=received,
                prompt_tokens=message.prompt_tokens,
            )
        )
        request.count += 1

    def _end(self, request: _Request) -> None:
        """The request left the engine: its slot is free."""
        if self._requests.get(request.key.request_id) is request:
            del self._requests[request.key.request_id]
        request.done.set()

    def _on_error(self, message: LlmErrorMessage) -> None:
        if message.request_id is None or message.fatal:
            error: OmniError = ModelError(
                f"{self.name}: worker error {message.code}: {message.message}"
            )
            if message.code == "engine_died":
                error = WorkerDied(f"{self.name}: {message.message}")
            self._on_worker_error(error, fatal=message.fatal)
            return
        request = self._requests.get(message.request_id)
        if request is None or request.key.epoch != message.epoch:
            return
        self._end(request)
        failure: OmniError
        if message.code == "busy":
            failure = ResourceUnavailable(f"{self.name}: {message.message}")
        elif message.code == UNSUPPORTED_STRUCTURED_OUTPUT:
            failure = StructuredOutputUnsupported(f"{self.name}: {message.message}")
        else:
            failure = ModelError(f"{self.name}: {message.code}: {message.message}")
        request.put(failure)

    def _log_failure(self, error: OmniError) -> None:
        log.warning("%s", error)

    def _fail_waiting(self, error: OmniError) -> None:
        for request in list(self._requests.values()):
            self._end(request)
            request.put(error)
        while self._stats_waiters:
            waiter = self._stats_waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error)

    # -- requests --------------------------------------------------------------------

    async def generate(
        self, key: RequestKey, prompt: str | Sequence[int], sampling: SamplingSpec
    ) -> DeltaStream:
        """Start a request and return its stream of deltas.

        ``prompt`` is text or a list of token ids. Raises :class:`ResourceUnavailable` when
        ``max_num_seqs`` requests are in flight or ``key``'s request is already running.
        """
        check_usable(self.name, self._failure, running=self.usable, recreate="stage")
        check_admission(self.name, key, self._requests, self.max_num_seqs, "max_num_seqs")
        if isinstance(prompt, str):
            message = GenerateMessage(key.request_id, key.epoch, prompt, None, sampling)
        else:
            message = GenerateMessage(key.request_id, key.epoch, None, tuple(prompt), sampling)
        assert self._channel is not None
        request = _Request(key)
        self._requests[key.request_id] = request
        try:
            self._channel.send_message(message)
        except ChannelClosed:
            self._end(request)
            raise self._failure or self._died("stopped reading its input") from None
        return DeltaStream(self, request)

    async def abort(self, key: RequestKey) -> bool:
        """Abort ``key``'s request inside vLLM and wait until its slot is free.

        Returns False when the request was not in flight. If the worker does not confirm
        within ``timeouts.abort_s`` it is retired and the stage becomes unusable.
        """
        request = self._requests.get(key.request_id)
        if request is None or request.key.epoch != key.epoch:
            return False
        request.aborted = True
        assert self._channel is not None
        try:
            self._channel.send_message(AbortMessage(key.request_id, key.epoch))
        except ChannelClosed:
            self._fail(self._died("stopped reading its input"))
            return True
        try:
            await asyncio.wait_for(request.done.wait(), self.timeouts.abort_s)
        except TimeoutError:
            error = StageRetired(
                f"{self.name}: request {key.request_id} was still running "
                f"{self.timeouts.abort_s} s after it was aborted; the worker was retired"
            )
            self._fail(error)
            await self._retire(str(error), self.timeouts.retire_s)
        return True

    async def stats(self) -> LlmStatsMessage:
        """The worker tree's memory now and how many requests it holds."""
        check_usable(self.name, self._failure, running=self.usable, recreate="stage")
        assert self._loop is not None
        assert self._channel is not None
        waiter: asyncio.Future[LlmStatsMessage] = self._loop.create_future()
        self._stats_waiters.append(waiter)
        self._channel.send_message(StatsMessage())
        return await asyncio.wait_for(waiter, self.timeouts.stats_s)

    # -- retirement ------------------------------------------------------------------

    def _before_retire(self, worker: WorkerProcess) -> None:
        if worker.outcome is None:
            self._observe_tree(worker.pid)

    async def _after_retire(self, outcome: RetireOutcome | None) -> None:
        stragglers: list[psutil.Process] = []
        if outcome is not None and outcome.confirmed_gone:
            members = [p for pid, p in self._members.items() if pid != outcome.pid]
            stragglers = await asyncio.get_running_loop().run_in_executor(
                None, wait_processes_gone, members, STRAGGLER_WAIT_S
            )
        if outcome is None or (outcome.confirmed_gone and not stragglers):
            self._remove_leftovers()
        self._settle_reservation(outcome, stragglers)

    def _remove_leftovers(self) -> None:
        """Delete the gone tree's shared memory and private temporary directory."""
        for path in sorted(self._shm_paths):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                log.info("%s: removed %s left by the worker's processes", self.name, path)
        self._shm_paths.clear()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def _observe_tree(self, root_pid: int) -> None:
        for process in tree_processes(root_pid):
            self._members.setdefault(process.pid, process)
        self._shm_paths |= tree_shm_paths(root_pid)

    def _settle_reservation(
        self, outcome: RetireOutcome | None, stragglers: Sequence[psutil.Process] = ()
    ) -> None:
        why = None if outcome is None else outcome.quarantine_reason
        survivors = [] if outcome is None else list(outcome.survivor_identities)
        if why is None and stragglers:
            why = (
                f"process(es) {', '.join(str(p.pid) for p in stragglers)} of the worker's tree "
                f"were still running {STRAGGLER_WAIT_S} s after it was retired"
            )
            log.warning("%s: %s", self.name, why)
        for process in stragglers:
            with contextlib.suppress(psutil.Error):
                survivors.append(ProcessIdentity(process.pid, float(process.create_time())))
        self._settle(why, survivors, self._remove_leftovers)

    def _close_waiting(self) -> None:
        closed = StageRetired(f"{self.name} was closed")
        for request in list(self._requests.values()):
            self._end(request)
            request.put(closed)


async def start_vllm_stage(
    spec: VllmStageSpec,
    *,
    ledger: ResourceLedger,
    owner: str,
    generation: int = 1,
    events: EventBus | None = None,
    timeouts: VllmTimeouts | None = None,
    env_dir: Path | None = None,
) -> VllmStageClient:
    """Reserve the stage's demands, then start its worker; unwind everything on failure.

    Raises :class:`ConfigError` when the demand on ``spec.memory_constraint`` is below
    :func:`engine_floor_bytes` and :class:`~runtime.errors.AdmissionRefused` when the
    ledger cannot hold it -- in both cases before any process starts.
    """
    floor = engine_floor_bytes(spec.model_dir, spec.engine_args)
    declared = spec.demands.get(spec.memory_constraint, 0)
    if declared < floor:
        raise ConfigError(
            f"stage {spec.name} demands {declared} bytes of {spec.memory_constraint}, less than "
            f"its weights plus KV cache ({floor} bytes); raise the demand",
            key="resource_budget.demands",
        )
    plan = ledger.reserve_plan(owner, {spec.name: dict(spec.demands)})
    client = VllmStageClient(
        spec,
        ledger=ledger,
        reservation=plan.stages[spec.name],
        generation=generation,
        events=events,
        timeouts=timeouts,
        env_dir=env_dir,
    )
    try:
        await client.start()
    except BaseException:
        await client.close()
        raise
    return client
