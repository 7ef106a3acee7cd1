"""The ``run`` command of ``omni-edge``: one request through a pipeline, tensors in and out
(``--inputs``, ``--expect``, ``--out``) or text (``--text``, ``--chat``) whose reply streams to
stdout and whose audio is written or played; the stages' loading is reported on stderr.

The command line registers it with :func:`add_run_command`; each handler returns an exit code
and lets :class:`~runtime.errors.OmniError` reach the caller, which prints it.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .command_args import add_machine_args, device_selection, given_topology, print_json, say
from .errors import EXIT_OK
from .events import (
    Event,
    EventBus,
    LoadProgress,
    PipelineLoadFailed,
    PipelineLoading,
    PipelineReady,
    StageFailed,
    StageReady,
)

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from .api import OmniRequestOutput
    from .chat import ChatMessage
    from .config import PipelineConfig


def _load_npz(path: str, what: str) -> dict[str, Any]:
    import numpy as np

    from .artifacts import NPZ_ERRORS
    from .errors import UsageError

    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except NPZ_ERRORS as exc:
        raise UsageError(f"{what} {path}: not a readable .npz of arrays ({exc})") from None


def _compare(
    outputs: dict[str, Any], expected: dict[str, Any], atol: float, rtol: float
) -> list[str]:
    import numpy as np

    problems = []
    for name, reference in expected.items():
        if name not in outputs:
            problems.append(f"output {name!r} is missing (outputs: {sorted(outputs)})")
            continue
        actual = outputs[name]
        if actual.shape != reference.shape:
            problems.append(f"{name}: shape {actual.shape} != expected {reference.shape}")
        elif not np.allclose(actual, reference, atol=atol, rtol=rtol):
            error = float(np.max(np.abs(actual.astype(np.float64) - reference)))
            problems.append(f"{name}: max abs error {error:g} exceeds atol {atol} / rtol {rtol}")
    return problems


def cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    from .adapters.embed_bundle import export_missing_embedders
    from .adapters.whisper_export import export_missing_recognisers
    from .api import Omni
    from .config import load_pipeline
    from .errors import EXIT_FAILED, UsageError
    from .pipeline_input import TEXT_INPUT, input_kind

    if args.text is not None and args.chat is not None:
        raise UsageError("--text and --chat: give one request, the text or the conversation")
    messages = _load_chat(Path(args.chat)) if args.chat is not None else None
    # A speech recogniser or an embedder the pipeline names is made on first use, before its
    # manifests load.
    export_missing_recognisers(Path(args.pipeline), say)
    export_missing_embedders(Path(args.pipeline), say)
    config = load_pipeline(args.pipeline)
    kind = input_kind(config)
    if args.text is not None or messages is not None:
        flag = "--text" if messages is None else "--chat"
        if kind != TEXT_INPUT:
            raise UsageError(
                f"{flag}: pipeline {config.pipeline} takes tensors, not text; accepted: "
                "--inputs X.npz, or nothing for its example inputs"
            )
        for other, given in (("--inputs", args.inputs), ("--expect", args.expect)):
            if given:
                raise UsageError(f"{other} applies to tensor pipelines; give {flag} or {other}")
        request: object = (
            args.text
            if messages is None
            else {"messages": [message.to_json() for message in messages]}
        )
        return _run_text(args, config, request, messages)
    if kind == TEXT_INPUT:
        raise UsageError(
            f"pipeline {config.pipeline} takes text; give it with --text, e.g. "
            f'omni-edge run {args.pipeline} --text "Hello there.", or a conversation with '
            "--chat FILE.json"
        )
    if args.play:
        raise UsageError("--play applies to --text runs of pipelines that speak")
    inputs = _load_npz(args.inputs, "--inputs") if args.inputs else None
    expected = _load_npz(args.expect, "--expect") if args.expect else None
    out = Path(args.out) if args.out else None
    with contextlib.ExitStack() as stack:
        omni = stack.enter_context(
            Omni(
                config,
                events=_loading_events(stack),
                topology=given_topology(args),
                selection=device_selection(args),
            )
        )
        # An adapter's final output may carry its text as a string (a transcript).
        outputs = {name: np.asarray(value) for name, value in omni.run(inputs).items()}
        plan = omni.execution_plan.to_json()
        metrics = omni.metrics()
    problems = [] if expected is None else _compare(outputs, expected, args.atol, args.rtol)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        np.savez(out / "outputs.npz", allow_pickle=False, **outputs)
        (out / "execution_plan.json").write_text(json.dumps(plan, indent=2) + "\n")
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    summary = {
        "pipeline": plan.get("pipeline"),
        "outputs": {
            name: {"dtype": str(a.dtype), "shape": list(a.shape)} for name, a in outputs.items()
        },
        "expect": None if expected is None else {"ok": not problems, "problems": problems},
        "out": None if out is None else str(out),
    }
    if args.json:
        print_json(summary)
    else:
        for name, array in outputs.items():
            print(f"{name}: {array.dtype} {list(array.shape)}")
        for stage in plan.get("stages", []):
            placement = stage.get("placement") or {}
            print(
                f"{stage['stage']}: pid {stage['worker']['pid']} "
                f"{placement.get('counts')} fraction on target {placement.get('fraction_on_target')}"
            )
        if expected is not None:
            print("matches --expect" if not problems else "MISMATCH with --expect:")
        for problem in problems:
            print(f"  {problem}")
        if out is not None:
            print(f"wrote {out / 'outputs.npz'}, execution_plan.json, metrics.json")
    return EXIT_FAILED if problems else EXIT_OK


class LoadReporter:
    """What ``run`` waits for while the stages load, on stderr (stdout keeps the streamed
    text and ``--json``): the stages at the start, each stage once ready, and every
    ``tick_s`` the stages still loading with the seconds so far
    (``omni-edge: loading: assistant (vLLM worker) loading… 14 s``)."""

    def __init__(self, write: Callable[[str], None] = say, tick_s: float = 5.0) -> None:
        self._write = write
        self._tick_s = tick_s
        self._progress = LoadProgress()
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._ticker: threading.Thread | None = None

    def __call__(self, event: Event) -> None:
        """An event, on the runtime's thread (an ``EventBus`` subscriber)."""
        with self._lock:
            if not self._progress.update(event):
                return
            snapshot = self._progress.snapshot
        assert snapshot is not None
        now = time.monotonic()
        if isinstance(event, PipelineLoading):
            names = ", ".join(stage.label for stage in snapshot.stages)
            self._write(f"loading {len(snapshot.stages)} stage(s): {names}")
            self._ticker = threading.Thread(target=self._tick, name="omni-loading", daemon=True)
            self._ticker.start()
        elif isinstance(event, StageReady | StageFailed):
            stage = next(s for s in snapshot.stages if s.stage == event.stage)
            self._write(f"loading: {stage.line(now)}")
        elif isinstance(event, PipelineReady | PipelineLoadFailed):
            self._ended.set()
            if isinstance(event, PipelineReady):
                self._write(snapshot.summary(now))

    def _tick(self) -> None:
        while not self._ended.wait(self._tick_s):
            with self._lock:
                snapshot = self._progress.snapshot
            if snapshot is not None and snapshot.loading:
                self._write(snapshot.summary(time.monotonic()))

    def close(self) -> None:
        """Stop the ticking line (idempotent)."""
        self._ended.set()
        ticker, self._ticker = self._ticker, None
        if ticker is not None and ticker is not threading.current_thread():
            ticker.join()


