"""Load a desired-state tree into typed models, collecting every problem.

Files come in as (path, bytes) pairs so the same code reads a working
directory or a git revision (see `desired.gitrepo`). Loading never stops at
the first bad file: a reviewer wants the whole list in one CI run.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from desired import models as m
from desired import problems as p
from desired.yamlio import MAX_FILE_BYTES, Document, YamlProblem, read_documents

YAML_SUFFIXES = (".yaml", ".yml")
SKIP_DIRS = frozenset({".git", ".venv", ".gpuaas", "node_modules", "__pycache__"})

_PATTERN_HINTS = {
    m.NAME_RE: "lowercase letters, digits, '.', '_' or '-' (1-63 chars)",
    m.PCI_RE: "a PCI address like 0000:1b:00.0",
    m.MAC_RE: "a lowercase MAC like 52:54:00:ab:cd:ef",
    m.DIGEST_RE: "64 lowercase hex characters",
    m.BY_ID_RE: "a /dev/disk/by-id/<name> path (no '..', no '/', no shell metacharacters)",
    m.SSH_KEY_RE: "an OpenSSH public key line",
}


@dataclass(frozen=True, slots=True)
class Source:
    """Where a model came from, for error positions."""

    doc: Document

    @property
    def file(self) -> str:
        return self.doc.file

    @property
    def line(self) -> int:
        return self.doc.line

    def at(self, *path: str | int, severity: p.Severity = p.Severity.ERROR,
           code: str, message: str, value: bool = True) -> p.Problem:
        line, col = self.doc.locate_value(path) if value else self.doc.locate(path)
        return p.Problem(code, message, self.doc.file, line, col, severity)


@dataclass
class DesiredState:
    """Everything one revision of the repo declares, keyed by name."""

    fleet: m.Fleet | None = None
    skus: dict[str, m.Sku] = field(default_factory=dict)
    images: dict[str, m.Image] = field(default_factory=dict)
    nodes: dict[str, m.Node] = field(default_factory=dict)
    slot_maps: dict[str, m.SlotMap] = field(default_factory=dict)
    allocations: dict[str, m.Allocation] = field(default_factory=dict)
    sources: dict[tuple[str, str], Source] = field(default_factory=dict)
    revision: str | None = None
    file_count: int = 0

    def source(self, kind: str, name: str) -> Source:
        return self.sources[(kind, name)]


@dataclass
class LoadResult:
    state: DesiredState
    problems: list[p.Problem]

    @property
    def errors(self) -> list[p.Problem]:
        return [x for x in self.problems if x.severity is p.Severity.ERROR]

    @property
    def warnings(self) -> list[p.Problem]:
        return [x for x in self.problems if x.severity is p.Severity.WARNING]


def iter_directory(root: Path) -> Iterator[tuple[str, bytes]]:
    """Yield (relative path, bytes) for every YAML file under root, sorted."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for name in filenames:
            if name.endswith(YAML_SUFFIXES):
                found.append(os.path.relpath(os.path.join(dirpath, name), root))
    for rel in sorted(found):
        yield rel, (root / rel).read_bytes()


def parse_files(files: Iterable[tuple[str, bytes]]) -> LoadResult:
    """Parse and type every document; cross-file rules run in `validation`."""
    state = DesiredState()
    problems: list[p.Problem] = []
    for name, data in files:
        state.file_count += 1
        try:
            for doc in read_documents(name, data):
                _add_document(state, doc, problems)
        except YamlProblem as e:
            problems.append(p.Problem(e.code, e.message, name, e.line, e.column))
    return LoadResult(state, problems)


