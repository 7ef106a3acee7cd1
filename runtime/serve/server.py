"""Running the server: safe defaults, uvicorn in the caller's thread or a background thread.

The server binds to 127.0.0.1 unless told otherwise; any other address requires an API key
(read from an environment variable), so that nothing on the network reaches the pipelines
unauthenticated.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from runtime.errors import UsageError
from runtime.serve.app import ServeApp, ServeStats
from runtime.serve.limits import ServeLimits
from runtime.serve.queueing import DEFAULT_MAX_QUEUE
from runtime.serve.registry import PipelineRegistry

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    import uvicorn

    from runtime.config import PipelineConfig
    from runtime.devices import DeviceSelection, Topology
    from runtime.ledger import ResourceLedger

log = logging.getLogger("omni.serve")

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8080
#: The most requests ``--max-queue`` lets wait for one pipeline.
MAX_QUEUE_LIMIT: Final = 10_000
#: How long a background server may take to bind, and to stop.
START_TIMEOUT_S: Final = 30.0
STOP_TIMEOUT_S: Final = 30.0


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def resolve_api_key(host: str, api_key_env: str | None) -> str | None:
    """The API key the server requires, read from ``api_key_env``; a non-loopback ``host``
    without one, or a variable that is unset or empty, is a UsageError saying what to do."""
    if api_key_env is None:
        if not is_loopback(host):
            raise UsageError(
                f"--host {host} is reachable from other machines; accepted: a loopback host "
                "(127.0.0.1, the default), or --api-key-env VAR naming an environment variable "
                "that holds the key clients must send"
            )
        return None
    key = os.environ.get(api_key_env, "")
    if not key.strip():
        raise UsageError(
            f"--api-key-env {api_key_env}: the variable is "
            f"{'empty' if api_key_env in os.environ else 'not set'}; accepted: the name of a "
            "variable holding a non-empty key"
        )
    return key.strip()


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """Where to listen and what to require. ``port`` 0 picks a free port; ``max_queue``
    requests may wait for each busy pipeline (0: none, a busy pipeline answers 429)."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = None
    limits: ServeLimits = field(default_factory=ServeLimits)
    max_queue: int = DEFAULT_MAX_QUEUE

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise UsageError(f"--port {self.port}; accepted: 0 to 65535 (0: a free port)")
        if not 0 <= self.max_queue <= MAX_QUEUE_LIMIT:
            raise UsageError(
                f"--max-queue {self.max_queue}; accepted: 0 (no queue: a busy pipeline answers "
                f"429 at once) to {MAX_QUEUE_LIMIT} requests waiting per pipeline"
            )
        if self.api_key is None and not is_loopback(self.host):
            raise UsageError(
                f"host {self.host} is not a loopback address; accepted: an API key with it"
            )


def _uvicorn_server(app: ServeApp) -> uvicorn.Server:
    import uvicorn

    config = uvicorn.Config(
        app.asgi, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5
    )
    return uvicorn.Server(config)


def _bind(options: ServeOptions) -> socket.socket:
    family = socket.AF_INET6 if ":" in options.host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((options.host.strip("[]"), options.port))
    except OSError as exc:
        sock.close()
        raise UsageError(
            f"cannot listen on {options.host}:{options.port}: {exc.strerror}; accepted: a free "
            "port (--port), or 0 for any"
        ) from None
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


class OmniServer:
    """The served pipelines and the HTTP server over them. :meth:`start` loads every
    pipeline and binds; :meth:`serve_forever` (CLI) or :meth:`start_background` (studio)
    runs it; :meth:`close` stops serving and closes every pipeline. Idempotent."""

    def __init__(
        self,
        pipelines: Sequence[str | Path | PipelineConfig],
        options: ServeOptions | None = None,
        *,
        topology: Topology | None = None,
        selection: DeviceSelection | None = None,
        progress: Callable[[str], None] | None = None,
        ledger: ResourceLedger | None = None,
    ) -> None:
        self.options = options or ServeOptions()
        #: The ledger the pipelines reserve in (None: one of the server's own).
        self.ledger = ledger
        self._pipelines = list(pipelines)
        self._topology = topology
        self._selection = selection
        self._progress = progress
        self.stats = ServeStats()
        self.registry: PipelineRegistry | None = None
        self.app: ServeApp | None = None
        self._socket: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def address(self) -> str:
        """The base URL clients use (``http://host:port/v1``)."""
        if self._socket is None:
            raise UsageError("the server is not started")
        host, port = self._socket.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/v1"

    def start(self) -> ServeApp:
        """Load every pipeline, bind the socket; nothing is served until run."""
        self.registry = PipelineRegistry(
            self._pipelines,
            topology=self._topology,
            selection=self._selection,
            progress=self._progress,
            ledger=self.ledger,
        )
        try:
            self._socket = _bind(self.options)
            app = ServeApp(
                self.registry,
                api_key=self.options.api_key,
                limits=self.options.limits,
                stats=self.stats,
                max_queue=self.options.max_queue,
            )
            self.app = app
            self._server = _uvicorn_server(app)
        except BaseException:
            self.close()
            raise
        return app

    def serve_forever(self) -> int:
        """Serve until SIGINT or SIGTERM, then close everything; returns the signal's number.

        The HTTP server runs in its thread (as for the studio); this thread waits for the
        signal, so that closing the pipelines always runs here, whatever stopped it."""
        received: list[int] = []
        stop = threading.Event()

        def on_signal(signum: int, frame: object) -> None:
            received.append(signum)
            stop.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.start_background()
            thread = self._thread
            while not stop.wait(0.5):
                if thread is None or not thread.is_alive():
                    break
        finally:
            self.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return received[0] if received else 0

    def start_background(self) -> None:
        """Serve from a thread of its own; returns once the server listens."""
        server, sock = self._server, self._socket
        assert server is not None
        assert sock is not None
        self._thread = threading.Thread(
            target=lambda: asyncio.run(server.serve(sockets=[sock])),
            name="omni-serve-http",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.02)
        if not server.started:
            self.close()
            raise UsageError(f"the server did not start listening within {START_TIMEOUT_S} s")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        server, thread = self._server, self._thread
        if self.app is not None:
            # Queued requests get their 503 now rather than wait out the HTTP server's stop.
            self.app.close_queues()
        if server is not None:
            server.should_exit = True
        if thread is not None and thread is not threading.current_thread():
            thread.join(STOP_TIMEOUT_S)
            if thread.is_alive():
                log.error("the HTTP server thread did not stop within %s s", STOP_TIMEOUT_S)
        if self._socket is not None:
            self._socket.close()
        if self.registry is not None:
            self.registry.close()

    def __enter__(self) -> OmniServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
