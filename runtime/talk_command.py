"""The ``talk`` command of ``omni-edge``: a spoken conversation in the terminal.

The microphone goes to a voice-chat pipeline (``assets/pipelines/voice-chat.yaml`` unless
named), its replies to the speaker; the terminal shows what was understood and the reply as it
is written. Speaking over a reply interrupts it. Ctrl+C (or ``--seconds``) ends the
conversation: the reply being made finishes, then the turns' latencies are printed.

What the pipeline needs is made on first use into the user data directory, before anything
loads: the voice activity bundle, the recogniser's bundles and the voice.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from .command_args import add_machine_args, device_selection, given_topology, say
from .errors import EXIT_INTERRUPTED, EXIT_OK

if TYPE_CHECKING:
    import argparse

    from .config import PipelineConfig
    from .conversation import ConversationEvent

#: Adapter options the command line may set, and their flags.
_OPTION_FLAGS = {"end_of_turn_s": "--end-of-turn", "barge_in": "--no-barge-in"}


def _device(text: str | None) -> str | int | None:
    if text is None:
        return None
    return int(text) if text.strip().isdigit() else text


def _first_use(path: Path) -> None:
    """Make what the pipeline names under the user data directory and is missing."""
    from .adapters.voice_export import ensure_voice_bundles
    from .adapters.whisper_export import export_missing_recognisers

    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    if "${data}/vad/silero/" in text:
        from .adapters.vad_bundle import ensure_vad_bundle

        ensure_vad_bundle(progress=say)
    export_missing_recognisers(path, say)
    if "${data}/voices/joe/" in text:
        ensure_voice_bundles("joe", progress=say)


def talk_config(args: argparse.Namespace) -> PipelineConfig:
    """The pipeline file, with the options given on the command line."""
    from .assets import demo_pipeline
    from .config import load_pipeline
    from .errors import UsageError

    path = Path(args.pipeline) if args.pipeline else demo_pipeline("voice-chat")
    if not path.is_file():
        raise UsageError(f"{path}: no such pipeline file; accepted: a voice-chat pipeline YAML")
    _first_use(path)
    config = load_pipeline(path)
    options: dict[str, Any] = {}
    if args.end_of_turn is not None:
        options["end_of_turn_s"] = args.end_of_turn
    if args.no_barge_in:
        options["barge_in"] = False
    if options:
        if config.adapter is None:
            raise UsageError(f"{', '.join(_OPTION_FLAGS.values())}: {path} has no adapter")
        merged = {**config.adapter.options, **options}
        config = dataclasses.replace(
            config, adapter=dataclasses.replace(config.adapter, options=merged)
        )
    return config


class _Printer:
    """What the terminal shows of the conversation (on the output thread)."""

    def __init__(self, out: TextIO, *, as_json: bool) -> None:
        self.out = out
        self.as_json = as_json
        self.replying: int | None = None

    def __call__(self, event: ConversationEvent) -> None:
        from .conversation import (
            INTERRUPTED,
            REPLY_DONE,
            REPLY_TEXT,
            TRANSCRIPT,
            TRANSCRIPT_PARTIAL,
        )

        if self.as_json:
            record: dict[str, Any] = {"event": event.event, "turn": event.turn}
            if event.t is not None:
                record["t"] = round(event.t, 3)
            if event.text is not None:
                record["text"] = event.text
            record.update({k: v for k, v in event.values.items() if k != "chunk_index"})
            print(json.dumps(record), file=self.out, flush=True)
            return
        name = event.event
        if name == TRANSCRIPT_PARTIAL and event.text:
            print(f"  ... {event.text}", file=self.out, flush=True)
        elif name == TRANSCRIPT:
            print(f"you: {event.text or '(nothing understood)'}", file=self.out, flush=True)
        elif name == REPLY_TEXT and event.text:
            if self.replying != event.turn:
                self.replying = event.turn
                print("assistant:", end="", file=self.out, flush=True)
            print(event.text, end="", file=self.out, flush=True)
        elif name == REPLY_DONE and self.replying == event.turn:
            self.replying = None
            print(file=self.out, flush=True)
        elif name == INTERRUPTED:
            if self.replying == event.turn:
                self.replying = None
                print(" [interrupted]", file=self.out, flush=True)


def cmd_talk(args: argparse.Namespace) -> int:
    from .api import PipelineSession
    from .errors import UsageError
    from .talk import TalkSettings, VoiceConversation

    if args.seconds is not None and args.seconds <= 0:
        raise UsageError(f"--seconds {args.seconds}: accepted: a positive number of seconds")
    from .audio import resolve_input_device, resolve_output_device

    echo = "off" if args.headphones else args.echo
    device = (_device(args.input_device), _device(args.output_device))
    # A missing or unknown device is reported before anything loads.
    resolve_input_device(device[0])
    resolve_output_device(device[1])
    settings = TalkSettings(device=device, echo=echo)
    config = talk_config(args)
    session = PipelineSession(
        config, topology=given_topology(args), selection=device_selection(args)
    )
    if session.kind != "voice-chat":
        raise UsageError(
            f"pipeline {config.pipeline} is a {session.kind} pipeline; accepted: a voice-chat "
            "pipeline (e.g. assets/pipelines/voice-chat.yaml)"
        )
    printer = _Printer(sys.stdout, as_json=args.json)
    started = time.perf_counter()
    say(f"loading {config.pipeline} (the recogniser, the assistant and the voice)")
    interrupted = False
    with session:
        say(f"loaded in {time.perf_counter() - started:.0f} s")
        conversation = VoiceConversation(session, settings, on_event=printer)
        conversation.start()
        say(
            "listening: speak, and speak over a reply to interrupt it; press Ctrl+C to end"
            + (f" (ending after {args.seconds:g} s)" if args.seconds else "")
        )
        deadline = None if args.seconds is None else time.monotonic() + args.seconds
        try:
            while not conversation.wait(0.2):
                if deadline is not None and time.monotonic() >= deadline:
                    break
        except KeyboardInterrupt:
            interrupted = True
        conversation.stop()
    timings = [t.to_json() for t in conversation.timings() if t.parts]
    if args.json:
        print(json.dumps({"summary": {"turns": timings}}), flush=True)
    else:
        for timing in timings:
            total = timing.get("first_audio_s")
            lead = timing.get("player_lead_s")
            if total is not None:
                say(
                    f"turn {timing['turn']}: first audio {total * 1000:.0f} ms after your speech "
                    f"ended (end of turn {timing['end_of_turn_s'] * 1000:.0f} ms)"
                    + ("" if lead is None else f", then {lead * 1000:.0f} ms to the speaker")
                    + (" [interrupted]" if timing["interrupted"] else "")
                )
    return EXIT_INTERRUPTED if interrupted else EXIT_OK


def add_talk_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``talk``."""
    from .audio.echo import ECHO_KINDS

    talk = commands.add_parser(
        "talk", help="a spoken conversation with the assistant (microphone and speaker)"
    )
    talk.add_argument(
        "pipeline",
        nargs="?",
        help="a voice-chat pipeline (default: assets/pipelines/voice-chat.yaml)",
    )
    talk.add_argument("--input-device", metavar="NAME|INDEX", help="the microphone")
    talk.add_argument("--output-device", metavar="NAME|INDEX", help="the speaker")
    talk.add_argument(
        "--echo",
        choices=ECHO_KINDS,
        default="auto",
        help="echo cancellation of the speaker's sound in the microphone (default: auto)",
    )
    talk.add_argument(
        "--headphones", action="store_true", help="no echo cancellation (same as --echo off)"
    )
    talk.add_argument(
        "--end-of-turn",
        type=float,
        metavar="SECONDS",
        help="the silence that ends your turn (default: the pipeline's, 0.45 s)",
    )
    talk.add_argument(
        "--no-barge-in", action="store_true", help="replies play to their end while you speak"
    )
    talk.add_argument(
        "--seconds", type=float, metavar="S", help="end the conversation after S seconds"
    )
    talk.add_argument("--json", action="store_true", help="print each event as a JSON line")
    add_machine_args(talk)
    talk.set_defaults(handler=cmd_talk)
