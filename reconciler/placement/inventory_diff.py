"""What a change to desired state does to inventory: added, changed, removed.

Pure: compares two DesiredStates (base and head of a pull request) and says,
per kind and name, what changes, plus which nodes change capability and which
slots become schedulable or stop being schedulable (with the reasons), so a
reviewer sees the capacity a PR creates or removes before it merges.

A changed document names its changed top-level fields (`fields`) and every
changed value down to the leaf with its old and new value (`values`:
`admin_state: active -> draining`, `slots[3].enabled: true -> false`, list
items keyed by `slot_index` or `name` where they have one).

A head read by delta from base (`desired.reading.deltas`, as `gpuaas plan` reads
it) is compared only where the delta names a document, and base's answer is
reused for every other node: the result equals the whole comparison.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from desired.state import Delta, DesiredState, delta_since
from policies import capability, eligibility

MAX_VALUES = 20  # changed values listed per document; the rest are counted
_SHOWN = 48  # characters of one value shown


@dataclass(frozen=True, slots=True)
class FieldChange:
    """One changed value of a document: its path, the old and the new value (None: absent)."""

    path: str
    before: Any
    after: Any

    def render(self, arrow: str = "->") -> str:
        return f"{self.path}: {_show(self.before)} {arrow} {_show(self.after)}"


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return "{...}"
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


@dataclass(frozen=True, slots=True)
class DocumentChange:
    """One desired-state document added, changed or removed between two revisions (a PR's base and head)."""

    kind: str
    name: str
    action: str  # "added" | "changed" | "removed": the words the sync's RowChange uses for the same events
    fields: tuple[str, ...] = ()
    values: tuple[FieldChange, ...] = ()  # changed documents: old -> new of each changed value
    more_values: int = 0  # changed values past MAX_VALUES, not listed

    def rendered_values(self, arrow: str = "->") -> str:
        """`path: old -> new; ...` (or the field names when no values are known)."""
        if not self.values:
            return ", ".join(self.fields)
        more = f"; and {self.more_values} more" if self.more_values else ""
        return "; ".join(v.render(arrow) for v in self.values) + more


@dataclass(frozen=True, slots=True)
class CapabilityChange:
    node: str
    before: str | None
    after: str | None
    why: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SlotChange:
    node: str
    slot_index: int
    schedulable_before: bool
    schedulable_after: bool
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class InventoryDiff:
    changes: tuple[DocumentChange, ...] = ()
    capabilities: tuple[CapabilityChange, ...] = ()
    slots: tuple[SlotChange, ...] = ()
    schedulable_gpus_before: int = 0
    schedulable_gpus_after: int = 0
    ineligible_after: Mapping[str, Mapping[int, tuple[str, ...]]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.changes or self.capabilities or self.slots)


_TABLES = (
    ("Sku", "skus"),
    ("Image", "images"),
    ("Node", "nodes"),
    ("SlotMap", "slot_maps"),
)


def diff(
    base: DesiredState,
    head: DesiredState,
    firmware: Mapping[str, bool] | None = None,
    *,
    schedulable_before: Mapping[str, Slots] | None = None,
    delta: Delta | None = None,
) -> InventoryDiff:
    """What changes from base to head. A head read by `delta` from base (`desired.reading.deltas`) is compared
    only where the delta names a document: every other document is the very same object in both.

    `schedulable_before`: `schedulable(base)`, when the caller kept it (a PR plan's kept base)."""
    delta = delta_since(delta, base)
    changed = None if delta is None else {kind: delta.names(kind) for kind, _ in _TABLES}
    changes: list[DocumentChange] = []
    for kind, attr in _TABLES:
        before: dict[str, Any] = getattr(base, attr)
        after: dict[str, Any] = getattr(head, attr)
        for name in sorted(set(before) | set(after) if changed is None else changed[kind]):
            if name not in before and name not in after:
                continue  # a delta key present in neither: added and removed again
            if name not in before:
                changes.append(DocumentChange(kind, name, "added"))
            elif name not in after:
                changes.append(DocumentChange(kind, name, "removed"))
            elif before[name] != after[name]:
                changes.append(_changed(kind, name, before[name], after[name]))
    changes.extend(_fleet_change(base, head))

    # Capability and schedulability of a node read its Node and its SlotMap only (and `firmware`, the same
    # for both): with a delta, the nodes it names are the only ones that can differ.
    touched = None if changed is None else changed["Node"] | changed["SlotMap"]
    cap_before = _capabilities(base, firmware, touched)
    cap_after = _capabilities(head, firmware, touched)
    none: tuple[str | None, tuple[str, ...]] = (None, ())
    capabilities = [
        CapabilityChange(
            node, cap_before.get(node, none)[0], cap_after.get(node, none)[0], cap_after.get(node, none)[1]
        )
        for node in sorted(set(cap_before) | set(cap_after))
        if cap_before.get(node, none)[0] != cap_after.get(node, none)[0]
    ]
    slots_before = schedulable(base) if schedulable_before is None else schedulable_before
    slots_after = schedulable(head, reuse=slots_before, touched=touched)
    slot_changes = []
    for node in sorted(slots_before.keys() | slots_after.keys() if touched is None else touched):
        was_slots, now_slots = slots_before.get(node, {}), slots_after.get(node, {})
        for idx in sorted(was_slots.keys() | now_slots.keys()):
            was = was_slots.get(idx, (False, ()))[0]
            now, why = now_slots.get(idx, (False, ("slot.removed",)))
            if was != now:
                slot_changes.append(SlotChange(node, idx, was, now, why))
    ineligible: dict[str, dict[int, tuple[str, ...]]] = {}
    for node, per_slot in slots_after.items():
        for idx, (ok, why) in per_slot.items():
            if not ok:
                ineligible.setdefault(node, {})[idx] = why
    return InventoryDiff(
        changes=tuple(changes),
        capabilities=tuple(capabilities),
        slots=tuple(slot_changes),
        schedulable_gpus_before=sum(ok for per_slot in slots_before.values() for ok, _ in per_slot.values()),
        schedulable_gpus_after=sum(ok for per_slot in slots_after.values() for ok, _ in per_slot.values()),
        ineligible_after=ineligible,
    )


def _fleet_change(base: DesiredState, head: DesiredState) -> list[DocumentChange]:
    if base.fleet is None and head.fleet is not None:
        return [DocumentChange("Fleet", head.fleet.name, "added")]
    if base.fleet is not None and head.fleet is None:
        return [DocumentChange("Fleet", base.fleet.name, "removed")]
    if base.fleet is not None and head.fleet is not None and base.fleet != head.fleet:
        return [_changed("Fleet", head.fleet.name, base.fleet, head.fleet)]
    return []


def _changed(kind: str, name: str, a: Any, b: Any) -> DocumentChange:
    da, db = a.model_dump(mode="json"), b.model_dump(mode="json")
    fields = tuple(sorted(k for k in set(da) | set(db) if da.get(k) != db.get(k)))
    values = list(_leaf_changes("", da, db))
    return DocumentChange(kind, name, "changed", fields, tuple(values[:MAX_VALUES]), max(0, len(values) - MAX_VALUES))


def _keyed(items: list[Any]) -> dict[str, Any] | None:
    """List items by their `slot_index` or `name` when every item has a distinct one, else None."""
    for key in ("slot_index", "name"):
        if items and all(isinstance(x, dict) and key in x for x in items):
            keys = [str(x[key]) for x in items]
            if len(set(keys)) == len(keys):
                return dict(zip(keys, items, strict=True))
    return None


def _leaf_changes(path: str, a: Any, b: Any) -> Iterator[FieldChange]:
    """Every differing leaf of two JSON values, in path order; lists of scalars are one leaf."""
    if a == b:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            yield from _leaf_changes(f"{path}.{k}" if path else str(k), a.get(k), b.get(k))
        return
    if isinstance(a, list) and isinstance(b, list) and any(isinstance(x, dict) for x in a + b):
        ka, kb = _keyed(a), _keyed(b)
        if ka is None or kb is None:
            ka = {str(i): x for i, x in enumerate(a)}
            kb = {str(i): x for i, x in enumerate(b)}
        order = sorted(set(ka) | set(kb), key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else 0, k))
        for k in order:
            yield from _leaf_changes(f"{path}[{k}]", ka.get(k), kb.get(k))
        return
    yield FieldChange(path, a, b)


