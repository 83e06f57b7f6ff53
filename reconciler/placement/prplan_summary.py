"""What a PR plan's renderings share: short revisions, node and slot groupings, the headline.

`prplan_render` prints these as text, markdown or JSON-ready data; keeping
them here means the three formats group and word things the same way.

Pure: values in, strings and lists out.
"""

from __future__ import annotations

from reconciler.placement.prplan import NodeChange, PrPlan


def short(rev: str | None) -> str:
    if rev is None:
        return "(empty)"
    return rev[:12] if len(rev) == 40 else rev


def slots_text(idx: tuple[int, ...]) -> str:
    return ",".join(str(i) for i in idx) if idx else "whole node"


def arrow(a: object, b: object, sep: str = "->") -> str:
    return f"{a or '-'} {sep} {b or '-'}"


def moved(a: object, b: object, sep: str = "->") -> str:
    """`a -> b` when the value changes; the value alone when it does not (`x -> x` is noise)."""
    return arrow(a, b, sep) if a != b else f"{a or '-'}"


def node_changes(pr: PrPlan) -> list[NodeChange]:
    """Nodes whose capability or mode really changes (a row with neither moving is left out)."""
    return [n for n in pr.nodes if (n.capability_before, n.mode_before) != (n.capability_after, n.mode_after)]


def node_why(pr: PrPlan, n: NodeChange, sep: str = "->") -> list[str]:
    """Why a node's capability or mode moves: its capability reasons, else its Node/SlotMap edits."""
    if n.why:
        return list(n.why)
    return [
        f"{c.kind}: {c.rendered_values(sep)}"
        for c in pr.inventory.changes
        if c.name == n.node and c.kind in ("Node", "SlotMap") and c.fields
    ]


def node_tenants(pr: PrPlan, node: str) -> str:
    """`3 allocation(s) of acme, globex` running on a node this change touches; empty when none."""
    here = [a for a in pr.affected if a.node == node]
    if not here:
        return ""
    tenants = ", ".join(sorted({a.tenant for a in here}))
    return f"{len(here)} running allocation(s) of {tenants}"


def headline(pr: PrPlan) -> str:
    if not pr.valid:
        return f"{len(pr.errors)} validation error(s) in head; nothing planned"
    if not pr.changed:
        return "no changes"
    parts = []
    inv = len(pr.inventory.changes)
    if inv:
        parts.append(f"{inv} inventory change(s)")
    if pr.nodes:
        parts.append(f"{len(pr.nodes)} node(s) change capability or mode")
    parts.append(f"{len(pr.plan.placements)} to place")
    parts.append(f"{len(pr.plan.pending)} pending ({len(pr.new_pending)} new)")
    parts.append(f"{len(pr.plan.releases)} to release")
    return ", ".join(parts)


def slot_groups(pr: PrPlan) -> dict[tuple[str, bool, tuple[str, ...]], list[int]]:
    """Slot changes grouped by (node, schedulable after, reasons), slot indexes in order."""
    out: dict[tuple[str, bool, tuple[str, ...]], list[int]] = {}
    for s in pr.inventory.slots:
        out.setdefault((s.node, s.schedulable_after, s.reasons), []).append(s.slot_index)
    return out


def ineligible_groups(pr: PrPlan) -> dict[tuple[str, tuple[str, ...]], list[int]]:
    """Slots of the slot maps this change adds or edits that head still cannot schedule, with the reasons."""
    touched = {c.name for c in pr.inventory.changes if c.kind in ("SlotMap", "Node") and c.action != "removed"}
    changed = {(s.node, s.slot_index) for s in pr.inventory.slots}
    out: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    for node in sorted(touched & set(pr.inventory.ineligible_after)):
        for idx, reasons in sorted(pr.inventory.ineligible_after[node].items()):
            if (node, idx) not in changed:
                out.setdefault((node, reasons), []).append(idx)
    return out


def host_groups(pr: PrPlan) -> dict[tuple[str, tuple[str, ...]], list[tuple[int | None, list[int]]]]:
    """Host-reported blocks grouped by (node, codes): the node itself (None), then its slots together."""
    out: dict[tuple[str, tuple[str, ...]], list[tuple[int | None, list[int]]]] = {}
    for node, idx, codes in pr.host_blocked:
        group = out.setdefault((node, codes), [])
        if idx is None:
            group.insert(0, (None, []))
        elif group and group[-1][0] is not None:
            group[-1][1].append(idx)
        else:
            group.append((idx, [idx]))
    return out
