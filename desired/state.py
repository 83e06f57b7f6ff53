"""The desired state of one revision: every declared document by kind and name, and where each came from.

A value type, shared by every layer: validation, planning, the inventory
sync and the service read it; the reader (`desired.reading`) builds it. It
holds no cache: what a reader kept to build it faster stays with the reader,
and the difference from an earlier state (`Delta`) is returned beside it in
`LoadResult`, never stored inside it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Protocol

from desired import models as m
from desired import problems as p

Key = tuple[str, str]  # (kind, name)

# The table of each kind with a name (the Fleet is a single document: `DesiredState.fleet`).
TABLES = {"Sku": "skus", "Image": "images", "Node": "nodes", "SlotMap": "slot_maps", "Allocation": "allocations"}


class Located(Protocol):
    """A document as the reader left it: its file, its place there, and positions of its fields."""

    @property
    def file(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def line(self) -> int: ...
    @property
    def blob(self) -> str | None: ...
    def locate(self, path: tuple[str | int, ...]) -> tuple[int, int]: ...
    def locate_value(self, path: tuple[str | int, ...]) -> tuple[int, int]: ...


@dataclass(frozen=True, slots=True)
class Source:
    """Where a model came from, for error positions."""

    doc: Located  # `desired.reading.yamlio.Document`
    # id() of the model the reader typed from `doc`: a state whose table holds another object (edited
    # in code, not read) has content that `doc` does not name. An id, not the model: a kept world
    # pickles its sources without the models it keeps apart (reconciler/caches/keptworlds.py).
    model_id: int = field(default=0, compare=False)  # where it was read from is what compares

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
    sources: dict[Key, Source] = field(default_factory=dict)
    revision: str | None = None
    file_count: int = 0

    def source(self, kind: str, name: str) -> Source:
        return self.sources[(kind, name)]


@dataclass
class LoadResult:
    """A state as read, its problems, and how it differs from the state it was built from (if it was)."""

    state: DesiredState
    problems: list[p.Problem]
    # Set when the reader built `state` from an earlier state (`desired.reading.deltas`): what differs.
    # A consumer that remembers the state it saw last works from the change (`delta_since`).
    delta: Delta | None = field(default=None, compare=False, repr=False)

    @property
    def errors(self) -> list[p.Problem]:
        return [x for x in self.problems if x.severity is p.Severity.ERROR]

    @property
    def warnings(self) -> list[p.Problem]:
        return [x for x in self.problems if x.severity is p.Severity.WARNING]


def key_of(model: Any) -> Key:
    """The (kind, name) a document's model is declared under."""
    if isinstance(model, m.Sku):
        return "Sku", model.sku
    if isinstance(model, m.Image):
        return "Image", model.slug
    if isinstance(model, m.Node):
        return "Node", model.name
    if isinstance(model, m.SlotMap):
        return "SlotMap", model.node
    if isinstance(model, m.Allocation):
        return "Allocation", model.id
    return "Fleet", model.name


def name_field(kind: str) -> str:
    """The field that names a document of `kind`."""
    return {"Sku": "sku", "Image": "slug", "SlotMap": "node", "Allocation": "id"}.get(kind, "name")


@dataclass(frozen=True, slots=True)
class Delta:
    """A state that is `base()` with only `keys` added, changed or removed.

    `base` is a weak reference: a chain of states must never keep every older
    revision alive. A consumer that finds `base()` is not the state it last
    saw (or None) does its full work.
    """

    base: weakref.ref[DesiredState]
    keys: frozenset[Key]

    def kinds(self) -> frozenset[str]:
        return frozenset(kind for kind, _ in self.keys)

    def names(self, kind: str) -> set[str]:
        return {name for k, name in self.keys if k == kind}


def delta_since(delta: Delta | None, since: DesiredState | None) -> Delta | None:
    """`delta` when it was taken from `since` (the state a consumer saw last), else None: do the full work."""
    if delta is None or since is None or delta.base() is not since:
        return None
    return delta


def delta_back(delta: Delta | None, state: DesiredState, since: DesiredState | None) -> Delta | None:
    """The way back: when `since` was built from `state` by `delta`, the same keys, based on `since`.

    A PR plan moves one engine from head back to base, and only head's read
    gives a Delta (base is where it came from). The keys that differ are the
    same set either way. Sound because neither side is edited in place: a
    state read by delta was assembled by the reader, and the state a Delta is
    based on shares every table its child did not change (copy on write), so
    editing it in place would change the child too.
    """
    if delta is None or since is None or delta.base() is not state:
        return None
    return Delta(weakref.ref(since), delta.keys)
