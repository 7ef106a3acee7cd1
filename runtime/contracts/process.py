"""What a controller and its worker processes agree on outside the frames.

The environment variables a worker reads, the prefix of the private folders the controller
makes for graph workers, and the exit statuses of the built-in workers. Defined here once:
the controller (``runtime.host``, ``runtime.backends``) and the workers import them.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "EXIT_ENGINE_DIED",
    "EXIT_LOAD_FAILED",
    "EXIT_OK",
    "EXIT_PROTOCOL",
    "EXIT_USAGE",
    "GENERATION_VARIABLE",
    "GRAPH_TMPDIR_PREFIX",
    "PRIVATE_TMPDIR_VARIABLE",
]

#: The variable through which a worker learns its generation (it echoes it in the handshake).
GENERATION_VARIABLE: Final = "OMNI_EDGE_WORKER_GENERATION"
#: Names a graph worker's private temporary directory, which the worker removes when it exits
#: (a worker outliving a killed controller cleans up after itself).
PRIVATE_TMPDIR_VARIABLE: Final = "OMNI_EDGE_WORKER_TMPDIR"
#: Prefix of the private temporary directories the controller makes for graph workers.
GRAPH_TMPDIR_PREFIX: Final = "oe-graph-"

#: The worker served until shutdown, or its controller closed the stream.
EXIT_OK: Final = 0
#: The worker was started wrongly (its generation variable is missing or malformed).
EXIT_USAGE: Final = 2
#: Loading failed (verification, session or engine creation); reported in a fatal ``error``.
EXIT_LOAD_FAILED: Final = 3
#: The controller broke the protocol.
EXIT_PROTOCOL: Final = 4
#: The vLLM worker's engine died under it.
EXIT_ENGINE_DIED: Final = 5
