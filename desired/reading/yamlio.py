"""Safe YAML reading that keeps line and column for every value.

libyaml (through PyYAML's C composer) builds the node tree quickly; this
module turns nodes into plain Python values itself so it can refuse what a
desired-state file must never contain: duplicate keys, tabs used for
indentation, non-UTF-8 bytes, alias expansion bombs, absurd nesting and
non-core tags, an anchor defined twice in one document (PyYAML refuses it
too; which value an alias meant would depend on the reader). Every refusal
is a Problem with a position, never a traceback.

Nesting is checked *before* libyaml sees the text: libyaml's composer recurses
in C and crashes the interpreter on a few tens of thousands of nested brackets.
"""

from __future__ import annotations

import datetime as dt
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from desired import problems as p

MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 64
MAX_NODES_PER_FILE = 200_000

_BaseLoader: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[misc]  # libyaml's loader class is untyped
    """libyaml composer with a lean resolver.

    PyYAML's resolver walks path resolvers for every node even when none are
    registered; on a 10,000-node fleet that is half the parse time.
    """

    _implicit = _BaseLoader.yaml_implicit_resolvers

    def descend_resolver(self, current_node: Any, current_index: Any) -> None:
        return None

    def ascend_resolver(self) -> None:
        return None

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        if kind is yaml.ScalarNode:
            if implicit[0]:
                for tag, regexp in self._implicit.get(value[:1], ()):
                    if regexp.match(value):
                        return str(tag)
            return _STR
        return _SEQ if kind is yaml.SequenceNode else _MAP


_TAB_INDENT = re.compile(rb"^[ ]*\t", re.MULTILINE)
_FLOW_TOKEN = re.compile(r"""[\[\]{}]|"(?:\\.|[^"\\\n])*"|'(?:''|[^'\n])*'|(?:^|\s)#[^\n]*""")
_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_MAP = "tag:yaml.org,2002:map"
_MERGE = "tag:yaml.org,2002:merge"
_SEQ = "tag:yaml.org,2002:seq"
_constructor = yaml.constructor.SafeConstructor()


class YamlProblem(Exception):
    """One problem that stops reading a file."""

    def __init__(self, code: str, message: str, line: int = 1, column: int = 1) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.line = line
        self.column = column


@dataclass(slots=True)
class Document:
    """One YAML document: its plain value, and the text to find positions in.

    The node tree is dropped after conversion and composed again only when a
    problem needs a position: a valid 10,000-node fleet never pays for it.
    """

    file: str
    index: int
    value: Any
    line: int
    data: bytes  # the file's bytes; zlib-compressed when `packed`
    _node: yaml.Node | None = None
    # A long-lived tree (`gpuaas run`) keeps its files compressed: positions are wanted
    # only for problems, and YAML text compresses to a fraction of its size.
    packed: bool = False
    # git's id of the file's bytes (set by the loader): with `index`, names the document's content
    # without serialising it (the inventory's content hash).
    blob: str | None = None

    @property
    def node(self) -> yaml.Node:
        if self._node is None:
            data = zlib.decompress(self.data) if self.packed else self.data
            nodes = [n for n in yaml.compose_all(_decode(data), Loader=_Loader) if n is not None]
            self._node = nodes[self.index]
        return self._node

    def locate(self, path: tuple[str | int, ...]) -> tuple[int, int]:
        """Line and column of the value at `path` (the deepest part that exists).

        A key that is present points at the key itself, so "unknown field"
        errors land on the offending key, not on its value.
        """
        node = self.node
        mark = node.start_mark
        for part in path:
            if isinstance(node, yaml.MappingNode):
                for key_node, value_node in node.value:
                    if key_node.value == part:
                        mark = key_node.start_mark
                        node = value_node
                        break
                else:
                    return int(mark.line) + 1, int(mark.column) + 1
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                if 0 <= part < len(node.value):
                    node = node.value[part]
                    mark = node.start_mark
                else:
                    break
            else:
                break
        return int(mark.line) + 1, int(mark.column) + 1

    def locate_value(self, path: tuple[str | int, ...]) -> tuple[int, int]:
        """Line and column of the value (not the key) at `path`."""
        node = self.node
        for part in path:
            if isinstance(node, yaml.MappingNode):
                found = next((v for k, v in node.value if k.value == part), None)
                if found is None:
                    break
                node = found
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                if not 0 <= part < len(node.value):
                    break
                node = node.value[part]
            else:
                break
        return int(node.start_mark.line) + 1, int(node.start_mark.column) + 1


