"""The common desired-state file, read without libyaml's event stream.

Almost every file in a fleet repo is the same few shapes: block mappings
and sequences of plain or single-quoted one-line scalars (a slot map is
eight copies of one slot). libyaml makes three Python objects per event
(the event and two marks) and the event loop handles each one, so on a large
fleet reading the trees is a large share of a PR plan's CPU time (`gpuaas bench
prplan`, `gpuaas bench validate` measure it).

This reader splits a file into its *shape* (the text with every `key: value`
value cut out) and its values, in one C-speed `re.split`. A shape seen before
maps to a compiled builder; each distinct raw value is typed once (YAML 1.1,
by yamlio's own resolver and constructors). What it returns must equal the
event path's value exactly, so it takes only what it is sure of and answers
None for everything else, which then goes the event path: comments, anchors,
aliases, tags, flow collections, block or multi-line scalars, escapes,
document markers, non-ASCII text, duplicate keys, keys that are not plain
words. Differential tests hold it to the event path over random documents.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from desired.reading import yamlio

MAX_SHAPES = 512  # distinct shapes kept; a tree of one-off shapes reads at the event path's speed
MAX_SHAPE_CHARS = 16 * 1024 * 1024  # and their text, in all (a file may be megabytes)
MAX_VALUES = 65_536  # distinct raw values kept typed
MAX_VALUE_CHARS = 256  # a longer value is typed each time it is read
MAX_LINES = 100_000  # a longer file takes the event path (its value budget, its messages)
MAX_NESTING = 60  # below yamlio.MAX_DEPTH: deeper goes the event path, which refuses it properly

# A value after "key: " up to the end of its line. The first ": " on a line ends the key;
# a quoted value holding ": " is still whole, as it runs to the end of the line.
_VALUE = re.compile(r": ([^\n]+)")
_LINE = re.compile(r"( *)(- +)?(?:([A-Za-z_][\w-]*):( \x00)?|(.+))?", re.ASCII)
# Plain scalars starting with an indicator, or holding what this reader leaves to libyaml.
_PLAIN_REFUSED = re.compile(r"^[-?:,\[\]{}#&*!|>'\"%@`\s]|[#'\"\[\]{}\\]|: |:$|\s$")
_NEGATIVE = re.compile(r"-[0-9.][^#'\"\[\]{}\\]*")

Builder = Callable[[list[Any]], Any]


class _Refused(Exception):
    """Not a file this reader is sure of."""


_shapes: dict[str, tuple[Builder, int, int] | None] = {}  # None: a shape refused before
_shape_chars = 0
_typed: dict[str, Any] = {}


def read(text: str) -> tuple[Any, int] | None:
    """(value, line of its first node) of a one-document plain block file, or None: read it with libyaml."""
    parts = _VALUE.split(text)
    shape = ": \x00".join(parts[0::2])
    if shape in _shapes:
        known = _shapes[shape]
    else:
        known = _compile_shape(shape)
        _keep_shape(shape, known)
    if known is None:
        return None
    build, count, line = known
    raw = parts[1::2]
    if len(raw) != count:
        return None
    typed = _typed
    try:
        values = [typed[v] if v in typed else _type(v) for v in raw]
    except _Refused:
        return None
    return build(values), line


def _keep_shape(shape: str, known: tuple[Builder, int, int] | None) -> None:
    global _shape_chars  # noqa: PLW0603 - the cache's size, beside the cache
    if len(_shapes) >= MAX_SHAPES or _shape_chars + len(shape) > MAX_SHAPE_CHARS:
        _shapes.clear()
        _shape_chars = 0
    _shapes[shape] = known
    _shape_chars += len(shape)


def _type(raw: str) -> Any:
    value = _scalar(raw)
    if len(raw) <= MAX_VALUE_CHARS:
        if len(_typed) >= MAX_VALUES:
            _typed.clear()
        _typed[raw] = value
    return value


def _scalar(raw: str) -> Any:
    """A one-line scalar as the event path types it, or _Refused."""
    if not (raw.isascii() and raw.isprintable()):
        raise _Refused
    first = raw[0]
    if first == "'":
        inner = raw[1:-1]
        if len(raw) < 2 or raw[-1] != "'" or "'" in inner.replace("''", ""):
            raise _Refused
        return inner.replace("''", "'")
    if first == '"':
        inner = raw[1:-1]
        if len(raw) < 2 or raw[-1] != '"' or '"' in inner or "\\" in inner:
            raise _Refused
        return inner
    if _PLAIN_REFUSED.search(raw) and not (_NEGATIVE.fullmatch(raw) and not _PLAIN_REFUSED.search(raw[1:])):
        raise _Refused
    try:
        return yamlio.plain_scalar(raw)
    except yamlio.YamlProblem:  # a bad timestamp or number: the event path says where
        raise _Refused from None


class _Open:
    """A mapping or sequence being laid out: its column, and its entries in order."""

    __slots__ = ("column", "entries", "is_map")

    def __init__(self, column: int, is_map: bool) -> None:
        self.column = column
        self.is_map = is_map
        # A map: (key, value slot | constant | _Open | None); a sequence: (None, the same).
        self.entries: list[tuple[str | None, Any]] = []


class _Slot(int):
    """The position of a value in the file's list of cut-out values."""


