"""`gpuaas status [-o text|json]`: the capacity read model of the database.

Per region x SKU: launchable counts for each allowed GPU count (what the
planner would still place, not raw free slots) and why free slots are not
launchable; node summaries (capability, mode, slots by status, draining or
drained); allocations with their claims and status. Reads the store only: the
desired state is the inventory the last reconciliation synced.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from reconciler import capacity
from reconciler.commands import db


def register(sub: Any) -> None:
    p = sub.add_parser("status", help="capacity per region x SKU, nodes and allocations, from the database")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    p.add_argument("--policy", help="placement policy override (default: the Fleet's)")
    db.add_database_arguments(p)
    p.set_defaults(func=run)


def collect(url: str, *, policy: str | None = None) -> dict[str, Any]:
    """The whole status document (plain data), read from the database at `url`."""
    from reconciler.errors import PermanentError
    from reconciler.store import connections, history, migrations, observing, readmodels

    with connections.connect(url, autocommit=True) as conn:
        if not migrations.applied(conn):
            raise PermanentError("the database has no schema yet: nothing was reconciled (run `gpuaas run`)",
                                 code="status.no_schema")
        state = readmodels.desired_state(conn)
        observed = observing.observe(conn)
        allocations = readmodels.allocations(conn)
        health = history.health(conn)
    try:
        model = capacity.read_model(state, observed, policy=policy)
    except ValueError as e:
        raise PermanentError(str(e), code="status.policy_unknown") from e
    doc = as_dict(state.revision, model, allocations)
    doc["reconciliation"] = {
        "last_applied_revision": health.last_applied_revision, "last_applied_at": health.last_applied_at,
        "failing": {"since": health.failing_since, "failures": health.failures,
                    "revision": health.failing_revision, "code": health.failing_code,
                    "message": health.failing_message} if health.failing else None,
        "invalid_revision": health.invalid_revision,
    }
    return doc


def as_dict(revision: str | None, model: capacity.ReadModel, allocations: Sequence[Any]) -> dict[str, Any]:
    return {
        "revision": revision,
        "capacity": [{
            "region": o.region, "sku": o.sku, "capacity_shape": o.capacity_shape, "unit": o.unit,
            "total": o.total, "in_use": o.in_use, "free": o.free, "usable": o.usable,
            "not_launchable": dict(o.not_launchable),
            "sizes": [_size(s) for s in o.sizes],
            "dedicated": {org: [_size(s) for s in sizes] for org, sizes in o.dedicated.items()},
        } for o in model.offers],
        "nodes": [{
            "name": n.name, "region": n.region, "pool": n.pool, "org": n.org, "admin_state": n.admin_state,
            "healthy": n.healthy, "capability": n.capability, "capability_reasons": list(n.capability_reasons),
            "mode": n.mode, "slots": dict(n.slots), "allocations": list(n.allocations), "drained": n.drained,
        } for n in model.nodes],
        "allocations": [{
            "id": a.id, "tenant": a.tenant, "sku": a.sku, "gpu_count": a.gpu_count, "region": a.region,
            "desired_state": a.desired_state, "status": a.status, "node": a.node,
            "slot_indexes": list(a.slot_indexes), "vm_profile": a.vm_profile,
            "pending": {"code": a.pending_code, "message": a.pending_message} if a.pending_code else None,
            "claims": [{"node": c.node, "slot_index": c.slot_index, "kind": c.kind, "status": c.status}
                       for c in a.claims],
            "placed_at": a.placed_at, "active_at": a.active_at,
        } for a in allocations],
    }


def _size(s: capacity.Size) -> dict[str, Any]:
    return {"gpu_count": s.gpu_count, "launchable": s.launchable, "stranded_gpus": s.stranded_gpus,
            "limit": {"code": s.limit_code, "message": s.limit_message} if s.launchable == 0 and s.limit_code
            else None}


def _node_mode(n: dict[str, Any]) -> str:
    if n["admin_state"] == "active":
        return str(n["mode"])
    if n["drained"]:
        return f"{n['admin_state']} (drained: empty and clean; set admin_state: active to return it)"
    left = len(n["allocations"])
    cleanup = n["slots"].get("cleanup", 0) + n["slots"].get("releasing", 0)
    return f"{n['admin_state']} ({left} allocation(s) running, {cleanup} slot(s) in cleanup)"


def _size_notes(sizes: list[dict[str, Any]]) -> list[str]:
    """Stranded GPUs per size; sizes none of which is launchable, grouped by their reason code."""
    out = [f"      {s['gpu_count']} GPU: {s['stranded_gpus']} usable GPU(s) stranded by topology"
           for s in sizes if s["stranded_gpus"] and s["launchable"]]
    by_code: dict[str, list[dict[str, Any]]] = {}
    for s in sizes:
        if s["limit"]:
            by_code.setdefault(s["limit"]["code"], []).append(s)
    for code, group in by_code.items():
        counts = ",".join(str(s["gpu_count"]) for s in group)
        out.append(f"      {counts} GPU: none launchable: {code}: {group[0]['limit']['message']}")
    return out


def render_text(doc: dict[str, Any]) -> str:
    out = [f"Status at revision {(doc['revision'] or '-')[:12]}"]
    rec = doc.get("reconciliation") or {}
    if rec.get("failing"):
        f = rec["failing"]
        out.append(f"  FAILING since {f['since']} ({f['failures']} failed reconciliation(s)), newest on "
                   f"{(f['revision'] or '-')[:12]}: {f['code']}: {f['message']}")
    if rec.get("invalid_revision"):
        out.append(f"  revision {rec['invalid_revision'][:12]} is invalid (see `gpuaas history`); "
                   "the last valid revision stays in force")
    out += ["",
           "Capacity (launchable now, per allowed GPU count; sizes and shapes compete for the same GPUs):"]
    out.append(f"  {'REGION':<12} {'SKU':<26} {'UNIT':<5} {'TOTAL':>5} {'IN USE':>6} {'FREE':>5} "
               f"{'USABLE':>6}  {'LAUNCHABLE':<22} NOT LAUNCHABLE (free units)")
    for o in doc["capacity"]:
        sizes = " ".join(f"{s['gpu_count']}g:{s['launchable']}" for s in o["sizes"])
        blocked = " ".join(f"{k}={v}" for k, v in o["not_launchable"].items()) or "-"
        out.append(f"  {o['region']:<12} {o['sku']:<26} {o['unit']:<5} {o['total']:>5} {o['in_use']:>6} "
                   f"{o['free']:>5} {o['usable']:>6}  {sizes:<22} {blocked}")
        out += _size_notes(o["sizes"])
        for org, dsizes in o["dedicated"].items():
            out.append(f"      tenant {org} (dedicated nodes too): "
                       + " ".join(f"{s['gpu_count']}g:{s['launchable']}" for s in dsizes))
    out += ["", "Nodes:", f"  {'NAME':<24} {'REGION':<12} {'CAPABILITY':<16} {'SLOTS':<34} MODE"]
    for n in doc["nodes"]:
        slots = " ".join(f"{k}={v}" for k, v in n["slots"].items()) or "-"
        org = f" org={n['org']}" if n["org"] else ""
        health = "" if n["healthy"] else " UNHEALTHY"
        out.append(f"  {n['name']:<24} {n['region']:<12} {n['capability']:<16} {slots:<34} "
                   f"{_node_mode(n)}{org}{health}")
    out += ["", "Allocations:"]
    if not doc["allocations"]:
        out.append("  -")
    for a in doc["allocations"]:
        where = f"{a['node']} [{','.join(str(i) for i in a['slot_indexes']) or 'whole node'}]" if a["node"] else "-"
        claims = ",".join(sorted({c["status"] for c in a["claims"]})) or "-"
        line = (f"  {a['id']:<26} {a['tenant']:<14} {a['gpu_count']}x {a['sku']:<24} {a['status']:<12} "
                f"{where:<28} claims={claims}")
        if a["vm_profile"]:
            line += f" profile={a['vm_profile']}"
        if a["pending"]:
            line += f"\n      {a['pending']['code']}: {a['pending']['message']}"
        out.append(line)
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:

    doc = collect(db.database_url(args), policy=args.policy)
    if args.output == "json":
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(render_text(doc))
    return 0
