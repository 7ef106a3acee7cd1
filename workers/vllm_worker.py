"""The vLLM worker process: vLLM's engine in this one process, stepped by its own loop.

Run as ``python -m workers.vllm_worker`` with an interpreter that has vLLM (the managed
``vllm-cpu`` or ``vllm-cuda`` environment) and the project root on ``PYTHONPATH``. It
speaks the language-model protocol (:mod:`runtime.contracts.llm_messages`) on its
stdin/stdout through a :class:`~runtime.transport.channel.FramedChannel`; everything else
(vLLM's logs among it) goes to stderr. Its generation comes from
``OMNI_EDGE_WORKER_GENERATION``.

vLLM's synchronous ``LLMEngine`` runs here with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: its
engine core (scheduler, KV cache) and its model executor live in this process, so torch
and vLLM are imported once and the worker's tree is this one process (vLLM's asynchronous
engine would start an engine-core process and, on the CPU, a model-worker process, each
importing torch and vLLM again).

1. ``hello`` announces the protocol, the ``text-stream`` feature, pid and generation.
2. ``llm_load`` builds the engine from the engine arguments, runs a two-token warm-up and
   answers ``llm_ready`` with the effective limits and the resident memory of the worker's
   process tree. A failure is a fatal ``llm_error`` and the process exits.
3. Each ``generate`` is added to the engine at once (a request constrained to JSON first has
   its schema checked by the grammar compiler: a refusal is an ``unsupported_structured_output``
   error naming what it does not support, and the engine never holds the request); while any request is in flight the
   loop steps the engine continuously (vLLM batches the running requests, up to
   ``max_num_seqs``) and reads new frames between steps without blocking; idle, it waits
   on its input. Every step's new text and token ids go out as one ``delta`` per request,
   all of one step in one write; the last one says ``finished``. ``abort`` removes the
   request from the engine (which frees its KV cache) before the next step and ends it
   with a ``delta`` whose reason is ``abort``. ``stats`` answers with the tree's current
   memory and the number of requests the engine holds. ``shutdown`` (or the controller
   closing stdin) aborts what runs and answers ``bye``. An engine step that raises leaves
   the engine in an unknown state: a fatal ``engine_died``.
4. The process then ends at once (:func:`_end_process`), after a failed load too: the engine
   is not shut down and the interpreter does not finalise torch and vLLM. Nothing outlives
   the process: the engine is in it, and its temporary folder is the controller's to remove.

Everything runs under the ``if __name__ == "__main__":`` guard, so nothing runs on import.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NoReturn

if __package__ in (None, ""):
    # Run by path: put the project root (holding `runtime` and `workers`) first on the path.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import psutil

from runtime.contracts.llm_messages import (
    CONTROLLER_TO_LLM_WORKER,
    FASTEST,
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
    cpu_flags,
    decode_llm_message,
    fastest_cpu_dtype,
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
from runtime.contracts.structured import JSON_SCHEMA, UNSUPPORTED_STRUCTURED_OUTPUT
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
#: Set before vLLM is imported: its engine core and model executor stay in this process.
ONE_PROCESS_ENVIRONMENT: Final = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
WARMUP_PROMPT: Final = "warm up"
WARMUP_ID: Final = "warmup"
#: Steps the two-token warm-up may take before the load is called failed.
WARMUP_MAX_STEPS: Final = 64
#: vLLM's structured-output backend: xgrammar compiles a JSON schema into a grammar over the
#: model's vocabulary on the CPU, and refuses up front what it cannot honour (vLLM's "auto"
#: would try other backends instead, each honouring a different subset of JSON Schema).
STRUCTURED_BACKEND: Final = "xgrammar"
#: The location prefix of the grammar compiler's messages (``[12:01:44] /path/file.cc:83: ``).
_COMPILER_LOCATION: Final = re.compile(r"\[\d\d:\d\d:\d\d\] \S+:\d+: ")
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
    module = importlib.import_module("vllm.sampling_params")
    output_kind = module.RequestOutputKind.DELTA
    structured = spec.structured_output
    constraint = None
    if structured is not None:
        constraint = (
            module.StructuredOutputsParams(json=structured.schema)
            if structured.kind == JSON_SCHEMA
            else module.StructuredOutputsParams(json_object=True)
        )
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
        structured_outputs=constraint,
    )


#: Keywords vLLM's xgrammar backend refuses in some combinations (its own check says which).
_SUSPECT_KEYWORDS: Final = (
    "multipleOf",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "format",
    "pattern",
    "minLength",
    "maxLength",
    "propertyNames",
    "patternProperties",
)


def _unsupported_at(schema: object, unsupported: Callable[[Any], bool]) -> tuple[str, str] | None:
    """The JSON pointer of the innermost subschema ``unsupported`` refuses and the keywords
    it has that may be why, or None."""

    def walk(node: object, path: str) -> tuple[str, str] | None:
        children = (
            node.items()
            if isinstance(node, dict)
            else enumerate(node)
            if isinstance(node, list)
            else ()
        )
        for key, child in children:
            found = walk(child, f"{path}/{key}")
            if found is not None:
                return found
        if isinstance(node, dict) and unsupported(node):
            keys = [key for key in _SUSPECT_KEYWORDS if key in node]
            return path or "/", ", ".join(keys) or "a keyword"
        return None

    return walk(schema, "")


def structured_output_problem(params: Any) -> str | None:
    """Why the structured-output backend cannot honour ``params``' constraint (its grammar
    compiler's own words), or None when it can. Runs the conversion vLLM runs when the
    request is added, so a refusal is known before the engine holds anything of it."""
    xgrammar = importlib.import_module("vllm.v1.structured_output.backend_xgrammar")
    schema = params.structured_outputs.json
    if isinstance(schema, str):
        with contextlib.suppress(ValueError, RecursionError):
            where = _unsupported_at(
                json.loads(schema), xgrammar.has_xgrammar_unsupported_json_features
            )
            if where is not None:
                return (
                    f"the JSON schema at {where[0]} uses {where[1]} in a way the grammar "
                    f"compiler ({STRUCTURED_BACKEND}) does not support"
                )
    try:
        xgrammar.validate_xgrammar_grammar(params)
    except Exception as exc:  # noqa: BLE001 - whatever the compiler refuses is reported
        cause = exc.__cause__
        detail = f"{exc}" if cause is None else f"{exc} ({cause})"
        text = _COMPILER_LOCATION.sub("", detail).strip()
        return " ".join(text.split()) or type(exc).__name__
    return None


def _cpu_threads(vllm_config: Any) -> int | None:
    """The threads a CPU engine computes with: what vLLM's own CPU executor gives its model
    worker (the cores of the first NUMA node, one logical CPU per physical core, one kept
    back), so the loop, the controller and other stages keep a core and torch's threads do
    not wait on each other for it. None: leave torch's choice (not a CPU engine, threads set
    by ``OMP_NUM_THREADS``, or vLLM told not to bind)."""
    platforms = importlib.import_module("vllm.platforms")
    if not platforms.current_platform.is_cpu() or "OMP_NUM_THREADS" in os.environ:
        return None
    try:
        manager = importlib.import_module("vllm.utils.ompmultiprocessing").OMPProcessManager(
            vllm_config
        )
        cpus = manager.cpu_lists[0] if manager.cpu_lists else []
    except Exception:  # noqa: BLE001 - no plan from vLLM: torch's own choice stands
        return None
    return len(cpus) or None


def _engine_id(request_id: str, epoch: int) -> str:
    return f"{request_id}@{epoch}"


class LlmWorker:
    """One engine served over one channel: the asyncio loop reads frames, steps the engine."""

    def __init__(self, channel: FramedChannel) -> None:
        self._channel = channel
        self._vllm: Any = None
        self._engine: Any = None
        self._max_num_seqs = 0
        # The requests in the engine, by the id the engine knows them by.
        self._running: dict[str, tuple[str, int]] = {}
        self._step_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._exit_code = EXIT_OK
        self._say_bye = False
        # Messages sent during one turn of the loop (every running request's delta of an
        # engine step) go out together in one write, in order.
        self._outbox: list[Message] = []

    # Loading.

    def load(self, message: LlmLoadMessage) -> LlmReadyMessage:
        """Build the engine and warm it up; any exception means the load failed."""
        started = time.perf_counter()
        for key, value in OFFLINE_ENVIRONMENT.items():
            os.environ.setdefault(key, value)
        os.environ.update(ONE_PROCESS_ENVIRONMENT)
        model_dir = Path(message.model_dir)
        if not (model_dir / "config.json").is_file():
            raise FileNotFoundError(
                f"model directory {model_dir} has no config.json; accepted: a Hugging Face "
                "model directory (config.json, weights, tokenizer files)"
            )
        vllm = importlib.import_module("vllm")
        llm_engine = importlib.import_module("vllm.v1.engine.llm_engine")
        arg_utils = importlib.import_module("vllm.engine.arg_utils")
        args = message.engine_args
        dtype = args.dtype
        if dtype == FASTEST:
            platform = importlib.import_module("vllm.platforms").current_platform
            dtype = fastest_cpu_dtype(cpu_flags()) if platform.is_cpu() else "auto"
        options: dict[str, Any] = {
            "model": str(model_dir),
            "tokenizer": str(model_dir),
            "dtype": dtype,
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
        structured = importlib.import_module("vllm.config.structured_outputs")
        # Compact JSON: a small model otherwise may spend its tokens on whitespace.
        options["structured_outputs_config"] = structured.StructuredOutputsConfig(
            backend=STRUCTURED_BACKEND, disable_any_whitespace=True
        )
        vllm_config = arg_utils.EngineArgs(**options).create_engine_config()
        threads = _cpu_threads(vllm_config)
        if threads is not None:
            importlib.import_module("torch").set_num_threads(threads)
        executor = importlib.import_module("vllm.v1.executor").Executor
        engine = llm_engine.LLMEngine(
            vllm_config=vllm_config,
            executor_class=executor.get_class(vllm_config),
            log_stats=False,
            multiprocess_mode=False,
        )
        self._vllm = vllm
        self._engine = engine
        warm = _sampling_params(vllm, SamplingSpec(max_tokens=2, temperature=0.0))
        engine.add_request(WARMUP_ID, {"prompt": WARMUP_PROMPT}, warm)
        for _ in range(WARMUP_MAX_STEPS):
            if not engine.has_unfinished_requests():
                break
            engine.step()
        else:
            raise RuntimeError(f"the warm-up did not finish within {WARMUP_MAX_STEPS} steps")
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
        """Answer messages until shutdown, end of input or the engine's failure."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if loop_reading_supported(self._channel):
            # POSIX: the loop watches stdin itself, so a request reaches the engine without a
            # thread hop, and frames that arrived during a step are read before the next one.
            self._channel.start_loop_reader(self._loop, self._on_frame, self._on_input_closed)
        else:
            threading.Thread(target=self._read_loop, name="vllm-worker-reader", daemon=True).start()
        await self._stop.wait()
        self._abort_running()
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
        if self._stop is not None and self._stop.is_set():
            return  # a frame handed over by the reader thread after the worker began to stop
        if isinstance(message, GenerateMessage):
            self._start(message)
        elif isinstance(message, AbortMessage):
            self._abort(message.request_id, message.epoch)
        elif isinstance(message, StatsMessage):
            rss, pss, processes = tree_memory()
            self._send(LlmStatsMessage(rss, pss, processes, self._engine_in_flight()))
        elif isinstance(message, ShutdownMessage):
            self._finish(EXIT_OK, True)
        else:
            self._send_error(None, "unexpected_message", f"{message.KIND} after llm_load")

    def _start(self, message: GenerateMessage) -> None:
        key = (message.request_id, message.epoch)
        engine_id = _engine_id(*key)
        if engine_id in self._running:
            self._send_error(
                key, "duplicate", f"request {message.request_id} epoch {message.epoch} is running"
            )
            return
        if len(self._running) >= self._max_num_seqs:
            self._send_error(
                key,
                "busy",
                f"{len(self._running)} requests are in flight; max_num_seqs is "
                f"{self._max_num_seqs}",
            )
            return
        prompt: dict[str, Any] = (
            {"prompt": message.prompt}
            if message.prompt is not None
            else {"prompt_token_ids": list(message.prompt_token_ids or ())}
        )
        if message.sampling.structured_output is not None:
            try:
                problem = structured_output_problem(_sampling_params(self._vllm, message.sampling))
            except Exception as exc:  # noqa: BLE001 - parameters vLLM refuses are reported
                problem = f"{type(exc).__name__}: {exc}"
            if problem is not None:
                self._send_error(key, UNSUPPORTED_STRUCTURED_OUTPUT, problem)
                return
        try:
            params = _sampling_params(self._vllm, message.sampling)
            self._engine.add_request(engine_id, prompt, params)
        except Exception as exc:  # noqa: BLE001 - a request vLLM refuses is reported to it
            # Whatever part of it the engine took is dropped again.
            with contextlib.suppress(Exception):
                self._engine.abort_request([engine_id])
            self._send_error(key, "request_failed", f"{type(exc).__name__}: {exc}")
            return
        self._running[engine_id] = key
        self._schedule_step()

    def _abort(self, request_id: str, epoch: int) -> None:
        """Remove the request from the engine (its KV cache is freed now) and end it."""
        engine_id = _engine_id(request_id, epoch)
        if self._running.pop(engine_id, None) is None:
            return  # finished already, or never started: its end was sent
        try:
            self._engine.abort_request([engine_id])
        except Exception as exc:  # noqa: BLE001 - an engine that cannot abort is unusable
            self._fatal("engine_died", f"the engine failed to abort: {exc}", EXIT_ENGINE_DIED)
            return
        self._send(DeltaMessage(request_id, epoch, "", (), True, "abort"))
        # One more step lets the scheduler drop the aborted request from its batch.
        self._schedule_step()

    def _engine_in_flight(self) -> int:
        """The requests the engine's scheduler holds (waiting or running)."""
        core = getattr(getattr(self._engine, "engine_core", None), "engine_core", None)
        scheduler = getattr(core, "scheduler", None)
        count = getattr(scheduler, "get_num_unfinished_requests", None)
        return int(count()) if callable(count) else len(self._running)

    def _needs_step(self) -> bool:
        if self._running:
            return True
        core = getattr(getattr(self._engine, "engine_core", None), "engine_core", None)
        has_requests = getattr(getattr(core, "scheduler", None), "has_requests", None)
        return bool(has_requests()) if callable(has_requests) else False

    def _schedule_step(self) -> None:
        """Step the engine on the loop's next turn, after the frames that arrived are read."""
        if self._step_scheduled or self._engine is None:
            return
        if self._stop is not None and self._stop.is_set():
            return
        self._step_scheduled = True
        asyncio.get_running_loop().call_soon(self._step)

    def _step(self) -> None:
        """One engine step: every running request's new tokens go out, in one write."""
        self._step_scheduled = False
        if self._engine is None or (self._stop is not None and self._stop.is_set()):
            return
        if not self._needs_step():
            return
        try:
            outputs = self._engine.step()
        except Exception as exc:  # noqa: BLE001 - a failed step leaves the engine unusable
            self._running.clear()
            self._fatal(
                "engine_died", f"the engine failed: {type(exc).__name__}: {exc}", EXIT_ENGINE_DIED
            )
            return
        for output in outputs:
            self._on_output(output)
        if self._running and not self._engine.has_unfinished_requests():
            # Requests the engine no longer holds would be stepped for forever: end them.
            for key in self._running.values():
                self._send_error(key, "engine_error", "the request left the engine unfinished")
            self._running.clear()
        self._flush()
        # Idle, the loop waits on its input: after the last request, no step is scheduled.
        if self._running:
            self._schedule_step()

    def _on_output(self, output: Any) -> None:
        engine_id = str(output.request_id)
        key = self._running.get(engine_id)
        if key is None:
            return  # aborted in this turn: its end was sent
        completion = output.outputs[0]
        finished = bool(output.finished)
        reason = None
        if finished:
            del self._running[engine_id]
            reason = str(completion.finish_reason)
            if reason not in FINISH_REASONS:
                self._send_error(key, "engine_error", f"finished with reason {reason!r}")
                return
        token_ids = tuple(int(token) for token in completion.token_ids)
        if not finished and not token_ids and not completion.text:
            return
        prompt_ids = getattr(output, "prompt_token_ids", None) if finished else None
        self._send(
            DeltaMessage(
                key[0],
                key[1],
                completion.text,
                token_ids,
                finished,
                reason,
                None if prompt_ids is None else len(prompt_ids),
            )
        )

    def _finish(self, code: int, say_bye: bool) -> None:
        if self._stop is None or self._stop.is_set():
            return
        self._exit_code = code
        self._say_bye = say_bye
        self._stop.set()

    def _fatal(self, code: str, text: str, exit_code: int) -> None:
        self._send_error(None, code, text, fatal=True)
        self._finish(exit_code, False)

    def _abort_running(self) -> None:
        """Abort what runs: each request ends with an ``abort`` delta."""
        engine = self._engine
        for engine_id, (request_id, epoch) in list(self._running.items()):
            if engine is not None:
                with contextlib.suppress(Exception):
                    engine.abort_request([engine_id])
            self._send(DeltaMessage(request_id, epoch, "", (), True, "abort"))
        self._running.clear()

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


def _serve(channel: FramedChannel, load: LlmLoadMessage) -> int:
    worker = LlmWorker(channel)
    try:
        ready = worker.load(load)
    except Exception as exc:  # noqa: BLE001 - any load failure is reported to the controller
        with contextlib.suppress(ChannelClosed):
            channel.send_message(
                LlmErrorMessage(None, None, "load_failed", f"{type(exc).__name__}: {exc}", True)
            )
        return EXIT_LOAD_FAILED
    channel.send_message(ready)
    return asyncio.run(worker.serve())


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
    return _serve(channel, first)


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


def _end_process(code: int) -> NoReturn:
    """End the process with ``code`` without finalising the interpreter.

    Everything the controller reads was written before ``bye``; the engine and its memory
    go with the process. Finalising torch and vLLM (their modules, threads and the engine's
    own finalizers) took about 2 s of a close on two cores, for nothing the controller sees.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    _end_process(main(sys.argv[1:]))
