"""The vLLM worker's protocol edges, run with this interpreter (which has no vLLM).

Everything here happens before the worker imports vLLM, or is the import failing: the
handshake, the first-message rules, the model-directory check and the load failure.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, cast

import pytest

from runtime.backends.vllm_client import VllmRoute, VllmStageSpec, start_vllm_stage
from runtime.contracts import FrameLimits
from runtime.contracts.codec import FrameDecoder, encode_frame
from runtime.contracts.llm_messages import (
    LLM_WORKER_TO_CONTROLLER,
    DeltaMessage,
    EngineArgs,
    GenerateMessage,
    LlmErrorMessage,
    LlmLoadMessage,
    LlmStatsMessage,
    SamplingSpec,
    decode_llm_message,
)
from runtime.contracts.messages import ByeMessage, ShutdownMessage
from runtime.errors import ModelError
from runtime.host import LaunchSpec, spawn_worker, worker_environment
from runtime.ledger import ResourceLedger
from runtime.transport.channel import FramedChannel
from runtime.transport.handshake import expect_hello
from workers import vllm_worker

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 60.0


class Worker:
    """A vLLM worker process on this interpreter, with a controller-side channel."""

    def __init__(self, *, with_generation: bool = True) -> None:
        env = worker_environment({}, generation=3, project_root=REPO_ROOT)
        if not with_generation:
            del env["OMNI_EDGE_WORKER_GENERATION"]
        spec = LaunchSpec(
            argv=(sys.executable, "-m", "workers.vllm_worker"), env=env, cwd=None, os_domain="posix"
        )
        self.process = spawn_worker(spec, "vllm-test")
        self.channel = FramedChannel(
            cast("BinaryIO", self.process.stdout), cast("BinaryIO", self.process.stdin), name="test"
        )

    def hello(self) -> None:
        hello = expect_hello(
            self.channel, expected_generation=3, expected_pid=self.process.pid, timeout_s=TIMEOUT_S
        )
        assert hello.worker == "vllm"
        assert hello.required_features == ("text-stream",)

    def read(self) -> object:
        frame = self.channel.read_frame(TIMEOUT_S)
        return decode_llm_message(frame, LLM_WORKER_TO_CONTROLLER)

    def close(self) -> None:
        self.channel.close()
        outcome = self.process.retire(10.0)
        assert outcome.confirmed_gone


@pytest.fixture
def worker() -> Iterator[Worker]:
    started = Worker()
    yield started
    started.close()


def _model(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 16)
    return model


def test_shutdown_before_load_says_bye(worker: Worker) -> None:
    worker.hello()
    worker.channel.send_message(ShutdownMessage())
    assert worker.read() == ByeMessage()
    assert worker.process.wait_exit(TIMEOUT_S) == vllm_worker.EXIT_OK


def test_closing_the_stream_before_load_ends_the_worker(worker: Worker) -> None:
    worker.hello()
    worker.channel.close()
    assert worker.process.wait_exit(TIMEOUT_S) == vllm_worker.EXIT_OK


def test_a_request_before_load_is_a_protocol_error(worker: Worker) -> None:
    worker.hello()
    worker.channel.send_message(GenerateMessage("r", 0, "hi", None, SamplingSpec()))
    error = worker.read()
    assert isinstance(error, LlmErrorMessage)
    assert error.fatal
    assert error.code == "unexpected_message"
    assert "expected llm_load, got generate" in error.message
    assert worker.process.wait_exit(TIMEOUT_S) == vllm_worker.EXIT_PROTOCOL


def test_a_malformed_first_frame_is_refused_by_code(worker: Worker) -> None:
    worker.hello()
    worker.process.stdin.write(encode_frame("llm_load", {"model_dir": "/m"}))
    worker.process.stdin.flush()
    error = worker.read()
    assert isinstance(error, LlmErrorMessage)
    assert error.code == "missing_field"
    assert "engine_args" in error.message
    assert worker.process.wait_exit(TIMEOUT_S) == vllm_worker.EXIT_PROTOCOL


def test_a_directory_without_a_model_fails_the_load(worker: Worker, tmp_path: Path) -> None:
    worker.hello()
    worker.channel.send_message(LlmLoadMessage(str(tmp_path), EngineArgs()))
    error = worker.read()
    assert isinstance(error, LlmErrorMessage)
    assert error.fatal
    assert error.code == "load_failed"
    assert f"model directory {tmp_path} has no config.json" in error.message
    assert worker.process.wait_exit(TIMEOUT_S) == vllm_worker.EXIT_LOAD_FAILED


def test_an_interpreter_without_vllm_fails_the_load_by_name(worker: Worker, tmp_path: Path) -> None:
    worker.hello()
    worker.channel.send_message(LlmLoadMessage(str(_model(tmp_path)), EngineArgs()))
    error = worker.read()
    assert isinstance(error, LlmErrorMessage)
    assert error.code == "load_failed"
    assert "No module named 'vllm'" in error.message
    assert worker.process.wait_exit(TIMEOUT_S) == vllm_worker.EXIT_LOAD_FAILED


def test_a_worker_without_its_generation_refuses_to_start() -> None:
    worker = Worker(with_generation=False)
    try:
        assert worker.process.wait_exit(TIMEOUT_S) == vllm_worker.EXIT_USAGE
        assert any("OMNI_EDGE_WORKER_GENERATION" in line for line in worker.process.stderr_tail())
    finally:
        worker.close()


def test_the_client_unwinds_a_failed_load(tmp_path: Path) -> None:
    ledger = ResourceLedger({"machine:ram": 1 << 30}, name="test")
    spec = VllmStageSpec(
        name="llm",
        model_dir=_model(tmp_path),
        engine_args=EngineArgs(kv_cache_memory_bytes=1 << 20),
        route=VllmRoute(interpreter="bundled"),
        demands={"machine:ram": 256 << 20},
    )
    before = {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("oe-vllm-")}
    with pytest.raises(
        ModelError, match="load_failed: ModuleNotFoundError: No module named 'vllm'"
    ):
        asyncio.run(start_vllm_stage(spec, ledger=ledger, owner="t"))
    assert ledger.snapshot().is_empty
    assert {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("oe-vllm-")} == before


def test_messages_of_one_loop_turn_go_out_together_and_in_order() -> None:
    read_fd, write_fd = os.pipe()
    reader = os.fdopen(read_fd, "rb", buffering=0)
    writer = os.fdopen(write_fd, "wb", buffering=0)
    sending = FramedChannel(reader, writer, name="worker-side")
    os.set_blocking(read_fd, False)
    big = "x" * (vllm_worker.BATCHED_DELTA_ITEMS + 1)

    def pending() -> bytes:
        try:
            return os.read(read_fd, 1 << 20)
        except BlockingIOError:
            return b""

    async def scenario() -> bytes:
        worker = vllm_worker.LlmWorker(sending)
        worker._send(DeltaMessage("a", 0, "one", (1,), False, None))
        worker._send(DeltaMessage("b", 0, "two", (2,), False, None))
        worker._send(LlmStatsMessage(1, 1, 1, 2))
        assert pending() == b""  # queued until the loop's turn ends
        # A delta too large to batch flushes what was queued, then goes out itself, at once.
        worker._send(DeltaMessage("a", 0, big, (3,), True, "length"))
        written = pending()
        await asyncio.sleep(0)
        assert pending() == b""
        worker._send(DeltaMessage("c", 0, "three", (4,), True, "stop"))
        await asyncio.sleep(0)
        return written + pending()

    try:
        data = asyncio.run(scenario())
        frames = FrameDecoder(FrameLimits()).feed(data)
        messages = [decode_llm_message(frame, LLM_WORKER_TO_CONTROLLER) for frame in frames]
    finally:
        writer.close()
        reader.close()
    assert [
        (m.request_id, m.text[:5], m.token_ids) for m in messages if isinstance(m, DeltaMessage)
    ] == [("a", "one", (1,)), ("b", "two", (2,)), ("a", "xxxxx", (3,)), ("c", "three", (4,))]
    assert isinstance(messages[2], LlmStatsMessage)
    assert messages[2].in_flight == 2
