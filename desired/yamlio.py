"""Safe YAML reading that keeps line and column for every value.

libyaml (through PyYAML's C composer) builds the node tree quickly; this
module turns nodes into plain Python values itself so it can refuse what a
desired-state file must never contain: duplicate keys, tabs used for
indentation, non-UTF-8 bytes, alias expansion bombs, absurd nesting and
non-core tags. Every refusal is a Problem with a position, never a traceback.

Nesting is checked *before* libyaml sees the text: libyaml's composer recurses
in C and crashes the interpreter on a few tens of thousands of nested brackets.
"""

from __future__ import annotations

import datetime as dt
import re
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
    data: bytes
    _node: yaml.Node | None = None

    @property
    def node(self) -> yaml.Node:
        if self._node is None:
            nodes = [n for n in yaml.compose_all(_decode(self.data), Loader=_Loader) if n is not None]
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
    try:
        nodes = list(yaml.compose_all(text, Loader=_Loader))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise YamlProblem(p.YAML_SYNTAX, _syntax_message(e), line, col) from None
    except yaml.YAMLError as e:
        raise YamlProblem(p.YAML_SYNTAX, str(e).splitlines()[0]) from None
    for index, node in enumerate(n for n in nodes if n is not None):
        budget = [MAX_NODES_PER_FILE]
        value = _convert(node, 0, budget)
        yield Document(name, index, value, int(node.start_mark.line) + 1, data, node)


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


def _at(node: yaml.Node) -> tuple[int, int]:
    return int(node.start_mark.line) + 1, int(node.start_mark.column) + 1


def _convert(node: yaml.Node, depth: int, budget: list[int]) -> Any:
    if depth > MAX_DEPTH:
        raise YamlProblem(p.YAML_TOO_DEEP, f"nesting deeper than {MAX_DEPTH} levels", *_at(node))
    budget[0] -= 1
    if budget[0] < 0:
        raise YamlProblem(
            p.YAML_ALIAS_BOMB,
            f"document expands to more than {MAX_NODES_PER_FILE} values (alias expansion?)",
            *_at(node),
        )
    tag = node.tag
    if isinstance(node, yaml.ScalarNode):
        return _scalar(node, tag)
    if isinstance(node, yaml.SequenceNode):
        if tag != _SEQ:
            raise YamlProblem(p.YAML_UNSUPPORTED_TAG, f"tag {tag!r} is not allowed", *_at(node))
        return [_convert(item, depth + 1, budget) for item in node.value]
    if isinstance(node, yaml.MappingNode):
        if tag != _MAP:
            raise YamlProblem(p.YAML_UNSUPPORTED_TAG, f"tag {tag!r} is not allowed", *_at(node))
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                raise YamlProblem(p.YAML_KEY_NOT_STRING, "keys must be plain strings", *_at(key_node))
            key = key_node.value
            if key in out:
                raise YamlProblem(p.YAML_DUPLICATE_KEY, f"duplicate key {key!r}", *_at(key_node))
            out[key] = _convert(value_node, depth + 1, budget)
        return out
    raise YamlProblem(p.YAML_SYNTAX, "unexpected YAML node", *_at(node))  # pragma: no cover


def _scalar(node: yaml.ScalarNode, tag: str) -> Any:
    if tag == _STR:
        return node.value
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
            value = _constructor.construct_yaml_timestamp(node)
            if isinstance(value, dt.datetime) and value.tzinfo is None:
                value = value.replace(tzinfo=dt.UTC)
            return value
    except (ValueError, yaml.YAMLError) as e:
        raise YamlProblem(p.YAML_SYNTAX, f"bad scalar {node.value!r}: {e}", *_at(node)) from None
    raise YamlProblem(p.YAML_UNSUPPORTED_TAG, f"tag {tag!r} is not allowed", *_at(node))
