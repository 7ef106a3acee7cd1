"""The ``omni-edge`` command line.

Exit codes: 0 success; 2 usage error or invalid config; 3 refused (verification,
admission, placement); 4 execution failed; 130 interrupted after a clean shutdown.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import __version__
from .errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_REFUSED, OmniError

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


def cmd_plan(args: argparse.Namespace) -> int:
    from .planning import plan_pipeline

    plan = plan_pipeline(args.pipeline)
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
    plan.set_defaults(handler=cmd_plan)

    bundle = commands.add_parser("bundle", help="create artifact bundles")
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
