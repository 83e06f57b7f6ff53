"""Cross-file validation between revisions: each document's problems are kept and reused.

`policies.validation` walks every document of a revision. Between two
revisions of a large fleet almost every document is the very same model
object (the blob cache hands it out again), so `Memo.validate` reruns the
rules only for documents that changed, and for those whose inputs changed:

- the context every rule may read (the Fleet, every SKU, every Image, in
  order): when any of them is another object, everything is checked again;
- a slot map also reads its own Node, and the first owner of each of its
  MACs (MAC uniqueness is fleet wide): a global MAC index is rebuilt per
  revision (one pass over the slots, no formatting) and a map is checked
  again when an owner of one of its MACs outside it changed.

Each document's problems are computed by the full rule (`validation`) run
on a view of the state holding that one document, with a pre-seeded MAC
index, so positions, messages and order are exactly those of a full run
(tested over random edit sequences). On any doubt (an error inside the
incremental path) it falls back to a full run and says why (`fallbacks`,
`last_fallback`, a log line on the `gpuaas` logger).

A state read by delta (`desired.reading.deltas`) names the documents that changed:
when the last state validated was its base, and only nodes and allocations
changed, only those (and the slot map of a changed node) are checked, not
every document walked. When they had no problem and still have none, the
answer is the last one, unchanged (every other document, and so its
problems, is the same); otherwise the walk above puts problems in order.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from desired import models as m
from desired import problems as p
from desired.state import DesiredState, LoadResult, delta_since
from policies import validation

log = logging.getLogger("gpuaas.validation")

_Context = tuple[Any, ...]


@dataclass(slots=True)
class _Kept:
    obj: Any  # held so that its id() cannot be reused while the entry lives
    doc: Any
    inputs: tuple[Any, ...]  # other objects (and MAC owners) the problems were computed from
    problems: tuple[p.Problem, ...]


class Memo:
    """Per-document problems of the last revisions validated, reused while their inputs are the same objects."""

    def __init__(self) -> None:
        self._context: _Context | None = None
        self._kept: dict[tuple[str, str], _Kept] = {}
        self.checked = 0  # documents whose rules ran in the last validate
        self.reused = 0
        self.fallbacks = 0
        self.last_fallback = ""
        self.by_delta = 0  # validations that checked only a delta's documents
        self._owners: dict[str, list[tuple[str, int]]] = {}  # shared MACs of the last walk
        self._last: weakref.ref[DesiredState] | None = None  # the last state validated (no parse problems)
        self._found: tuple[p.Problem, ...] = ()  # and its cross-file problems
        self._ingress: tuple[weakref.ref[DesiredState], tuple[p.Problem, ...]] | None = None  # state, its overlaps

    def validate(self, result: LoadResult) -> LoadResult:
        """Add cross-file problems to a parse result, exactly as `validation.validate` (returns the same object)."""
        state, last, self._last = result.state, self._last, None
        try:
            found = self._by_delta(result, last) if not result.problems else None
            if found is None:
                found = list(self._problems(state))
        except Exception as e:  # any doubt: forget everything, run the full rules
            self.fallbacks += 1
            self.last_fallback = f"{type(e).__name__}: {e}"
            log.warning("incremental validation failed (%s); running the full validation", self.last_fallback)
            self._kept, self._context = {}, None
            return validation.validate(result)
        if not result.problems:
            self._last, self._found = weakref.ref(state), tuple(found)
        result.problems.extend([*found, *self._overlaps(result, last)])
        return result

    def _overlaps(self, result: LoadResult, last: weakref.ref[DesiredState] | None) -> tuple[p.Problem, ...]:
        """Ingress ranges compared across nodes: the last state's answer while no Node document changed
        (a walk over every node, per commit), else checked whole."""
        state, kept = result.state, self._ingress
        delta = delta_since(result.delta, last() if last is not None else None)
        if delta is not None and "Node" not in delta.kinds() and kept is not None and kept[0]() is delta.base():
            found = kept[1]
        else:
            found = tuple(validation.ingress_overlaps(state))
        self._ingress = (weakref.ref(state), found) if not result.problems else None
        return found

    def adopt(self, result: LoadResult, found: list[p.Problem], owners: dict[str, list[tuple[str, int]]]) -> LoadResult:
        """`validate`'s answer for a tree an earlier run validated: its cross-file problems and shared MACs.

        Nothing is checked, so no document's problems are kept. `_by_delta`
        reads a changed document that has no kept entry as one that had no
        problem: that holds only when the tree had none at all, so only such
        a tree may be the base of the next read by delta (otherwise the next
        state is walked whole, which is always right).
        """
        clean = not result.problems and not found
        self._last = weakref.ref(result.state) if clean else None
        self._found, self._owners = (), owners
        self.checked = self.reused = 0
        result.problems.extend(found)
        return result

    def validate_once(self, result: LoadResult) -> LoadResult:
        """`validate`, for a command that validates a tree or two: a memo that holds nothing runs the whole rules.

        The per-document walk builds a one-document view for each of 20,000
        documents (a third more than `validation.validate` at 10,000 nodes),
        which pays only when a later revision reuses them. A command reads
        base and then head by delta from it: `adopt` primes that as well.
        A memo that holds something validates as `validate` does.
        """
        last = self._last() if self._last is not None else None
        if last is not None or self._kept:
            return self.validate(result)
        found = validation.validate(LoadResult(result.state, [])).problems
        return self.adopt(result, found, _mac_owners(result.state.slot_maps))

    @property
    def owners(self) -> dict[str, list[tuple[str, int]]]:
        """MACs used by more than one slot in the last state validated: (node, slot position) of each use."""
        return self._owners

    def _by_delta(self, result: LoadResult, last: weakref.ref[DesiredState] | None) -> list[p.Problem] | None:
        """The problems from checking only what the read's delta changed since `last`, or None: walk everything."""
        state = result.state
        delta = delta_since(result.delta, last() if last is not None else None)
        if delta is None or not delta.kinds() <= {"Node", "Allocation"}:
            return None  # the Fleet, SKUs, images: every rule reads them; a slot map: MAC owners move
        rules = {r.kind: r for r in self._rules(state, self._owners)}
        wanted = set(delta.keys)
        wanted.update(("SlotMap", name) for kind, name in delta.keys if kind == "Node" and name in state.slot_maps)
        clean = True
        for kind, name in sorted(wanted):
            table: Mapping[str, Any] = getattr(state, rules[kind].attr)
            was = self._kept.pop((kind, name), None)
            clean = clean and (was is None or not was.problems)
            if name in table:
                hit = self._kept[(kind, name)] = self._check(state, rules[kind], name, table[name])
                clean = clean and not hit.problems
        self.checked, self.reused = len(wanted), len(self._kept) - len(wanted)
        # Machines are compared across nodes: the last state (validated clean or walked) had none
        # duplicated, or a walk put them in `_found`; only a Node change can add one.
        if not clean or ("Node" in delta.kinds() and any(True for _ in validation.machine_duplicates(state))):
            return None  # problems come in document order: the walk puts them there (reusing these checks)
        self.by_delta += 1
        return list(self._found)

    # ----------------------------------------------------------------- rules

    def _problems(self, state: DesiredState) -> Iterator[p.Problem]:
        context = (state.fleet, *state.skus, *state.skus.values(), *state.images, *state.images.values())
        if self._context is None or not _same(self._context, context):
            self._kept.clear()  # every rule may read the fleet, the SKUs and the images
        self._context = context
        self.checked = self.reused = 0
        kept, self._kept = self._kept, {}
        self._owners = owners = _mac_owners(state.slot_maps)
        yield from validation._fleet(state)
        for rule in self._rules(state, owners):
            yield from self._each(kept, state, rule)
        yield from validation.machine_duplicates(state)  # cross-node, O(nodes): never kept

    @staticmethod
    def _rules(state: DesiredState, owners: dict[str, list[tuple[str, int]]]) -> list[_Rule]:
        def map_inputs(name: str, smap: Any) -> tuple[Any, ...]:
            return (state.nodes.get(name), *_outside_owners(name, smap, owners))

        def map_rules(view: DesiredState) -> Iterator[p.Problem]:
            ((name, smap),) = view.slot_maps.items()
            macs = {mac: f"{node} slots[{i}]" for mac, node, i in _outside_owners(name, smap, owners)}
            if name in state.nodes:
                view.nodes = {name: state.nodes[name]}
            return validation._slot_maps(view, macs=macs)

        return [
            _Rule("Sku", "skus", validation._skus, _nothing),
            _Rule("Image", "images", validation._images, _nothing),
            _Rule("Node", "nodes", validation._nodes, _nothing),
            _Rule("SlotMap", "slot_maps", map_rules, map_inputs),
            _Rule("Allocation", "allocations", validation._allocations, _nothing),
        ]

    def _each(self, kept: dict[tuple[str, str], _Kept], state: DesiredState, rule: _Rule) -> Iterator[p.Problem]:
        table: Mapping[str, Any] = getattr(state, rule.attr)
        for name, obj in table.items():
            doc = state.sources[(rule.kind, name)].doc
            hit = kept.get((rule.kind, name))
            if hit is not None and hit.obj is obj and hit.doc is doc and _same(hit.inputs, rule.inputs(name, obj)):
                self.reused += 1
            else:
                hit = self._check(state, rule, name, obj)
                self.checked += 1
            self._kept[(rule.kind, name)] = hit
            yield from hit.problems

    @staticmethod
    def _check(state: DesiredState, rule: _Rule, name: str, obj: Any) -> _Kept:
        """The full rule over a view holding this one document: the same problems, positions, order."""
        view = DesiredState(fleet=state.fleet, skus=state.skus, images=state.images, sources=state.sources)
        setattr(view, rule.attr, {name: obj})
        return _Kept(obj, state.sources[(rule.kind, name)].doc, rule.inputs(name, obj), tuple(rule.rules(view)))