def _loading_events(stack: contextlib.ExitStack) -> EventBus:
    """An event bus for ``Omni`` whose loading events :class:`LoadReporter` reports."""
    events = EventBus()
    reporter = LoadReporter()
    stack.callback(reporter.close)
    stack.callback(events.subscribe(reporter))
    return events


def _printable(text: str) -> str:
    """Model text for a terminal: control characters other than line breaks and tabs become
    U+FFFD, so generated bytes cannot drive the terminal."""
    return "".join(
        ch if ch in "\n\t" or (ch.isprintable() and ch != "\x7f") else "\ufffd" for ch in text
    )


def _load_chat(path: Path) -> tuple[ChatMessage, ...]:
    """``--chat FILE.json``: a list of ``{"role", "content"}`` messages (or an object whose
    ``messages`` is one), ending with the user's turn."""
    from .chat import parse_messages
    from .errors import UsageError

    where = f"--chat {path}"
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(
            f"{where}: not JSON ({exc}); accepted: a list of {{'role', 'content'}} messages"
        ) from None
    if isinstance(document, dict):
        if set(document) - {"messages"}:
            unknown = sorted(set(document) - {"messages"})[0]
            raise UsageError(f"{where}: unknown key {unknown!r}; accepted: 'messages'")
        document = document.get("messages")
    return parse_messages(document, where=where)