def _compile_shape(shape: str) -> tuple[Builder, int, int] | None:
    lines = shape.split("\n")
    if len(lines) > MAX_LINES:
        return None
    layout = _Layout()
    try:
        for number, text in enumerate(lines, 1):
            if text.strip(" "):
                layout.add(number, text)
        return layout.result()
    except _Refused:
        return None


class _Layout:
    """The lines of a shape laid out as nested containers; _Refused for anything not plainly block style."""

    def __init__(self) -> None:
        self.stack: list[_Open] = []
        self.root: _Open | None = None
        self.root_line = 0
        self.pending: _Open | None = None  # the map whose last key has no value on its line
        self.pending_column = 0
        self.slots = 0

    def add(self, number: int, text: str) -> None:
        match = _LINE.fullmatch(text)
        if match is None:
            raise _Refused
        indent, dash, key, cut, other = match.groups()
        column = len(indent)
        if other is not None and dash is None:
            raise _Refused  # a comment, a document marker, a continued scalar
        self._settle_pending(column, dash is not None)
        if self.root is None:
            if column:
                raise _Refused
            self.root = _Open(0, dash is None)
            self.root_line = number
            self.stack.append(self.root)
        if dash is not None:
            if key is None:
                self._scalar_item(column, other)
                return
            column = self._map_item(column, len(dash))
        else:
            if key is None:
                raise _Refused
            self._close_to_map(column)
        self._key(key, column, has_value=cut is not None)
        if len(self.stack) > MAX_NESTING:
            raise _Refused

    def _settle_pending(self, column: int, is_item: bool) -> None:
        """A key without a value holds what is indented below it (or an indentless sequence), else null."""
        owner, self.pending = self.pending, None
        if owner is not None and (column > self.pending_column or (is_item and column == self.pending_column)):
            nested = _Open(column, not is_item)
            owner.entries[-1] = (owner.entries[-1][0], nested)
            self.stack.append(nested)

    def _sequence_at(self, column: int) -> _Open:
        while self.stack and self.stack[-1].column > column:
            self.stack.pop()
        if not self.stack or self.stack[-1].column != column or self.stack[-1].is_map:
            raise _Refused
        return self.stack[-1]

    def _scalar_item(self, column: int, other: str | None) -> None:
        if other is None or "\x00" in other:
            raise _Refused
        self._sequence_at(column).entries.append((None, _Constant(_scalar(other))))

    def _map_item(self, column: int, dash: int) -> int:
        """A "- key: ..." line opens a mapping in the sequence; its keys stand where this key stands."""
        item = _Open(column + dash, True)
        self._sequence_at(column).entries.append((None, item))
        self.stack.append(item)
        return item.column

    def _close_to_map(self, column: int) -> None:
        stack = self.stack
        while stack and (stack[-1].column > column or (stack[-1].column == column and not stack[-1].is_map)):
            stack.pop()
        if not stack or stack[-1].column != column:
            raise _Refused

    def _key(self, key: str, column: int, *, has_value: bool) -> None:
        mapping = self.stack[-1]
        if any(k == key for k, _ in mapping.entries):
            raise _Refused  # a duplicate key: the event path names it
        if has_value:
            mapping.entries.append((key, _Slot(self.slots)))
            self.slots += 1
        else:
            mapping.entries.append((key, None))
            self.pending, self.pending_column = mapping, column

    def result(self) -> tuple[Builder, int, int]:
        if self.root is None:
            raise _Refused
        return _builder(self.root), self.slots, self.root_line


class _Constant:
    """A value written into the shape itself (a scalar item of a sequence)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _builder(node: _Open) -> Builder:
    """A function from the file's typed values to this container's plain value."""
    parts = [(key, _part(entry)) for key, entry in node.entries]
    if not node.is_map:
        getters = [get for _, get in parts]
        return lambda values: [get(values) for get in getters]
    slots = [entry for _, entry in node.entries]
    if slots and all(type(s) is _Slot for s in slots) and slots == list(range(slots[0], slots[0] + len(slots))):
        keys, lo, hi = tuple(k for k, _ in node.entries), slots[0], slots[0] + len(slots)
        return lambda values: dict(zip(keys, values[lo:hi], strict=True))
    return lambda values: {key: get(values) for key, get in parts}


def _part(entry: Any) -> Builder:
    if type(entry) is _Slot:
        index = int(entry)
        return lambda values: values[index]
    if isinstance(entry, _Open):
        return _builder(entry)
    if isinstance(entry, _Constant):
        constant = entry.value
        return lambda _values: constant
    return lambda _values: None  # `key:` and nothing below it: null, as libyaml's empty plain scalar
