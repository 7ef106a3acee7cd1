"""``packaging/build_frozen.py`` loaded as a module, for the frozen application's tests."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.helpers.distributions import REPO

BUILD_SCRIPT = REPO / "packaging" / "build_frozen.py"


def load_build_frozen() -> ModuleType:
    """The build script as a module (``packaging`` is also a PyPI package's name)."""
    spec = importlib.util.spec_from_file_location("build_frozen", BUILD_SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