def _run_text(
    args: argparse.Namespace,
    config: PipelineConfig,
    request: object,
    messages: tuple[ChatMessage, ...] | None = None,
) -> int:
    """``run --text`` / ``--chat``: stream the text to stdout as it arrives; write or play the
    audio. With ``--chat`` and ``--out``, the conversation with the reply is written too; other
    arrays of the final output (an embedding pipeline's vectors) go to ``outputs.npz``."""
    import numpy as np

    from .api import AudioChunk, Omni
    from .audio import AudioPlayer, WavWriter
    from .contracts import new_request_id
    from .errors import UsageError

    out = Path(args.out) if args.out else None
    if out is not None and out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: accepted: a folder (it exists and is not one)")
    if args.play:
        from .audio import resolve_output_device

        # A missing output device is reported before anything loads.
        resolve_output_device(None)
    request_id = new_request_id()
    streamed = False
    final: OmniRequestOutput | None = None
    # Arrays the final output carries beyond text and audio (an embedding pipeline's vectors).
    arrays: dict[str, Any] = {}
    wav: Path | None = None
    samples = 0
    rate = 0
    with contextlib.ExitStack() as stack:
        omni = stack.enter_context(
            Omni(
                config,
                events=_loading_events(stack),
                topology=given_topology(args),
                selection=device_selection(args),
            )
        )
        writer: WavWriter | None = None
        player: AudioPlayer | None = None
        for output in omni.generate(request, request_id=request_id):
            if output.finished:
                final = output
                arrays = _result_arrays(output)
            elif output.text is not None and not args.json:
                sys.stdout.write(_printable(output.text))
                sys.stdout.flush()
                streamed = True
            chunk = AudioChunk.from_output(output)
            if chunk is None or not chunk.pcm.size:
                continue
            rate = chunk.sample_rate
            samples += chunk.pcm.size
            if out is not None:
                if writer is None:
                    out.mkdir(parents=True, exist_ok=True)
                    writer = stack.enter_context(WavWriter(out / f"{request_id}.wav", rate))
                writer.write(chunk.pcm)
            if args.play:
                if player is None:
                    player = AudioPlayer(
                        None, sample_rate_in=rate, cushion_s=0.5, max_cushion_s=1.0
                    )
                    player.start()
                    stack.callback(player.stop)
                player.feed(chunk.pcm)
        if streamed:
            sys.stdout.write("\n")
            sys.stdout.flush()
        if player is not None:
            player.end_of_stream()
            player.wait(samples / rate + 5.0)
        plan = omni.execution_plan.to_json()
        metrics = omni.metrics()
        if writer is not None:
            wav = writer.close()
    text = None if final is None else final.text
    engine = {} if final is None else {k: v for k, v in final.metrics.items() if k != "stages"}
    # What the program measured (a speech request's timing breakdown, say) joins its calls.
    for entry in metrics.get("requests", []):
        if entry.get("request_id") == request_id and engine:
            entry["program"] = engine
    written = [] if wav is None else [wav.name]
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        if text is not None:
            (out / f"{request_id}.txt").write_text(text, encoding="utf-8")
            written.append(f"{request_id}.txt")
        if arrays:
            np.savez(out / "outputs.npz", allow_pickle=False, **arrays)
            written.append("outputs.npz")
        if text is not None and messages is not None:
            # The conversation with the reply: give it back with --chat to go on.
            turns = [*(message.to_json() for message in messages)]
            turns.append({"role": "assistant", "content": text})
            chat_path = out / f"{request_id}.chat.json"
            chat_path.write_text(json.dumps(turns, indent=2) + "\n", encoding="utf-8")
            written.append(chat_path.name)
        (out / "execution_plan.json").write_text(json.dumps(plan, indent=2) + "\n")
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str) + "\n")
    audio_s = samples / rate if rate else 0.0
    if args.json:
        print_json(
            {
                "pipeline": config.pipeline,
                "request_id": request_id,
                "text": text,
                "tokens": engine.get("tokens"),
                "finish_reason": engine.get("finish_reason"),
                "audio_seconds": audio_s,
                "outputs": {
                    name: {"dtype": str(a.dtype), "shape": list(a.shape)}
                    for name, a in arrays.items()
                },
                "wav": None if wav is None else str(wav),
                "out": None if out is None else str(out),
            }
        )
        return EXIT_OK
    parts = [f"request {request_id}"]
    if engine.get("tokens") is not None:
        parts.append(f"{engine['tokens']} tokens ({engine.get('finish_reason')})")
    if samples:
        parts.append(f"{audio_s:.2f} s of audio")
    parts.extend(f"{name} {a.dtype}{list(a.shape)}" for name, a in arrays.items())
    if samples and wav is None and not args.play:
        parts.append("the audio was not kept (give --out DIR or --play)")
    if out is not None:
        parts.append(
            f"wrote {', '.join([*written, 'execution_plan.json', 'metrics.json'])} in {out}"
        )
    say("; ".join(parts))
    return EXIT_OK


