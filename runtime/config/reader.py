"""Reading a composed YAML tree into typed values; every failure names file, line and key."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import yaml
from yaml.constructor import SafeConstructor

from runtime.config.sizes import SIZE_FORMS, parse_size
from runtime.errors import ConfigError
from runtime.paths import expand_data_placeholder

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

#: Names a pipeline gives (pipelines, routes, environments, output types).
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: Environment variable names.
ENV_VAR_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, slots=True)
class SourceLocation:
    """Where a value was written: a file (or '<string>') and a 1-based line."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True, slots=True)
class ConfigItem:
    """One YAML node and the dotted key that reached it (``stages[1].backend.route.ep``)."""

    key: str
    node: yaml.Node

    @property
    def line(self) -> int:
        return int(self.node.start_mark.line) + 1

    def child(self, name: str) -> ConfigItem:
        """A key under this one, located at this node (for a field that was left out)."""
        return ConfigItem(_join(self.key, name), self.node)


def _join(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


def describe(value: object) -> str:
    if value is None:
        return "nothing (null)"
    return f"{value!r} ({type(value).__name__})"


def _describe_node(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return repr(node.value)


#: What PyYAML's constructors raise for a value its tag cannot read (``!!timestamp x``,
#: ``!!int ''``, ``!!bool maybe``): they index, look up and convert without checking first.
_CONSTRUCT_ERRORS = (
    yaml.YAMLError,
    ValueError,
    TypeError,
    AttributeError,
    KeyError,
    IndexError,
    OverflowError,
    RecursionError,
)


class ConfigReader:
    """Reads typed values out of a composed YAML tree; every failure names file, line and key.

    Backend section parsers (``BACKEND_PARSERS``) receive one, so their errors read like
    the rest of the pipeline's.
    """

    __slots__ = ("_constructor", "base_dir", "file")

    def __init__(self, file: str, base_dir: Path | None) -> None:
        self.file = file
        self.base_dir = base_dir
        self._constructor = SafeConstructor()

    def plain_mapping(self, item: ConfigItem) -> dict[str, Any]:
        """A free-form mapping (adapter options) as plain Python values."""
        try:
            value = self._constructor.construct_object(item.node, deep=True)
        except _CONSTRUCT_ERRORS as exc:
            self.reject(item, f"expected a mapping of plain values; {type(exc).__name__}: {exc}")
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            self.reject(item, "expected a mapping with string keys")
        return dict(value)

    def fail(self, message: str, *, key: str | None, line: int | None) -> NoReturn:
        raise ConfigError(message, file=self.file, line=line, key=key or None)

    def reject(self, item: ConfigItem, message: str) -> NoReturn:
        """Fail at ``item``'s key and line."""
        self.fail(message, key=item.key, line=item.line)

    def scalar(self, item: ConfigItem, expected: str) -> object:
        if not isinstance(item.node, yaml.ScalarNode):
            self.reject(item, f"expected {expected}; found {_describe_node(item.node)}")
        try:
            return self._constructor.construct_object(item.node, deep=True)
        except _CONSTRUCT_ERRORS as exc:
            problem = exc.problem if isinstance(exc, yaml.MarkedYAMLError) else None
            self.reject(
                item, f"cannot read {item.node.value!r} ({problem or exc}); expected {expected}"
            )

    def _pairs(self, item: ConfigItem, expected: str) -> list[tuple[str, int, yaml.Node]]:
        """(name, key line, value node) for each key of a mapping; duplicates are errors."""
        if not isinstance(item.node, yaml.MappingNode):
            self.reject(item, f"expected {expected}; found {_describe_node(item.node)}")
        pairs: list[tuple[str, int, yaml.Node]] = []
        first_line: dict[str, int] = {}
        for key_node, value_node in item.node.value:
            line = int(key_node.start_mark.line) + 1
            if not isinstance(key_node, yaml.ScalarNode):
                self.fail(
                    f"keys must be plain names; found {_describe_node(key_node)} as a key "
                    f"(expected {expected})",
                    key=item.key,
                    line=line,
                )
            name = str(key_node.value)
            if name in first_line:
                self.fail(
                    f"duplicate key {name!r} (first given on line {first_line[name]}); "
                    "each key may appear once",
                    key=_join(item.key, name),
                    line=line,
                )
            first_line[name] = line
            pairs.append((name, line, value_node))
        return pairs

    def entries(self, item: ConfigItem, *, expected: str = "a mapping") -> dict[str, ConfigItem]:
        """A free-form mapping's values by name, each keyed ``parent[name]``."""
        return {
            name: ConfigItem(f"{item.key}[{name}]", node)
            for name, _, node in self._pairs(item, expected)
        }

    def get(self, item: ConfigItem, name: str, *, expected: str = "a mapping") -> ConfigItem | None:
        """One field of a mapping without checking the others, or None when absent."""
        for key, _, node in self._pairs(item, expected):
            if key == name:
                return ConfigItem(_join(item.key, name), node)
        return None

    def mapping(
        self,
        item: ConfigItem,
        *,
        required: Sequence[str],
        optional: Sequence[str] = (),
    ) -> dict[str, ConfigItem]:
        """The named fields of a mapping; unknown, duplicate and missing keys are errors."""
        accepted = (*required, *optional)
        listing = ", ".join(accepted)
        fields: dict[str, ConfigItem] = {}
        for name, line, node in self._pairs(item, f"a mapping with keys {listing}"):
            key = _join(item.key, name)
            if name not in accepted:
                self.fail(f"unknown key {name!r}; accepted keys: {listing}", key=key, line=line)
            fields[name] = ConfigItem(key, node)
        for name in required:
            if name not in fields:
                self.fail(
                    f"missing required key {name!r}; this mapping needs {', '.join(required)}"
                    + (f" and may have {', '.join(optional)}" if optional else ""),
                    key=_join(item.key, name),
                    line=item.line,
                )
        return fields

    def sequence(self, item: ConfigItem, *, expected: str = "a list") -> list[ConfigItem]:
        if not isinstance(item.node, yaml.SequenceNode):
            self.reject(item, f"expected {expected}; found {_describe_node(item.node)}")
        return [
            ConfigItem(f"{item.key}[{index}]", node) for index, node in enumerate(item.node.value)
        ]

    def string(
        self,
        item: ConfigItem,
        *,
        expected: str = "a non-empty string",
        pattern: re.Pattern[str] | None = None,
    ) -> str:
        value = self.scalar(item, expected)
        if not isinstance(value, str) or not value or (pattern and not pattern.match(value)):
            self.reject(item, f"expected {expected}; found {describe(value)}")
        return value

    def choice(self, item: ConfigItem, choices: Collection[str]) -> str:
        expected = "one of " + ", ".join(choices)
        value = self.scalar(item, expected)
        if not isinstance(value, str) or value not in choices:
            self.reject(item, f"expected {expected}; found {describe(value)}")
        return value

    def boolean(self, item: ConfigItem) -> bool:
        value = self.scalar(item, "true or false")
        if not isinstance(value, bool):
            self.reject(item, f"expected true or false; found {describe(value)}")
        return value

    def integer(self, item: ConfigItem, *, minimum: int = 0) -> int:
        expected = f"an integer >= {minimum}"
        value = self.scalar(item, expected)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.reject(item, f"expected {expected}; found {describe(value)}")
        return value

    def size(self, item: ConfigItem, *, minimum: int = 0) -> int:
        """A byte count: an integer, or a string with a unit (see ``parse_size``)."""
        value = self.scalar(item, SIZE_FORMS)
        try:
            size = parse_size(value)
        except ValueError as exc:
            self.reject(item, str(exc))
        if size < minimum:
            self.reject(item, f"{size} is below the minimum of {minimum}; expected {SIZE_FORMS}")
        return size

    def fraction(self, item: ConfigItem) -> float:
        """A number in (0, 1]."""
        expected = "a number greater than 0 and at most 1 (e.g. 1.0 or 0.9)"
        value = self.scalar(item, expected)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
            self.reject(item, f"expected {expected}; found {describe(value)}")
        return float(value)

    def number(self, item: ConfigItem, *, minimum: float, maximum: float) -> float:
        """A finite number in [minimum, maximum] (an integer is taken as one)."""
        expected = f"a number from {minimum:g} to {maximum:g}"
        value = self.scalar(item, expected)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or not minimum <= value <= maximum
        ):
            self.reject(item, f"expected {expected}; found {describe(value)}")
        return float(value)

    def located_path(self, item: ConfigItem, text: str) -> Path:
        """``text`` as a path: ``${data}`` expanded, a relative one joined to the pipeline's
        directory (refused when the pipeline was not read from a file)."""
        path = Path(expand_data_placeholder(text))
        if not path.is_absolute():
            if self.base_dir is None:
                self.reject(
                    item,
                    f"{text!r} is a relative path, but this pipeline was not read from a file; "
                    "use an absolute path",
                )
            # normpath folds "..", but symlinks stay: a venv's python is one and its location matters.
            path = Path(os.path.normpath(self.base_dir / path))
        return path

    def file_path(
        self,
        item: ConfigItem,
        *,
        what: str,
        suffix: str | None = None,
        executable: bool = False,
    ) -> Path:
        """An existing file, absolute or relative to the pipeline file's directory."""
        accepted = (
            f"the path of {what}, absolute, relative to the pipeline file, or starting with "
            "${data}/ (the user data directory)"
        )
        text = self.string(item, expected=accepted)
        path = self.located_path(item, text)
        if suffix is not None and path.suffix != suffix:
            self.reject(item, f"{str(path)!r} is not a {suffix} file; expected {accepted}")
        try:
            exists, is_file = path.exists(), path.is_file()
        except (OSError, ValueError) as exc:
            # A name too long for the OS, or one with a NUL byte, names no file.
            self.reject(
                item, f"{what} {str(path)!r} cannot be looked up ({exc}); expected {accepted}"
            )
        if not exists:
            self.reject(item, f"{what} {str(path)!r} does not exist; expected {accepted}")
        if not is_file:
            self.reject(item, f"{what} {str(path)!r} is not a file; expected {accepted}")
        if executable and not os.access(path, os.X_OK):
            self.reject(item, f"{what} {str(path)!r} is not executable")
        return path
