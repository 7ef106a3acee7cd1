"""Helpers for the graph worker tests: real bundles, and real worker processes.

Plain functions and classes (no fixtures), so tests elsewhere can import them.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, cast

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from runtime.artifacts import create_bundle
from runtime.contracts.messages import WORKER_TO_CONTROLLER, AckMessage, LoadMessage
from runtime.transport.channel import FramedChannel
from runtime.transport.handshake import expect_hello
from runtime.transport.shm import new_prefix
from runtime.transport.stdio import start_log_pump
from tests.helpers.onnx_graphs import IR_VERSION, OPSET

if TYPE_CHECKING:
    from runtime.contracts.codec import Frame
    from runtime.contracts.messages import Message

CPU = "CPUExecutionProvider"
#: The loop graph's state: [LOOP_ROWS, LOOP_WIDTH] float32, 1 MiB (travels in shared memory).
LOOP_ROWS = 1024
LOOP_WIDTH = 256
#: A step count no test waits for: only cancellation ends such a call.
ENDLESS_STEPS = 10**12
REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER_SCRIPT = REPO_ROOT / "workers" / "ort_worker.py"
#: Seconds a worker gets to answer a control message (start-up imports ONNX Runtime).
REPLY_TIMEOUT_S = 60.0


def identity_of(manifest_path: Path) -> str:
    return hashlib.sha256(manifest_path.read_bytes()).hexdigest()


def loop_weights(width: int = LOOP_WIDTH) -> np.ndarray:
    """The fixed weight matrix of :func:`make_loop_bundle`."""
    rng = np.random.default_rng(7)
    weights = rng.standard_normal((width, width)) / np.sqrt(width)
    return np.asarray(weights, dtype=np.float32)


def loop_reference(x: np.ndarray, steps: int) -> np.ndarray:
    """What the loop graph computes: ``steps`` times ``s = tanh(s @ W)``, from ``s = x``."""
    state = x
    for _ in range(steps):
        state = np.tanh(state @ loop_weights())
    return state


def make_loop_bundle(tmp_path: Path, *, rows: int = LOOP_ROWS, width: int = LOOP_WIDTH) -> Path:
    """A graph that runs ``s = tanh(s @ W)`` for ``n`` steps, ``n`` being an input.

    Inputs: ``x`` float32 [rows, width] (by default [LOOP_ROWS, LOOP_WIDTH], 1 MiB) and ``n``
    int64 scalar (the example uses 1). A call with a huge ``n`` runs for hours unless it is
    cancelled; it stops after the step it is in, so wide steps make a call slow to stop.
    """
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["state_in", "W"], ["product"], name="step_matmul"),
            helper.make_node("Tanh", ["product"], ["state_out"], name="step_tanh"),
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going"),
        ],
        "step",
        [
            helper.make_tensor_value_info("iteration", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("state_in", TensorProto.FLOAT, [rows, width]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("state_out", TensorProto.FLOAT, [rows, width]),
        ],
    )
    graph = helper.make_graph(
        [
            helper.make_node(
                "Constant", [], ["true"], value=numpy_helper.from_array(np.array(True), "true")
            ),
            helper.make_node("Loop", ["n", "true", "x"], ["y"], body=body, name="steps"),
        ],
        "loop",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, width]),
            helper.make_tensor_value_info("n", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, width])],
        initializer=[numpy_helper.from_array(loop_weights(width), "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    source = tmp_path / "src-loop"
    source.mkdir()
    onnx.save_model(model, str(source / "loop.onnx"))
    x = np.random.default_rng(8).standard_normal((rows, width)).astype(np.float32)
    np.savez(source / "inputs.npz", x=x, n=np.array(1, np.int64))
    bundle = create_bundle(source / "loop.onnx", source / "inputs.npz", tmp_path / "loop")
    return bundle.manifest_path


@dataclass
class WorkerProcess:
    """A real ORT worker child process and the controller's end of its channel."""

    process: subprocess.Popen[bytes]
    channel: FramedChannel
    generation: int
    log: list[str] = field(default_factory=list)

    def read(self, timeout_s: float = REPLY_TIMEOUT_S) -> tuple[Message, Frame]:
        """The next message that is not an ``ack``; acks release our shared buffers."""
        while True:
            message, frame = self.channel.read_message(WORKER_TO_CONTROLLER, timeout_s=timeout_s)
            if not isinstance(message, AckMessage):
                return message, frame
            self.channel.acknowledge(message.owner, message.generation)

    def load_message(
        self,
        manifest: Path,
        *,
        identity: str | None = None,
        providers: tuple[str, ...] = (CPU,),
        max_io_bytes: int = 1 << 26,
        binary_headers: bool = False,
    ) -> LoadMessage:
        return LoadMessage(
            manifest_path=str(manifest),
            expected_identity=identity or identity_of(manifest),
            providers=providers,
            allowed_providers=providers,
            target_provider=providers[0],
            max_io_bytes=max_io_bytes,
            min_fraction_on_target=1.0,
            shm_prefix=self.channel.shm_prefix,
            binary_headers=binary_headers,
        )

    def exit_code(self, timeout_s: float = 30.0) -> int:
        return self.process.wait(timeout=timeout_s)


@contextmanager
def running_worker(
    *, by_path: bool = False, generation: int = 1, shm: bool = False
) -> Iterator[WorkerProcess]:
    """Start ``workers/ort_worker.py`` (as a module or by path), check its hello, and on exit
    close the channel and reap the process (killing it if it does not exit)."""
    target = [str(WORKER_SCRIPT)] if by_path else ["-m", "workers.ort_worker"]
    env = dict(os.environ, OMNI_EDGE_WORKER_GENERATION=str(generation))
    # Run by path, the worker must find the project by itself; as a module it needs the path.
    env.pop("PYTHONPATH", None)
    if not by_path:
        env["PYTHONPATH"] = str(REPO_ROOT)
    process = subprocess.Popen(
        [sys.executable, *target],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO_ROOT if not by_path else Path(tempfile.gettempdir()),
    )
    assert process.stdin is not None
    assert process.stdout is not None
    assert process.stderr is not None
    prefix = new_prefix(os.getpid(), generation) if shm else None
    channel = FramedChannel(
        cast("BinaryIO", process.stdout),
        cast("BinaryIO", process.stdin),
        name="controller",
        shm_prefix=prefix,
        same_domain=shm,
    )
    worker = WorkerProcess(process, channel, generation)
    pump: threading.Thread = start_log_pump(
        cast("BinaryIO", process.stderr), worker.log.append, name="ort-worker"
    )
    try:
        expect_hello(
            channel,
            expected_generation=generation,
            expected_pid=process.pid,
            timeout_s=REPLY_TIMEOUT_S,
        )
        yield worker
    finally:
        channel.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        pump.join(5)
