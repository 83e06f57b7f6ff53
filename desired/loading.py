"""Load a desired-state tree into typed models, collecting every problem.

Files come in as (path, bytes) pairs so the same code reads a working
directory or a git revision (see `desired.gitrepo`). Loading never stops at
the first bad file: a reviewer wants the whole list in one CI run.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from desired import models as m
from desired import problems as p
from desired.yamlio import Document, YamlProblem, read_documents

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

    def at(
        self, *path: str | int, severity: p.Severity = p.Severity.ERROR, code: str, message: str, value: bool = True
    ) -> p.Problem:
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


# Below this many files one process is faster than starting a pool.
PARALLEL_THRESHOLD = 2000
# No progress from the pool for this long: something is wrong with it; parse in this process instead.
WORKER_TIMEOUT_S = 60.0
_POLL_S = 0.25  # how often a wait for the pool looks at `cancel`

Cancel = Callable[[], bool]


class Cancelled(Exception):
    """The caller asked to stop (SIGTERM) while the tree was being parsed; nothing was produced."""


@dataclass(frozen=True, slots=True)
class _Parsed:
    index: int
    line: int
    value: Any


def parse_files(files: Iterable[tuple[str, bytes]], *, workers: int | None = None,
                cancel: Cancel | None = None) -> LoadResult:
    """Parse and type every document; cross-file rules run in `policies.validation`.

    Large trees are parsed by a pool of workers (libyaml's composer is the
    cost, and it holds the GIL); results are merged in file order, so the
    outcome is identical to a single-process run. `cancel` is polled while
    parsing: when it returns True, Cancelled is raised within a fraction of
    a second and the workers are gone.
    """
    file_list = list(files)
    state = DesiredState(file_count=len(file_list))
    problems: list[p.Problem] = []
    for i, ((name, data), (parsed, found)) in enumerate(
            zip(file_list, _parse_all(file_list, workers, cancel), strict=True)):
        if cancel is not None and i % 256 == 0 and cancel():
            raise Cancelled
        problems.extend(found)
        for item in parsed:
            doc = Document(name, item.index, item.value, item.line, data)
            model = _type_document(doc, problems)
            if model is not None:
                _register(state, doc, model, problems)
    return LoadResult(state, problems)


def _parse_all(
    file_list: list[tuple[str, bytes]], workers: int | None, cancel: Cancel | None
) -> Iterator[tuple[list[_Parsed], list[p.Problem]]]:
    n = workers if workers is not None else (os.cpu_count() or 1)
    if n <= 1 or len(file_list) < PARALLEL_THRESHOLD or "forkserver" not in mp.get_all_start_methods():
        yield from (_parse_one(name, data) for name, data in file_list)
        return
    # forkserver, never fork: the caller may run threads (watchfiles' inotify thread, a
    # database pool), and a child forked while another thread holds a lock can wait on it
    # forever. The fork server is a clean single-threaded process that forks the workers.
    # ProcessPoolExecutor, not Pool: a worker that dies breaks the pool (BrokenProcessPool)
    # instead of being replaced behind our back while we wait.
    step = max(1, len(file_list) // (n * 32))
    chunks = [file_list[i:i + step] for i in range(0, len(file_list), step)]
    done = 0
    pool = futures.ProcessPoolExecutor(n, mp_context=_CONTEXT)
    try:
        pending = [pool.submit(_parse_chunk, c) for c in chunks]
        for fut in pending:
            waited = 0.0
            while True:
                if cancel is not None and cancel():
                    raise Cancelled
                try:
                    chunk = fut.result(timeout=_POLL_S)
                    break
                except futures.TimeoutError:
                    waited += _POLL_S
                    if waited >= WORKER_TIMEOUT_S:
                        raise _PoolStuck from None
            done += len(chunk)
            yield from chunk
    except (_PoolStuck, futures.process.BrokenProcessPool, OSError):
        # Degrade, never hang: what the pool did not deliver is parsed here.
        yield from (_parse_one(name, data) for name, data in file_list[done:])
    finally:
        # Queued chunks are dropped; a worker finishes at most the small chunk it holds.
        pool.shutdown(wait=True, cancel_futures=True)


class _PoolStuck(Exception):
    pass


_CONTEXT = mp.get_context("forkserver") if "forkserver" in mp.get_all_start_methods() else mp.get_context()
if "forkserver" in mp.get_all_start_methods():
    # The fork server imports the parser once; every worker it forks starts warm.
    _CONTEXT.set_forkserver_preload(["desired.loading"])


def _parse_chunk(chunk: list[tuple[str, bytes]]) -> list[tuple[list[_Parsed], list[p.Problem]]]:
    # Plain values cross the pipe: pickling them is ~5x cheaper than pickling models.
    return [_parse_one(name, data) for name, data in chunk]


def _parse_one(name: str, data: bytes) -> tuple[list[_Parsed], list[p.Problem]]:
    parsed: list[_Parsed] = []
    try:
        for doc in read_documents(name, data):
            parsed.append(_Parsed(doc.index, doc.line, doc.value))
    except YamlProblem as e:
        return parsed, [p.Problem(e.code, e.message, name, e.line, e.column)]
    return parsed, []


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
        return model.model_validate(value)
    except ValidationError as e:
        problems.extend(_field_problems(doc, e))
        return None


def _register(state: DesiredState, doc: Document, obj: Any, problems: list[p.Problem]) -> None:
    kind, name, table = _identity(state, obj)
    if name in table:
        first = state.sources[(kind, name)]
        line, col = doc.locate_value((_name_field(kind),)) if kind != "Fleet" else (doc.line, 1)
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
