"""What several ``omni-edge`` commands share: the machine flags (``--topology``,
``--devices``), progress lines on stderr and JSON on stdout.

Kept apart from :mod:`runtime.cli` so that the command modules below it can use them.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

    from runtime.devices import DeviceSelection, Topology


def say(line: str) -> None:
    """A progress line on stderr (stdout keeps the results and ``--json``)."""
    print(f"omni-edge: {line}", file=sys.stderr, flush=True)


def print_json(document: Any) -> None:
    json.dump(document, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def add_machine_args(parser: argparse.ArgumentParser) -> None:
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


def machine_topology(args: argparse.Namespace) -> Topology:
    """The machine of ``--topology FILE``, else this one."""
    from runtime.devices import discover_topology, load_topology

    return load_topology(args.topology) if args.topology else discover_topology()


def given_topology(args: argparse.Namespace) -> Topology | None:
    """``--topology FILE``'s machine, or None: the runtime then discovers this one."""
    return machine_topology(args) if args.topology else None


def device_selection(args: argparse.Namespace) -> DeviceSelection | None:
    """``--devices``: only these device ids, or None for the saved selection."""
    from runtime.devices import DeviceSelection

    if not args.devices:
        return None
    return DeviceSelection(frozenset(part for part in args.devices.split(",") if part))


def log_to_stderr() -> None:
    """The runtime's warnings (a pipeline recreated, a worker retired) on stderr, in the
    same form as the progress lines: what a long-running command reports as it goes."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("omni-edge: %(message)s"))
    logger = logging.getLogger("omni")
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
