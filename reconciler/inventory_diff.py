"""What a change to desired state does to inventory: added, changed, disabled.

Pure: compares two DesiredStates (base and head of a pull request) and says,
per kind and name, what changes, plus which nodes change capability and which
slots become schedulable or stop being schedulable (with the reasons), so a
reviewer sees the capacity a PR creates or removes before it merges.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from desired.loading import DesiredState
from policies import capability, eligibility


@dataclass(frozen=True, slots=True)
class Change:
    kind: str
    name: str
    action: str  # "added" | "changed" | "disabled"
    fields: tuple[str, ...] = ()


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
    changes: tuple[Change, ...] = ()
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


def diff(base: DesiredState, head: DesiredState, firmware: Mapping[str, bool] | None = None) -> InventoryDiff:
    changes: list[Change] = []
    for kind, attr in _TABLES:
        before: dict[str, Any] = getattr(base, attr)
        after: dict[str, Any] = getattr(head, attr)
        for name in sorted(set(before) | set(after)):
            if name not in before:
                changes.append(Change(kind, name, "added"))
            elif name not in after:
                changes.append(Change(kind, name, "disabled"))
            elif before[name] != after[name]:
                changes.append(Change(kind, name, "changed", _changed_fields(before[name], after[name])))
    changes.extend(_fleet_change(base, head))

    cap_before = _capabilities(base, firmware)
    cap_after = _capabilities(head, firmware)
    none: tuple[str | None, tuple[str, ...]] = (None, ())
    capabilities = [
        CapabilityChange(
            node, cap_before.get(node, none)[0], cap_after.get(node, none)[0], cap_after.get(node, none)[1]
        )
        for node in sorted(set(cap_before) | set(cap_after))
        if cap_before.get(node, none)[0] != cap_after.get(node, none)[0]
    ]
    slots_before = _schedulable(base)
    slots_after = _schedulable(head)
    slot_changes = []
    for key in sorted(set(slots_before) | set(slots_after)):
        was = slots_before.get(key, (False, ()))[0]
        now, why = slots_after.get(key, (False, ("slot.removed",)))
        if was != now:
            slot_changes.append(SlotChange(key[0], key[1], was, now, why))
    ineligible: dict[str, dict[int, tuple[str, ...]]] = {}
    for (node, idx), (ok, why) in slots_after.items():
        if not ok:
            ineligible.setdefault(node, {})[idx] = why
    return InventoryDiff(
        changes=tuple(changes),
        capabilities=tuple(capabilities),
        slots=tuple(slot_changes),
        schedulable_gpus_before=sum(1 for ok, _ in slots_before.values() if ok),
        schedulable_gpus_after=sum(1 for ok, _ in slots_after.values() if ok),
        ineligible_after=ineligible,
    )


def _fleet_change(base: DesiredState, head: DesiredState) -> list[Change]:
    if base.fleet is None and head.fleet is not None:
        return [Change("Fleet", head.fleet.name, "added")]
    if base.fleet is not None and head.fleet is None:
        return [Change("Fleet", base.fleet.name, "disabled")]
    if base.fleet is not None and head.fleet is not None and base.fleet != head.fleet:
        return [Change("Fleet", head.fleet.name, "changed", _changed_fields(base.fleet, head.fleet))]
    return []


def _changed_fields(a: Any, b: Any) -> tuple[str, ...]:
    da, db = a.model_dump(), b.model_dump()
    return tuple(sorted(k for k in set(da) | set(db) if da.get(k) != db.get(k)))


def _capabilities(state: DesiredState, firmware: Mapping[str, bool] | None) -> dict[str, tuple[str, tuple[str, ...]]]:
    out = {}
    for name, node in state.nodes.items():
        smap = state.slot_maps.get(name)
        eligible = sum(1 for why in eligibility.eligible_slots(smap).values() if not why) if smap else 0
        ready = (firmware or {}).get(name, node.firmware_ready)
        verdict = capability.node_capability(node, firmware_ready=ready, eligible_slots=eligible)
        out[name] = (verdict.capability.value, tuple(code for code, _ in verdict.reasons))
    return out


def _schedulable(state: DesiredState) -> dict[tuple[str, int], tuple[bool, tuple[str, ...]]]:
    """Per slot: eligible by its own metadata AND its node is slice-capable by intent."""
    out: dict[tuple[str, int], tuple[bool, tuple[str, ...]]] = {}
    for node_name, smap in state.slot_maps.items():
        node = state.nodes.get(node_name)
        node_reasons: tuple[str, ...] = ()
        if node is None:
            node_reasons = ("node.missing",)
        elif not node.slice_tagged:
            node_reasons = (capability.NO_SLICE_TAG,)
        for idx, why in eligibility.eligible_slots(smap).items():
            reasons = node_reasons + tuple(r.code for r in why)
            out[(node_name, idx)] = (not reasons, reasons)
    return out