def read_documents(name: str, data: bytes) -> Iterator[Document]:
    """Yield every document in a file; raise YamlProblem on the first refusal."""
    if len(data) > MAX_FILE_BYTES:
        raise YamlProblem(p.YAML_TOO_LARGE, f"file is {len(data)} bytes; the limit is {MAX_FILE_BYTES}")
    text = _decode(data)
    tab = _TAB_INDENT.search(data)
    if tab:
        line = data.count(b"\n", 0, tab.start()) + 1
        col = tab.end() - tab.start()
        raise YamlProblem(p.YAML_TAB, "tab used for indentation; YAML indents with spaces", line, col)
    _check_flow_depth(text)
    from desired.reading import blockstyle  # imports this module

    plain = blockstyle.read(text)
    if plain is not None:  # the common plain block file, without libyaml's event stream
        yield Document(name, 0, plain[0], plain[1], data)
        return
    try:
        yield from _build(name, text, data)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise YamlProblem(p.YAML_SYNTAX, _syntax_message(e), line, col) from None
    except yaml.YAMLError as e:
        raise YamlProblem(p.YAML_SYNTAX, str(e).splitlines()[0]) from None


def _decode(data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise YamlProblem(p.YAML_ENCODING, f"byte 0x{data[e.start]:02x} is not valid UTF-8", line, col) from None
    return text.removeprefix("\ufeff")


def _check_flow_depth(text: str) -> None:
    # Cheap C-speed count first; only files with many brackets get the careful scan.
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return
    depth = 0
    for match in _FLOW_TOKEN.finditer(text):
        tok = match.group()
        if tok in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                line = text.count("\n", 0, match.start()) + 1
                col = match.start() - (text.rfind("\n", 0, match.start()) + 1) + 1
                raise YamlProblem(p.YAML_TOO_DEEP, f"nesting deeper than {MAX_DEPTH} levels", line, col)
        elif tok in "]}":
            depth = max(0, depth - 1)


def _syntax_message(e: yaml.MarkedYAMLError) -> str:
    parts = [part for part in (e.context, e.problem) if part]
    return "; ".join(parts) if parts else "malformed YAML"


def _pos(mark: Any) -> tuple[int, int]:
    return int(mark.line) + 1, int(mark.column) + 1


class _Frame:
    """One open mapping or sequence while events stream in."""

    __slots__ = ("anchor", "count", "key", "key_mark", "mark", "value")

    def __init__(self, value: dict[str, Any] | list[Any], mark: Any, anchor: str | None) -> None:
        self.value = value
        self.mark = mark
        self.anchor = anchor
        self.key: str | None = None
        self.key_mark: Any = None
        self.count = 1  # values this container expands to, itself included


def _build(name: str, text: str, data: bytes) -> Iterator[Document]:
    """Build plain values straight from libyaml's event stream.

    No node tree is built (positions are recomposed lazily when a problem
    needs one). This loop is the hot path of validating a large fleet, hence
    the locals and the inlined common cases.
    """
    loader = _BaseLoader(text)
    try:
        yield from _events_to_documents(name, data, loader.get_event)
    finally:
        loader.dispose()


def _too_many(mark: Any) -> YamlProblem:
    return YamlProblem(
        p.YAML_ALIAS_BOMB,
        f"document expands to more than {MAX_NODES_PER_FILE} values (alias expansion?)",
        *_pos(mark),
    )


def _events_to_documents(name: str, data: bytes, get: Any) -> Iterator[Document]:  # noqa: PLR0912, PLR0915
    scalar_ev, alias_ev = yaml.ScalarEvent, yaml.AliasEvent
    map_start, seq_start = yaml.MappingStartEvent, yaml.SequenceStartEvent
    map_end, seq_end = yaml.MappingEndEvent, yaml.SequenceEndEvent
    doc_end, stream_end = yaml.DocumentEndEvent, yaml.StreamEndEvent
    stack: list[_Frame] = []
    top: _Frame | None = None
    top_is_map = False
    anchors: dict[str, tuple[Any, int]] = {}
    budget = MAX_NODES_PER_FILE
    root: Any = None
    root_mark: Any = None
    index = 0
    while True:
        ev = get()
        kind = ev.__class__
        if kind is scalar_ev:
            if top is not None and top_is_map and top.key is None:
                if ev.tag is None and ev.implicit[0] and _resolve(ev.value) == _MERGE:
                    raise YamlProblem(p.YAML_KEY_NOT_STRING, "merge keys (<<) are not allowed", *_pos(ev.start_mark))
                key = ev.value  # keys are their raw text: `1:` and `"1":` are the same key
                if key in top.value:
                    raise YamlProblem(p.YAML_DUPLICATE_KEY, f"duplicate key {key!r}", *_pos(ev.start_mark))
                top.key = key
                if ev.anchor:
                    _new_anchor(ev, anchors, stack)
                    anchors[ev.anchor] = (key, 1)
                continue
            value: Any = ev.value if (ev.tag is None and not ev.implicit[0]) else _scalar(ev)
            if ev.anchor:
                _new_anchor(ev, anchors, stack)
                anchors[ev.anchor] = (value, 1)
            budget -= 1
            if top is None:
                root, root_mark = value, ev.start_mark
            elif top_is_map:
                top.value[top.key] = value  # type: ignore[index, call-overload]  # a dict when top_is_map
                top.key = None
                top.count += 1
            else:
                top.value.append(value)  # type: ignore[union-attr]  # top.value is a list here
                top.count += 1
        elif kind is map_start or kind is seq_start:
            is_map = kind is map_start
            if ev.tag not in (None, "!", _MAP if is_map else _SEQ):
                raise YamlProblem(p.YAML_UNSUPPORTED_TAG, f"tag {ev.tag!r} is not allowed", *_pos(ev.start_mark))
            if len(stack) >= MAX_DEPTH:
                raise YamlProblem(p.YAML_TOO_DEEP, f"nesting deeper than {MAX_DEPTH} levels", *_pos(ev.start_mark))
            if top is not None and top_is_map and top.key is None:
                raise YamlProblem(p.YAML_KEY_NOT_STRING, "keys must be plain strings", *_pos(ev.start_mark))
            if ev.anchor:
                _new_anchor(ev, anchors, stack)
            top = _Frame({} if is_map else [], ev.start_mark, ev.anchor)
            top_is_map = is_map
            stack.append(top)
        elif kind is map_end or kind is seq_end or kind is alias_ev:
            if kind is alias_ev:
                if ev.anchor not in anchors:
                    raise YamlProblem(p.YAML_SYNTAX, f"unknown anchor {ev.anchor!r}", *_pos(ev.start_mark))
                value, count = anchors[ev.anchor]
                budget -= count
                mark = ev.start_mark
                if top is not None and top_is_map and top.key is None:
                    if isinstance(value, dict | list):
                        raise YamlProblem(p.YAML_KEY_NOT_STRING, "keys must be plain strings", *_pos(mark))
                    top.key = value
                    continue
            else:
                frame = stack.pop()
                value, count, mark = frame.value, frame.count, frame.mark
                if frame.anchor:
                    anchors[frame.anchor] = (value, count)
                budget -= 1
                top = stack[-1] if stack else None
                top_is_map = top is not None and isinstance(top.value, dict)
            if budget < 0:
                raise _too_many(mark)
            if top is None:
                root, root_mark = value, mark
            elif top_is_map:
                top.value[top.key] = value  # type: ignore[index, call-overload]  # a dict when top_is_map
                top.key = None
                top.count += count
            else:
                top.value.append(value)  # type: ignore[union-attr]  # top.value is a list here
                top.count += count
        elif kind is doc_end:
            if budget < 0:
                raise _too_many(root_mark)
            if root_mark is not None:
                yield Document(name, index, root, int(root_mark.line) + 1, data)
                index += 1
            root, root_mark, anchors, budget = None, None, {}, MAX_NODES_PER_FILE
        elif kind is stream_end:
            return


def _new_anchor(ev: Any, anchors: dict[str, Any], open_frames: list[_Frame]) -> None:
    """Refuse an anchor already defined in this document (closed, or still open around this node)."""
    if ev.anchor in anchors or any(f.anchor == ev.anchor for f in open_frames):
        raise YamlProblem(
            p.YAML_DUPLICATE_ANCHOR, f"anchor &{ev.anchor} is defined twice in this document", *_pos(ev.start_mark)
        )


_resolve_cache: dict[str, str] = {}


def _resolve(value: str) -> str:
    """Implicit tag of a plain scalar (YAML 1.1 core rules, as PyYAML's SafeLoader)."""
    tag = _resolve_cache.get(value)
    if tag is None:
        tag = _STR
        for candidate, regexp in _BaseLoader.yaml_implicit_resolvers.get(value[:1], ()):
            if regexp.match(value):
                tag = str(candidate)
                break
        if len(_resolve_cache) > 65_536:
            _resolve_cache.clear()
        _resolve_cache[value] = tag
    return tag


def plain_scalar(value: str) -> Any:
    """A plain (unquoted, untagged) scalar's value, by the YAML 1.1 rules `_scalar` applies."""
    tag = _resolve(value)
    return value if tag == _STR else _construct(tag, value, None, None)


def _scalar(ev: Any) -> Any:
    tag = ev.tag
    if tag in (None, "!"):
        tag = _resolve(ev.value) if ev.implicit[0] else _STR
    if tag == _STR:
        return ev.value
    return _construct(tag, ev.value, ev.start_mark, ev.end_mark)


def _construct(tag: str, value: str, start: Any, end: Any) -> Any:
    node = yaml.ScalarNode(tag, value, start, end)
    where = _pos(start) if start is not None else (1, 1)
    try:
        if tag == _INT:
            return _constructor.construct_yaml_int(node)
        if tag == _BOOL:
            return _constructor.construct_yaml_bool(node)
        if tag == _NULL:
            return None
        if tag == _FLOAT:
            return _constructor.construct_yaml_float(node)
        if tag == _TIMESTAMP:
            stamp = _constructor.construct_yaml_timestamp(node)
            if isinstance(stamp, dt.datetime) and stamp.tzinfo is None:
                stamp = stamp.replace(tzinfo=dt.UTC)
            return stamp
    except (ValueError, yaml.YAMLError) as e:
        raise YamlProblem(p.YAML_SYNTAX, f"bad scalar {value!r}: {e}", *where) from None
    raise YamlProblem(p.YAML_UNSUPPORTED_TAG, f"tag {tag!r} is not allowed", *where)
