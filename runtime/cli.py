"""The ``omni-edge`` command line.

Exit codes: 0 success; 2 usage error or invalid config; 3 refused (verification,
admission, placement); 4 execution failed; 130 interrupted after a clean shutdown.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_REFUSED, OmniError
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
    from .chat import ChatMessage
    from .config import PipelineConfig
    from .devices import DeviceSelection, Topology
    from .engine.outputs import OmniRequestOutput

Handler = Callable[[argparse.Namespace], int]


def _print_json(document: Any) -> None:
    json.dump(document, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def cmd_verify(args: argparse.Namespace) -> int:
    from .artifacts import inspect_bundle

    report = inspect_bundle(args.manifest)
    if args.json:
        _print_json(report.to_json())
    else:
        print(f"bundle {report.manifest_path}")
        if report.manifest is not None:
            print(f"  component {report.manifest.component}  identity {report.manifest.identity}")
        for check in report.files:
            print(f"  {check.status:<15} {check.name}")
        for error in report.errors:
            print(f"  error: {error}", file=sys.stderr)
        print("verified" if report.ok else "REFUSED: the bundle failed verification")
    return EXIT_OK if report.ok else EXIT_REFUSED


def _topology(args: argparse.Namespace) -> Topology:
    from .devices import discover_topology, load_topology

    return load_topology(args.topology) if args.topology else discover_topology()


def _selection(args: argparse.Namespace) -> DeviceSelection | None:
    from .devices import DeviceSelection

    if not args.devices:
        return None
    return DeviceSelection(frozenset(part for part in args.devices.split(",") if part))


def cmd_devices(args: argparse.Namespace) -> int:
    from .devices import DeviceSelection, load_selection, save_selection, selection_path

    topology = _topology(args)
    selection = load_selection()
    changed = False
    if args.allow_all:
        selection, changed = DeviceSelection(), True
    for physical_id in args.allow:
        selection, changed = selection.allow(topology, physical_id), True
    for physical_id in args.exclude:
        selection, changed = selection.exclude(topology, physical_id), True
    if changed:
        save_selection(selection)
    if args.json:
        document = topology.to_dict()
        document["selection"] = {
            "allowed": None if selection.allowed is None else sorted(selection.allowed),
            "file": str(selection_path()),
        }
        if args.audio:
            from .audio.devices import audio_devices_json

            document["audio"] = audio_devices_json()
        _print_json(document)
        return EXIT_OK
    print(topology.to_table())
    if args.audio:
        from .audio.devices import audio_devices_text

        print(audio_devices_text())
    if selection.allowed is None:
        print("device selection: all devices allowed")
    else:
        print(f"device selection: only {', '.join(sorted(selection.allowed))}")
    if changed:
        print(f"saved to {selection_path()}")
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    from .adapters.whisper_export import export_missing_recognisers
    from .planning import plan_pipeline

    # A speech recogniser the pipeline names is made on first use, before its manifests load.
    export_missing_recognisers(Path(args.pipeline), _progress)
    plan = plan_pipeline(args.pipeline, topology=_topology(args), selection=_selection(args))
    if args.json:
        _print_json(plan.to_json())
    else:
        print(plan.to_text())
    return EXIT_OK if plan.admitted else EXIT_REFUSED


def cmd_bundle_create(args: argparse.Namespace) -> int:
    from .artifacts import create_bundle, parse_meta_pairs

    bundle = create_bundle(
        Path(args.graph),
        Path(args.inputs),
        Path(args.out),
        component=args.component,
        metadata=parse_meta_pairs(args.meta),
    )
    if args.json:
        _print_json(bundle.to_json())
    else:
        print(f"created bundle {bundle.manifest_path}")
        print(f"  component {bundle.manifest.component}  identity {bundle.identity}")
        for name in sorted(bundle.manifest.files):
            print(f"  {bundle.manifest.files[name]}  {name}")
    return EXIT_OK


def _add_machine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--topology",
        metavar="FILE",
        help="check against the machine described in FILE instead of discovering this one",
    )
    parser.add_argument(
        "--devices",
        metavar="ID[,ID...]",
        help="allow only these device ids for this command (default: the saved selection)",
    )


def _load_npz(path: str, what: str) -> dict[str, Any]:
    import numpy as np

    from .errors import UsageError

    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (OSError, ValueError) as exc:
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

    from .adapters.whisper_export import export_missing_recognisers
    from .api import Omni
    from .config import load_pipeline
    from .errors import EXIT_FAILED, UsageError
    from .pipeline_input import TEXT_INPUT, input_kind

    if args.text is not None and args.chat is not None:
        raise UsageError("--text and --chat: give one request, the text or the conversation")
    messages = _load_chat(Path(args.chat)) if args.chat is not None else None
    # A speech recogniser the pipeline names is made on first use, before its manifests load.
    export_missing_recognisers(Path(args.pipeline), _progress)
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
                topology=_topology(args) if args.topology else None,
                selection=_selection(args),
            )
        )
        # An adapter's final output may carry its text as a string (a transcript).
        outputs = {name: np.asarray(value) for name, value in omni.run(inputs).items()}
        plan = omni.execution_plan
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
        _print_json(summary)
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


def _progress(line: str) -> None:
    print(f"omni-edge: {line}", file=sys.stderr, flush=True)


class LoadReporter:
    """What ``run`` waits for while the stages load, on stderr (stdout keeps the streamed
    text and ``--json``): the stages at the start, each stage once ready, and every
    ``tick_s`` the stages still loading with the seconds so far
    (``omni-edge: loading: assistant (vLLM worker) loading… 14 s``)."""

    def __init__(self, write: Callable[[str], None] = _progress, tick_s: float = 5.0) -> None:
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


def _log_to_stderr() -> None:
    """The runtime's warnings (a pipeline recreated, a worker retired) on stderr, in the
    same form as the progress lines: what a long-running command reports as it goes."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("omni-edge: %(message)s"))
    logger = logging.getLogger("omni")
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False


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
    audio. With ``--chat`` and ``--out``, the conversation with the reply is written too."""
    from .api import Omni
    from .audio import AudioPlayer, WavWriter
    from .contracts import new_request_id
    from .engine.outputs import AudioChunk
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
    wav: Path | None = None
    samples = 0
    rate = 0
    with contextlib.ExitStack() as stack:
        omni = stack.enter_context(
            Omni(
                config,
                events=_loading_events(stack),
                topology=_topology(args) if args.topology else None,
                selection=_selection(args),
            )
        )
        writer: WavWriter | None = None
        player: AudioPlayer | None = None
        for output in omni.generate(request, request_id=request_id):
            if output.finished:
                final = output
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
        plan = omni.execution_plan
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
        _print_json(
            {
                "pipeline": config.pipeline,
                "request_id": request_id,
                "text": text,
                "tokens": engine.get("tokens"),
                "finish_reason": engine.get("finish_reason"),
                "audio_seconds": audio_s,
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
    if samples and wav is None and not args.play:
        parts.append("the audio was not kept (give --out DIR or --play)")
    if out is not None:
        parts.append(
            f"wrote {', '.join([*written, 'execution_plan.json', 'metrics.json'])} in {out}"
        )
    _progress("; ".join(parts))
    return EXIT_OK


def cmd_bundle_export_vad(args: argparse.Namespace) -> int:
    from .adapters.vad_bundle import default_vad_dir, ensure_vad_bundle

    out = Path(args.out) if args.out else default_vad_dir()
    made: list[str] = []

    def progress(line: str) -> None:
        made.append(line)
        _progress(line)

    bundle = ensure_vad_bundle(out, progress=progress)
    if args.json:
        summary = {
            "root": str(bundle.root),
            "made": bool(made),
            "manifest": str(bundle.manifest_path),
            "identity": bundle.identity,
            "checkpoint_revision": bundle.manifest.metadata.get("checkpoint_revision"),
        }
        _print_json(summary)
    else:
        state = "made" if made else "already present and verified"
        print(f"voice activity bundle {state} at {bundle.root}")
    return EXIT_OK


def cmd_bundle_export_voice(args: argparse.Namespace) -> int:
    from .adapters.voice_export import default_voice_dir, ensure_voice_bundles, export_voice

    out = Path(args.out) if args.out else default_voice_dir(args.voice)
    exported: list[str] = []

    def progress(line: str) -> None:
        exported.append(line)
        _progress(line)

    if args.if_missing:
        bundles = ensure_voice_bundles(args.voice, out, progress=progress)
    else:
        progress(f"exporting voice {args.voice!r} into {out}")
        bundles = export_voice(out, args.voice)
    validation = bundles.validation
    summary = {
        "voice": args.voice,
        "root": str(bundles.root),
        "exported": bool(exported),
        "acoustic": str(bundles.acoustic.manifest_path),
        "decoder": str(bundles.decoder.manifest_path),
        "checkpoint_revision": bundles.checkpoint_revision,
        "max_abs_error": validation.get("max_abs_error"),
        "min_snr_db": validation.get("min_snr_db"),
    }
    if args.json:
        _print_json(summary)
    else:
        state = "exported" if exported else "already present and verified"
        print(f"voice {args.voice} {state} at {bundles.root}")
        print(f"  acoustic {bundles.acoustic.manifest_path}  identity {bundles.acoustic.identity}")
        print(f"  decoder  {bundles.decoder.manifest_path}  identity {bundles.decoder.identity}")
        print(
            f"  validated against the uncut voice: max abs error {summary['max_abs_error']}, "
            f"SNR {summary['min_snr_db']} dB"
        )
    return EXIT_OK


def _speak_config(args: argparse.Namespace) -> PipelineConfig:
    import dataclasses

    from .adapters.voice_export import ensure_voice_bundles
    from .assets import demo_pipeline
    from .config import load_pipeline
    from .errors import UsageError

    if args.pipeline is None:
        # The default pipeline reads the default voice from the user data directory.
        ensure_voice_bundles("joe", progress=_progress)
        path = demo_pipeline("speak")
    else:
        path = Path(args.pipeline)
    config = load_pipeline(path)
    if args.deterministic:
        if config.adapter is None:
            raise UsageError(f"--deterministic: pipeline {path} has no speech adapter")
        options = {**config.adapter.options, "scales": "deterministic"}
        config = dataclasses.replace(
            config, adapter=dataclasses.replace(config.adapter, options=options)
        )
    return config


def _device_arg(text: str | None) -> str | int | None:
    """``--device``: an index when it is a number, else a name."""
    if text is None:
        return None
    return int(text) if text.strip().isdigit() else text


def cmd_speak(args: argparse.Namespace) -> int:
    import time

    from .adapters.speak import speak_interruptibly
    from .adapters.tts import SpeechAdapter
    from .api import Omni
    from .engine.outputs import AudioChunk
    from .engine.program import load_program
    from .errors import UsageError

    out = Path(args.out) if args.out else None
    metrics_path = Path(args.metrics) if args.metrics else None
    for path, flag in ((out, "--out"), (metrics_path, "--metrics")):
        if path is not None and (not path.parent.is_dir() or path.is_dir()):
            raise UsageError(
                f"{flag} {path}: accepted: a file in an existing folder"
                + ("" if path.parent.is_dir() else f" ({path.parent} does not exist)")
            )
    play = args.play or args.device is not None
    device = _device_arg(args.device)
    if play:
        from .audio import resolve_output_device

        # A missing or unknown output is reported before anything loads.
        resolve_output_device(device)
    config = _speak_config(args)
    program = load_program(config)
    if not isinstance(program, SpeechAdapter):
        raise UsageError(
            f"pipeline {config.pipeline} cannot speak; accepted: a pipeline whose adapter is "
            "runtime.adapters.tts:SpeechAdapter (e.g. assets/pipelines/speak.yaml)"
        )
    # Unspeakable text is refused here, before any stage starts.
    started = time.perf_counter()
    plan = program.prepare(args.text)
    preparation_s = time.perf_counter() - started
    heard: list[bool] = []

    def first_audio(output: OmniRequestOutput) -> None:
        chunk = AudioChunk.from_output(output)
        if not heard and chunk is not None and chunk.pcm.size:
            heard.append(True)
            _progress("speaking; press Ctrl+C to stop")

    with Omni(
        config,
        topology=_topology(args) if args.topology else None,
        selection=_selection(args),
    ) as omni:
        # Ctrl+C stops the player within one block, then cancels the request.
        result = speak_interruptibly(
            omni,
            plan,
            out=out,
            play=play,
            device=device,
            on_chunk=first_audio,
        )
    for item in result.skipped[:10]:
        _progress(f"skipped {item['reason']} {item['text']!r}: {item['detail']}")
    if metrics_path is not None:
        document = {
            **result.to_metrics(),
            "pipeline": config.pipeline,
            "text_chars": len(args.text),
            "text_preparation_s": preparation_s,
        }
        metrics_path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(result.summary())
    if result.status == "interrupted":
        _progress("interrupted; the speech was stopped and nothing is left running")
        return EXIT_INTERRUPTED
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    import signal

    from .serve import OmniServer, ServeOptions, resolve_api_key

    # The key is checked before anything loads: a refused address costs no start-up.
    api_key = resolve_api_key(args.host, args.api_key_env)
    _log_to_stderr()
    options = ServeOptions(host=args.host, port=args.port, api_key=api_key)
    if args.pipelines:
        pipelines: list[str | Path] = list(args.pipelines)
    else:
        from .adapters.voice_export import ensure_voice_bundles
        from .assets import demo_pipeline

        ensure_voice_bundles("joe", progress=_progress)
        pipelines = [demo_pipeline("add"), demo_pipeline("speak")]
    server = OmniServer(
        pipelines,
        options,
        topology=_topology(args) if args.topology else None,
        selection=_selection(args),
        progress=_progress,
    )
    with server:
        server.start()
        assert server.registry is not None
        for pipeline in server.registry.pipelines.values():
            _progress(f"model {pipeline.name} ({pipeline.kind})")
        key_note = f"; clients send the key in ${args.api_key_env}" if api_key else ""
        print(f"serving {server.address}{key_note}", flush=True)
        _progress("press Ctrl+C to stop")
        received = server.serve_forever()
    _progress("stopped; every pipeline was closed")
    return EXIT_INTERRUPTED if received == signal.SIGINT else EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    from .errors import UsageError
    from .host import default_project_root

    # The suite lives in the source checkout beside the packages, not in an installed build.
    root = default_project_root()
    if not (root / "benchmarks" / "suite.py").is_file():
        raise UsageError(
            f"omni-edge bench runs from a source checkout; {root} has no benchmarks/suite.py"
        )
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    suite = importlib.import_module("benchmarks.suite")

    def log(line: str) -> None:
        print(f"omni-edge bench: {line}", file=sys.stderr, flush=True)

    return int(suite.main_with(args, log=log))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="omni-edge",
        description="Run, plan and verify multi-stage local AI pipelines.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    verify = commands.add_parser("verify", help="verify an artifact bundle's manifest and files")
    verify.add_argument("manifest", help="manifest.json or the bundle directory")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.set_defaults(handler=cmd_verify)

    plan = commands.add_parser(
        "plan", help="validate a pipeline and check admission; nothing loads"
    )
    plan.add_argument("pipeline", help="pipeline YAML file")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    _add_machine_args(plan)
    plan.set_defaults(handler=cmd_plan)

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
    _add_machine_args(run)
    run.set_defaults(handler=cmd_run)

    from .envs.commands import add_env_commands

    add_env_commands(commands)

    devices = commands.add_parser(
        "devices", help="list this machine's devices and memory constraints; choose devices"
    )
    devices.add_argument("--json", action="store_true", help="print the topology as JSON")
    devices.add_argument(
        "--topology", metavar="FILE", help="describe the machine in FILE instead of this one"
    )
    devices.add_argument(
        "--allow", action="append", default=[], metavar="ID", help="allow a device (saved)"
    )
    devices.add_argument(
        "--exclude", action="append", default=[], metavar="ID", help="exclude a device (saved)"
    )
    devices.add_argument("--allow-all", action="store_true", help="allow every device (saved)")
    devices.add_argument(
        "--audio", action="store_true", help="also list audio inputs and outputs (PortAudio)"
    )
    devices.set_defaults(handler=cmd_devices)

    bundle = commands.add_parser("bundle", help="create artifact bundles; export voices")
    bundle_commands = bundle.add_subparsers(dest="bundle_command", required=True, metavar="ACTION")
    create = bundle_commands.add_parser(
        "create", help="copy a graph, its external data and example inputs into a bundle"
    )
    create.add_argument("graph", help="the ONNX graph")
    create.add_argument("--inputs", required=True, help="example inputs (.npz)")
    create.add_argument("--out", required=True, help="new (or empty) bundle directory")
    create.add_argument("--component", help="component name (default: the graph's file stem)")
    create.add_argument(
        "--meta",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="metadata entry (repeatable), e.g. --meta checkpoint_revision=abc123",
    )
    create.add_argument("--json", action="store_true", help="print the bundle as JSON")
    create.set_defaults(handler=cmd_bundle_create)
    export_vad = bundle_commands.add_parser(
        "export-vad",
        help="bundle Silero VAD from the installed silero-vad wheel (once; verified after)",
    )
    export_vad.add_argument("--out", help="bundle directory (default: <user data>/vad/silero)")
    export_vad.add_argument("--json", action="store_true", help="print a JSON summary")
    export_vad.set_defaults(handler=cmd_bundle_export_vad)
    export_voice = bundle_commands.add_parser(
        "export-voice",
        help="cut an installed Piper voice into acoustic and decoder bundles (validated)",
    )
    export_voice.add_argument("--voice", default="joe", help="the voice to export (joe)")
    export_voice.add_argument(
        "--out",
        metavar="DIR",
        help="new (or empty) directory (default: voices/<voice> in the user data directory)",
    )
    export_voice.add_argument(
        "--if-missing",
        action="store_true",
        help="do nothing when bundles of the installed voice already verify there",
    )
    export_voice.add_argument("--json", action="store_true", help="print a JSON summary")
    export_voice.set_defaults(handler=cmd_bundle_export_voice)

    speak = commands.add_parser(
        "speak", help="speak a text with the streaming voice pipeline; write a WAV and/or play"
    )
    speak.add_argument("text", help="the text to speak")
    speak.add_argument("--out", metavar="FILE.wav", help="write the speech as a 16-bit WAV file")
    speak.add_argument("--play", action="store_true", help="play the speech as it is produced")
    speak.add_argument(
        "--device",
        metavar="NAME|INDEX",
        help="audio output by name (a part of it) or index (implies --play)",
    )
    speak.add_argument(
        "--metrics",
        metavar="FILE.json",
        help="write time to first audio, real-time factor, underruns, ... as JSON",
    )
    speak.add_argument(
        "--pipeline",
        metavar="YAML",
        help="a speech pipeline (default: assets/pipelines/speak.yaml with the voice joe)",
    )
    speak.add_argument(
        "--deterministic",
        action="store_true",
        help="no sampling noise: the same text always gives the same audio",
    )
    _add_machine_args(speak)
    speak.set_defaults(handler=cmd_speak)

    from .pipeline_commands import add_pipeline_commands

    add_pipeline_commands(commands)

    from .transcribe_command import add_transcribe_commands

    add_transcribe_commands(commands)

    serve = commands.add_parser(
        "serve",
        help=(
            "serve pipelines over an OpenAI-compatible HTTP API "
            "(chat, speech, transcription, graph runs)"
        ),
    )
    serve.add_argument(
        "pipelines",
        nargs="*",
        metavar="PIPELINE.yaml",
        help="pipelines to serve, each as the model of its name (default: the add and speech "
        "demos)",
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; another needs --api-key-env)",
    )
    serve.add_argument(
        "--port", type=int, default=8080, help="port to listen on (default 8080; 0: any free)"
    )
    serve.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="require 'Authorization: Bearer <key>' with the key held by this variable",
    )
    _add_machine_args(serve)
    serve.set_defaults(handler=cmd_serve)

    bench = commands.add_parser(
        "bench",
        help="measure every speed goal beside its baseline; write benchmarks/results/latest.*",
    )
    bench.add_argument(
        "--quick", action="store_true", help="fewer iterations, no vLLM (the CI mode, < 3 min)"
    )
    bench.add_argument(
        "--out", metavar="DIR", help="write latest.json and latest.md here (benchmarks/results)"
    )
    bench.add_argument(
        "--only",
        metavar="ID[,ID...]",
        help=(
            "run only these: graph, handoff, startup, ledger, speech, speech_in, vllm, "
            "llm_cold, studio, serve, memory"
        ),
    )
    bench.add_argument(
        "--runs",
        type=int,
        default=1,
        metavar="N",
        help="run everything N times (1 to 20) and keep each figure's median run",
    )
    bench.add_argument(
        "--update-readme",
        action="store_true",
        help="rewrite the results table in README.md (between the bench markers)",
    )
    bench.set_defaults(handler=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except OmniError as exc:
        print(f"omni-edge: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("omni-edge: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