def _result_arrays(output: OmniRequestOutput) -> dict[str, Any]:
    """The arrays of a text request's final output other than its text and audio, copied
    (the output is acknowledged as iteration goes on)."""
    import numpy as np

    return {
        name: np.array(value, copy=True)
        for name, value in output.outputs.items()
        if name not in ("pcm", "text")
        and isinstance(value, np.ndarray)
        and value.ndim >= 1
        and value.size > 0
    }


def add_run_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``run``."""
    run = commands.add_parser("run", help="run a pipeline once and save its outputs")
    run.add_argument("pipeline", help="pipeline YAML file")
    run.add_argument("--inputs", metavar="X.npz", help="inputs (default: the example inputs)")
    run.add_argument(
        "--text",
        metavar="TEXT",
        help="the request of a pipeline that takes text; its text streams to stdout",
    )
    run.add_argument(
        "--chat",
        metavar="FILE.json",
        help="a conversation for a pipeline that takes text: a JSON list of "
        '{"role": "system"|"user"|"assistant", "content": ...} messages ending with the '
        "user's turn, rendered with the model's chat template; the reply streams to stdout",
    )
    run.add_argument(
        "--out",
        metavar="DIR",
        help="write outputs.npz, execution_plan.json, metrics.json (with --text or --chat: "
        "<request>.wav, <request>.txt, execution_plan.json, metrics.json; with --chat also "
        "<request>.chat.json, the conversation with the reply)",
    )
    run.add_argument(
        "--play", action="store_true", help="with --text: play the audio as it is produced"
    )
    run.add_argument("--expect", metavar="REF.npz", help="compare outputs with a reference")
    run.add_argument("--atol", type=float, default=1e-6, help="absolute tolerance (1e-6)")
    run.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance (1e-5)")
    run.add_argument("--json", action="store_true", help="print a JSON summary")
    add_machine_args(run)
    run.set_defaults(handler=cmd_run)
