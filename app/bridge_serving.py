"""The Serve switch's half of the studio's bridge: the local server for the open pipeline.

:class:`ServeSwitch` belongs to :class:`app.bridge.RuntimeBridge` and keeps its rules: the
server starts and stops on the bridge's control thread, and what the server's thread
reports (each answered request) reaches the GUI thread only through the bridge's ``post``.
No other studio module imports :mod:`runtime.serve`.
"""

from __future__ import annotations

import dataclasses
import importlib
from functools import partial
from typing import TYPE_CHECKING

from app.models import QueueLine, ServedLine, ServeView
from runtime.errors import OmniError

if TYPE_CHECKING:
    from collections.abc import Callable

    from runtime.config import PipelineConfig
    from runtime.devices import DeviceSelection, Topology
    from runtime.ledger import ResourceLedger
    from runtime.serve import OmniServer, ServedRequest

#: Requests the Serve panel lists.
SERVED_SHOWN = 50


def serve_unavailable_reason() -> str | None:
    """Why this build cannot serve (the desktop build leaves the server out), or None."""
    try:
        importlib.import_module("runtime.serve")
    except ImportError as exc:
        return (
            f"this build has no HTTP server ({exc.name} is not included); install the "
            "omni-edge-studio Python package to serve (omni-edge serve)"
        )
    return None


class ServeSwitch:
    """Serve the open pipeline on 127.0.0.1:``port`` (0: any free port; None: the server's
    default), apart from the studio's own run (its stages load again for the server).

    ``submit`` runs a job on the control thread, ``post`` a callback on the GUI thread,
    ``emit`` shows a :class:`ServeView`, ``line`` writes a line to the studio's log, and
    ``machine`` gives the control thread's topology and device selection."""

    def __init__(
        self,
        *,
        submit: Callable[[Callable[[], None]], None],
        post: Callable[[Callable[[], None]], None],
        emit: Callable[[ServeView], None],
        line: Callable[[str], None],
        machine: Callable[[], tuple[Topology | None, DeviceSelection]],
        unavailable: str | None,
        ledger: ResourceLedger | None = None,
    ) -> None:
        #: The studio's ledger: what the server loads counts against the same memory.
        self.ledger = ledger
        self._submit = submit
        self._post = post
        self._emit = emit
        self._line = line
        self._machine = machine
        self.unavailable = unavailable
        self.port: int | None = None
        self.view = ServeView()
        # Control-thread state.
        self._server: OmniServer | None = None

    def start(self, config: PipelineConfig) -> bool:
        """False when a server runs already or this build cannot serve (GUI thread)."""
        if self.view.state not in ("stopped", "failed"):
            return False
        if self.unavailable is not None:
            self._show(ServeView(state="failed", error=self.unavailable))
            return False
        self._show(ServeView(state="starting"))
        self._submit(partial(self._start_job, config, self.port))
        return True

    def stop(self) -> bool:
        """Stop the server and close its pipelines; False when none runs (GUI thread)."""
        view = self.view
        if view.state not in ("starting", "serving"):
            return False
        self._show(dataclasses.replace(view, state="stopping", error=None))
        self._submit(self.stop_job)
        return True

    # -- control thread --------------------------------------------------------------

    def _start_job(self, config: PipelineConfig, port: int | None) -> None:
        from runtime.serve import OmniServer, ServeOptions
        from runtime.serve.endpoints import ENDPOINTS

        topology, selection = self._machine()
        options = ServeOptions() if port is None else ServeOptions(port=port)
        server = OmniServer(
            [config],
            options,
            topology=topology,
            selection=selection,
            progress=lambda text: self._line(f"serve: {text}"),
            ledger=self.ledger,
        )
        try:
            server.start()
            server.start_background()
        except OmniError as exc:
            server.close()
            self._post(partial(self._show, ServeView(state="failed", error=str(exc))))
            return
        # Called on the server's thread for each answered request.
        server.stats.listener = lambda served: self._post(partial(self._served, served))
        # Called on the server's thread whenever a pipeline's queue grows or shrinks.
        server.stats.queue_listener = lambda name, depth: self._post(
            partial(self._queued, name, depth)
        )
        self._server = server
        registry = server.registry
        models = tuple(registry.pipelines) if registry is not None else ()
        max_queue = server.options.max_queue
        view = ServeView(
            state="serving",
            address=server.address,
            models=models,
            endpoints=tuple(str(endpoint) for endpoint in ENDPOINTS),
            queues=tuple(QueueLine(model, 0, max_queue) for model in models),
        )
        self._post(partial(self._show, view))
        self._line(f"serving {', '.join(models)} at {server.address}")

    def stop_job(self) -> None:
        """Stop the server, if one runs (control thread)."""
        server, self._server = self._server, None
        if server is not None:
            server.stats.listener = None
            server.stats.queue_listener = None
            server.close()
            self._line("stopped serving")
        self._post(partial(self._show, ServeView(state="stopped")))

    # -- GUI thread --------------------------------------------------------------------

    def _show(self, view: ServeView) -> None:
        self.view = view
        self._emit(view)

    def _served(self, served: ServedRequest) -> None:
        view = self.view
        if view.state != "serving":
            return
        line = ServedLine(
            served.method, served.path, served.model, served.status, served.duration_s
        )
        self._show(
            dataclasses.replace(
                view, served=view.served + 1, recent=(*view.recent, line)[-SERVED_SHOWN:]
            )
        )

    def _queued(self, name: str, depth: int) -> None:
        view = self.view
        if view.state != "serving":
            return
        queues = tuple(
            dataclasses.replace(queue, queued=depth) if queue.model == name else queue
            for queue in view.queues
        )
        self._show(dataclasses.replace(view, queues=queues))
