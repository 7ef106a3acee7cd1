"""``module:function`` names in a pipeline, imported while it loads to prove they resolve."""

from __future__ import annotations

import importlib
import re
from typing import TYPE_CHECKING, Any, NoReturn

from runtime.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable

CALLABLE_FORM = (
    "'module:function' (an importable module and a callable in it, "
    "e.g. 'mypkg.transforms:to_tensors')"
)

_CALLABLE_RE = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")


def resolve_callable(
    spec: str, *, file: str | None, line: int | None, key: str | None
) -> Callable[..., Any]:
    """Import ``module:function`` and return the callable; failures are ``ConfigError``."""

    def fail(message: str) -> NoReturn:
        raise ConfigError(f"{message}; expected {CALLABLE_FORM}", file=file, line=line, key=key)

    if not _CALLABLE_RE.match(spec):
        fail(f"{spec!r} is not of the form 'module:function'")
    module_name, _, attribute = spec.partition(":")
    try:
        target: object = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            fail(f"module {missing!r} not found (is it installed or on the import path?)")
        fail(f"importing module {module_name!r} failed: {exc}")
    except ImportError as exc:
        fail(f"importing module {module_name!r} failed: {exc}")
    except SyntaxError as exc:
        fail(f"module {module_name!r} has a syntax error at line {exc.lineno}: {exc.msg}")
    reached = module_name
    for index, part in enumerate(attribute.split(".")):
        if not hasattr(target, part):
            fail(f"{reached!r} has no attribute {part!r}")
        target = getattr(target, part)
        reached += (":" if index == 0 else ".") + part
    if not callable(target):
        fail(f"{spec!r} is a {type(target).__name__}, which is not callable")
    return target
