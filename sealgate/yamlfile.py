"""Strict YAML for the files operators write (rules, `rules test` cases, the issuer's callers).

The text is composed into nodes, which keep their line numbers, and read through typed accessors
whose errors name file, line and field: `file:line: field: message`. Refused while composing, so
an expanded tree is never built: anchors and aliases (how YAML bombs multiply, and what lets one
entry silently pull in another under review), explicit tags (how YAML asks for objects) and
nesting deeper than 32 levels. Refused in every mapping: duplicate keys (the second would
silently replace the first) and keys that are not plain strings.

Scalars have one spelling each: integers plain decimal (YAML 1.1 reads `0443` as octal, `0x1bb`
as hex and `1:30` as 90), booleans `true` or `false` (not yes/no/on/off).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Final

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .files import read_regular
from .reasons import SealgateError

__all__ = [
    "BOOL",
    "FLOAT",
    "INT",
    "MAX_FILE_BYTES",
    "NULL",
    "STR",
    "Entries",
    "Where",
    "YamlFile",
    "YamlFileError",
    "describe",
    "format_location",
    "join",
    "show",
]

MAX_FILE_BYTES: Final = 1024 * 1024
_MAX_DEPTH: Final = 32
_SHOW_MAX: Final = 100
_PLAIN_INT: Final = re.compile(r"-?(?:0|[1-9](?:_?[0-9])*)")

_T: Final = "tag:yaml.org,2002:"
STR, INT, FLOAT, BOOL, NULL = (f"{_T}{t}" for t in ("str", "int", "float", "bool", "null"))


def format_location(path: Path, line: int | None, field: str, message: str) -> str:
    """`file:line: field: message`, the shape of every error and warning about such a file."""
    where = f"{path}:{line}" if line is not None else str(path)
    return f"{where}: {field}: {message}" if field else f"{where}: {message}"


class YamlFileError(SealgateError, ValueError):
    """A file we refuse to read. `str()` is `file:line: field: message`."""

    def __init__(self, path: Path, line: int | None, field: str, message: str) -> None:
        super().__init__(format_location(path, line, field, message))
        self.path = path
        self.line = line
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class Where:
    path: Path
    line: int | None

    def __str__(self) -> str:
        return f"{self.path}:{self.line}" if self.line is not None else str(self.path)


# key -> (key node, value node), in file order
Entries = dict[str, tuple[ScalarNode, Node]]


def join(parent: str, key: str) -> str:
    """The field name of `key` under `parent`: `policies.ci`."""
    return f"{parent}.{key}" if parent else key


def show(text: str) -> str:
    """`text` quoted for an error message, cut short: the file's words, never a screenful."""
    shown = repr(text)
    return shown if len(shown) <= _SHOW_MAX else shown[: _SHOW_MAX - 3] + "..."


def _line(node: Node) -> int | None:
    return node.start_mark.line + 1 if node.start_mark is not None else None


def describe(node: Node) -> str:
    """What a node is, in an error's words: "expected a list, got a mapping"."""
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    return {NULL: "null", BOOL: "true/false", INT: "a number", FLOAT: "a number"}.get(
        node.tag, "a string"
    )


