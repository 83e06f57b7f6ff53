"""Fleet summary: what the desired state offers, before any claim exists.

Pure: takes a DesiredState (and optional observed firmware readiness) and
returns plain data the CLI renders as text or JSON.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from desired.state import DesiredState
from policies import capability, eligibility


def fleet_summary(state: DesiredState, firmware: Mapping[str, bool] | None = None) -> dict[str, Any]:
    firmware = firmware or {}
    nodes = []
    slot_totals: Counter[str] = Counter()
    reason_totals: Counter[str] = Counter()
    for name in sorted(state.nodes):
        node = state.nodes[name]
        smap = state.slot_maps.get(name)
        reasons = eligibility.eligible_slots(smap) if smap else {}
        eligible = sum(1 for why in reasons.values() if not why)
        ready = firmware.get(name, node.firmware_ready)
        verdict = capability.node_capability(node, firmware_ready=ready, eligible_slots=eligible)
        slot_totals["eligible"] += eligible
        slot_totals["ineligible"] += len(reasons) - eligible
        for why in reasons.values():
            for r in why:
                reason_totals[r.code] += 1
        nodes.append(
            {
                "name": name,
                "region": node.region,
                "pool": node.pool,
                "capability": verdict.capability.value,
                "why": [{"code": c, "message": msg} for c, msg in verdict.reasons],
                "admin_state": node.admin_state.value,
                "org": node.org,
                "baremetal_sku": node.baremetal_sku,
                "slots": {"total": len(reasons), "eligible": eligible},
                "ineligible_slots": {str(i): [r.code for r in why] for i, why in sorted(reasons.items()) if why},
            }
        )
    return {
        "revision": state.revision,
        "nodes": nodes,
        "slots": {
            "eligible": slot_totals["eligible"],
            "ineligible": slot_totals["ineligible"],
            "ineligible_by_reason": dict(sorted(reason_totals.items())),
        },
        "skus": [
            {
                "sku": s.sku,
                "capacity_shape": s.capacity_shape.value,
                "fabric": s.network_fabric.value,
                "gpu_counts": list(s.counts),
                "price_minor_per_gpu_hour": s.gpu_hourly_price_minor,
                "active": s.active,
            }
            for s in sorted(state.skus.values(), key=lambda s: s.sku)
        ],
        "images": sorted(state.images),
        "allocations": [
            {
                "id": a.id,
                "tenant": a.tenant,
                "sku": a.sku,
                "gpu_count": a.gpu_count,
                "region": a.region,
                "state": a.state.value,
            }
            for a in sorted(state.allocations.values(), key=lambda a: (a.requested_at, a.id))
        ],
    }


def render_text(summary: dict[str, Any]) -> str:
    lines = [f"Fleet at {summary['revision'] or 'working tree'}", "", "Nodes:"]
    for n in summary["nodes"]:
        slots = n["slots"]
        extra = f" org={n['org']}" if n["org"] else ""
        lines.append(
            f"  {n['name']:<24} {n['region']}/{n['pool']:<14} {n['capability']:<16} "
            f"{n['admin_state']:<11} slots {slots['eligible']}/{slots['total']} eligible{extra}"
        )
        for why in n["why"]:
            if n["capability"] == "slice_candidate":
                lines.append(f"      why: {why['code']}: {why['message']}")
    s = summary["slots"]
    lines += ["", f"Slots: {s['eligible']} eligible, {s['ineligible']} not schedulable"]
    for code, count in s["ineligible_by_reason"].items():
        lines.append(f"  {count:>4} {code}")
    lines += ["", "SKUs:"]
    for k in summary["skus"]:
        counts = ",".join(str(c) for c in k["gpu_counts"])
        lines.append(
            f"  {k['sku']:<26} {k['capacity_shape']:<10} fabric={k['fabric']:<11} gpus={counts:<8} "
            f"{k['price_minor_per_gpu_hour']} minor/GPU-h{'' if k['active'] else ' (inactive)'}"
        )
    lines += ["", f"Images: {', '.join(summary['images']) or '-'}", "", "Allocations:"]
    for a in summary["allocations"]:
        lines.append(
            f"  {a['id']:<28} {a['tenant']:<14} {a['sku']:<24} {a['gpu_count']} GPU  {a['region']:<10} {a['state']}"
        )
    if not summary["allocations"]:
        lines.append("  -")
    return "\n".join(lines)
