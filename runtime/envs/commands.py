"""The ``env`` command of ``omni-edge``: create, list and remove managed environments.

The command line registers it with :func:`add_env_commands`; each handler returns an exit
code and lets :class:`~runtime.errors.OmniError` reach the caller, which prints it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.errors import EXIT_FAILED, EXIT_OK
from runtime.ledger import format_bytes

from .manager import create_env, envs_root, list_envs, remove_env
from .recipes import RECIPES

if TYPE_CHECKING:
    import argparse


def cmd_env_create(args: argparse.Namespace) -> int:
    def progress(line: str) -> None:
        if args.quiet and line.startswith("    "):
            return
        print(line, flush=True)

    info = create_env(
        args.name,
        progress=progress,
        recipe=args.recipe,
        base_python=None if args.python is None else Path(args.python),
    )
    if args.json:
        json.dump(info.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"{info.name}: {info.python}")
    return EXIT_OK


def cmd_env_list(args: argparse.Namespace) -> int:
    infos = list_envs(with_size=args.sizes)
    if args.json:
        document = {
            "root": str(envs_root()),
            "environments": [info.to_json() for info in infos],
            "recipes": {
                name: {"description": recipe.description, "notes": recipe.notes}
                for name, recipe in RECIPES.items()
            },
        }
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_OK
    print(f"environments in {envs_root()}:")
    if not infos:
        print("  (none)")
    for info in infos:
        size = "" if info.size_bytes is None else f", {format_bytes(info.size_bytes)}"
        made = "" if info.created_at is None else f", created {info.created_at}"
        print(f"  {info.name}: {info.status} (recipe {info.recipe or '?'}{made}{size})")
    print("recipes: " + ", ".join(f"{name} ({r.description})" for name, r in RECIPES.items()))
    return EXIT_OK


def cmd_env_remove(args: argparse.Namespace) -> int:
    if remove_env(args.name):
        print(f"removed environment {args.name!r}")
        return EXIT_OK
    print(f"omni-edge: no environment named {args.name!r} in {envs_root()}", file=sys.stderr)
    return EXIT_FAILED


def add_env_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``env create|list|remove`` to the command line's subcommands."""
    env = commands.add_parser("env", help="manage worker environments (env:NAME interpreters)")
    actions = env.add_subparsers(dest="env_command", required=True, metavar="ACTION")

    create = actions.add_parser(
        "create", help="create an environment from its recipe, or reuse it when it is ready"
    )
    create.add_argument("name", help=f"environment name; recipes: {', '.join(RECIPES)}")
    create.add_argument("--recipe", help="the recipe to use when the name is not a recipe's name")
    create.add_argument(
        "--python", metavar="PATH", help="the Python that creates it (default: this one)"
    )
    create.add_argument("--quiet", action="store_true", help="show steps but not their output")
    create.add_argument("--json", action="store_true", help="print the environment as JSON")
    create.set_defaults(handler=cmd_env_create)

    listing = actions.add_parser("list", help="list environments and recipes")
    listing.add_argument("--sizes", action="store_true", help="add each one's disk use")
    listing.add_argument("--json", action="store_true", help="print the list as JSON")
    listing.set_defaults(handler=cmd_env_list)

    remove = actions.add_parser("remove", help="delete an environment")
    remove.add_argument("name", help="environment name")
    remove.set_defaults(handler=cmd_env_remove)
