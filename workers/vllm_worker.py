"""The vLLM worker process: build vLLM's async engine for a model directory, then stream.

Run as ``python -m workers.vllm_worker`` with an interpreter that has vLLM (the managed
``vllm-cpu`` or ``vllm-cuda`` environment) and the project root on ``PYTHONPATH``. It
speaks the language-model protocol (:mod:`runtime.contracts.llm_messages`) on its
stdin/stdout through a :class:`~runtime.transport.channel.FramedChannel`; everything else
(vLLM's logs among it) goes to stderr. Its generation comes from
``OMNI_EDGE_WORKER_GENERATION``.

1. ``hello`` announces the protocol, the ``text-stream`` feature, pid and generation.
2. ``llm_load`` builds ``AsyncLLM`` from the engine arguments, runs a two-token warm-up
   and answers ``llm_ready`` with the effective limits and the resident memory of the
   worker's whole process tree (vLLM's engine core and its model worker included). A
   failure is a fatal ``llm_error`` and the process exits.
3. Each ``generate`` runs as its own task: vLLM batches concurrent requests. Every engine
   step's new text and token ids go out as one ``delta``; the last one says ``finished``.
   ``abort`` cancels the request's task, which makes vLLM abort it and free its KV cache;
   the request then ends with a ``delta`` whose reason is ``abort``. ``stats`` answers with
   the tree's current memory. ``shutdown`` (or the controller closing stdin) aborts what
   runs, shuts the engine down and answers ``bye``.

vLLM starts its engine processes with ``spawn``, which re-imports this module: everything
runs under the ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if __package__ in (None, ""):
    # Run by path: put the project root (holding `runtime` and `workers`) first on the path.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import psutil

from runtime.contracts.llm_messages import (
    CONTROLLER_TO_LLM_WORKER,
    FINISH_REASONS,
    AbortMessage,
    DeltaMessage,
    GenerateMessage,
    LlmErrorMessage,
    LlmLoadMessage,
    LlmReadyMessage,
    LlmStatsMessage,
    SamplingSpec,
    StatsMessage,
    decode_llm_message,
)
from runtime.contracts.messages import ByeMessage, MessageError, ShutdownMessage
from runtime.contracts.process import (
    EXIT_ENGINE_DIED,
    EXIT_LOAD_FAILED,
    EXIT_OK,
    EXIT_PROTOCOL,
    EXIT_USAGE,
    GENERATION_VARIABLE,
)
from runtime.transport.channel import (
    ChannelClosed,
    FramedChannel,
    ProtocolError,
)
from runtime.transport.handshake import send_hello
from runtime.transport.stdio import claim_worker_stdio, loop_reading_supported

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from runtime.contracts.codec import Frame
    from runtime.contracts.messages import Message

WORKER_NAME: Final = "vllm"

#: Set before vLLM is imported: nothing may reach for the network, and logs stay quiet.
OFFLINE_ENVIRONMENT: Final = {
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
#: How often the engine's health is checked while idle, in seconds.
HEALTH_INTERVAL_S: Final = 0.5
#: How long shutdown waits for aborted requests to wind down, in seconds.
DRAIN_S: Final = 5.0
WARMUP_PROMPT: Final = "warm up"
#: A delta with more text characters plus token ids than this is written on its own: below
#: it, its frame is far under the header limit (at most 16 bytes of JSON per item).
BATCHED_DELTA_ITEMS: Final = 16_384


def _generation() -> int:
    raw = os.environ.get(GENERATION_VARIABLE, "")
    if not raw.isdigit():
        raise ValueError(
            f"{GENERATION_VARIABLE}={raw!r}; accepted: the non-negative integer generation the "
            "controller assigned"
        )
    return int(raw)


def tree_memory() -> tuple[int, int, int]:
    """``(rss, pss, processes)`` of this process and all its descendants.

    RSS counts shared library pages once per process; PSS splits them, so it is what the
    tree really holds (it falls back to RSS where the OS does not report it).
    """
    me = psutil.Process()
    rss = pss = count = 0
    for process in [me, *me.children(recursive=True)]:
        try:
            info = process.memory_info()
            try:
                shared = getattr(process.memory_full_info(), "pss", info.rss)
            except (psutil.AccessDenied, OSError):
                shared = info.rss
        except psutil.NoSuchProcess:
            continue
        rss += info.rss
        pss += int(shared)
        count += 1
    return rss, pss, count


def _sampling_params(vllm: Any, spec: SamplingSpec) -> Any:
    output_kind = importlib.import_module("vllm.sampling_params").RequestOutputKind.DELTA
    return vllm.SamplingParams(
        n=1,
        max_tokens=spec.max_tokens,
        min_tokens=spec.min_tokens,
        temperature=spec.temperature,
        top_p=spec.top_p,
        top_k=spec.top_k,
        seed=spec.seed,
        stop=list(spec.stop),
        stop_token_ids=list(spec.stop_token_ids),
        ignore_eos=spec.ignore_eos,
        output_kind=output_kind,
    )


class LlmWorker:
    """One engine served over one channel, on one asyncio loop."""

    def __init__(self, channel: FramedChannel) -> None:
        self._channel = channel
        self._vllm: Any = None
        self._engine: Any = None
        self._max_num_seqs = 0
        self._tasks: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._exit_code = EXIT_OK
        self._say_bye = False
        # Messages sent during one turn of the loop (every running request's delta of an
        # engine step) go out together in one write, in order.
        self._outbox: list[Message] = []

    # Loading.

    async def load(self, message: LlmLoadMessage) -> LlmReadyMessage:
        """Build the engine and warm it up; any exception means the load failed."""
        started = time.perf_counter()
        for key, value in OFFLINE_ENVIRONMENT.items():
            os.environ.setdefault(key, value)
        model_dir = Path(message.model_dir)
        if not (model_dir / "config.json").is_file():
            raise FileNotFoundError(
                f"model directory {model_dir} has no config.json; accepted: a Hugging Face "
                "model directory (config.json, weights, tokenizer files)"
            )
        vllm = importlib.import_module("vllm")
        async_llm = importlib.import_module("vllm.v1.engine.async_llm")
        arg_utils = importlib.import_module("vllm.engine.arg_utils")
        args = message.engine_args
        options: dict[str, Any] = {
            "model": str(model_dir),
            "tokenizer": str(model_dir),
            "dtype": args.dtype,
            "max_num_seqs": args.max_num_seqs,
            "enforce_eager": args.enforce_eager,
            "seed": args.seed,
            "disable_log_stats": True,
            "trust_remote_code": False,
        }
        if args.max_model_len is not None:
            options["max_model_len"] = args.max_model_len
        if args.kv_cache_memory_bytes is not None:
            options["kv_cache_memory_bytes"] = args.kv_cache_memory_bytes
        if args.gpu_memory_utilization is not None:
            options["gpu_memory_utilization"] = args.gpu_memory_utilization
        engine = async_llm.AsyncLLM.from_engine_args(arg_utils.AsyncEngineArgs(**options))
        self._vllm = vllm
        self._engine = engine
        warm = _sampling_params(vllm, SamplingSpec(max_tokens=2, temperature=0.0))
        async for _ in engine.generate({"prompt": WARMUP_PROMPT}, warm, "warmup"):
            pass
        config = engine.vllm_config
        self._max_num_seqs = int(config.scheduler_config.max_num_seqs)
        platforms = importlib.import_module("vllm.platforms")
        rss, pss, processes = tree_memory()
        return LlmReadyMessage(
            model=str(model_dir),
            vllm_version=str(vllm.__version__),
            device=str(platforms.current_platform.device_type),
            max_num_seqs=self._max_num_seqs,
            max_model_len=int(config.model_config.max_model_len),
            rss_bytes=rss,
            pss_bytes=pss,
            processes=processes,
            load_s=time.perf_counter() - started,
            engine_args=args,
        )

    # Serving.

    async def serve(self) -> int:
        """Answer messages until shutdown, end of input or the engine's death."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if loop_reading_supported(self._channel):
            # POSIX: the loop watches stdin itself, so a request reaches the engine without a
            # thread hop.
            self._channel.start_loop_reader(self._loop, self._on_frame, self._on_input_closed)
        else:
            threading.Thread(target=self._read_loop, name="vllm-worker-reader", daemon=True).start()
        health = asyncio.create_task(self._watch_health())
        await self._stop.wait()
        health.cancel()
        await self._wind_down()
        self._flush()
        if self._say_bye:
            with contextlib.suppress(ChannelClosed):
                self._channel.send_message(ByeMessage())
        return self._exit_code

    def _on_frame(self, frame: Frame) -> None:
        """On the loop: decode one frame from the controller and act on it."""
        if self._stop is not None and self._stop.is_set():
            return  # shutting down: nothing more is started
        try:
            message = decode_llm_message(frame, CONTROLLER_TO_LLM_WORKER)
        except MessageError as exc:
            self._fatal(exc.code, str(exc), EXIT_PROTOCOL)
            return
        self._dispatch(message)

    def _on_input_closed(self, error: BaseException | None) -> None:
        """On the loop: the controller's stream ended (``None``) or broke."""
        if isinstance(error, ProtocolError):
            self._fatal(error.code, error.detail, EXIT_PROTOCOL)
        else:
            self._finish(EXIT_OK, False)

    def _read_loop(self) -> None:
        """Reader thread (where the loop cannot watch stdin): decode, then hand to the loop."""
        while True:
            try:
                frame = self._channel.read_frame()
                message = decode_llm_message(frame, CONTROLLER_TO_LLM_WORKER)
            except ChannelClosed:
                self._post(self._finish, EXIT_OK, False)
                return
            except ProtocolError as exc:
                self._post(self._fatal, exc.code, exc.detail, EXIT_PROTOCOL)
                return
            except MessageError as exc:
                self._post(self._fatal, exc.code, str(exc), EXIT_PROTOCOL)
                return
            self._post(self._dispatch, message)
            if isinstance(message, ShutdownMessage):
                return

    def _post(self, callback: Callable[..., None], *args: object) -> None:
        assert self._loop is not None
        # A closed loop means the worker is already exiting: nothing is left to tell it.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(callback, *args)

    def _dispatch(self, message: Message) -> None:
        if isinstance(message, GenerateMessage):
            self._start(message)
        elif isinstance(message, AbortMessage):
            task = self._tasks.get((message.request_id, message.epoch))
            if task is not None:
                task.cancel()
        elif isinstance(message, StatsMessage):
            rss, pss, processes = tree_memory()
            self._send(LlmStatsMessage(rss, pss, processes, len(self._tasks)))
        elif isinstance(message, ShutdownMessage):
            self._finish(EXIT_OK, True)
        else:
            self._send_error(None, "unexpected_message", f"{message.KIND} after llm_load")

    def _start(self, message: GenerateMessage) -> None:
        key = (message.request_id, message.epoch)
        if key in self._tasks:
            self._send_error(
                key, "duplicate", f"request {message.request_id} epoch {message.epoch} is running"
            )
            return
        if len(self._tasks) >= self._max_num_seqs:
            self._send_error(
                key,
                "busy",
                f"{len(self._tasks)} requests are in flight; max_num_seqs is {self._max_num_seqs}",
            )
            return
        self._tasks[key] = asyncio.create_task(self._generate(message))

    async def _generate(self, message: GenerateMessage) -> None:
        key = (message.request_id, message.epoch)
        prompt: dict[str, Any] = (
            {"prompt": message.prompt}
            if message.prompt is not None
            else {"prompt_token_ids": list(message.prompt_token_ids or ())}
        )
        engine_id = f"{message.request_id}@{message.epoch}"
        try:
            params = _sampling_params(self._vllm, message.sampling)
            async for output in self._engine.generate(prompt, params, engine_id):
                completion = output.outputs[0]
                finished = bool(output.finished)
                reason = None
                if finished:
                    reason = str(completion.finish_reason)
                    if reason not in FINISH_REASONS:
                        self._send_error(key, "engine_error", f"finished with reason {reason!r}")
                        return
                token_ids = tuple(int(token) for token in completion.token_ids)
                if not finished and not token_ids and not completion.text:
                    continue
                prompt_ids = getattr(output, "prompt_token_ids", None) if finished else None
                self._send(
                    DeltaMessage(
                        message.request_id,
                        message.epoch,
                        completion.text,
                        token_ids,
                        finished,
                        reason,
                        None if prompt_ids is None else len(prompt_ids),
                    )
                )
        except asyncio.CancelledError:
            # vLLM's generate() aborted the request on its way out; say it ended.
            self._send(DeltaMessage(message.request_id, message.epoch, "", (), True, "abort"))
        except Exception as exc:  # noqa: BLE001 - a request's failure is reported, not raised
            dead = self._engine is not None and bool(getattr(self._engine, "errored", False))
            if dead:
                self._fatal("engine_died", f"the engine died: {exc}", EXIT_ENGINE_DIED)
            else:
                self._send_error(key, "request_failed", f"{type(exc).__name__}: {exc}")
        finally:
            self._tasks.pop(key, None)

    async def _watch_health(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            if self._engine is not None and bool(getattr(self._engine, "errored", False)):
                self._fatal("engine_died", "vLLM's engine core stopped", EXIT_ENGINE_DIED)
                return

    def _finish(self, code: int, say_bye: bool) -> None:
        if self._stop is None or self._stop.is_set():
            return
        self._exit_code = code
        self._say_bye = say_bye
        self._stop.set()

    def _fatal(self, code: str, text: str, exit_code: int) -> None:
        self._send_error(None, code, text, fatal=True)
        self._finish(exit_code, False)

    async def _wind_down(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=DRAIN_S)
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.shutdown()
            # Collected now, while the interpreter is whole: its finalizer shuts down again.
            del engine
            gc.collect()

    # Sending.

    def _send(self, message: Message) -> None:
        """Queue ``message``; the loop writes what was queued once this turn's callbacks ran.

        A delta too large to be sure it fits a frame is written at once, on its own, so a
        frame over the limits is refused here (to its request) as before.
        """
        if (
            isinstance(message, DeltaMessage)
            and len(message.text) + len(message.token_ids) > BATCHED_DELTA_ITEMS
        ):
            self._flush()
            self._write(message)
            return
        self._outbox.append(message)
        if len(self._outbox) == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        messages, self._outbox = self._outbox, []
        if messages:
            self._write(messages[-1], before=messages[:-1])

    def _write(self, message: Message, before: Sequence[Message] = ()) -> None:
        try:
            self._channel.send(message.KIND, message.to_body(), before=before)
        except ChannelClosed:
            # The controller is gone; the reader sees the same and stops the worker.
            self._finish(EXIT_OK, False)

    def _send_error(
        self, key: tuple[str, int] | None, code: str, text: str, *, fatal: bool = False
    ) -> None:
        request_id, epoch = (None, None) if key is None else key
        self._send(LlmErrorMessage(request_id, epoch, code, text, fatal))


async def _run_async(channel: FramedChannel, load: LlmLoadMessage) -> int:
    worker = LlmWorker(channel)
    try:
        ready = await worker.load(load)
    except Exception as exc:  # noqa: BLE001 - any load failure is reported to the controller
        with contextlib.suppress(ChannelClosed):
            channel.send_message(
                LlmErrorMessage(None, None, "load_failed", f"{type(exc).__name__}: {exc}", True)
            )
        await worker._wind_down()
        return EXIT_LOAD_FAILED
    channel.send_message(ready)
    return await worker.serve()


def run(channel: FramedChannel, generation: int) -> int:
    """The worker's whole life on an open channel; returns the process exit status."""
    send_hello(
        channel, worker=WORKER_NAME, generation=generation, required_features=("text-stream",)
    )
    try:
        frame = channel.read_frame()
        first = decode_llm_message(frame, CONTROLLER_TO_LLM_WORKER)
    except ChannelClosed:
        return EXIT_OK
    except (ProtocolError, MessageError) as exc:
        code = getattr(exc, "code", "bad_message")
        with contextlib.suppress(ChannelClosed):
            channel.send_message(LlmErrorMessage(None, None, code, str(exc), True))
        return EXIT_PROTOCOL
    if isinstance(first, ShutdownMessage):
        channel.send_message(ByeMessage())
        return EXIT_OK
    if not isinstance(first, LlmLoadMessage):
        channel.send_message(
            LlmErrorMessage(
                None, None, "unexpected_message", f"expected llm_load, got {first.KIND}", True
            )
        )
        return EXIT_PROTOCOL
    return asyncio.run(_run_async(channel, first))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: claim stdio for frames, then :func:`run`."""
    del argv  # The worker takes no arguments: its instructions arrive in ``llm_load``.
    try:
        generation = _generation()
    except ValueError as exc:
        print(f"vllm worker: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # The controller owns shutdown; a terminal's Ctrl+C must not kill the worker mid-frame.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    frames_in, frames_out = claim_worker_stdio()
    channel = FramedChannel(frames_in, frames_out, name=f"vllm-worker-{generation}")
    try:
        return run(channel, generation)
    finally:
        channel.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
