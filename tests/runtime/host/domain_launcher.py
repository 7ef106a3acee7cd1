"""Stands in for the other OS domain's launcher (WSL interop, ``wsl.exe``) on Linux.

It starts the worker as its own child, in a session of its own (as a process of the other
domain is outside the controller's process group), hands it its standard streams and waits:
the process the controller started is then a launcher, not the worker.
"""

from __future__ import annotations

import subprocess
import sys


def main() -> int:
    worker = subprocess.Popen(sys.argv[1:], start_new_session=True)
    return worker.wait()


if __name__ == "__main__":
    sys.exit(main())
