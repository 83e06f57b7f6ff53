"""Type the documents of one file into models, and assemble a tree's models into a `DesiredState`.

Typing is a pure function of a document's plain value: the kind and
apiVersion pick the model, pydantic checks every field, and every refusal
becomes a Problem at the document's file, line and column. Assembly
registers the models in file order and reports duplicates at the later file.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from desired import models as m
from desired import patterns
from desired import problems as p
from desired.reading.safefiles import FileData, UnreadFile
from desired.reading.yamlio import Document, YamlProblem, read_documents
from desired.state import TABLES, DesiredState, LoadResult, Source, key_of, name_field

_PATTERN_HINTS = {
    m.NAME_RE: "lowercase letters, digits, '.', '_' or '-' (1-63 chars)",
    patterns.PCI_RE: "a PCI address like 0000:1b:00.0",
    patterns.MAC_RE: "a lowercase MAC like 52:54:00:ab:cd:ef",
    m.DIGEST_RE: "64 lowercase hex characters",
    patterns.BY_ID_RE: "a /dev/disk/by-id/<name> path (no '..', no '/', no shell metacharacters)",
    patterns.SSH_KEY_RE: "an OpenSSH public key line",
}


@dataclass(frozen=True, slots=True)
class Typed:
    """One document as the reader and typing left it: plain value (None when not wanted), model, problems."""

    index: int
    line: int
    value: Any
    model: Any  # None: refused by typing (its problems say why)
    problems: list[p.Problem]


@dataclass(slots=True)
class Blob:
    """What one file's bytes parse and type to: reused for every later revision holding the same blob."""

    name: str
    file_problems: list[p.Problem]
    docs: list[tuple[Document, Any, list[p.Problem]]]  # document, its model (None: refused), its problems
    generation: int = 0


@dataclass(slots=True)
class Tree:
    """The last tree assembled: the blob of every path, the state and its parse problems."""

    origin: str  # what the paths are relative to (a resolved root and prefix)
    revision: str  # the commit it was read at
    by_path: dict[str, Any]  # path -> Blob
    state: DesiredState
    problems: tuple[Any, ...]  # the parse problems (before cross-file validation)
    extra: dict[str, Any] = field(default_factory=dict)


def renamed(blob: Blob, name: str) -> Blob:
    """The same bytes at another path: documents and problems name the new path."""
    docs = [
        (replace(d, file=name, _node=None), model, [replace(x, file=name) for x in found])
        for d, model, found in blob.docs
    ]
    return Blob(name, [replace(x, file=name) for x in blob.file_problems], docs, blob.generation)


def parse_one(name: str, data: FileData, values: bool = True) -> tuple[list[Typed], list[p.Problem]]:
    """Read and type one file. `values`: keep each document's plain value beside its model."""
    if isinstance(data, UnreadFile):
        return [], [p.Problem(data.code, data.message, name, 1, 1)]
    typed: list[Typed] = []
    found: list[p.Problem] = []
    try:
        for doc in read_documents(name, data):
            doc_problems: list[p.Problem] = []
            model = _type_document(doc, doc_problems)
            typed.append(Typed(doc.index, doc.line, doc.value if values else None, model, doc_problems))
    except YamlProblem as e:
        found = [p.Problem(e.code, e.message, name, e.line, e.column)]
    return typed, found


def assemble(blobs: Sequence[Blob | None]) -> LoadResult:
    """The state the blobs declare, in file order, with every problem (duplicates named at the later file)."""
    state = DesiredState(file_count=len(blobs))
    problems: list[p.Problem] = []
    for blob in blobs:
        assert blob is not None  # noqa: S101 - every file was read or found above
        problems.extend(blob.file_problems)
        for doc, model, found in blob.docs:
            problems.extend(found)
            if model is not None:
                _register(state, doc, model, problems)
    return LoadResult(state, problems)


def _type_document(doc: Document, problems: list[p.Problem]) -> Any:
    value = doc.value
    if not isinstance(value, dict):
        problems.append(
            p.Problem(
                p.YAML_NOT_MAPPING, "a document must be a mapping with apiVersion and kind", doc.file, doc.line, 1
            )
        )
        return None
    kind = value.get("kind")
    api = value.get("apiVersion")
    if kind is None:
        problems.append(p.Problem(p.DOC_KIND_MISSING, "document has no 'kind'", doc.file, doc.line, 1))
        return None
    model = m.KINDS.get(kind) if isinstance(kind, str) else None
    if model is None:
        line, col = doc.locate_value(("kind",))
        known = ", ".join(sorted(m.KINDS))
        problems.append(
            p.Problem(p.DOC_KIND_UNKNOWN, f"unknown kind {kind!r}; known kinds: {known}", doc.file, line, col)
        )
        return None
    if api != m.API_VERSION:
        line, col = doc.locate_value(("apiVersion",)) if api is not None else (doc.line, 1)
        problems.append(
            p.Problem(p.DOC_API_VERSION, f"apiVersion must be {m.API_VERSION!r}, got {api!r}", doc.file, line, col)
        )
        return None
    try:
        return m.compact(model.model_validate(value))
    except ValidationError as e:
        problems.extend(_field_problems(doc, e))
        return None


def _register(state: DesiredState, doc: Document, obj: Any, problems: list[p.Problem]) -> None:
    kind, name = key_of(obj)
    table: dict[str, Any] = getattr(state, TABLES[kind]) if kind != "Fleet" else {}
    if kind == "Fleet" and state.fleet is not None:
        table[state.fleet.name] = state.fleet
    if name in table:
        first = state.sources[(kind, name)]
        line, col = doc.locate_value((name_field(kind),)) if kind != "Fleet" else (doc.line, 1)
        problems.append(
            p.Problem(
                p.DUPLICATE_NAME if kind != "SlotMap" else p.NODE_SLOTMAP_MULTIPLE,
                f"{kind} {name!r} is already declared at {first.file}:{first.line}",
                doc.file,
                line,
                col,
            )
        )
        return
    table[name] = obj
    state.sources[(kind, name)] = Source(doc, id(obj))
    if kind == "Fleet":
        if state.fleet is not None:
            problems.append(p.Problem(p.FLEET_MULTIPLE, "only one Fleet document is allowed", doc.file, doc.line, 1))
            return
        state.fleet = obj


def _field_problems(doc: Document, error: ValidationError) -> Iterator[p.Problem]:
    items = error.errors(include_url=False)
    # A list whose only item failed also reports "too short": that echo helps nobody.
    failed = {tuple(i["loc"]) for i in items}
    for item in items:
        loc = tuple(item["loc"])
        if item["type"] == "too_short" and any(f[: len(loc)] == loc and f != loc for f in failed):
            continue
        kind = item["type"]
        dotted = _dotted(loc)
        if kind == "missing":
            line, col = doc.locate(loc[:-1])
            yield p.Problem(p.FIELD_MISSING, f"required field '{dotted}' is missing", doc.file, line, col)
        elif kind == "extra_forbidden":
            line, col = doc.locate(loc)
            yield p.Problem(p.FIELD_UNKNOWN, f"unknown field '{dotted}'", doc.file, line, col)
        elif loc and loc[-1] == "[key]":  # a bad mapping key: point at the key itself, name the mapping
            line, col = doc.locate(loc[:-1])
            yield p.Problem(
                p.FIELD_VALUE, f"key {str(loc[-2])!r} of '{_dotted(loc[:-2])}': {_message(item)}", doc.file, line, col
            )
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
