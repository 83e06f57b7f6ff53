"""`gpuaas status [-o text|json]`: the capacity read model of the database, printed.

The document is `reconciler.reports.status.document`, the one the service
serves; this module reads it and renders it as text: the capacity table per
region x SKU, the node list, the allocations, and warnings first (a failing
or unapplied revision, orphaned allocations, removed nodes, a disrupted
region).
"""

from __future__ import annotations

import argparse
from typing import Any

from reconciler.commands import db, repeating
from schemas import output


def collect(url: str, *, policy: str | None = None) -> dict[str, Any]:
    """The status document (reconciler.reports.status) read from the database at `url`."""
    from reconciler.reports import status
    from reconciler.store import connections

    with connections.connect(url, autocommit=True) as conn:
        return status.document(conn, policy=policy)


def register(sub: Any) -> None:
    p = sub.add_parser("status", help="capacity per region x SKU, nodes and allocations, from the database")
    output.add_argument(p, "text")
    p.add_argument("--policy", help="placement policy override (default: the Fleet's)")
    repeating.add_arguments(p)
    db.add_database_arguments(p)
    p.set_defaults(func=run)


def _node_mode(n: dict[str, Any]) -> str:
    if n.get("removed"):
        return (
            f"REMOVED from git; {len(n['claims'])} live claim(s) of {', '.join(n['allocations'])} remain "
            "(nothing released them)"
        )
    if n["admin_state"] == "active":
        return str(n["mode"])
    if n["drained"]:
        return f"{n['admin_state']} (drained: empty and clean; set admin_state: active to return it)"
    left = len(n["allocations"])
    cleanup = n["slots"].get("cleanup", 0) + n["slots"].get("releasing", 0)
    return f"{n['admin_state']} ({left} allocation(s) running, {cleanup} slot(s) in cleanup)"


def _size_notes(sizes: list[dict[str, Any]]) -> list[str]:
    """Stranded GPUs per size; sizes none of which is launchable, grouped by their reason code."""
    out = [
        f"      {s['gpu_count']} GPU: {s['stranded_gpus']} usable GPU(s) stranded by topology"
        for s in sizes
        if s["stranded_gpus"] and s["launchable"]
    ]
    by_code: dict[str, list[dict[str, Any]]] = {}
    for s in sizes:
        if s["limit"]:
            by_code.setdefault(s["limit"]["code"], []).append(s)
    for code, group in by_code.items():
        counts = ",".join(str(s["gpu_count"]) for s in group)
        out.append(f"      {counts} GPU: none launchable: {code}: {group[0]['limit']['message']}")
    return out


def render_text(doc: dict[str, Any]) -> str:
    out = [f"Status at revision {(doc['revision'] or '-')[:12]} (the revision applied)", *_warnings(doc)]
    out += ["", "Capacity (launchable now, per allowed GPU count; sizes and shapes compete for the same GPUs):"]
    return _capacity_and_the_rest(doc, out)


def _warnings(doc: dict[str, Any]) -> list[str]:
    out: list[str] = []
    rec = doc.get("reconciliation") or {}
    head = rec.get("head")
    if head and not head["applied"]:
        out.append(
            f"  HEAD {(head['revision'] or '-')[:12]} NOT APPLIED since {head['since']}: "
            f"{head['code']}: {head['message']} (see `gpuaas history`)"
        )
    if rec.get("failing"):
        f = rec["failing"]
        out.append(
            f"  FAILING since {f['since']} ({f['failures']} failed reconciliation(s)), newest on "
            f"{(f['revision'] or '-')[:12]}: {f['code']}: {f['message']}"
        )
    if doc.get("orphaned"):
        out.append(
            "  warning: allocations holding claims are no longer declared (set `state: released` to free "
            "them): " + ", ".join(doc["orphaned"])
        )
    if doc.get("removed_nodes"):
        out.append(
            "  warning: nodes removed from git still hold claims (their allocations run on; release them, "
            "then remove the node): " + ", ".join(doc["removed_nodes"])
        )
    for r in doc.get("disrupted_regions") or ():
        out.append(
            f"  region {r['region']} DISRUPTED: {r['silent']} of {r['nodes']} hosts silent at once; none is "
            "marked unavailable and nothing moves until they report (control plane or network outage?)"
        )
    if rec.get("invalid_revision"):
        out.append(
            f"  revision {rec['invalid_revision'][:12]} is invalid (see `gpuaas history`); "
            "the last valid revision stays in force"
        )
    return out


