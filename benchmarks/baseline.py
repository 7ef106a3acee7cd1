"""The in-process baseline of the graph figures: the session the worker creates for a bundle,
made in this process with the worker's own code, and a call on it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from benchmarks import graphs
from workers.ort_session import create_session, load_verified_graph

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    import numpy as np
    import onnxruntime as ort

    from runtime.artifacts import VerifiedBundle


def in_process_session(
    bundle: VerifiedBundle, *, intra_op_threads: int = 0, allow_spinning: bool = True
) -> ort.InferenceSession:
    """The session the worker creates for ``bundle`` on the demos' CPU route, made here with
    the thread options the plan gave the worker."""
    loaded = load_verified_graph(bundle.manifest_path, bundle.identity)
    return create_session(
        loaded,
        [graphs.CPU],
        [graphs.CPU],
        graphs.CPU,
        intra_op_threads=intra_op_threads,
        allow_spinning=allow_spinning,
    )


def session_call(
    session: ort.InferenceSession, inputs: Mapping[str, np.ndarray]
) -> Callable[[], object]:
    feed = dict(inputs)
    return lambda: session.run(None, feed)
