"""The ``speak`` command of ``omni-edge``: a text spoken by the streaming voice pipeline, written
to a WAV file and/or played as it is produced; Ctrl+C stops the player, then the request.

The command line registers it with :func:`add_speak_command`; the handler returns an exit code
and lets :class:`~runtime.errors.OmniError` reach the caller, which prints it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from .command_args import add_machine_args, device_selection, given_topology, say
from .errors import EXIT_INTERRUPTED, EXIT_OK

if TYPE_CHECKING:
    import argparse

    from .api import OmniRequestOutput
    from .config import PipelineConfig


def _speak_config(args: argparse.Namespace) -> PipelineConfig:
    import dataclasses

    from .adapters.voice_export import ensure_voice_bundles
    from .assets import demo_pipeline
    from .config import load_pipeline
    from .errors import UsageError

    if args.pipeline is None:
        # The default pipeline reads the default voice from the user data directory.
        ensure_voice_bundles("joe", progress=say)
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
    from .api import AudioChunk, Omni, PipelineSession
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
    # Nothing loads here: the session only reads the pipeline and makes its program.
    speech = PipelineSession(config)
    if speech.kind != "speech":
        raise UsageError(
            f"pipeline {config.pipeline} cannot speak; accepted: a pipeline whose adapter is "
            "runtime.adapters.tts:SpeechAdapter (e.g. assets/pipelines/speak.yaml)"
        )
    # Unspeakable text is refused here, before any stage starts.
    started = time.perf_counter()
    plan = speech.prepare(args.text)
    preparation_s = time.perf_counter() - started
    heard: list[bool] = []

    def first_audio(output: OmniRequestOutput) -> None:
        chunk = AudioChunk.from_output(output)
        if not heard and chunk is not None and chunk.pcm.size:
            heard.append(True)
            say("speaking; press Ctrl+C to stop")

    with Omni(
        config,
        topology=given_topology(args),
        selection=device_selection(args),
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
        say(f"skipped {item['reason']} {item['text']!r}: {item['detail']}")
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
        say("interrupted; the speech was stopped and nothing is left running")
        return EXIT_INTERRUPTED
    return EXIT_OK


def add_speak_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``speak``."""
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
    add_machine_args(speak)
    speak.set_defaults(handler=cmd_speak)
