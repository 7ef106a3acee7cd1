"""Omni Edge runtime: the Qt-free control plane.

Importing this package is cheap on purpose: it loads nothing outside the standard
library. Subpackages import their heavier dependencies (NumPy, ONNX Runtime) lazily.
"""

import os

__version__ = "0.1.0"

# ONNX Runtime otherwise writes a session file into the temporary folder and a database
# under ~/.cache/Microsoft in every process that loads it; set before it is imported.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
