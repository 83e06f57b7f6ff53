"""Render a PrPlan as text (terminal), markdown (a PR comment) or JSON-ready data.

The markdown starts with a hidden marker (`MARKER`) so a CI job can find and
update its previous comment instead of adding a new one, then a summary
table; every list follows in a collapsible `<details>` section (open when it
is short), so a large PR stays readable.

Every value is escaped for the document it lands in (`schemas.rendering`):
a hostile name or message renders as itself and changes no structure.

Pure: values in, strings and dicts out.
"""

from __future__ import annotations

from typing import Any

from reconciler import plans
from reconciler.placement import capacity
from reconciler.placement.prplan import NodeChange, PrPlan
from schemas import rendering

MARKER = "<!-- gpuaas-plan -->"
OPEN_BELOW = 10  # sections with at most this many rows render expanded
_SYMBOL = {"added": "+", "changed": "~", "removed": "-"}


def short(rev: str | None) -> str:
    if rev is None:
        return "(empty)"
    return rev[:12] if len(rev) == 40 else rev


def _slots(idx: tuple[int, ...]) -> str:
    return ",".join(str(i) for i in idx) if idx else "whole node"


def _arrow(a: object, b: object, sep: str = "->") -> str:
    return f"{a or '-'} {sep} {b or '-'}"


def _moved(a: object, b: object, sep: str = "->") -> str:
    """`a -> b` when the value changes; the value alone when it does not (`x -> x` is noise)."""
    return _arrow(a, b, sep) if a != b else f"{a or '-'}"


def node_changes(pr: PrPlan) -> list[NodeChange]:
    """Nodes whose capability or mode really changes (a row with neither moving is left out)."""
    return [n for n in pr.nodes if (n.capability_before, n.mode_before) != (n.capability_after, n.mode_after)]