def _capabilities(
    state: DesiredState, firmware: Mapping[str, bool] | None, only: set[str] | None = None
) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Per node (of `only`, when given): its capability and the reason codes."""
    out = {}
    for name in state.nodes if only is None else sorted(only & state.nodes.keys()):
        node = state.nodes[name]
        smap = state.slot_maps.get(name)
        eligible = sum(1 for why in eligibility.eligible_slots(smap).values() if not why) if smap else 0
        ready = (firmware or {}).get(name, node.firmware_ready)
        verdict = capability.node_capability(node, firmware_ready=ready, eligible_slots=eligible)
        out[name] = (verdict.capability.value, tuple(code for code, _ in verdict.reasons))
    return out


# slot index -> (schedulable, reasons); read only: a kept base shares one among equal nodes (caches.keptworlds)
Slots = Mapping[int, tuple[bool, tuple[str, ...]]]


def schedulable(
    state: DesiredState, *, reuse: Mapping[str, Slots] | None = None, touched: set[str] | None = None
) -> dict[str, Slots]:
    """Per node, per slot: eligible by its own metadata AND its node is slice-capable by intent.

    With `touched` (a delta's nodes), `reuse` is the answer for the state this one was read from: every
    other node's Node and SlotMap are the same objects there, and so is its answer."""
    out: dict[str, Slots] = {}
    for node_name in state.slot_maps:  # by key: a reused node's slot map is never read (a lazy base's stays unloaded)
        if touched is not None and reuse is not None and node_name not in touched and node_name in reuse:
            out[node_name] = reuse[node_name]
            continue
        smap = state.slot_maps[node_name]
        node = state.nodes.get(node_name)
        node_reasons: tuple[str, ...] = ()
        if node is None:
            node_reasons = ("node.missing",)
        elif not node.slice_tagged:
            node_reasons = (capability.NO_SLICE_TAG,)
        per_slot: dict[int, tuple[bool, tuple[str, ...]]] = {}
        for idx, why in eligibility.eligible_slots(smap).items():
            reasons = node_reasons + tuple(r.code for r in why)
            per_slot[idx] = (not reasons, reasons)
        out[node_name] = per_slot
    return out
