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
from reconciler.placement import prplan_summary as summary
from reconciler.placement.prplan import PrPlan
from schemas import rendering

MARKER = "<!-- gpuaas-plan -->"
OPEN_BELOW = 10  # sections with at most this many rows render expanded
_SYMBOL = {"added": "+", "changed": "~", "removed": "-"}


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
        "summary": summary.headline(pr),
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
    for (node, now, reasons), idx in summary.slot_groups(pr).items():
        verb = "become schedulable" if now else "stop being schedulable"
        why = f": {', '.join(reasons)}" if reasons else ""
        out.append(f"    {node} slots [{summary.slots_text(tuple(idx))}] {verb}{why}")
    unschedulable = summary.ineligible_groups(pr)
    if unschedulable:
        out.append("  not schedulable in head:")
        out += [
            f"    {node} slots [{summary.slots_text(tuple(idx))}]: {', '.join(reasons)}"
            for (node, reasons), idx in unschedulable.items()
        ]
    return out


def _text_nodes(pr: PrPlan) -> list[str]:
    if not summary.node_changes(pr):
        return []
    out = ["", "Nodes:"]
    for n in summary.node_changes(pr):
        line = f"  {n.node:<24} capability {summary.moved(n.capability_before, n.capability_after):<34}"
        line += f" mode {summary.moved(n.mode_before, n.mode_after)}"
        why = summary.node_why(pr, n) + ([summary.node_tenants(pr, n.node)] if summary.node_tenants(pr, n.node) else [])
        if why:
            line += f"  ({'; '.join(why)})"
        out.append(line.rstrip())
    return out


def _text_affected(pr: PrPlan) -> list[str]:
    if not pr.affected:
        return []
    out = ["", "Running allocations on changed nodes (they keep running; drained nodes take no new ones):"]
    out += [
        f"  {a.allocation_id:<24} tenant {a.tenant:<14} {a.node} "
        f"slots [{summary.slots_text(a.slot_indexes)}]: {a.change}"
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
                f"  + {x.allocation_id:<24} {x.gpu_count}x {x.sku} -> {x.node} "
                f"slots [{summary.slots_text(x.slot_indexes)}]"
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
            f"  - {r.allocation_id:<24} {r.node} slots [{summary.slots_text(r.slot_indexes)}] -> cleanup"
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
            f"  {node} "
            f"{'(node-wide corruption)' if idx is None else 'slots [' + summary.slots_text(tuple(slots)) + ']'}: "
            f"{', '.join(codes)}"
            for (node, codes), idxs in summary.host_groups(pr).items()
            for idx, slots in idxs
        ]
    return out


def render_text(pr: PrPlan) -> str:
    out = [
        f"Plan: {summary.short(pr.base_revision)} -> {summary.short(pr.head_revision)}"
        + (" (offline: base state planned from no claims)" if pr.offline else " (against the database)")
    ]
    if not pr.valid:
        out += ["", *(e.render() for e in pr.errors), "", f"Plan: {summary.headline(pr)}."]
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
    out += ["", f"Plan: {summary.headline(pr)}."]
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
    revs = f"{_code(summary.short(pr.base_revision))} → {_code(summary.short(pr.head_revision))}"
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
        f"**{rendering.md_text(summary.headline(pr))}**"
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
            [_code(node), summary.slots_text(tuple(idx)), "no → yes" if now else "yes → no", _codes(reasons)]
            for (node, now, reasons), idx in summary.slot_groups(pr).items()
        ],
    )
    out += _details(
        "Slots still not schedulable (added or changed nodes)",
        ["Node", "Slots", "Reasons"],
        [
            [_code(node), summary.slots_text(tuple(idx)), _codes(reasons)]
            for (node, reasons), idx in summary.ineligible_groups(pr).items()
        ],
    )
    out += _details(
        "Nodes: capability and mode",
        ["Node", "Capability", "Mode", "Why", "Running here"],
        [
            [
                _code(n.node),
                summary.moved(n.capability_before, n.capability_after, "→"),
                summary.moved(n.mode_before, n.mode_after, "→"),
                _codes(n.why) if n.why else "; ".join(summary.node_why(pr, n, "→")) or "-",
                summary.node_tenants(pr, n.node) or "-",
            ]
            for n in summary.node_changes(pr)
        ],
    )
    out += _details(
        "Running allocations on changed nodes",
        ["Allocation", "Tenant", "Node", "Slots", "Change"],
        [
            [_code(a.allocation_id), a.tenant, _code(a.node), summary.slots_text(a.slot_indexes), a.change]
            for a in pr.affected
        ],
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
                summary.slots_text(x.slot_indexes),
                f"{x.profile.name} ({x.profile.vcpu_count} vCPU, {x.profile.memory_mib} MiB)" if x.profile else "-",
            ]
            for x in pr.plan.placements
        ],
    )
    out += _details(
        "Not placed until their hosts report them clear",
        ["Node", "Slots", "Codes"],
        [
            [_code(node), "whole node" if idx is None else summary.slots_text(tuple(slots)), _codes(codes)]
            for (node, codes), idxs in summary.host_groups(pr).items()
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
            [
                _code(r.allocation_id),
                pr.tenants.get(r.allocation_id, "-"),
                _code(r.node),
                summary.slots_text(r.slot_indexes),
            ]
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
