"""The worker-process lifecycle shared by the stage clients that own a worker (graph, vLLM).

Such a client spawns its worker, shakes hands over a framed channel, hands the worker's
frames from the reader thread to the event loop, and ends the worker one way: a failure
fails everything waiting on it, then one bounded retirement per worker settles the
stage's reservation (:mod:`runtime.backends.retirement`) and publishes ``WorkerRetired``.
A subclass says what waits on its worker and what its retired worker leaves to remove.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, BinaryIO, ClassVar, Generic, Protocol, TypeVar, cast

from runtime.backends.base import ReservationRecord, WorkerRecord, reservation_record
from runtime.backends.retirement import settle_reservation
from runtime.contracts.messages import HelloMessage, ShutdownMessage
from runtime.errors import ExecutionError, WorkerDied
from runtime.events import StageWorkerUp, WorkerRetired
from runtime.host import (
    BUILTIN_WORKERS,
    LaunchSpec,
    ProcessIdentity,
    RouteError,
    current_os_domain,
    default_project_root,
    is_frozen,
    is_wsl,
    resolve_interpreter,
    worker_argv,
    worker_environment,
)
from runtime.host.crossdomain import (
    OtherDomain,
    crossing_environment,
    end_announced_tree,
    identity_confirmed,
    is_absolute_in,
    other_domain_for,
)
from runtime.transport.channel import (
    ChannelClosed,
    FramedChannel,
    ProtocolError,
)
from runtime.transport.handshake import HandshakeError, expect_hello
from runtime.transport.stdio import loop_reading_supported, start_reader_thread

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable, Mapping, Sequence
    from pathlib import Path

    from runtime.contracts import FrameLimits
    from runtime.contracts.codec import Frame
    from runtime.errors import OmniError
    from runtime.events import EventBus
    from runtime.host import RetireOutcome, WorkerProcess
    from runtime.ledger import ResourceLedger, StageReservation

__all__ = ["WorkerRoute", "WorkerStageClient", "WorkerTimeouts", "worker_launch_spec"]

#: What the worker reports once it is loaded (its ``ready`` message).
ReadyT = TypeVar("ReadyT")


class WorkerRoute(Protocol):
    """Where a worker runs: what :func:`worker_launch_spec` reads of a route."""

    @property
    def interpreter(self) -> str: ...

    @property
    def worker(self) -> str: ...

    @property
    def os_domain(self) -> str: ...

    @property
    def env(self) -> Mapping[str, str]: ...


class WorkerTimeouts(Protocol):
    """The deadlines the shared lifecycle reads, in seconds."""

    @property
    def hello_s(self) -> float: ...

    @property
    def shutdown_s(self) -> float: ...

    @property
    def retire_s(self) -> float: ...


def worker_launch_spec(
    route: WorkerRoute,
    *,
    generation: int,
    extra_env: Mapping[str, str],
    env_dir: Path | None = None,
    other: OtherDomain | None = None,
) -> LaunchSpec:
    """The worker's argv and environment: the route's, plus ``extra_env``. With ``other``
    (a route into the other OS domain) the argv starts it there and the environment crosses
    as ``WSLENV`` lists it (see :mod:`runtime.host.crossdomain`)."""
    if other is not None:
        return _crossing_launch_spec(route, other, generation=generation, extra_env=extra_env)
    frozen = is_frozen()
    interpreter = resolve_interpreter(
        route.interpreter, frozen=frozen, env_dir=env_dir, os_domain=route.os_domain
    )
    argv = worker_argv(interpreter, route.worker, frozen=frozen)
    extra = dict(route.env)
    extra.update(extra_env)
    env = worker_environment(extra, generation=generation, project_root=default_project_root())
    return LaunchSpec(argv=argv, env=env, cwd=None, os_domain=route.os_domain)


def route_other_domain(route: WorkerRoute) -> OtherDomain | None:
    """The other OS domain ``route``'s worker runs in, None for this one (RouteError if it
    cannot be reached as configured)."""
    try:
        return other_domain_for(
            route.os_domain,
            controller_domain=current_os_domain(),
            wsl=is_wsl(),
            environ=os.environ,
            route_env=route.env,
        )
    except ValueError as exc:
        raise RouteError(str(exc), key="os_domain") from None


_PYTHON_EXAMPLES = {"windows": "C:\\Python311\\python.exe", "posix": "/usr/bin/python3"}


def _crossing_launch_spec(
    route: WorkerRoute, other: OtherDomain, *, generation: int, extra_env: Mapping[str, str]
) -> LaunchSpec:
    domain = other.worker_domain
    if not is_absolute_in(domain, route.interpreter):
        example = _PYTHON_EXAMPLES[domain]
        raise RouteError(
            f"interpreter {route.interpreter!r} of a route into the {domain} domain must be "
            f"the absolute path of a Python there (e.g. {example})",
            key="interpreter",
        )
    if route.worker in BUILTIN_WORKERS:
        args: list[str] = ["-m", BUILTIN_WORKERS[route.worker]]
    else:
        try:
            args = [other.path(route.worker)]
        except ValueError as exc:
            raise RouteError(str(exc), key="worker") from None
    extra = dict(route.env)
    extra.update(extra_env)
    env = worker_environment(extra, generation=generation, project_root=default_project_root())
    return LaunchSpec(
        argv=tuple(other.command(route.interpreter, args)),
        env=crossing_environment(env, inherited=os.environ),
        cwd=None,
        os_domain=domain,
    )


class WorkerStageClient(ABC, Generic[ReadyT]):
    """A stage client owning one worker process, its framed channel and its reservation."""

    #: Why :meth:`close` retires the worker (the reason ``WorkerRetired`` carries).
    _CLOSE_REASON: ClassVar[str] = "stage closed"

    timeouts: WorkerTimeouts

    def __init__(
        self,
        name: str,
        ledger: ResourceLedger,
        reservation: StageReservation,
        generation: int,
        events: EventBus | None,
    ) -> None:
        self.name = name
        self.generation = generation
        self._ledger = ledger
        self._reservation: StageReservation | None = reservation
        self._late_exit_watch: threading.Thread | None = None
        self._events = events
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: WorkerProcess | None = None
        self._channel: FramedChannel | None = None
        self._tmpdir: Path | None = None
        self._ready: ReadyT | None = None
        self._load_future: asyncio.Future[ReadyT] | None = None
        self._bye: asyncio.Future[None] | None = None
        self._failure: OmniError | None = None
        self._retire_task: asyncio.Task[RetireOutcome | None] | None = None
        self._hello: HelloMessage | None = None
        self._closed = False
        #: The other OS domain the worker runs in (None: this one), and the worker's identity
        #: there as its hello announced it and that domain confirmed.
        self._other: OtherDomain | None = None
        self._announced: ProcessIdentity | None = None

    # -- what a subclass adds ----------------------------------------------------------

    @abstractmethod
    def _log_failure(self, error: OmniError) -> None:
        """Log the failure that made the worker unusable (once)."""

    @abstractmethod
    def _fail_waiting(self, error: OmniError) -> None:
        """Fail what waits on the worker besides its load and its bye."""

    @abstractmethod
    def _close_waiting(self) -> None:
        """Fail what waits on the worker because the stage is being closed."""

    @abstractmethod
    def _on_frame_thread(self, frame: Frame) -> None:
        """Reader thread: decode one frame and hop to the loop."""

    def _on_frame_loop(self, frame: Frame) -> None:
        """On the loop, where it watches the pipe itself: decode one frame and handle it."""
        self._on_frame_thread(frame)

    def _before_retire(self, worker: WorkerProcess) -> None:
        """Just before ``worker`` is retired (it may still be running)."""

    @abstractmethod
    async def _after_retire(self, outcome: RetireOutcome | None) -> None:
        """Remove what the retired worker left and settle the reservation."""

    # -- state -----------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        return self._failure is None and not self._closed and self._ready is not None

    @property
    def failure(self) -> OmniError | None:
        return self._failure

    @property
    def peer_features(self) -> frozenset[str]:
        """The features the worker offered in its hello."""
        return frozenset(() if self._hello is None else self._hello.offered_features)

    @property
    def pid(self) -> int | None:
        return None if self._worker is None else self._worker.pid

    @property
    def announced_identity(self) -> ProcessIdentity | None:
        """A worker in the other OS domain: its identity there, as announced and confirmed
        (the pid the controller started is its launcher's)."""
        return self._announced

    def _worker_record(self, launch_spec: Callable[[], LaunchSpec]) -> WorkerRecord:
        """The ``worker`` entry of the stage's record."""
        argv = () if self._worker is None else tuple(launch_spec().argv)
        return WorkerRecord(pid=self.pid, generation=self.generation, argv=argv)

    def _reservation_record(self) -> ReservationRecord | None:
        """The ``reservation`` entry of the stage's record (None once it is settled)."""
        return reservation_record(self._reservation)

    # -- start -----------------------------------------------------------------------

    def _spawn(
        self, spec: LaunchSpec, spawn: Callable[[LaunchSpec, str], WorkerProcess]
    ) -> WorkerProcess:
        """Start the worker with ``spawn`` (``spawn_worker``, as the subclass's module names it)."""
        self._worker = spawn(spec, f"{self.name}-g{self.generation}")
        return self._worker

    def _open_channel(
        self,
        worker: WorkerProcess,
        limits: FrameLimits,
        *,
        shm_prefix: str | None = None,
        same_domain: bool = False,
    ) -> FramedChannel:
        self._channel = FramedChannel(
            cast("BinaryIO", worker.stdout),
            cast("BinaryIO", worker.stdin),
            name=self.name,
            limits=limits,
            shm_prefix=shm_prefix,
            same_domain=same_domain,
        )
        return self._channel

    async def _handshake(self) -> FramedChannel:
        """Wait for the worker's hello, then start reading its frames on a thread."""
        loop, channel, worker = self._loop, self._channel, self._worker
        assert loop is not None
        assert channel is not None
        assert worker is not None
        other = self._other
        try:
            self._hello = await loop.run_in_executor(
                None,
                lambda: expect_hello(
                    channel,
                    # Across domains the controller started a launcher, not the worker.
                    expected_generation=self.generation,
                    expected_pid=worker.pid if other is None else None,
                    timeout_s=self.timeouts.hello_s,
                ),
            )
        except ChannelClosed as exc:
            raise self._died("exited before its handshake") from exc
        if other is not None:
            announced = ProcessIdentity(self._hello.pid, self._hello.create_time)
            confirmed = await loop.run_in_executor(None, identity_confirmed, other, announced)
            if not confirmed:
                raise HandshakeError(
                    f"worker {self._hello.worker} announced pid {announced.pid} created at "
                    f"{announced.create_time:.3f}, which the {other.worker_domain} domain does "
                    "not show",
                    code="wrong_pid",
                    channel=channel.name,
                )
            self._announced = announced
        self._load_future = loop.create_future()
        if loop_reading_supported(channel):
            # POSIX: the loop itself watches the pipe; no reader thread, no hop.
            channel.start_loop_reader(loop, self._on_frame_loop, self._on_closed)
        else:
            start_reader_thread(channel, self._on_frame_thread, self._on_closed_thread)
        if self._events is not None:
            self._events.publish(StageWorkerUp(stage=self.name, pid=self._hello.pid))
        return channel

    # -- the worker's end ----------------------------------------------------------------

    def _on_closed_thread(self, error: BaseException | None) -> None:
        if self._loop is None or self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._on_closed, error)

    def _on_closed(self, error: BaseException | None) -> None:
        if self._closed and error is None:
            return
        if isinstance(error, ProtocolError):
            self._fail(error)
        else:
            self._fail(self._died("closed its output stream"))

    def _on_ready(self, message: ReadyT) -> None:
        if self._load_future is not None and not self._load_future.done():
            self._load_future.set_result(message)

    def _fail_load(self, error: OmniError) -> None:
        if self._load_future is not None and not self._load_future.done():
            self._load_future.set_exception(error)

    def _on_worker_error(self, error: OmniError, *, fatal: bool) -> None:
        """A worker error outside any request: it fails the load, and a fatal one the worker."""
        self._fail_load(error)
        if fatal:
            self._fail(error)

    def _on_bye(self) -> None:
        if self._bye is not None and not self._bye.done():
            self._bye.set_result(None)

    def _died(self, what: str) -> WorkerDied:
        worker = self._worker
        code = None if worker is None else worker.wait_exit(0.5)
        tail = () if worker is None else worker.stderr_tail()[-5:]
        exit_text = "is still running" if code is None else f"exit code {code}"
        last = f"; last log lines: {' | '.join(tail)}" if tail else ""
        pid = None if worker is None else worker.pid
        return WorkerDied(f"{self.name}: worker pid {pid} {what} ({exit_text}){last}")

    def _fail(self, error: OmniError) -> None:
        """The worker is unusable: fail everything waiting on it and retire it."""
        if self._failure is None:
            self._failure = error
            self._log_failure(error)
        self._fail_waiting(error)
        self._fail_load(error)
        self._on_bye()
        self._schedule_retire(str(error), self.timeouts.retire_s)

    # -- retirement ------------------------------------------------------------------

    def _schedule_retire(self, reason: str, deadline_s: float) -> None:
        if self._retire_task is None and self._loop is not None:
            self._retire_task = self._loop.create_task(self._retire_once(reason, deadline_s))

    async def _retire(self, reason: str, deadline_s: float) -> RetireOutcome | None:
        self._schedule_retire(reason, deadline_s)
        assert self._retire_task is not None
        return await asyncio.shield(self._retire_task)

    async def _retire_once(self, reason: str, deadline_s: float) -> RetireOutcome | None:
        worker = self._worker
        outcome: RetireOutcome | None = None
        if worker is not None:
            loop = asyncio.get_running_loop()
            self._before_retire(worker)
            remote = None
            if self._other is not None and self._announced is not None:
                # The worker's native tree goes first, confirmed by its identity; then the
                # launcher, which would otherwise leave that tree running.
                other, announced = self._other, self._announced
                remote = await loop.run_in_executor(
                    None,
                    lambda: end_announced_tree(other, announced, deadline_s=deadline_s / 2),
                )
            outcome = await loop.run_in_executor(None, worker.retire, deadline_s)
            if remote is not None and not remote.confirmed_gone:
                outcome = dataclasses.replace(
                    outcome,
                    verified=False,
                    confirmed_gone=False,
                    pid=remote.pid,
                    detail=remote.detail,
                )
        if self._channel is not None:
            self._channel.close()
        await self._after_retire(outcome)
        if outcome is not None and self._events is not None:
            self._events.publish(
                WorkerRetired(
                    stage=self.name,
                    pid=outcome.pid,
                    reason=reason,
                    confirmed_gone=outcome.confirmed_gone,
                )
            )
        return outcome

    def _settle(
        self,
        why: str | None,
        survivors: Sequence[ProcessIdentity],
        cleanup: Callable[[], None],
    ) -> None:
        """Release the reservation (``why`` None) or quarantine it; see ``settle_reservation``."""
        reservation, self._reservation = self._reservation, None
        self._late_exit_watch = settle_reservation(
            self._ledger,
            reservation,
            why,
            stage=self.name,
            survivors=survivors,
            cleanup=cleanup,
        )

    @property
    def late_exit_watch(self) -> threading.Thread | None:
        """The watcher releasing a quarantine once a retired tree's survivors exit, if any."""
        return self._late_exit_watch

    async def wait_retired(self) -> RetireOutcome | None:
        """Wait for a retirement already under way (after a failure); None if none is."""
        if self._retire_task is None:
            return None
        return await asyncio.shield(self._retire_task)

    async def close(self) -> None:
        """Shut the worker down (sentinel, then bounded retirement) and settle the ledger."""
        if self._closed:
            await self.wait_retired()
            return
        self._closed = True
        self._close_waiting()
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        channel = self._channel
        # Only a worker that answered its load reads a shutdown: one still starting or loading
        # (a vLLM engine takes tens of seconds) is retired at once instead of awaiting a bye.
        answered = self._load_future is not None and self._load_future.done()
        if self._failure is None and channel is not None and answered:
            self._bye = self._loop.create_future()
            try:
                channel.send_message(
                    ShutdownMessage(), owner=self.name, from_loop=channel.loop_reading
                )
                await asyncio.wait_for(self._bye, self.timeouts.shutdown_s)
            except (ExecutionError, TimeoutError):
                pass
        await self._retire(self._CLOSE_REASON, self.timeouts.retire_s)
