"""The loaded pipelines of the studio's bridge: the open one and those kept warm beside it.

:class:`LoadedPipelines` is the bridge's control-thread state: every method runs in a control
job (:class:`app.control.ControlThread`), one at a time, so none of it needs a lock. The
one thing another thread may do is cancel a load under way (:meth:`PendingLoad.cancel`,
from the GUI thread, never waiting).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runtime.api import LoadCancelled, PipelineSession
from runtime.errors import AdmissionRefused, UsageError
from runtime.events import EventBus, LoadProgress

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from runtime.api import RequestHandle, Resolution
    from runtime.config import PipelineConfig
    from runtime.devices import DeviceSelection, Topology
    from runtime.events import Event
    from runtime.ledger import ResourceLedger

__all__ = ["LoadCancelled", "LoadedPipeline", "LoadedPipelines", "PendingLoad"]


class PendingLoad:
    """One load of a pipeline's stages: the control thread starts it, the GUI thread may
    cancel it at any moment without waiting."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._session: PipelineSession | None = None
        self.cancelled = False
        #: What the GUI thread has seen of it (GUI thread only).
        self.progress = LoadProgress()

    def attach(self, session: PipelineSession) -> bool:
        """The session about to load (control thread); False once cancelled."""
        with self._lock:
            if self.cancelled:
                return False
            self._session = session
            return True

    def detach(self) -> None:
        with self._lock:
            self._session = None

    def cancel(self) -> None:
        """Stop the load (any thread, never waits); the control thread unwinds it."""
        with self._lock:
            self.cancelled = True
            session = self._session
        if session is not None:
            session.cancel_load()


@dataclass
class LoadedPipeline:
    """One loaded pipeline's session and what undoes its event subscriptions."""

    session: PipelineSession
    unsubscribe: Callable[[], None]

    @property
    def config(self) -> PipelineConfig:
        return self.session.config

    def usable(self) -> bool:
        return self.session.usable

    def close(self) -> None:
        try:
            self.session.close()
        finally:
            self.unsubscribe()


class LoadedPipelines:
    """The open pipeline's stages, once loaded, and those kept warm (control thread only).

    ``ledger`` is the studio's (the machine's memory), ``machine`` gives the topology and
    device selection loads use, ``line`` writes a studio log line, and each load's events go
    to ``on_event`` and ``on_load_event`` (runtime threads).
    """

    def __init__(
        self,
        *,
        ledger: ResourceLedger,
        machine: Callable[[], tuple[Topology | None, DeviceSelection]],
        line: Callable[[str], None],
        on_event: Callable[[Event], None],
        on_load_event: Callable[[PendingLoad, Event], None],
    ) -> None:
        self._ledger = ledger
        self._machine = machine
        self._line = line
        self._on_event = on_event
        self._on_load_event = on_load_event
        self.open: LoadedPipeline | None = None
        #: Loaded pipelines other than the open one, by source file, oldest first.
        self._warm: dict[Path | None, LoadedPipeline] = {}

    def load(
        self, config: PipelineConfig, pending: PendingLoad, resolution: Resolution | None = None
    ) -> None:
        """Load ``config``'s stages as the open pipeline, making room by unloading the warm
        ones, oldest first, when the machine's memory is held by them; raises what stopped
        it (:class:`LoadCancelled` once cancelled), with everything it began unwound."""
        events = EventBus()
        detach = (
            events.subscribe(self._on_event),
            events.subscribe(lambda event: self._on_load_event(pending, event)),
        )

        def unsubscribe() -> None:
            for undo in detach:
                undo()

        topology, selection = self._machine()
        while True:
            try:
                # The ledger's capacities are the machine's (declared by the first load); the
                # pipeline's own capacities are its ceiling, checked against its demands.
                session = PipelineSession(
                    config,
                    ledger=self._ledger,
                    events=events,
                    topology=topology,
                    selection=selection,
                    resolution=resolution,
                )
                if not pending.attach(session):
                    raise LoadCancelled(f"loading pipeline {config.pipeline} was cancelled")
                try:
                    session.load()
                finally:
                    pending.detach()
            except AdmissionRefused as exc:
                if exc.holders and self._warm:
                    # Pipelines kept warm hold the memory: the oldest makes room.
                    source, warm = next(iter(self._warm.items()))
                    del self._warm[source]
                    self._line(
                        f"unloading {warm.config.pipeline} to make room for "
                        f"{config.pipeline} ({exc})"
                    )
                    warm.close()
                    continue
                unsubscribe()
                raise
            except BaseException:
                unsubscribe()
                raise
            break
        self.open = LoadedPipeline(session, unsubscribe)

    def reopen(self, config: PipelineConfig) -> LoadedPipeline | None:
        """Make the warm pipeline of ``config``'s file the open one again, if it is still
        loaded as ``config`` says and usable; one that changed or lost a worker is closed."""
        warm = self._warm.pop(config.source, None)
        if warm is not None and warm.config == config and warm.usable():
            self.open = warm
            return warm
        if warm is not None:  # the file changed, or a worker of it was retired
            warm.close()
        return None

    def session(self) -> PipelineSession:
        """The open pipeline's loaded session (to start a spoken conversation on)."""
        loaded = self.open
        if loaded is None:
            raise UsageError("the pipeline is not loaded")
        return loaded.session

    def submit(self, request_input: object) -> RequestHandle:
        return self.session().submit(request_input)

    def cancel(self, request_id: str) -> None:
        loaded = self.open
        if loaded is not None:
            loaded.session.cancel(request_id, wait=True)

    def settle(self, *, cancelled: bool, keep_after_cancel: bool) -> bool:
        """After a request: keep the stages warm when it completed or failed and they are all
        usable (True); after a cancel (unless asked to keep them) or a retired worker unload
        them, so nothing stays held."""
        loaded = self.open
        keep = loaded is not None and (not cancelled or keep_after_cancel) and loaded.usable()
        if loaded is not None and not keep:
            self.unload()
        return keep

    def unload(self) -> None:
        """Unload the open pipeline and every one kept warm."""
        self.close_open()
        self.unload_warm()

    def close_open(self) -> None:
        """Close the open pipeline's stages (those of a load cancelled too late), not the warm."""
        loaded, self.open = self.open, None
        if loaded is not None:
            loaded.close()

    def unload_warm(self) -> None:
        warm, self._warm = list(self._warm.values()), {}
        for loaded in warm:
            loaded.close()

    def keep_warm(self) -> bool:
        """Another pipeline is being opened: keep the loaded one warm, while it is usable;
        True when one was kept."""
        loaded, self.open = self.open, None
        if loaded is None:
            return False
        if not loaded.usable():
            loaded.close()
            return False
        self._warm[loaded.config.source] = loaded
        return True
