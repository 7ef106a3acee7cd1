"""The two-process floor of a graph call: what any design with a worker process pays.

A second Python process holds the same session (made by :func:`baseline.in_process_session`
with the plan's thread options) bound once, with ONNX Runtime's I/O binding, to a shared-memory
segment for its inputs and outputs. One call is: the caller copies the inputs into the segment,
writes one byte to a pipe, the worker runs and writes one byte back, and the caller copies the
outputs out (the copy ``Omni.run`` returns). No framing, no checks, no bookkeeping: each side
does only what crossing the process boundary needs. The same loop without the two copies shows
what the wake-ups alone cost.

:class:`FloorWorker` gives the floor's calls to time beside others: the graph benchmark times
them in the same alternating batches as the pipeline and the in-process session, so the
pipeline's ratio to the floor is measured side by side (:func:`measure_floor` times the floor
against the in-process session alone). POSIX only (the pipes are handed to the worker by
descriptor).
"""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from benchmarks.child import child_environment
from benchmarks.graphs import PROJECT_ROOT
from benchmarks.stats import Samples, interleaved, ms, rounded

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    import onnxruntime as ort

    from benchmarks.figures import Detail
    from runtime.artifacts import VerifiedBundle

#: Why the floor is not measured on Windows.
NOT_ON_WINDOWS: Final = "not measured: the worker's pipes are passed by descriptor (POSIX)"
#: Seconds the worker may take to stop once told.
STOP_TIMEOUT_S: Final = 30.0
_ALIGN: Final = 64
#: Where the segment lives: shared memory where the system has it.
_SHM_DIR: Final = Path("/dev/shm")