class _Refused(Exception):
    def __init__(self, line: int | None, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader's composer minus anchors, aliases, explicit tags and deep nesting."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        # The stubs leave Parser.peek_event untyped; it returns the next parser event.
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        if isinstance(event, yaml.NodeEvent) and event.anchor is not None:
            raise _Refused(line, "YAML anchors and aliases are not allowed")
        if isinstance(event, yaml.ScalarEvent | yaml.CollectionStartEvent) and event.tag:
            raise _Refused(line, "YAML tags are not allowed")
        if self._depth >= _MAX_DEPTH:
            raise _Refused(line, f"nested deeper than {_MAX_DEPTH} levels")
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class YamlFile:
    """One file read the strict way, with typed access to its nodes.

    `root` is None for a file without a document (empty, or only comments). Subclasses set
    `error_type` to raise their own subclass of YamlFileError.
    """

    error_type: ClassVar[type[YamlFileError]] = YamlFileError

    def __init__(
        self, path: Path, text: str | None = None, *, max_bytes: int = MAX_FILE_BYTES
    ) -> None:
        self.path = path
        self.root = self._compose(self._read(max_bytes) if text is None else text)

    def _read(self, max_bytes: int) -> str:
        try:
            data, _ = read_regular(self.path, max_bytes)
        except OSError as exc:
            raise self.error_type(self.path, None, "", f"cannot read: {exc.strerror}") from None
        if len(data) > max_bytes:
            raise self.error_type(self.path, None, "", f"file is larger than {max_bytes} bytes")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.error_type(
                self.path, None, "", f"not valid UTF-8 (byte {exc.start})"
            ) from None

    def _compose(self, text: str) -> Node | None:
        loader = _StrictLoader(text)
        try:
            return loader.get_single_node()
        except _Refused as exc:
            raise self.error_type(self.path, exc.line, "", exc.message) from None
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            # Only the parser's words, never its snippet of the file: the line may hold a secret
            # or a key hash.
            problem = " ".join(p for p in (exc.context, exc.problem) if p)
            raise self.error_type(
                self.path, mark.line + 1 if mark else None, "", f"YAML syntax error: {problem}"
            ) from None
        except yaml.YAMLError as exc:
            message = f"YAML error: {type(exc).__name__}"
            raise self.error_type(self.path, None, "", message) from None
        finally:
            loader.dispose()

    # -- errors and where things are ------------------------------------------------------

    def where(self, node: Node) -> Where:
        return Where(self.path, _line(node))

    def error(self, node: Node, field: str, message: str) -> YamlFileError:
        """The error to raise about `node`."""
        return self.error_type(self.path, _line(node), field, message)

    # -- typed access ---------------------------------------------------------------------

    def mapping(self, node: Node, field: str) -> Entries:
        if not isinstance(node, MappingNode):
            raise self.error(node, field, f"expected a mapping, got {describe(node)}")
        entries: Entries = {}
        for key_node, value in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag != STR:
                raise self.error(key_node, field, "keys must be plain strings (quote them)")
            key: str = key_node.value
            if key in entries:
                first = _line(entries[key][0])
                raise self.error(
                    key_node, join(field, key), f"duplicate key (first at line {first})"
                )
            entries[key] = (key_node, value)
        return entries

    def expect_keys(
        self,
        entries: Entries,
        where: Node,
        field: str,
        allowed: Collection[str],
        required: Collection[str] = (),
    ) -> None:
        for key, (key_node, _) in entries.items():
            if key not in allowed:
                raise self.error(
                    key_node,
                    join(field, key),
                    f"unknown key {show(key)} (expected one of: {', '.join(allowed)})",
                )
        for key in required:
            if key not in entries:
                raise self.error(where, join(field, key), "required key is missing")

    def scalar(self, node: Node, field: str, tags: Collection[str], what: str) -> str:
        """The text of a scalar whose resolved tag is one of `tags` (`what` names them)."""
        if not isinstance(node, ScalarNode) or node.tag not in tags:
            raise self.error(node, field, f"expected {what}, got {describe(node)}")
        value: str = node.value
        return value

    def is_null(self, node: Node) -> bool:
        return isinstance(node, ScalarNode) and node.tag == NULL

    def string(self, node: Node, field: str) -> str:
        return self.scalar(node, field, (STR,), "a string")

    def integer(self, node: Node, field: str, low: int, high: int, what: str = "") -> int:
        value = self._plain_int(node, self.scalar(node, field, (INT,), "an integer"), field)
        if not low <= value <= high:
            raise self.error(node, field, f"{what}{value} out of range {low}-{high}")
        return value

    def boolean(self, node: Node, field: str) -> bool:
        return self._plain_bool(node, self.scalar(node, field, (BOOL,), "true or false"), field)

    def sequence(self, node: Node, field: str) -> list[Node]:
        if not isinstance(node, SequenceNode):
            raise self.error(node, field, f"expected a list, got {describe(node)}")
        items: list[Node] = node.value
        return items

    def data(self) -> object:
        """The whole document as plain Python values (dict, list, str, int, bool, None, ...),
        for readers that check types on values rather than nodes. None for an empty file."""
        return None if self.root is None else self._value(self.root, "")

    def value(self, node: Node, field: str) -> object:
        """The value at `node` as plain Python values, as `data` reads the whole document."""
        return self._value(node, field)

    def _value(self, node: Node, field: str) -> object:
        if isinstance(node, MappingNode):
            return {
                key: self._value(value, join(field, key))
                for key, (_, value) in self.mapping(node, field).items()
            }
        if isinstance(node, SequenceNode):
            return [self._value(item, f"{field}[{i}]") for i, item in enumerate(node.value)]
        if node.tag == INT:
            return self._plain_int(node, node.value, field)
        if node.tag == BOOL:
            return self._plain_bool(node, node.value, field)
        try:
            return SafeConstructor().construct_object(node)
        except yaml.YAMLError as exc:
            raise self.error(node, field, f"unreadable value ({type(exc).__name__})") from None

    def _plain_int(self, node: Node, text: str, field: str) -> int:
        if not _PLAIN_INT.fullmatch(text):
            raise self.error(node, field, f"{show(text)} is not a plain decimal integer")
        return int(text)

    def _plain_bool(self, node: Node, text: str, field: str) -> bool:
        if text.lower() not in ("true", "false"):
            raise self.error(node, field, f"write true or false, not {show(text)}")
        return text.lower() == "true"
