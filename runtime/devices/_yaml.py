"""Reading composed YAML nodes into typed values with the file, line and key of every error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

import yaml
from yaml.constructor import ConstructorError, SafeConstructor

from runtime.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

_STR = "tag:yaml.org,2002:str"
_NULL = "tag:yaml.org,2002:null"


@dataclass(frozen=True, slots=True)
class Located:
    """A YAML node with the dotted key path that leads to it, for error messages."""

    file: str
    node: yaml.Node
    key: str

    @property
    def line(self) -> int:
        return int(self.node.start_mark.line) + 1

    def fail(self, message: str) -> NoReturn:
        raise ConfigError(message, file=self.file, line=self.line, key=self.key or None)

    def child(self, node: yaml.Node, key: str) -> Located:
        return Located(self.file, node, key)

    def is_null(self) -> bool:
        return isinstance(self.node, yaml.ScalarNode) and self.node.tag == _NULL

    def mapping(self, allowed: frozenset[str], required: frozenset[str]) -> dict[str, Located]:
        """The entries of a mapping node; unknown, duplicate and missing keys are errors."""
        entries = self.entries()
        for name, value in entries.items():
            if name not in allowed:
                value.fail_key(f"unknown key (accepted: {', '.join(sorted(allowed))})")
        for name in sorted(required - entries.keys()):
            self.fail(f"missing required key '{name}'")
        return entries

    def entries(self) -> dict[str, Located]:
        """The entries of a mapping node with string keys, in file order; duplicates are errors."""
        if not isinstance(self.node, yaml.MappingNode):
            self.fail(f"expected a mapping, got {_describe(self.node)}")
        found: dict[str, Located] = {}
        key_lines: dict[str, int] = {}
        for key_node, value_node in self.node.value:
            if not (isinstance(key_node, yaml.ScalarNode) and key_node.tag == _STR):
                self.child(key_node, self.key).fail(
                    f"keys must be strings, got {_describe(key_node)}"
                )
            name = str(key_node.value)
            path = f"{self.key}.{name}" if self.key else name
            key_line = int(key_node.start_mark.line) + 1
            if name in found:
                self.child(key_node, path).fail(
                    f"duplicate key (first given on line {key_lines[name]})"
                )
            key_lines[name] = key_line
            found[name] = _Entry(self.file, value_node, path, key_line)
        return found

    def fail_key(self, message: str) -> NoReturn:
        self.fail(message)

    def sequence(self) -> Iterator[Located]:
        if not isinstance(self.node, yaml.SequenceNode):
            self.fail(f"expected a list, got {_describe(self.node)}")
        for index, item in enumerate(self.node.value):
            yield self.child(item, f"{self.key}[{index}]")

    def scalar(self) -> object:
        if not isinstance(self.node, yaml.ScalarNode):
            self.fail(f"expected a single value, got {_describe(self.node)}")
        try:
            return SafeConstructor().construct_object(self.node, deep=True)
        except (ConstructorError, ValueError) as error:
            self.fail(f"cannot read value {self.node.value!r}: {error}")

    def string(self) -> str:
        value = self.scalar()
        if not isinstance(value, str):
            self.fail(
                f"expected a string, but YAML reads {self.node.value!r} as "
                f"{type(value).__name__}; put it in quotes"
            )
        if not value.strip():
            self.fail("expected a non-empty string")
        return value

    def string_list(self) -> tuple[str, ...]:
        items = tuple(item.string() for item in self.sequence())
        for index, item in enumerate(items):
            if item in items[:index]:
                self.fail(f"{item!r} is listed twice")
        return items


@dataclass(frozen=True, slots=True)
class _Entry(Located):
    """A mapping value that also remembers the line of its key (errors about keys point there)."""

    key_line: int

    def fail_key(self, message: str) -> NoReturn:
        raise ConfigError(message, file=self.file, line=self.key_line, key=self.key or None)


def compose_file(path: Path) -> Located:
    """Compose a YAML file into its root node; unreadable or malformed files are ConfigErrors."""
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found", file=name) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read file: {error}", file=name) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = None if mark is None else int(mark.line) + 1
        raise ConfigError(f"not valid YAML: {error.problem}", file=name, line=line) from None
    except yaml.YAMLError as error:
        raise ConfigError(f"not valid YAML: {error}", file=name) from None
    if root is None:
        raise ConfigError("the file is empty", file=name)
    return Located(name, root, "")


def _describe(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return f"{node.value!r}"