def node_why(pr: PrPlan, n: NodeChange, arrow: str = "->") -> list[str]:
    """Why a node's capability or mode moves: its capability reasons, else its Node/SlotMap edits."""
    if n.why:
        return list(n.why)
    return [
        f"{c.kind}: {c.rendered_values(arrow)}"
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


# ------------------------------------------------------------------- json


def as_dict(pr: PrPlan) -> dict[str, Any]:
    inv = pr.inventory
    new = {x.allocation_id for x in pr.new_pending}
    return {
        "base": pr.base_revision,
        "head": pr.head_revision,
        "offline": pr.offline,
        "valid": pr.valid,
        "changed": pr.changed,
        "errors": [e.as_dict() for e in pr.errors],
        "base_errors": [e.as_dict() for e in pr.base_errors],
        "summary": headline(pr),
        "inventory": {
            "changes": [
                {"kind": c.kind, "name": c.name, "action": c.action, "fields": list(c.fields)} for c in inv.changes
            ],
            "values": [
                {"kind": c.kind, "name": c.name, "field": v.path, "before": v.before, "after": v.after}
                for c in inv.changes
                for v in c.values
            ],
            "slots": [
                {
                    "node": s.node,
                    "slot_index": s.slot_index,
                    "schedulable_before": s.schedulable_before,
                    "schedulable_after": s.schedulable_after,
                    "reasons": list(s.reasons),
                }
                for s in inv.slots
            ],
            "schedulable_gpus_before": inv.schedulable_gpus_before,
            "schedulable_gpus_after": inv.schedulable_gpus_after,
            "ineligible_after": {
                n: {str(i): list(r) for i, r in sorted(slots.items())}
                for n, slots in sorted(inv.ineligible_after.items())
            },
        },
        "nodes": [
            {
                "node": n.node,
                "capability_before": n.capability_before,
                "capability_after": n.capability_after,
                "mode_before": n.mode_before,
                "mode_after": n.mode_after,
                "why": list(n.why),
            }
            for n in pr.nodes
        ],
        "placements": [_placement(x) for x in pr.plan.placements],
        "pending": [
            {
                "allocation_id": x.allocation_id,
                "code": x.code,
                "message": x.message,
                "new": x.allocation_id in new,
                "details": dict(x.details),
            }
            for x in pr.plan.pending
        ],
        "releases": [
            {
                "allocation_id": r.allocation_id,
                "tenant": pr.tenants.get(r.allocation_id),
                "node": r.node,
                "slot_indexes": list(r.slot_indexes),
            }
            for r in pr.plan.releases
        ],
        "orphaned": list(pr.orphaned),
        "affected": [
            {
                "allocation_id": a.allocation_id,
                "tenant": a.tenant,
                "node": a.node,
                "slot_indexes": list(a.slot_indexes),
                "change": a.change,
            }
            for a in pr.affected
        ],
        "sku_capacity": [
            {
                "region": c.region,
                "sku": c.sku,
                "unit": c.unit,
                "total_before": c.total_before,
                "total_after": c.total_after,
                "usable_before": c.usable_before,
                "usable_after": c.usable_after,
            }
            for c in pr.sku_capacity
        ],
        "host_drift": [{"node": n, "slot_index": i, "codes": list(c)} for n, i, c in pr.host_blocked],
        "capacity": [
            {"region": c.region, "sku": c.sku, "gpu_count": c.gpu_count, "before": c.before, "after": c.after}
            for c in pr.capacity_changes
        ],
        "launchable_after": capacity_rows(pr.capacity_after),
    }


def _placement(x: plans.Placement) -> dict[str, Any]:
    return {
        "allocation_id": x.allocation_id,
        "tenant": x.tenant,
        "sku": x.sku,
        "gpu_count": x.gpu_count,
        "region": x.region,
        "node": x.node,
        "slot_indexes": list(x.slot_indexes),
        "capacity_shape": x.capacity_shape,
        "vm_profile": x.profile.name if x.profile else None,
        "vcpu_count": x.profile.vcpu_count if x.profile else None,
        "memory_mib": x.profile.memory_mib if x.profile else None,
        "image": x.image,
    }


def capacity_rows(model: capacity.ReadModel) -> list[dict[str, Any]]:
    return [
        {
            "region": o.region,
            "sku": o.sku,
            "unit": o.unit,
            "usable": o.usable,
            "launchable": {str(s.gpu_count): s.launchable for s in o.sizes},
            "not_launchable": dict(o.not_launchable),
        }
        for o in model.offers
    ]


# ------------------------------------------------------------------- text


def _text_inventory(pr: PrPlan) -> list[str]:
    inv = pr.inventory
    if not (inv.changes or inv.slots):
        return []
    out = ["", "Inventory:"]
    out += [
        f"  {_SYMBOL.get(c.action, '?')} {c.kind} {c.name}" + (f" ({c.rendered_values()})" if c.fields else "")
        for c in inv.changes
    ]
    delta = inv.schedulable_gpus_after - inv.schedulable_gpus_before
    out.append(f"  schedulable slots: {inv.schedulable_gpus_before} -> {inv.schedulable_gpus_after} ({delta:+d})")
    for (node, now, reasons), idx in slot_groups(pr).items():
        verb = "become schedulable" if now else "stop being schedulable"
        why = f": {', '.join(reasons)}" if reasons else ""
        out.append(f"    {node} slots [{_slots(tuple(idx))}] {verb}{why}")
    unschedulable = ineligible_groups(pr)
    if unschedulable:
        out.append("  not schedulable in head:")
        out += [
            f"    {node} slots [{_slots(tuple(idx))}]: {', '.join(reasons)}"
            for (node, reasons), idx in unschedulable.items()
        ]
    return out


def _text_nodes(pr: PrPlan) -> list[str]:
    if not node_changes(pr):
        return []
    out = ["", "Nodes:"]
    for n in node_changes(pr):
        line = f"  {n.node:<24} capability {_moved(n.capability_before, n.capability_after):<34}"
        line += f" mode {_moved(n.mode_before, n.mode_after)}"
        why = node_why(pr, n) + ([node_tenants(pr, n.node)] if node_tenants(pr, n.node) else [])
        if why:
            line += f"  ({'; '.join(why)})"
        out.append(line.rstrip())
    return out


def _text_affected(pr: PrPlan) -> list[str]:
    if not pr.affected:
        return []
    out = ["", "Running allocations on changed nodes (they keep running; drained nodes take no new ones):"]
    out += [
        f"  {a.allocation_id:<24} tenant {a.tenant:<14} {a.node} slots [{_slots(a.slot_indexes)}]: {a.change}"
        for a in pr.affected
    ]
    return out


def _text_allocations(pr: PrPlan) -> list[str]:
    out = []
    if pr.plan.placements:
        out += ["", "Placements:"]
        for x in pr.plan.placements:
            prof = f" profile {x.profile.name}" if x.profile else ""
            out.append(
                f"  + {x.allocation_id:<24} {x.gpu_count}x {x.sku} -> {x.node} slots [{_slots(x.slot_indexes)}]"
                f"{prof} (tenant {x.tenant})"
            )
    if pr.plan.pending:
        new = {x.allocation_id for x in pr.new_pending}
        out += ["", "Pending:"]
        for y in pr.plan.pending:
            tag = "new" if y.allocation_id in new else "unchanged"
            out.append(f"  ! {y.allocation_id:<24} {y.code} ({tag}): {y.message}")
    if pr.plan.releases:
        out += ["", "Releases:"]
        out += [
            f"  - {r.allocation_id:<24} {r.node} slots [{_slots(r.slot_indexes)}] -> cleanup"
            f" (tenant {pr.tenants.get(r.allocation_id, '-')})"
            for r in pr.plan.releases
        ]
    if pr.orphaned:
        out += [
            "",
            "warning: allocations holding claims are no longer declared (set `state: released` to free "
            "them): " + ", ".join(pr.orphaned),
        ]
    if pr.host_blocked:
        out += ["", "Not placed until their hosts report them clear:"]
        out += [
            f"  {node} {'(node-wide corruption)' if idx is None else 'slots [' + _slots(tuple(slots)) + ']'}: "
            f"{', '.join(codes)}"
            for (node, codes), idxs in host_groups(pr).items()
            for idx, slots in idxs
        ]
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


def render_text(pr: PrPlan) -> str:
    out = [
        f"Plan: {short(pr.base_revision)} -> {short(pr.head_revision)}"
        + (" (offline: base state planned from no claims)" if pr.offline else " (against the database)")
    ]
    if not pr.valid:
        out += ["", *(e.render() for e in pr.errors), "", f"Plan: {headline(pr)}."]
        return _lines(out)
    if pr.base_errors:
        out.append(f"note: base has {len(pr.base_errors)} validation error(s); its state is partial")
    out += _text_inventory(pr) + _text_nodes(pr) + _text_affected(pr) + _text_allocations(pr)
    if pr.sku_capacity:
        out += ["", "Capacity per SKU (before -> after):"]
        out += [
            f"  {c.region:<12} {c.sku:<26} total {c.total_before} -> {c.total_after} {c.unit}s, "
            f"usable {c.usable_before} -> {c.usable_after}"
            for c in pr.sku_capacity
        ]
    if pr.capacity_changes:
        out += ["", "Launchable capacity (before -> after):"]
        out += [f"  {c.region:<12} {c.sku:<26} {c.gpu_count} GPU: {c.before} -> {c.after}" for c in pr.capacity_changes]
    out += ["", f"Plan: {headline(pr)}."]
    return _lines(out)


def _lines(out: list[str]) -> str:
    # Each entry is one line: a newline or escape sequence in a value (a file name
    # from git) must not start a line of its own in a terminal or a CI log.
    return "\n".join(rendering.terminal_text(line) for line in out)


# --------------------------------------------------------------- markdown
# Every value from the repo or the plan goes through schemas.rendering (md_text,
# md_code): a name, file name, revision or message can never open an HTML tag,
# break a table cell, leave a <details> block or start a code span of its own.


def _code(value: object) -> rendering.Markdown:
    return rendering.md_code(value)


def _codes(values: tuple[str, ...] | list[str]) -> rendering.Markdown:
    return rendering.md_join(", ", (rendering.md_code(v) for v in values))


def _table(header: list[str], rows: list[list[object]]) -> list[str]:
    lines = [rendering.md_row(header), "|" + "---|" * len(header)]
    lines += [rendering.md_row(row) for row in rows]
    return lines


def _details(title: str, header: list[str], rows: list[list[object]]) -> list[str]:
    if not rows:
        return []
    attr = " open" if len(rows) <= OPEN_BELOW else ""
    return [
        "",
        f"<details{attr}><summary><b>{rendering.html_text(title)}</b> ({len(rows)})</summary>",
        "",
        *_table(header, rows),
        "",
        "</details>",
    ]


def render_markdown(pr: PrPlan) -> str:
    revs = f"{_code(short(pr.base_revision))} → {_code(short(pr.head_revision))}"
    out = [MARKER, f"### gpuaas plan: {revs}", ""]
    if not pr.valid:
        out += [f"**Invalid: {len(pr.errors)} validation error(s); nothing was planned.**", ""]
        out += _table(
            ["File", "Code", "Message"],  # FILE:LINE:COL once, as validate prints it
            [[_code(f"{e.file}:{e.line}:{e.column}"), _code(e.code), e.message] for e in pr.errors],
        )
        return "\n".join(out) + "\n"
    inv = pr.inventory
    new = {x.allocation_id for x in pr.new_pending}
    delta = inv.schedulable_gpus_after - inv.schedulable_gpus_before
    out += _table(
        ["", "Count"],
        [
            ["Inventory changes", len(inv.changes)],
            ["Schedulable slots", f"{inv.schedulable_gpus_before} → {inv.schedulable_gpus_after} ({delta:+d})"],
            ["Nodes changing capability or mode", len(pr.nodes)],
            ["Allocations to place", len(pr.plan.placements)],
            ["Allocations pending", f"{len(pr.plan.pending)} ({len(new)} new)"],
            ["Releases", len(pr.plan.releases)],
        ],
    )
    out += [
        "",
        f"**{rendering.md_text(headline(pr))}**"
        + (" (offline: base state planned from no claims)" if pr.offline else ""),
    ]
    if pr.base_errors:
        out += ["", f"> base has {len(pr.base_errors)} validation error(s); its state is partial"]
    if pr.orphaned:
        out += [
            "",
            "> **warning:** allocations holding claims are no longer declared (set `state: released` "
            "to free them): " + _codes(pr.orphaned),
        ]
    out += _details(
        "Inventory",
        ["", "Kind", "Name", "Fields"],
        [
            [_SYMBOL.get(c.action, "?") + " " + c.action, c.kind, _code(c.name), c.rendered_values("→")]
            for c in inv.changes
        ],
    )
    out += _details(
        "Slot eligibility",
        ["Node", "Slots", "Schedulable", "Reasons"],
        [
            [_code(node), _slots(tuple(idx)), "no → yes" if now else "yes → no", _codes(reasons)]
            for (node, now, reasons), idx in slot_groups(pr).items()
        ],
    )
    out += _details(
        "Slots still not schedulable (added or changed nodes)",
        ["Node", "Slots", "Reasons"],
        [[_code(node), _slots(tuple(idx)), _codes(reasons)] for (node, reasons), idx in ineligible_groups(pr).items()],
    )
    out += _details(
        "Nodes: capability and mode",
        ["Node", "Capability", "Mode", "Why", "Running here"],
        [
            [
                _code(n.node),
                _moved(n.capability_before, n.capability_after, "→"),
                _moved(n.mode_before, n.mode_after, "→"),
                _codes(n.why) if n.why else "; ".join(node_why(pr, n, "→")) or "-",
                node_tenants(pr, n.node) or "-",
            ]
            for n in node_changes(pr)
        ],
    )
    out += _details(
        "Running allocations on changed nodes",
        ["Allocation", "Tenant", "Node", "Slots", "Change"],
        [[_code(a.allocation_id), a.tenant, _code(a.node), _slots(a.slot_indexes), a.change] for a in pr.affected],
    )
    out += _details(
        "Placements",
        ["Allocation", "Tenant", "Request", "Node", "Slots", "VM profile"],
        [
            [
                _code(x.allocation_id),
                x.tenant,
                f"{x.gpu_count}x {x.sku}",
                _code(x.node),
                _slots(x.slot_indexes),
                f"{x.profile.name} ({x.profile.vcpu_count} vCPU, {x.profile.memory_mib} MiB)" if x.profile else "-",
            ]
            for x in pr.plan.placements
        ],
    )
    out += _details(
        "Not placed until their hosts report them clear",
        ["Node", "Slots", "Codes"],
        [
            [_code(node), "whole node" if idx is None else _slots(tuple(slots)), _codes(codes)]
            for (node, codes), idxs in host_groups(pr).items()
            for idx, slots in idxs
        ],
    )
    out += _details(
        "Pending",
        ["Allocation", "Code", "Reason", "New"],
        [
            [_code(y.allocation_id), _code(y.code), y.message, "yes" if y.allocation_id in new else "no"]
            for y in pr.plan.pending
        ],
    )
    out += _details(
        "Releases",
        ["Allocation", "Tenant", "Node", "Slots"],
        [
            [_code(r.allocation_id), pr.tenants.get(r.allocation_id, "-"), _code(r.node), _slots(r.slot_indexes)]
            for r in pr.plan.releases
        ],
    )
    out += _details(
        "Capacity per SKU",
        ["Region", "SKU", "Total", "Usable (free, launchable)"],
        [
            [
                c.region,
                _code(c.sku),
                f"{c.total_before} → {c.total_after} {c.unit}s",
                f"{c.usable_before} → {c.usable_after}",
            ]
            for c in pr.sku_capacity
        ],
    )
    out += _details(
        "Launchable capacity",
        ["Region", "SKU", "GPUs", "Before", "After"],
        [[c.region, _code(c.sku), c.gpu_count, c.before, c.after] for c in pr.capacity_changes],
    )
    return "\n".join(out) + "\n"
