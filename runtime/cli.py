"""The ``omni-edge`` command line.

Exit codes: 0 success; 2 usage error or invalid config; 3 refused (verification,
admission, placement); 4 execution failed; 130 interrupted after a clean shutdown.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from . import __version__
from .command_args import (
    add_machine_args,
    device_selection,
    given_topology,
    log_to_stderr,
    machine_topology,
    print_json,
    say,
)
from .errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_REFUSED, OmniError

Handler = Callable[[argparse.Namespace], int]


def cmd_verify(args: argparse.Namespace) -> int:
    from .artifacts import inspect_bundle

    report = inspect_bundle(args.manifest)
    if args.json:
        print_json(report.to_json())
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


def cmd_devices(args: argparse.Namespace) -> int:
    from .devices import DeviceSelection, load_selection, save_selection, selection_path

    topology = machine_topology(args)
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
        print_json(document)
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
    from .adapters.embed_bundle import export_missing_embedders
    from .adapters.whisper_export import export_missing_recognisers
    from .planning import plan_pipeline

    # A speech recogniser or an embedder the pipeline names is made on first use, before its
    # manifests load.
    export_missing_recognisers(Path(args.pipeline), say)
    export_missing_embedders(Path(args.pipeline), say)
    plan = plan_pipeline(
        args.pipeline, topology=machine_topology(args), selection=device_selection(args)
    )
    if args.json:
        print_json(plan.to_json())
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
        print_json(bundle.to_json())
    else:
        print(f"created bundle {bundle.manifest_path}")
        print(f"  component {bundle.manifest.component}  identity {bundle.identity}")
        for name in sorted(bundle.manifest.files):
            print(f"  {bundle.manifest.files[name]}  {name}")
    return EXIT_OK


def cmd_bundle_export_vad(args: argparse.Namespace) -> int:
    from .adapters.vad_bundle import default_vad_dir, ensure_vad_bundle

    out = Path(args.out) if args.out else default_vad_dir()
    made: list[str] = []

    def progress(line: str) -> None:
        made.append(line)
        say(line)

    bundle = ensure_vad_bundle(out, progress=progress)
    if args.json:
        summary = {
            "root": str(bundle.root),
            "made": bool(made),
            "manifest": str(bundle.manifest_path),
            "identity": bundle.identity,
            "checkpoint_revision": bundle.manifest.metadata.get("checkpoint_revision"),
        }
        print_json(summary)
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
        say(line)

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
        print_json(summary)
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


def cmd_serve(args: argparse.Namespace) -> int:
    import signal

    from .serve import OmniServer, ServeOptions, resolve_api_key

    # The key is checked before anything loads: a refused address costs no start-up.
    api_key = resolve_api_key(args.host, args.api_key_env)
    log_to_stderr()
    options = ServeOptions(
        host=args.host, port=args.port, api_key=api_key, max_queue=args.max_queue
    )
    if args.pipelines:
        pipelines: list[str | Path] = list(args.pipelines)
    else:
        from .adapters.voice_export import ensure_voice_bundles
        from .assets import demo_pipeline

        ensure_voice_bundles("joe", progress=say)
        pipelines = [demo_pipeline("add"), demo_pipeline("speak")]
    server = OmniServer(
        pipelines,
        options,
        topology=given_topology(args),
        selection=device_selection(args),
        progress=say,
    )
    with server:
        server.start()
        assert server.registry is not None
        for pipeline in server.registry.pipelines.values():
            say(f"model {pipeline.name} ({pipeline.kind})")
        key_note = f"; clients send the key in ${args.api_key_env}" if api_key else ""
        print(f"serving {server.address}{key_note}", flush=True)
        say("press Ctrl+C to stop")
        received = server.serve_forever()
    say("stopped; every pipeline was closed")
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
    add_machine_args(plan)
    plan.set_defaults(handler=cmd_plan)

    from .run_command import add_run_command

    add_run_command(commands)

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

    from .speak_command import add_speak_command

    add_speak_command(commands)

    from .talk_command import add_talk_command

    add_talk_command(commands)

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
        "--max-queue",
        type=int,
        default=16,
        metavar="N",
        help="requests that may wait for each busy pipeline, in arrival order (default 16; "
        "0: none, a busy pipeline answers 429 at once); a full queue answers 429 with "
        "Retry-After",
    )
    serve.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="require 'Authorization: Bearer <key>' with the key held by this variable",
    )
    add_machine_args(serve)
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
            "llm_cold, studio, serve, serve_speech, serve_chat, memory"
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
