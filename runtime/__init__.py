"""Omni Edge runtime: the Qt-free control plane.

Importing this package is cheap on purpose: it loads nothing outside the standard
library. Subpackages import their heavier dependencies (NumPy, ONNX Runtime) lazily.
"""

__version__ = "0.1.0"