@dataclass(frozen=True, slots=True)
class _Rule:
    kind: str
    attr: str  # the DesiredState table it walks
    rules: Callable[[DesiredState], Iterator[p.Problem]]
    inputs: Callable[[str, Any], tuple[Any, ...]]  # what else its problems depend on, besides the context


def _nothing(_name: str, _obj: Any) -> tuple[Any, ...]:
    return ()


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Element-wise identity (names compared by value): the same objects, in the same order."""
    return len(a) == len(b) and all(
        x is y or (type(x) is type(y) and isinstance(x, (str, int, tuple)) and x == y)
        for x, y in zip(a, b, strict=True)
    )


def _mac_owners(slot_maps: Mapping[str, m.SlotMap]) -> dict[str, list[tuple[str, int]]]:
    """MACs used by more than one slot: every (node, slot position) using it, in validation order."""
    first: dict[str, tuple[str, int]] = {}
    shared: dict[str, list[tuple[str, int]]] = {}
    for name, smap in slot_maps.items():
        for i, slot in enumerate(smap.slots):
            mac = slot.mac_address
            owner = first.setdefault(mac, (name, i))
            if owner[0] != name or owner[1] != i:
                shared.setdefault(mac, [owner]).append((name, i))
    return shared


def _outside_owners(
    name: str, smap: m.SlotMap, shared: dict[str, list[tuple[str, int]]]
) -> tuple[tuple[str, str, int], ...]:
    """(mac, node, slot) of the first owner of each of this map's MACs, where that owner is another map."""
    if not shared:
        return ()
    out = []
    for slot in smap.slots:
        owners = shared.get(slot.mac_address)
        if owners is not None and owners[0][0] != name:
            out.append((slot.mac_address, owners[0][0], owners[0][1]))
    return tuple(out)