def _add_document(state: DesiredState, doc: Document, problems: list[p.Problem]) -> None:
    value = doc.value
    if not isinstance(value, dict):
        problems.append(p.Problem(p.YAML_NOT_MAPPING, "a document must be a mapping with apiVersion and kind", doc.file, doc.line, 1))
        return
    kind = value.get("kind")
    api = value.get("apiVersion")
    if kind is None:
        problems.append(p.Problem(p.DOC_KIND_MISSING, "document has no 'kind'", doc.file, doc.line, 1))
        return
    model = m.KINDS.get(kind) if isinstance(kind, str) else None
    if model is None:
        line, col = doc.locate_value(("kind",))
        known = ", ".join(sorted(m.KINDS))
        problems.append(p.Problem(p.DOC_KIND_UNKNOWN, f"unknown kind {kind!r}; known kinds: {known}", doc.file, line, col))
        return
    if api != m.API_VERSION:
        line, col = doc.locate_value(("apiVersion",)) if api is not None else (doc.line, 1)
        problems.append(p.Problem(p.DOC_API_VERSION, f"apiVersion must be {m.API_VERSION!r}, got {api!r}", doc.file, line, col))
        return
    try:
        obj = model.model_validate(value)
    except ValidationError as e:
        problems.extend(_field_problems(doc, e))
        return
    _register(state, doc, obj, problems)


def _register(state: DesiredState, doc: Document, obj: Any, problems: list[p.Problem]) -> None:
    kind, name, table = _identity(state, obj)
    if name in table:
        first = state.sources[(kind, name)]
        line, col = doc.locate_value((_name_field(kind),)) if kind != "Fleet" else (doc.line, 1)
        problems.append(p.Problem(
            p.DUPLICATE_NAME if kind != "SlotMap" else p.NODE_SLOTMAP_MULTIPLE,
            f"{kind} {name!r} is already declared at {first.file}:{first.line}",
            doc.file, line, col,
        ))
        return
    table[name] = obj
    state.sources[(kind, name)] = Source(doc)
    if kind == "Fleet":
        if state.fleet is not None:
            problems.append(p.Problem(p.FLEET_MULTIPLE, "only one Fleet document is allowed", doc.file, doc.line, 1))
            return
        state.fleet = obj


def _name_field(kind: str) -> str:
    return {"Sku": "sku", "Image": "slug", "SlotMap": "node", "Allocation": "id"}.get(kind, "name")


def _identity(state: DesiredState, obj: Any) -> tuple[str, str, dict[str, Any]]:
    if isinstance(obj, m.Sku):
        return "Sku", obj.sku, state.skus
    if isinstance(obj, m.Image):
        return "Image", obj.slug, state.images
    if isinstance(obj, m.Node):
        return "Node", obj.name, state.nodes
    if isinstance(obj, m.SlotMap):
        return "SlotMap", obj.node, state.slot_maps
    if isinstance(obj, m.Allocation):
        return "Allocation", obj.id, state.allocations
    fleets: dict[str, Any] = {} if state.fleet is None else {state.fleet.name: state.fleet}
    return "Fleet", obj.name, fleets


def _field_problems(doc: Document, error: ValidationError) -> Iterator[p.Problem]:
    for item in error.errors(include_url=False):
        loc = tuple(item["loc"])
        kind = item["type"]
        dotted = _dotted(loc)
        if kind == "missing":
            line, col = doc.locate(loc[:-1])
            yield p.Problem(p.FIELD_MISSING, f"required field '{dotted}' is missing", doc.file, line, col)
        elif kind == "extra_forbidden":
            line, col = doc.locate(loc)
            yield p.Problem(p.FIELD_UNKNOWN, f"unknown field '{dotted}'", doc.file, line, col)
        else:
            line, col = doc.locate_value(loc)
            code = p.FIELD_TYPE if kind.endswith("_type") or kind.endswith("_parsing") else p.FIELD_VALUE
            yield p.Problem(code, f"field '{dotted or '<document>'}': {_message(item)}", doc.file, line, col)


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _message(item: Any) -> str:
    if item["type"] == "string_pattern_mismatch":
        pattern = item.get("ctx", {}).get("pattern", "")
        hint = _PATTERN_HINTS.get(pattern, f"must match {pattern}")
        return f"{item['input']!r} is not {hint}" if pattern in _PATTERN_HINTS else hint
    msg = str(item["msg"])
    return msg.removeprefix("Value error, ")
