"""``omni-edge-studio [PIPELINE.yaml | manifest.json]`` and ``omni-edge-studio --self-test``."""

from __future__ import annotations

import argparse
import importlib
import multiprocessing
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="omni-edge-studio",
        description="Desktop studio for multi-stage local AI pipelines.",
    )
    parser.add_argument(
        "pipeline",
        nargs="?",
        type=Path,
        metavar="PIPELINE.yaml",
        help="a pipeline file or a bundle's manifest.json to open (default: the last one, else a demo)",
    )
    parser.add_argument(
        "--self-test",
        action="store_true",
        help="run the bundled demos headless (Qt offscreen) and exit non-zero on any failure",
    )
    parser.add_argument(
        "--with-llm",
        action="store_true",
        help="with --self-test: also run demos with a local language-model stage (needs vLLM)",
    )
    parser.add_argument(
        "--report",
        type=Path,
        metavar="FILE.json",
        help="with --self-test: write the results as JSON",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        metavar="SECONDS",
        help="with --self-test: the longest any one step may take (180)",
    )
    return parser


def _run_worker(argv: Sequence[str]) -> int:
    """A frozen build launches workers as ``<executable> --worker NAME [ARGS]``."""
    from runtime.host import BUILTIN_WORKERS

    if len(argv) < 2 or argv[1] not in BUILTIN_WORKERS:
        print(
            f"omni-edge-studio: --worker needs one of {', '.join(BUILTIN_WORKERS)}", file=sys.stderr
        )
        return EXIT_USAGE
    module = importlib.import_module(BUILTIN_WORKERS[argv[1]])
    return int(module.main(list(argv[2:])))


def _no_display() -> bool:
    """Qt aborts the process on Linux without a display unless a platform is forced."""
    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM"):
        return False
    return not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def main(argv: Sequence[str] | None = None) -> int:
    multiprocessing.freeze_support()
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["--worker"]:
        return _run_worker(arguments)
    args = _parser().parse_args(arguments)
    if args.self_test:
        # Headless by definition: no display is needed or used.
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
        from app.selftest import run_self_test

        return run_self_test(
            report=args.report, step_timeout_s=args.timeout, with_llm=args.with_llm
        )
    if args.pipeline is not None and not args.pipeline.exists():
        print(f"omni-edge-studio: {args.pipeline}: no such file", file=sys.stderr)
        return EXIT_USAGE

    if _no_display():
        print(
            "omni-edge-studio: no display found (DISPLAY and WAYLAND_DISPLAY are unset). Run it "
            "in a desktop session, under `xvfb-run`, or check the demos headless with "
            "`omni-edge-studio --self-test`.",
            file=sys.stderr,
        )
        return EXIT_USAGE

    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication

    from app.demos import default_demo, icon_path
    from app.settings import StudioSettings
    from app.theme import follow_system_scheme
    from app.window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Omni Edge Studio")
    app.setOrganizationName("omni-edge-studio")
    icon = icon_path()
    if icon is not None:
        QApplication.setWindowIcon(QIcon(str(icon)))
    follow_system_scheme(app)  # type: ignore[arg-type]
    settings = StudioSettings()
    window = MainWindow(settings=settings)
    window.show()
    start = args.pipeline
    if start is None:
        last = settings.last_pipeline
        start = last if last is not None and last.exists() else default_demo()
    if start is not None:
        window.open_path(start)
    return int(app.exec())


if __name__ == "__main__":
    raise SystemExit(main())
