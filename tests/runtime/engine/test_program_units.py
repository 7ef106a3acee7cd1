"""``RequestContext``, ``ChainProgram`` and ``TextStream`` on their own, without an orchestrator.

The graph stages are real and run in this process (``worker: inprocess``); the language
model is a small scripted client satisfying :class:`~runtime.backends.base.LlmClient`,
since vLLM takes minutes to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from runtime.backends.base import Delta, LlmClient, StageRecord
from runtime.config import load_pipeline
from runtime.contracts import RequestKey
from runtime.engine.orchestrator import Request
from runtime.engine.outputs import OmniRequestOutput
from runtime.engine.program import ChainProgram, Emitted, RequestContext, TextProgram
from runtime.engine.stage_runtime import StageRuntime
from runtime.engine.stages import GraphStage, LlmStage
from runtime.errors import ModelError, RequestCancelled, StageRetired, UsageError
from runtime.events import Event, EventBus, StageCallFinished
from runtime.ledger import ResourceLedger
from runtime.metrics import RequestMetrics
from tests.helpers.onnx_graphs import make_bundle
from tests.runtime.engine.inprocess_support import write_inprocess_pipeline
from tests.runtime.engine.support import ENDLESS_STEPS

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence
    from pathlib import Path

    from runtime.contracts.llm_messages import SamplingSpec
    from runtime.errors import OmniError

N = 1024


@pytest.fixture(scope="module")
def add_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_bundle(tmp_path_factory.mktemp("add"), kind="add", name="add", n=N)


def _inputs() -> dict[str, np.ndarray]:
    return {"a": np.full(N, 1.5, np.float32), "b": np.full(N, 2.0, np.float32)}


class _Recorder:
    def __init__(self, events: EventBus) -> None:
        self.seen: list[Event] = []
        events.subscribe(self.seen.append)

    def calls(self) -> list[StageCallFinished]:
        return [event for event in self.seen if isinstance(event, StageCallFinished)]


@contextlib.asynccontextmanager
async def _stages(pipeline: Path, options: dict[str, Any]) -> AsyncIterator[StageRuntime]:
    runtime = StageRuntime(
        load_pipeline(pipeline),
        ledger=ResourceLedger(name="units"),
        events=EventBus(),
        topology=options["topology"],
        selection=options["selection"],
    )
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.close()


def _context(runtime: StageRuntime, window: int = 8) -> RequestContext:
    request = Request(request_id="r1", inputs=None, key=RequestKey("r1"))
    return RequestContext(request, runtime.stages, runtime.events, window)


def _graph(runtime: StageRuntime, index: int) -> GraphStage:
    stage = runtime.stages[index]
    assert isinstance(stage, GraphStage)
    return stage


def _output(ctx: RequestContext) -> OmniRequestOutput:
    item = ctx.request.stream.next_future().result(0)
    assert isinstance(item, OmniRequestOutput)
    return item


# -- RequestContext: graph calls -----------------------------------------------------------


def test_a_call_without_hold_copies_the_outputs_and_frees_the_slot(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    async def scenario() -> None:
        pipeline = write_inprocess_pipeline(tmp_path / "one.yaml", [add_manifest])
        async with _stages(pipeline, options) as runtime:
            recorder = _Recorder(runtime.events)
            ctx = _context(runtime)
            result = await ctx.call(0, _inputs())
            stage = _graph(runtime, 0)
            assert stage.client.slot is None  # type: ignore[attr-defined]
            assert not stage.lock.locked()
            # The copy is the caller's: writable, and it stays after the slot was freed.
            assert result.outputs["c"].flags.writeable
            np.testing.assert_array_equal(result.outputs["c"], np.full(N, 3.5, np.float32))
            assert result.copied_bytes == result.bytes_in + result.bytes_out == 3 * 4 * N
            (entry,) = ctx.request.stage_metrics
            assert (entry.stage, entry.bytes_in, entry.bytes_out) == ("stage-0", 8 * N, 4 * N)
            assert (entry.copied_bytes, entry.generation) == (12 * N, None)
            assert set(entry.to_json()) == {
                "stage",
                "queue_s",
                "run_s",
                "transfer_s",
                "bytes_in",
                "bytes_out",
                "copied_bytes",
            }
            (event,) = recorder.calls()
            assert (event.request_id, event.stage, event.copied_bytes) == ("r1", "stage-0", 12 * N)

    asyncio.run(scenario())


def test_a_held_call_keeps_the_slot_and_its_read_only_outputs_until_release(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    async def scenario() -> None:
        pipeline = write_inprocess_pipeline(tmp_path / "one.yaml", [add_manifest])
        async with _stages(pipeline, options) as runtime:
            ctx = _context(runtime)
            stage = _graph(runtime, 0)
            result = await ctx.call(0, _inputs(), hold=True)
            assert stage.client.slot == ctx.request.key  # type: ignore[attr-defined]
            assert stage.lock.locked()
            assert not result.outputs["c"].flags.writeable
            assert result.copied_bytes == result.bytes_in
            ctx.release(0)
            assert stage.client.slot is None  # type: ignore[attr-defined]
            assert not stage.lock.locked()

    asyncio.run(scenario())


def test_then_release_frees_the_held_stage_once_the_next_call_took_its_inputs(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    async def scenario() -> None:
        pipeline = write_inprocess_pipeline(tmp_path / "two.yaml", [add_manifest, add_manifest])
        async with _stages(pipeline, options) as runtime:
            ctx = _context(runtime)
            first, second = _graph(runtime, 0), _graph(runtime, 1)
            held = await ctx.call(0, _inputs(), hold=True)
            total = held.outputs["c"]
            result = await ctx.call(1, {"a": total, "b": total}, hold=True, then_release=0)
            assert first.client.slot is None  # type: ignore[attr-defined]
            assert not first.lock.locked()
            assert second.client.slot == ctx.request.key  # type: ignore[attr-defined]
            np.testing.assert_array_equal(result.outputs["c"], np.full(N, 7.0, np.float32))
            await ctx.aclose()
            # aclose dropped the retained result; with no call active the stage stays usable.
            assert second.client.slot is None  # type: ignore[attr-defined]
            assert not second.lock.locked()
            assert second.client.usable

    asyncio.run(scenario())


def test_a_cancelled_request_starts_no_call(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    async def scenario() -> None:
        pipeline = write_inprocess_pipeline(tmp_path / "one.yaml", [add_manifest])
        async with _stages(pipeline, options) as runtime:
            ctx = _context(runtime)
            ctx.request.cancel_requested = True
            with pytest.raises(RequestCancelled, match="r1 was cancelled"):
                await ctx.call(0, _inputs())
            assert ctx.request.stage_metrics == []
            assert not _graph(runtime, 0).lock.locked()
            with pytest.raises(UsageError, match="is a graph stage; use call"):
                ctx.generate(0, "text")

    asyncio.run(scenario())


def test_a_call_left_while_it_runs_is_stopped_and_its_stage_retired(
    loop_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    async def scenario() -> None:
        pipeline = write_inprocess_pipeline(tmp_path / "loop.yaml", [loop_manifest], max_io="4MiB")
        async with _stages(pipeline, options) as runtime:
            ctx = _context(runtime)
            with np.load(loop_manifest.parent / "inputs.npz", allow_pickle=False) as archive:
                inputs = {"x": archive["x"], "n": np.array(ENDLESS_STEPS, np.int64)}
            call = asyncio.create_task(ctx.call(0, inputs))
            stage = _graph(runtime, 0)
            while stage.client.slot is None:  # type: ignore[attr-defined]
                await asyncio.sleep(0.005)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            assert not stage.lock.locked()
            assert not stage.client.usable
            with pytest.raises(StageRetired, match="retired after an active call was cancelled"):
                await ctx.call(0, inputs)
            # The endless call stopped between nodes, so the reservation is released.
            await stage.client.close()
            assert runtime.ledger.snapshot().is_empty

    asyncio.run(scenario())


# -- RequestContext: outputs ---------------------------------------------------------------


def test_emit_waits_while_window_outputs_are_unacknowledged(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    async def scenario() -> None:
        pipeline = write_inprocess_pipeline(tmp_path / "one.yaml", [add_manifest])
        async with _stages(pipeline, options) as runtime:
            ctx = _context(runtime, window=2)
            await ctx.emit({"i": 0}, stage="stage-0")
            await ctx.emit({"i": 1}, stage="stage-0")
            third = asyncio.create_task(ctx.emit({"i": 2}, stage="stage-0"))
            await asyncio.sleep(0.05)
            assert not third.done()
            first = _output(ctx)
            assert (first.index, first.outputs) == (0, {"i": 0})
            first.release_stage_buffers()
            await asyncio.wait_for(third, 2)
            second, last = _output(ctx), _output(ctx)
            assert [second.index, last.index] == [1, 2]
            # A second release of the same output counts once.
            first.release_stage_buffers()
            fourth = asyncio.create_task(ctx.emit({"i": 3}, stage="stage-0"))
            await asyncio.sleep(0.05)
            assert not fourth.done()
            second.release_stage_buffers()
            await asyncio.wait_for(fourth, 2)

    asyncio.run(scenario())


def test_emit_with_wait_returns_once_the_caller_acknowledges(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    async def scenario() -> None:
        pipeline = write_inprocess_pipeline(tmp_path / "one.yaml", [add_manifest])
        async with _stages(pipeline, options) as runtime:
            ctx = _context(runtime)
            await ctx.call(0, _inputs())
            emitted = asyncio.create_task(
                ctx.emit({"x": 1}, stage="stage-0", finished=True, wait=True, text="hi")
            )
            await asyncio.sleep(0.05)
            assert not emitted.done()
            output = _output(ctx)
            assert output.finished
            assert (output.text, output.outputs["text"]) == ("hi", "hi")
            assert [entry["stage"] for entry in output.metrics["stages"]] == ["stage-0"]
            # The same calls as values, their JSON what the metrics carry.
            assert [call.to_json() for call in output.calls] == output.metrics["stages"]
            output.release_stage_buffers()
            await asyncio.wait_for(emitted, 2)

    asyncio.run(scenario())


def test_a_narrowed_context_numbers_its_stages_from_zero_and_emits_to_its_hook(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    async def scenario() -> None:
        pipeline = write_inprocess_pipeline(tmp_path / "two.yaml", [add_manifest, add_manifest])
        async with _stages(pipeline, options) as runtime:
            ctx = _context(runtime)
            seen: list[Emitted] = []

            async def hook(emitted: Emitted) -> None:
                seen.append(emitted)

            view = ctx.narrowed(1, hook)
            assert (view.stage_count, view.stage_name(0)) == (1, "stage-1")
            result = await view.call(0, _inputs())
            await view.emit(result.outputs, stage=view.stage_name(0), finished=True)
            (emitted,) = seen
            assert (emitted.stage, emitted.finished) == ("stage-1", True)
            assert not ctx.request.stream.next_future().done()
            # The request's metrics are shared: the view's call is the request's.
            assert [entry.stage for entry in ctx.request.stage_metrics] == ["stage-1"]

    asyncio.run(scenario())


# -- ChainProgram ------------------------------------------------------------------------


def test_chain_prepare_accepts_a_mapping_of_arrays_or_nothing(
    add_manifest: Path, tmp_path: Path
) -> None:
    program = ChainProgram(
        load_pipeline(write_inprocess_pipeline(tmp_path / "two.yaml", [add_manifest] * 2))
    )
    assert program.prepare(None) is None
    prepared = program.prepare({"a": [1.0, 2.0]})
    assert prepared is not None
    assert isinstance(prepared["a"], np.ndarray)
    with pytest.raises(UsageError, match="takes a mapping of input name to array, not list"):
        program.prepare([1.0])


def test_the_chain_holds_each_stage_until_the_next_took_its_inputs(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    async def scenario() -> None:
        pipeline = write_inprocess_pipeline(tmp_path / "two.yaml", [add_manifest, add_manifest])
        async with _stages(pipeline, options) as runtime:
            ctx = _context(runtime)
            program = ChainProgram(runtime.config)
            running = asyncio.create_task(program.run(ctx, _inputs()))
            pending = asyncio.wrap_future(ctx.request.stream.next_future())
            output = await asyncio.wait_for(pending, 5)
            assert isinstance(output, OmniRequestOutput)
            first, second = _graph(runtime, 0), _graph(runtime, 1)
            # The final output is out and unacknowledged: only the last stage is held.
            assert first.client.slot is None  # type: ignore[attr-defined]
            assert second.client.slot == ctx.request.key  # type: ignore[attr-defined]
            assert (output.stage, output.finished) == ("stage-1", True)
            np.testing.assert_array_equal(output.outputs["c"], np.full(N, 7.0, np.float32))
            assert not running.done()
            output.release_stage_buffers()
            await asyncio.wait_for(running, 2)
            assert second.client.slot is None  # type: ignore[attr-defined]
            assert not second.lock.locked()

    asyncio.run(scenario())


def test_a_handoff_without_tensors_is_a_model_error(
    add_manifest: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    async def scenario() -> None:
        pipeline = write_inprocess_pipeline(
            tmp_path / "bad.yaml",
            [add_manifest, add_manifest],
            handoff="tests.runtime.engine.inprocess_support:shapeless_handoff",
        )
        async with _stages(pipeline, options) as runtime:
            ctx = _context(runtime)
            with pytest.raises(ModelError, match="must return \\{'tensors'"):
                await ChainProgram(runtime.config).run(ctx, _inputs())
            await ctx.aclose()
            assert _graph(runtime, 0).client.slot is None  # type: ignore[attr-defined]
            with pytest.raises(UsageError, match="stage-0 has no custom_process_input_func"):
                ChainProgram(runtime.config).handoff(0, {})

    asyncio.run(scenario())


# -- TextStream ----------------------------------------------------------------------------


class ScriptedLlm:
    """A language-model client that streams a fixed script; records what it was asked."""

    def __init__(self, name: str, script: Sequence[str]) -> None:
        self._name = name
        self.script = tuple(script)
        self.requests: list[tuple[RequestKey, str | Sequence[int], SamplingSpec]] = []
        self.aborted: list[RequestKey] = []
        self.in_flight: set[str] = set()
        self.release = asyncio.Event()

    @property
    def name(self) -> str:
        return self._name

    @property
    def usable(self) -> bool:
        return True

    @property
    def failure(self) -> OmniError | None:
        return None

    @property
    def max_num_seqs(self) -> int:
        return 2

    async def start(self) -> StageRecord:
        return self.record()

    def record(self) -> StageRecord:
        return StageRecord(stage=self._name, backend="scripted")

    async def close(self) -> None:
        self.in_flight.clear()

    async def generate(
        self, key: RequestKey, prompt: str | Sequence[int], sampling: SamplingSpec, /
    ) -> AsyncIterator[Delta]:
        self.requests.append((key, prompt, sampling))
        self.in_flight.add(key.request_id)
        return self._deltas(key)

    async def _deltas(self, key: RequestKey) -> AsyncIterator[Delta]:
        last = len(self.script) - 1
        for index, text in enumerate(self.script):
            if index == 1:
                await self.release.wait()
            finished = index == last
            if finished:
                self.in_flight.discard(key.request_id)
            yield Delta(
                key=key,
                text=text,
                token_ids=(index,),
                finished=finished,
                finish_reason="stop" if finished else None,
                index=index,
                received_at=time.monotonic(),
            )

    async def abort(self, key: RequestKey, /) -> bool:
        if key.request_id not in self.in_flight:
            return False
        self.in_flight.discard(key.request_id)
        self.aborted.append(key)
        return True


def _llm_context(
    tmp_path: Path, client: LlmClient, model_dir: Path | None = None
) -> tuple[RequestContext, EventBus]:
    path = tmp_path / "llm.yaml"
    path.write_text(
        "pipeline: llm\nasync_chunk: false\nstages:\n  - stage_id: 0\n    backend:\n"
        "      name: native.vllm.v1\n      model: tiny\n      route: {interpreter: bundled}\n"
        "      sampling: {max_tokens: 16}\n"
        "    resource_budget:\n      capacities: {machine:ram: 64GiB}\n"
        "      demands: {machine:ram: 3GiB}\n",
        encoding="utf-8",
    )
    config = load_pipeline(path)
    stage = config.stages[0]
    backend = stage.backend
    assert not backend.is_graph
    events = EventBus()
    request = Request(request_id="t1", inputs=None, key=RequestKey("t1"))
    handle = LlmStage(stage, backend, client, model_dir)  # type: ignore[arg-type]
    return RequestContext(request, [handle], events), events


def test_a_text_stream_yields_the_deltas_and_records_the_call(tmp_path: Path) -> None:
    async def scenario() -> None:
        client = ScriptedLlm("stage-0", ["Hello", ",", " world"])
        client.release.set()
        ctx, events = _llm_context(tmp_path, client)
        recorder = _Recorder(events)
        async with ctx.generate(0, "Say hello", max_tokens=3) as stream:
            parts = [text async for text in stream]
        assert parts == ["Hello", ",", " world"]
        assert (stream.text, stream.tokens, stream.finish_reason) == ("Hello, world", 3, "stop")
        ((key, prompt, sampling),) = client.requests
        assert (key, prompt, sampling.max_tokens) == (ctx.request.key, "Say hello", 3)
        assert client.aborted == []
        (entry,) = ctx.request.stage_metrics
        assert entry.generation is not None
        assert (entry.generation.tokens, entry.generation.finish_reason) == (3, "stop")
        assert (entry.bytes_in, entry.bytes_out, entry.copied_bytes) == (9, 12, None)
        assert entry.generation.time_to_first_token_s is not None
        assert set(entry.to_json()) == {
            "stage",
            "queue_s",
            "run_s",
            "transfer_s",
            "bytes_in",
            "bytes_out",
            "tokens",
            "finish_reason",
            "time_to_first_token_s",
            "started_at",
            "finished_at",
            "prompt",
        }
        assert entry.generation.prompt == "Say hello"
        (event,) = recorder.calls()
        assert (event.stage, event.bytes_out) == ("stage-0", 12)
        metrics = stream.metrics()
        assert (metrics["tokens"], metrics["text_chars"]) == (3, 12)
        assert ctx.resources.streams == []

    asyncio.run(scenario())


def test_leaving_a_text_stream_early_aborts_the_request(tmp_path: Path) -> None:
    async def scenario() -> None:
        client = ScriptedLlm("stage-0", ["one", " two", " three"])
        ctx, _ = _llm_context(tmp_path, client)
        async with ctx.generate(0, "count") as stream:
            assert await anext(stream) == "one"
        assert client.aborted == [ctx.request.key]
        assert ctx.request.stage_metrics == []
        with pytest.raises(StopAsyncIteration):
            await anext(stream)

    asyncio.run(scenario())


def test_a_cancel_during_a_text_stream_raises_and_aborts(tmp_path: Path) -> None:
    async def scenario() -> None:
        client = ScriptedLlm("stage-0", ["one", " two", " three"])
        client.release.set()
        ctx, _ = _llm_context(tmp_path, client)
        stream = ctx.generate(0, "count")
        assert await anext(stream) == "one"
        ctx.request.cancel_requested = True
        with pytest.raises(RequestCancelled, match="t1 was cancelled"):
            await anext(stream)
        assert client.aborted == [ctx.request.key]

    asyncio.run(scenario())


def test_closing_the_context_aborts_unfinished_streams_and_bad_sampling_is_refused(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        client = ScriptedLlm("stage-0", ["one", " two"])
        ctx, _ = _llm_context(tmp_path, client)
        stream = ctx.generate(0, [1, 2, 3], temperature=0.5)
        assert await anext(stream) == "one"
        assert client.requests[0][2].temperature == 0.5
        await ctx.aclose()
        assert client.aborted == [ctx.request.key]
        with pytest.raises(UsageError, match="unknown sampling option 'warmth'"):
            ctx.generate(0, "x", warmth=1)
        with pytest.raises(UsageError, match="is a language-model stage; use generate"):
            await ctx.call(0, {})

    asyncio.run(scenario())


def test_a_conversation_is_rendered_with_the_model_folders_template(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "chat_template.jinja").write_text(
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}",
        encoding="utf-8",
    )
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Hello Ada."},
        {"role": "user", "content": "What is my name?"},
    ]

    async def scenario() -> None:
        client = ScriptedLlm("stage-0", ["Ada", "."])
        client.release.set()
        ctx, _ = _llm_context(tmp_path, client, model)
        program = TextProgram(load_pipeline(tmp_path / "llm.yaml"))
        request = program.prepare({"messages": conversation, "max_tokens": 2})
        outputs: list[OmniRequestOutput] = []
        ctx.request.stream.put = outputs.append  # type: ignore[method-assign]
        await program.run(ctx, request)
        rendered = (
            "[system] Be brief.\n[user] My name is Ada.\n[assistant] Hello Ada.\n"
            "[user] What is my name?\n[assistant] "
        )
        ((_, prompt, sampling),) = client.requests
        assert (prompt, sampling.max_tokens) == (rendered, 2)
        final = outputs[-1]
        assert final.finished
        assert (final.text, final.metrics["prompt"]) == ("Ada.", rendered)
        record = RequestMetrics("t1", "completed", tuple(ctx.request.stage_metrics))
        assert record.to_json()["prompts"] == {"stage-0": rendered}

    asyncio.run(scenario())


def test_a_template_that_refuses_the_turns_fails_the_request_with_its_words(
    tmp_path: Path,
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "chat_template.jinja").write_text(
        "{% if messages[0].role == 'system' %}{{ raise_exception('no system turns') }}{% endif %}"
        "{{ messages[-1].content }}",
        encoding="utf-8",
    )

    async def scenario() -> None:
        client = ScriptedLlm("stage-0", ["x"])
        ctx, _ = _llm_context(tmp_path, client, model)
        program = TextProgram(load_pipeline(tmp_path / "llm.yaml"))
        request = program.prepare(
            {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]}
        )
        with pytest.raises(UsageError, match="refused the messages: no system turns"):
            await program.run(ctx, request)
        assert client.requests == []

    asyncio.run(scenario())