def _layout(
    inputs: Mapping[str, np.ndarray], outputs: Mapping[str, tuple[tuple[int, ...], str]]
) -> tuple[dict[str, int], dict[str, int], int]:
    """Offsets of every input and output in the segment, and its size."""
    offset = 0
    placed_in: dict[str, int] = {}
    for name, array in inputs.items():
        placed_in[name] = offset
        offset += -(-array.nbytes // _ALIGN) * _ALIGN
    placed_out: dict[str, int] = {}
    for name, (shape, dtype) in outputs.items():
        placed_out[name] = offset
        offset += -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // _ALIGN) * _ALIGN
    return placed_in, placed_out, max(offset, _ALIGN)


class FloorWorker:
    """The floor's second process, bound to its segment; a context manager.

    :meth:`call` gives the floor's call with or without its two copies, to be timed beside
    other calls (in alternating batches) by the caller. Leaving the context stops the worker
    and removes the segment and the pipes, whatever happened."""

    def __init__(
        self,
        bundle: VerifiedBundle,
        inputs: Mapping[str, np.ndarray],
        session: ort.InferenceSession,
        *,
        intra_op_threads: int,
        allow_spinning: bool,
        python: str | None = None,
    ) -> None:
        """``session`` is the in-process session of ``bundle`` made with the same thread
        options; its outputs for ``inputs`` are what the worker's first call must give."""
        self._bundle = bundle
        self._feed = {name: np.ascontiguousarray(array) for name, array in inputs.items()}
        self._threads = intra_op_threads
        self._spinning = allow_spinning
        self._expected = list(session.run(None, self._feed))
        self._outputs = {
            meta.name: (tuple(value.shape), str(value.dtype))
            for meta, value in zip(session.get_outputs(), self._expected, strict=True)
        }
        self._python = python or sys.executable
        self._owned: list[int] = []
        self._worker: subprocess.Popen[bytes] | None = None
        self._mapping: mmap.mmap | None = None
        self._path: str | None = None
        self._views_in: dict[str, np.ndarray] = {}
        self._views_out: dict[str, np.ndarray] = {}
        self._write_fd = self._read_fd = -1

    def __enter__(self) -> FloorWorker:
        try:
            self._start()
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            if self._worker is not None and self._worker.poll() is None and exc_info[0] is None:
                os.write(self._write_fd, b"q")
                self._worker.wait(STOP_TIMEOUT_S)
        finally:
            self._close()

    def _start(self) -> None:
        feed, outputs = self._feed, self._outputs
        placed_in, placed_out, size = _layout(feed, outputs)
        folder = _SHM_DIR if _SHM_DIR.is_dir() else None
        descriptor, self._path = tempfile.mkstemp(prefix="bench-floor-", dir=folder)
        self._owned.append(descriptor)
        to_worker = os.pipe()
        self._owned.extend(to_worker)
        to_caller = os.pipe()
        self._owned.extend(to_caller)
        os.ftruncate(descriptor, size)
        self._mapping = mmap.mmap(descriptor, size)
        memory = np.frombuffer(self._mapping, np.uint8)
        self._views_in = {
            name: _view(memory, placed_in[name], a.shape, a.dtype) for name, a in feed.items()
        }
        self._views_out = {
            name: _view(memory, placed_out[name], shape, np.dtype(dtype))
            for name, (shape, dtype) in outputs.items()
        }
        spec = {
            "manifest": str(self._bundle.manifest_path),
            "segment": self._path,
            "threads": self._threads,
            "spinning": self._spinning,
            "inputs": {n: [placed_in[n], list(a.shape), str(a.dtype)] for n, a in feed.items()},
            "outputs": {n: [placed_out[n], list(s), d] for n, (s, d) in outputs.items()},
            "read_fd": to_worker[0],
            "write_fd": to_caller[1],
        }
        self._worker = subprocess.Popen(
            [self._python, "-m", "benchmarks.pipe_floor", json.dumps(spec)],
            pass_fds=(to_worker[0], to_caller[1]),
            stdin=subprocess.DEVNULL,
            cwd=PROJECT_ROOT,
            env=child_environment(None),
        )
        # The worker's ends are its own now: a worker that dies reads as the end of the pipe.
        for fd in (to_worker[0], to_caller[1]):
            self._owned.remove(fd)
            os.close(fd)
        self._write_fd, self._read_fd = to_worker[1], to_caller[0]
        for name, array in feed.items():
            np.copyto(self._views_in[name], array)
        self.call(copies=False)()
        for name, value in zip(outputs, self._expected, strict=True):
            np.testing.assert_allclose(self._views_out[name], value, rtol=1e-4, atol=1e-5)

    def call(self, *, copies: bool) -> Callable[[], object]:
        """One floor call: with ``copies``, the inputs copied into the segment before it and
        the outputs copied out after it. RuntimeError when the worker has stopped."""
        feed, views_in, views_out = self._feed, self._views_in, self._views_out
        write_fd, read_fd = self._write_fd, self._read_fd

        def through() -> object:
            if copies:
                for name, array in feed.items():
                    np.copyto(views_in[name], array)
            try:
                os.write(write_fd, b"c")
            except BrokenPipeError:
                # A worker that ended before the call closed its end of the pipe.
                raise RuntimeError("the floor's worker stopped") from None
            if os.read(read_fd, 1) != b"r":
                raise RuntimeError("the floor's worker stopped")
            if copies:
                return {name: view.copy() for name, view in views_out.items()}
            return views_out

        return through

    def _close(self) -> None:
        worker = self._worker
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait()
        for fd in self._owned:
            os.close(fd)
        self._owned.clear()
        self._views_in.clear()
        self._views_out.clear()
        if self._mapping is not None:
            try:
                self._mapping.close()
            except BufferError:
                pass
            self._mapping = None
        if self._path is not None:
            Path(self._path).unlink(missing_ok=True)
            self._path = None


def floor_details(floor: Samples, bare: Samples, direct: Samples) -> dict[str, Detail]:
    """The floor's p50s in ms, and against the in-process session's, of one interleaving."""
    return {
        "floor_p50_ms": rounded(ms(floor.p50)),
        "floor_without_copies_p50_ms": rounded(ms(bare.p50)),
        "floor_in_process_p50_ms": rounded(ms(direct.p50)),
        "floor_ratio": rounded(floor.p50 / direct.p50),
        "floor_without_copies_ratio": rounded(bare.p50 / direct.p50),
    }


def measure_floor(
    bundle: VerifiedBundle,
    inputs: Mapping[str, np.ndarray],
    *,
    intra_op_threads: int,
    allow_spinning: bool,
    rounds: int,
    batch: int,
    warmup: int,
    python: str | None = None,
) -> dict[str, Detail]:
    """The floor's p50s in ms beside the in-process session's, measured in one harness.

    ``python`` runs the worker (default: this interpreter). RuntimeError when the worker
    stops before the measurement ends; nothing is left behind either way."""
    from benchmarks.baseline import in_process_session, session_call

    if sys.platform == "win32":
        return {"floor": NOT_ON_WINDOWS}
    session = in_process_session(
        bundle, intra_op_threads=intra_op_threads, allow_spinning=allow_spinning
    )
    feed = {name: np.ascontiguousarray(array) for name, array in inputs.items()}
    with FloorWorker(
        bundle,
        feed,
        session,
        intra_op_threads=intra_op_threads,
        allow_spinning=allow_spinning,
        python=python,
    ) as worker:
        floor, bare, direct = interleaved(
            [worker.call(copies=True), worker.call(copies=False), session_call(session, feed)],
            warmup=warmup,
            rounds=rounds,
            batch=batch,
        )
    return floor_details(floor, bare, direct)


def _view(
    memory: np.ndarray[Any, Any], offset: int, shape: Sequence[int], dtype: np.dtype[Any]
) -> np.ndarray[Any, Any]:
    count = int(np.prod(shape))
    return memory[offset : offset + count * dtype.itemsize].view(dtype).reshape(tuple(shape))


def _worker(argv: Sequence[str]) -> int:
    """The floor's worker: the session bound once to the segment, one byte in, one out."""
    import onnxruntime as ort

    from benchmarks.baseline import in_process_session
    from runtime.artifacts import verify_bundle

    spec: dict[str, Any] = json.loads(argv[0])
    session = in_process_session(
        verify_bundle(spec["manifest"]),
        intra_op_threads=int(spec["threads"]),
        allow_spinning=bool(spec["spinning"]),
    )
    descriptor = os.open(spec["segment"], os.O_RDWR)
    mapping = mmap.mmap(descriptor, os.fstat(descriptor).st_size)
    os.close(descriptor)
    memory = np.frombuffer(mapping, np.uint8)
    binding = session.io_binding()
    for key, bind in (("inputs", binding.bind_input), ("outputs", binding.bind_output)):
        for name, (offset, shape, dtype) in spec[key].items():
            array = _view(memory, offset, shape, np.dtype(dtype))
            bind(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)
    options = ort.RunOptions()
    read_fd, write_fd = int(spec["read_fd"]), int(spec["write_fd"])
    while os.read(read_fd, 1) == b"c":
        session.run_with_iobinding(binding, options)
        os.write(write_fd, b"r")
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))