def _capacity_and_the_rest(doc: dict[str, Any], out: list[str]) -> str:
    """The capacity table, the node list and the allocations after `out` (the header and warnings)."""
    out.append(
        f"  {'REGION':<12} {'SKU':<26} {'UNIT':<5} {'TOTAL':>5} {'IN USE':>6} {'FREE':>5} "
        f"{'USABLE':>6}  {'LAUNCHABLE':<22} NOT LAUNCHABLE (free units)"
    )
    for o in doc["capacity"]:
        sizes = " ".join(f"{s['gpu_count']}g:{s['launchable']}" for s in o["sizes"])
        blocked = " ".join(f"{k}={v}" for k, v in o["not_launchable"].items()) or "-"
        out.append(
            f"  {o['region']:<12} {o['sku']:<26} {o['unit']:<5} {o['total']:>5} {o['in_use']:>6} "
            f"{o['free']:>5} {o['usable']:>6}  {sizes:<22} {blocked}"
        )
        if o.get("removed_in_use"):
            out.append(f"      {o['removed_in_use']} in use on node(s) removed from git")
        out += _size_notes(o["sizes"])
        for org, dsizes in o["dedicated"].items():
            out.append(
                f"      tenant {org} (dedicated nodes too): "
                + " ".join(f"{s['gpu_count']}g:{s['launchable']}" for s in dsizes)
            )
    out += ["", "Nodes:", f"  {'NAME':<24} {'REGION':<12} {'CAPABILITY':<16} {'SLOTS':<34} MODE"]
    for n in doc["nodes"]:
        slots = " ".join(f"{k}={v}" for k, v in n["slots"].items()) or "-"
        org = f" org={n['org']}" if n["org"] else ""
        health = "" if n["healthy"] else _unhealthy(n)
        out.append(
            f"  {n['name']:<24} {n['region']:<12} {n['capability']:<16} {slots:<34} "
            f"{_node_mode(n)}{org}{health}{_host_drift(n)}{_machine_text(n.get('machine'))}"
        )
    out += ["", "Allocations:"]
    if not doc["allocations"]:
        out.append("  -")
    for a in doc["allocations"]:
        where = f"{a['node']} [{','.join(str(i) for i in a['slot_indexes']) or 'whole node'}]" if a["node"] else "-"
        claims = ",".join(sorted({c["status"] for c in a["claims"]})) or "-"
        line = (
            f"  {a['id']:<26} {a['tenant']:<14} {a['gpu_count']}x {a['sku']:<24} {a['status']:<12} "
            f"{where:<28} claims={claims}"
        )
        if a["vm_profile"]:
            line += f" profile={a['vm_profile']}"
        if a.get("orphaned"):
            line += " ORPHANED (no longer declared)"
        if a.get("endpoints"):
            line += "\n      " + endpoint_text(a["endpoints"])
        if a["pending"]:
            line += f"\n      {a['pending']['code']}: {a['pending']['message']}"
        line += _lifecycle_text(a.get("lifecycle"), a["status"])
        line += _baremetal_text(a.get("baremetal"))
        out.append(line)
    for d in doc.get("machine_drift") or []:
        out.append(f"  DRIFT {d['provider']}/{d['machine_id']}: {d['code']}: {d['message']}")
    return "\n".join(out)


def _machine_text(m: dict[str, Any] | None) -> str:
    """A node's machine, when it says something: leased, erase failed, quarantined, slice profile owed."""
    if not m:
        return ""
    out = ""
    lease = m.get("lease")
    if lease:
        out += (
            f" CLEANUP_BLOCKED (erase of {lease['allocation_id']} failed)"
            if lease["phase"] == "erase_failed"
            else f" leased ({lease['allocation_id']}: {lease['phase']})"
        )
    if m.get("quarantine"):
        out += f"\n      QUARANTINED {m['quarantine']['code']}: {m['quarantine']['message']}"
    if m.get("needs_slice_profile"):
        out += "\n      node.slice_profile_owed: a lease wrote over the slice host; no slice until its agent reports"
    return out


def _baremetal_text(b: dict[str, Any] | None) -> str:
    if not b:
        return ""
    out = f"\n      baremetal: {b['phase']} via {b['provider']}/{b['machine_id']} ({b['provider_state'] or '-'})" + (
        f" ssh={b['ssh_endpoint']}" if b["ssh_endpoint"] else ""
    )
    if b["wait_code"]:
        out += f"\n      {b['wait_code']}: {b['wait_message']}"
    elif b["provider_message"] and b["phase"] in ("deploy_failed", "erase_failed"):
        out += f"\n      {b['provider_message']}"
    return out


def endpoint_text(found: list[dict[str, Any]]) -> str:
    """`ssh 203.0.113.13:20000 -> 10.100.0.10:22, tcp 203.0.113.13:20001 -> 10.100.0.10:8888`."""
    return ", ".join(
        f"{'ssh' if e['purpose'] == 'ssh' else 'tcp'} {e['public_address']}:{e['public_port']}"
        f" -> {e['private_ip']}:{e['guest_port']}"
        for e in found
    )


def _host_drift(n: dict[str, Any]) -> str:
    """What the node's host reports that keeps capacity off the market (seed 000, slice drift)."""
    out = ""
    if n.get("corrupt"):
        out += f" CORRUPT (host reports node-wide corruption: {', '.join(n['corrupt'])}; nothing new is placed)"
    for d in n.get("host_drift") or ():
        out += f"\n      slot {d['slot_index']} not placed: its host reports {', '.join(d['codes'])}"
    return out


def _unhealthy(n: dict[str, Any]) -> str:
    reasons = n.get("health_reasons") or []
    word = " UNAVAILABLE" if n.get("unavailable") else " UNHEALTHY"
    return word + "".join(f"\n      {r['code']}: {r['message']}" for r in reasons)


def _lifecycle_text(c: dict[str, Any] | None, status: str) -> str:
    """The lifecycle line under an allocation, when it says more than its status does."""
    if not c:
        return ""
    bits = [f"lifecycle={c['state']}"]
    if c["host_phase"]:
        bits.append(f"phase={c['host_phase']}")
    if c["state"] == "ready" and c["boot_ip"]:
        bits.append(f"ip={c['boot_ip']}")
    if c["host_unreachable"]:
        bits.append("HOST_UNREACHABLE (host silent; nothing is released)")
    if c["failed_attempts"]:
        bits.append(f"failed_attempts={c['failed_attempts']}")
    if len(bits) == 1 and c["state"] == status and not c["failure"]:
        return ""
    out = "\n      " + " ".join(bits)
    if c["failure"]:
        out += f"\n      {c['failure']['code']}: {c['failure']['message']}"
    return out


def run(args: argparse.Namespace) -> int:
    url = db.reading_url(args)
    return repeating.show(args, lambda: collect(url, policy=args.policy), render_text)
