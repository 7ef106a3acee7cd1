"""The ``pipeline`` command of ``omni-edge``: make your own models into pipelines ("My
pipelines", :mod:`runtime.model_import`), list and remove them.

The command line registers it with :func:`add_pipeline_commands`; each handler returns an
exit code and lets :class:`~runtime.errors.OmniError` reach the caller, which prints it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.errors import EXIT_OK

if TYPE_CHECKING:
    import argparse


def _say(line: str) -> None:
    print(f"omni-edge: {line}", file=sys.stderr, flush=True)


def _print_json(document: Any) -> None:
    json.dump(document, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def cmd_pipeline_new(args: argparse.Namespace) -> int:
    from runtime.model_import import import_model

    made = import_model(
        Path(args.source),
        name=args.name,
        inputs=Path(args.inputs) if args.inputs else None,
        speak=args.speak,
        progress=None if args.json else _say,
    )
    if args.json:
        _print_json(made.to_json())
    else:
        print(made.pipeline)
        hint = "" if made.kind == "graph" else ' --text "Hello!"'
        _say(f"run it with: omni-edge run {made.pipeline}{hint}")
    return EXIT_OK


def cmd_pipeline_list(args: argparse.Namespace) -> int:
    from runtime.model_import import list_my_pipelines, my_pipelines_dir

    made = list_my_pipelines()
    if args.json:
        _print_json([entry.to_json() for entry in made])
        return EXIT_OK
    if not made:
        _say(f"no pipelines made yet in {my_pipelines_dir()} (omni-edge pipeline new MODEL)")
    for entry in made:
        print(f"{entry.name}\t{entry.kind}\t{entry.pipeline}\t(from {entry.source})")
    return EXIT_OK


def cmd_pipeline_remove(args: argparse.Namespace) -> int:
    from runtime.model_import import remove_my_pipeline

    folder = remove_my_pipeline(args.name)
    _say(f"removed {folder}")
    return EXIT_OK


def add_pipeline_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``pipeline new``, ``pipeline list`` and ``pipeline remove``."""
    pipeline = commands.add_parser(
        "pipeline", help="make pipelines of your own models (My pipelines); list, remove"
    )
    pipeline_commands = pipeline.add_subparsers(
        dest="pipeline_command", required=True, metavar="ACTION"
    )
    new = pipeline_commands.add_parser(
        "new",
        help="an ONNX file -> a verified bundle and a one-stage pipeline; a Hugging Face model "
        "folder -> a chat pipeline (with --speak, chat-speak)",
    )
    new.add_argument("source", help="an ONNX file, or a Hugging Face model folder")
    new.add_argument("--name", help="the pipeline's name (default: from the file or folder)")
    new.add_argument(
        "--inputs",
        metavar="X.npz",
        help="example inputs of an ONNX file (default: made from its declared inputs)",
    )
    new.add_argument(
        "--speak", action="store_true", help="a language model's replies spoken by the voice"
    )
    new.add_argument("--json", action="store_true", help="print the result as JSON")
    new.set_defaults(handler=cmd_pipeline_new)
    listing = pipeline_commands.add_parser("list", help="the pipelines made here")
    listing.add_argument("--json", action="store_true", help="print them as JSON")
    listing.set_defaults(handler=cmd_pipeline_list)
    remove = pipeline_commands.add_parser("remove", help="remove a pipeline made here")
    remove.add_argument("name")
    remove.set_defaults(handler=cmd_pipeline_remove)
